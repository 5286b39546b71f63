#!/bin/sh
# A serving layout's rank tensors as the manifest accounts for them (rank_tensors[].pieces):
# a fill that a tensor entry's piece stands for is matched when the manifest is read, the
# rest kept as they are; check and verify still refuse a manifest whose fills name the
# wrong source, overlap, leave a gap, come out of order or pass the tensor's end, naming
# the rank tensor, and pass an untouched one.
. "$TOP/tests/cli/lib.sh"

SRC="$TOP/testdata/conformance/vllm-deepseekv3-bf16-tp2/model"
expect_exit 0 "split vllm tp 2" -- tps split "$SRC" --tp 2 --layout vllm -o "$T/o" -q
expect_exit 0 "check of the untouched split" -- tps check "$T/o"
expect_exit 0 "verify of the untouched split" -- tps verify "$T/o"

# edit NAME WORD PY: a copy of the split whose manifest's rank tensor
# model.layers.0.mlp.gate_up_proj.weight of rank 0 (two fills: gate rows, up rows) PY edits
# (f: its fills); check and verify exit 1 and say WORD.
edit() {
  name=$1 word=$2 py=$3
  d="$T/$name"
  rm -rf "$d" && cp -r "$T/o" "$d"
  python3 - "$d/tpshard.json" "$py" <<'PY' || { notok "$name: edit"; return; }
import json, sys
p = sys.argv[1]
m = json.load(open(p))
rt = [r for r in m["rank_tensors"]
      if r["rank"] == 0 and r["name"] == "model.layers.0.mlp.gate_up_proj.weight"][0]
f = rt["pieces"]
assert len(f) == 2 and f[1]["at"] == f[0]["nbytes"], f
exec(sys.argv[2])
json.dump(m, open(p, "w"), indent=1)
PY
  expect_exit 1 "$name: check refuses" -- tps check "$d"
  expect_stderr_has "$word" "$name: check names it"
  expect_stderr_has "gate_up_proj" "$name: check names the rank tensor"
  expect_exit 1 "$name: verify fails" -- tps verify "$d"
  expect_stdout_has "$word" "$name: verify says why"
}

edit swapped "should hold a piece of 'model.layers.0.mlp.up_proj.weight'" \
  'f[0]["source"], f[1]["source"] = f[1]["source"], f[0]["source"]'
edit reversed "accounts for its bytes from" 'f.reverse()'
edit shifted "accounts for its bytes from" 'f[1]["at"] += 2'
edit short "should hold a piece of" 'f[1]["nbytes"] -= 2; f.append({"at": f[1]["at"] + f[1]["nbytes"], "nbytes": 2, "zeros": True})'
edit twice "accounts for its bytes from 32768, not 65536" 'f.append(dict(f[1]))'
edit gap "accounts for 32768 of its 65536 bytes" 'del f[1]'
edit unknown "should hold a piece of 'model.layers.0.mlp.nope.weight'" 'f[1]["source"] = "model.layers.0.mlp.nope.weight"'
finish
