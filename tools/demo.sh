#!/bin/sh
# `make demo`: split a bundled tiny LLaMA checkpoint over 4 ranks, check the
# shards against their manifest, verify them against the source, merge them
# back and compare the result with the input byte for byte. Prints each
# command before running it; exits non-zero on the first failure.
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top" || exit 1
bin=${TPSHARD:-./tpshard}
model=testdata/conformance/llama-tp4-uneven-vocab/model

[ -x "$bin" ] || { echo "demo: $bin is not built; run make first" >&2; exit 1; }
work=$(mktemp -d "${TMPDIR:-/tmp}/tpshard-demo.XXXXXX") || exit 1
echo "demo: writing into $work"
echo

step() {
  echo "\$ $*"
  "$@" || { rc=$?; echo "demo: FAILED (exit $rc): $*" >&2; exit 1; }
  echo
}

step "$bin" split "$model" --tp 4 -o "$work/llama-tp4"
step ls -l "$work/llama-tp4"
step "$bin" check "$work/llama-tp4"
step "$bin" verify "$work/llama-tp4" --source "$model"
step "$bin" merge "$work/llama-tp4" -o "$work/llama-merged"
step cmp "$model/model.safetensors" "$work/llama-merged/model.safetensors"

echo "demo: ok: split, check, verify and merge agree; merged file is identical to the input"
echo "demo: the files are in $work (remove with: rm -rf $work)"
