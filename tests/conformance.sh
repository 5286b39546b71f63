#!/bin/sh
# Every case in testdata/conformance (a copy of the independent conformance
# suite) must pass check.py.
top=$(cd "$(dirname "$0")/.." && pwd)
w="$TPS_TMP/conf"; mkdir -p "$w"
for c in "$top"/testdata/conformance/*/; do
  [ -f "$c/case.json" ] || continue
  line=$(cd "$top/testdata/conformance" && python3 check.py "$TPSHARD" "$c" "$w" 2>&1 | tail -n 1)
  case $line in ok*) echo "ok - conformance $line";; *) echo "not ok - conformance: $line";; esac
done
