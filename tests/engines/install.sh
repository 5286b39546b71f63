#!/bin/sh
# Makes build/engines-venv/vllm and build/engines-venv/sglang once, from PyPI:
#   torch (the PyPI wheel, with its CUDA libraries: torch imports them even
#   on a CPU; vLLM 0.33.0 wants torch 2.14.0, SGLang 0.5.23 torch 2.14.1,
#   hence two venvs), the engine itself with --no-deps, and the packages its
#   model, layer and loader modules import, pinned in
#   tests/engines/{vllm,sglang}-requirements.txt (--no-deps as well).  The
#   engines' other dependencies are GPU kernel packages (flashinfer, cutlass,
#   deep-gemm, sglang-kernel ...) and server packages that building and loading
#   a model on a CPU never imports.
# About 6 GB of downloads the first time.  Output: build/engines-venv/*.log.
set -e
top=$(cd "$(dirname "$0")/../.." && pwd)
here="$top/tests/engines"
mkdir -p "$top/build/engines-venv"
make_venv() {  # name torch-version engine-spec
  v="$top/build/engines-venv/$1"
  log="$top/build/engines-venv/$1.log"
  if [ -x "$v/bin/python" ] && [ -f "$v/.complete" ]; then return 0; fi
  echo "installing $3 into build/engines-venv/$1 (log: build/engines-venv/$1.log)"
  rm -rf "$v"
  python3 -m venv "$v" >"$log" 2>&1
  "$v/bin/pip" install --disable-pip-version-check "torch==$2" >>"$log" 2>&1 ||
    { echo "pip could not install torch==$2 (see $log)"; exit 1; }
  "$v/bin/pip" install --disable-pip-version-check --no-deps "$3" -r "$here/$1-requirements.txt" \
    >>"$log" 2>&1 || { echo "pip could not install $3 (see $log)"; exit 1; }
  "$v/bin/python" -c "import $1" >>"$log" 2>&1 ||
    { echo "build/engines-venv/$1 cannot import $1 (see $log)"; exit 1; }
  touch "$v/.complete"
}
make_venv vllm 2.14.0 vllm==0.33.0
make_venv sglang 2.14.1 sglang==0.5.23
