#!/bin/sh
# Every kind of --json document, success and error, of every command, so the
# schema test at the end of `make test` (tests/py/check_json_docs.py, over
# what `tps` keeps) sees each variant the schemas in docs/schema describe:
# quantized checkpoints (supported and refused), no config.json, a tpshard
# output as the model; plans accepted, rejected, with a serving layout,
# untied, --list, split --dry-run; split, and a --ranks auto task with no
# rank to write; check complete, partial and corrupt; merge; verify passing,
# failing and without --source; an error from each command. Here: each run
# prints one JSON document and exits as documented.
. "$TOP/tests/cli/lib.sh"
C="$TOP/testdata/conformance"
L="$C/llama-tp4-uneven-vocab/model"

# jrun NAME STATUS ARGS...: `tpshard ARGS... --json` exits STATUS and prints
# one JSON document (one line) on stdout.
jrun() {
  name=$1 want=$2; shift 2
  run tps "$@" --json
  if [ "$RC" = "$want" ] && python3 -c '
import json, sys
t = open(sys.argv[1]).read()
assert t.endswith("\n") and t.count("\n") == 1, "not one line"
d = json.loads(t)
assert isinstance(d, dict) and isinstance(d.get("ok"), bool), "no ok"
' "$OUT" 2>"$T/.pyerr"; then
    ok "--json: $name (exit $RC)"
  else
    notok "--json: $name: exit $RC, expected $want, one JSON document"; diag "$OUT"; diag "$ERR"; diag "$T/.pyerr"
  fi
}
# jhas NAME EXPR: the last document satisfies the Python expression EXPR on d.
jhas() {
  python3 -c "import json, sys; d = json.load(open(sys.argv[1])); assert $2" "$OUT" 2>"$T/.pyerr" &&
    ok "--json: $1" || { notok "--json: $1"; diag "$OUT"; diag "$T/.pyerr"; }
}

# Quantized checkpoints: block FP8 (supported) and AWQ (refused).
python3 "$TOP/tests/cli/mkfp8.py" "$L" "$T/fp8" && python3 "$TOP/tests/cli/mkfp8.py" "$L" "$T/awq" awq ||
  notok "make the quantized checkpoints"
jrun "inspect of a block-FP8 checkpoint" 0 inspect "$T/fp8"
jhas "inspect shows the FP8 blocks" 'd["quantization"]["block_size"] == [16, 16] and d["quantization"]["supported"]'
jrun "inspect of an AWQ checkpoint (shown, not split)" 0 inspect "$T/awq"
jhas "inspect says why AWQ is refused" 'd["quantization"]["supported"] is False and "awq" in d["quantization"]["problem"]'
jrun "plan of a block-FP8 checkpoint at tp 2" 0 plan "$T/fp8" --tp 2
jrun "plan of a block-FP8 checkpoint at tp 4 (a shard would cut a block)" 1 plan "$T/fp8" --tp 4
jhas "the rejection names the block" 'not d["ok"] and "block" in d["rejected"]'
jrun "plan of an AWQ checkpoint: error document" 1 plan "$T/awq" --tp 2
jhas "the error says awq" 'd["ok"] is False and "awq" in d["error"]'

# No config.json; a tpshard output as the model.
mkdir -p "$T/nocfg" && cp "$L/model.safetensors" "$T/nocfg/"
jrun "inspect without config.json" 0 inspect "$T/nocfg"
jhas "config and family are null" 'd["config"] is None and d["family"] is None'
jrun "inspect of a missing path: error document" 1 inspect "$T/nothing"

# Plans.
jrun "plan --list" 0 plan --list
jrun "plan at tp 4" 0 plan "$L" --tp 4
jrun "plan rejected at tp 8" 1 plan "$L" --tp 8
jhas "a rejected plan: ok false, rejected says why" 'd["ok"] is False and "num_key_value_heads" in d["rejected"]'
jrun "plan with the vllm layout (rank_tensors)" 0 plan "$L" --tp 8 --layout vllm
jhas "serving layout plans list rank_tensors" 'd["target"].startswith("vllm") and len({t["rank"] for t in d["rank_tensors"]}) == 8'
jrun "plan --untie" 0 plan "$C/gemma3-tp2-tied-reject/model" --tp 2 --untie
jrun "plan with an unknown family: error document" 1 plan "$L" --tp 2 --family nope
jrun "split --dry-run prints the plan" 0 split "$L" --tp 2 -o "$T/dry" --dry-run

# Split, check, merge, verify.
jrun "split" 0 split "$L" --tp 4 -o "$T/s4"
jrun "split into an existing output: error document" 1 split "$L" --tp 4 -o "$T/s4"
jrun "inspect of a tpshard output" 0 inspect "$T/s4"
export RANK=3 WORLD_SIZE=4
jrun "split --ranks auto, a task with no rank to write" 0 split "$L" --tp 2 -o "$T/none" --ranks auto
unset RANK WORLD_SIZE
jhas "ranks_written is 0" 'd["ranks_written"] == 0 and d["files_written"] == 0'
[ ! -e "$T/none" ] && ok "the task with no rank wrote nothing" || notok "the task with no rank wrote something"
jrun "check of a complete directory" 0 check "$T/s4"
jrun "split --ranks 1,3" 0 split "$L" --tp 4 --ranks 1,3 -o "$T/part"
jrun "check of a partial directory: exit 3" 3 check "$T/part"
jhas "the partial directory names the missing ranks" 'd["missing_ranks"] == "0,2" and d["ranks_present"] == 2'
jrun "merge" 0 merge "$T/s4" -o "$T/m4"
jrun "merge of a partial directory: error document" 1 merge "$T/part" -o "$T/mp"
jrun "verify with --source" 0 verify "$T/s4" --source "$L"
jrun "verify without --source" 0 verify "$T/s4"
jrun "split of a block-FP8 checkpoint" 0 split "$T/fp8" --tp 2 -o "$T/fp8-2"
jrun "verify of the block-FP8 split (dequantized)" 0 verify "$T/fp8-2" --source "$T/fp8"
cp -r "$T/s4" "$T/flip"
python3 - "$T/flip/model-rank-2-part-0.safetensors" <<'PY'
import struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); n = struct.unpack("<Q", b[:8])[0]
b[8 + n + 64] ^= 0x10; open(p, "wb").write(b)
PY
jrun "check of a flipped bit: error document" 1 check "$T/flip"
jrun "verify of a flipped bit: ok false" 1 verify "$T/flip" --source "$L"
jhas "the failing verify counts its failures" 'd["ok"] is False and d["summary"]["failed"] > 0'
jrun "verify of a plain checkpoint: error document" 1 verify "$L"

# Pipeline stages (--pp): the plan, split and check documents carry pp and the stages.
jrun "plan --pp 2 with the vllm layout" 0 plan "$L" --tp 2 --pp 2 --layout vllm
jhas "plan --pp: pp, stages, every worker's bytes, each tensor's stages" \
  'd["pp"] == 2 and len(d["stages"]) == 2 and len(d["rank_bytes"]) == 4 and all(t["stages"] for t in d["tensors"])'
jrun "split --pp 2" 0 split "$L" --tp 2 --pp 2 --layout vllm -o "$T/pp"
jhas "split --pp: pp and four ranks' bytes" 'd["pp"] == 2 and len(d["rank_bytes"]) == 4'
jrun "check of a --pp directory" 0 check "$T/pp"
jhas "check --pp: pp 2, four ranks present" 'd["pp"] == 2 and d["ranks_present"] == 4'
finish
