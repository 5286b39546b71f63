#!/bin/sh
# Every --json document (each command, success and failure) is one object whose
# first keys are "ok" and then "schema_version": 1, the contract a JSON Schema
# reads; the error document is {"ok":false,"schema_version":1,"error":...}.
. "$TOP/tests/cli/lib.sh"
L="$TOP/testdata/conformance/llama-tp3/model"

# doc NAME WANT_OK: $OUT is one JSON object opening with ok (== WANT_OK) and schema_version 1.
doc() {
  if python3 - "$OUT" "$2" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
assert text.endswith("}\n") and text.count("\n") == 1, "one line"
d = json.loads(text, object_pairs_hook=lambda kv: kv)
keys = [k for k, _ in d]
assert keys[:2] == ["ok", "schema_version"], keys[:3]
assert dict(d)["schema_version"] == 1 and dict(d)["ok"] is (sys.argv[2] == "true")
PY
  then ok "$1: ok, schema_version first"; else notok "$1"; diag "$OUT"; fi
}

run tps inspect "$L" --json; doc "inspect --json" true
run tps plan --list --json; doc "plan --list --json" true
run tps plan "$L" --tp 3 --json; doc "plan --json" true
run tps plan "$L" --tp 2 --json; doc "plan --json, rejected" false
run tps split "$L" --tp 3 -o "$T/s" --dry-run --json; doc "split --dry-run --json" true
run tps split "$L" --tp 3 -o "$T/s" --json; doc "split --json" true
run tps check "$T/s" --json; doc "check --json" true
run tps verify "$T/s" --json; doc "verify --json" true
run tps merge "$T/s" -o "$T/m" --json; doc "merge --json" true
run tps split "$L" --tp 3 -o "$T/s" --json; doc "split --json over an output: error document" false
grep -q '"error":".*--force' "$OUT" && ok "the error document carries the message" ||
  { notok "error message"; diag "$OUT"; }
run tps inspect "$T/nothing" --json; doc "inspect --json of a missing path: error document" false
finish
