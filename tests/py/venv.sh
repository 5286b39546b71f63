#!/bin/sh
# Makes build/venv with the test oracles (numpy, safetensors) once.
top=$(cd "$(dirname "$0")/../.." && pwd)
v="$top/build/venv"
[ -x "$v/bin/python" ] && "$v/bin/python" -c 'import numpy, safetensors' 2>/dev/null && exit 0
python3 -m venv "$v" || { echo "python3 -m venv failed (apt-get install python3-venv)"; exit 1; }
"$v/bin/pip" install -q numpy safetensors || { echo "pip install numpy safetensors failed"; exit 1; }
"$v/bin/python" -c 'import numpy, safetensors'
