#!/bin/sh
# Makes build/venv with the test oracles once: numpy, the reference
# safetensors library and transformers (its config classes only: no torch),
# and jsonschema (the validator of the --json documents against docs/schema)
# and PyYAML (reads the examples' workflow file), from PyPI (the only tests
# that need the network, and only the first time).
# On failure prints one line saying why; pip's own output is kept in
# build/venv.log.
top=$(cd "$(dirname "$0")/../.." && pwd)
v="$top/build/venv"
log="$top/build/venv.log"
pkgs="numpy safetensors transformers jsonschema pyyaml"
[ -x "$v/bin/python" ] && "$v/bin/python" -c 'import numpy, safetensors, transformers, jsonschema, yaml' 2>/dev/null &&
  exit 0
mkdir -p "$top/build"
python3 -m venv "$v" >"$log" 2>&1 ||
  { echo "python3 -m venv failed (install python3-venv: sudo apt-get install python3-venv)"; exit 1; }
if ! "$v/bin/python" -m pip install --quiet --disable-pip-version-check --retries 1 --timeout 20 \
    $pkgs >>"$log" 2>&1; then
  echo "cannot install $pkgs from PyPI (no network, or no registry reachable?); pip's output: build/venv.log"
  exit 1
fi
"$v/bin/python" -c 'import numpy, safetensors, transformers, jsonschema, yaml' >>"$log" 2>&1 ||
  { echo "the venv in build/venv cannot import $pkgs; pip's output: build/venv.log"; exit 1; }
