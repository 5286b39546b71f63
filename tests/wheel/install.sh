#!/bin/sh
# Builds the wheel (make wheel; cached in build/wheel) and installs it into a
# fresh venv, VENV, from the file alone (pip --no-index: no network). On
# failure prints one line saying why.
# Usage: tests/wheel/install.sh VENV
top=$(cd "$(dirname "$0")/../.." && pwd)
venv=$1
# The make that runs the tests must not pass its knobs or job server on.
if ! out=$(cd "$top" && env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s wheel 2>&1 >/dev/null); then
  # tools/wheel.sh's line says why; make's own line after it only that it failed
  why=$(echo "$out" | sed -n 's/^tpshard: error: //p' | tail -n 1)
  echo "${why:-make wheel failed: $(echo "$out" | tail -n 1)}"
  exit 1
fi
whl=$(ls "$top"/build/wheel/dist/tpshard-*.whl 2>/dev/null | head -n 1)
[ -n "$whl" ] || { echo "make wheel left no wheel in build/wheel/dist"; exit 1; }
rm -rf "$venv"
python3 -m venv "$venv" >"$venv.log" 2>&1 ||
  { echo "python3 -m venv failed (install python3-venv: sudo apt-get install python3-venv)"
    exit 1; }
"$venv/bin/python" -m pip install --no-index --quiet --disable-pip-version-check "$whl" \
    >>"$venv.log" 2>&1 ||
  { echo "pip install --no-index $(basename "$whl") failed: $(tail -n 1 "$venv.log")"; exit 1; }
echo "$whl"
