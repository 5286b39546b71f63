#!/bin/sh
# tests/gpu/prepare.sh - fills .gpu/ (ignored by git) with what tests/gpu/run.sh
# needs on a GPU machine that has no package registry:
#   *.deb          Debian's libcjson, libyaml and zlib (runtime and -dev), which
#                  run.sh unpacks into its scratch directory when pkg-config
#                  does not find them there;
#   nccl.h         a fallback header when the machine has NCCL's library only;
#   make           a fallback GNU make;
#   tpshard        a `make CUDA=1` build made here, used only when the build
#                  on the GPU machine fails (run.sh says so);
#   gen_llama      bench/gen_llama.c built here (likewise a fallback).
# Run it from the repository root on a Debian/Ubuntu machine with apt-get and
# the CUDA toolkit; then send .gpu/ along with the tree.
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top"
out=$top/.gpu
rm -rf "$out"
mkdir -p "$out"
(cd "$out" && apt-get download libcjson1 libcjson-dev libyaml-0-2 libyaml-dev zlib1g zlib1g-dev \
  2>/dev/null)
cuda=${CUDA_HOME:-/usr/local/cuda}
for h in "$cuda/include/nccl.h" /usr/include/nccl.h /usr/local/include/nccl.h; do
  [ -f "$h" ] && { cp "$h" "$out/nccl.h"; break; }
done
cp "$(command -v make)" "$out/make"
# a CUDA build of this tree, made in a copy so that ./tpshard stays as it is
b=$(mktemp -d)
trap 'rm -rf "$b"' EXIT
git ls-files -z | xargs -0 cp --parents -t "$b"
(cd "$b" && make -s -j"$(nproc)" CUDA=1 CUDA_HOME="$cuda" tpshard build/gen_llama >/dev/null)
cp "$b/tpshard" "$b/build/gen_llama" "$out/"
ls -l "$out"
du -sh "$out"
