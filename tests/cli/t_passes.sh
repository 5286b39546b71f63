#!/bin/sh
# split in passes (--ranks-per-pass, and the automatic choice past 131072 tensor-rank
# pairs): each pass compiles the layout for its ranks only. The rank files and the manifest
# must be those of the one-pass split, byte for byte, in every layout: the one-pass engine
# is the reference the engines tested (make test-engines), so any difference is a bug here.
# Cases: every conformance model at its tp and layout (KV heads replicated across ranks,
# refined FP8 grids, GPTQ, NVFP4, MXFP4, Gemma 4, DeepSeek), passes of 1, 2 and 3 ranks.
. "$TOP/tests/cli/lib.sh"

for c in "$TOP"/testdata/conformance/*/; do
	name=$(basename "$c")
	case $name in *reject*) continue ;; esac
	tp=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['tp'])" "$c/case.json")
	lay=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1])).get('layout','dtensor'))" "$c/case.json")
	[ "$tp" -gt 1 ] || continue
	rm -rf "$T/a"
	tps split "$c/model" --tp "$tp" --layout "$lay" -o "$T/a" -q 2>"$ERR" ||
		{ notok "$name: one pass"; diag "$ERR"; continue; }
	for n in 1 2 3; do
		[ "$n" -lt "$tp" ] || continue
		rm -rf "$T/b"
		if ! tps split "$c/model" --tp "$tp" --layout "$lay" --ranks-per-pass "$n" -o "$T/b" -q 2>"$ERR"; then
			notok "$name: passes of $n"
			diag "$ERR"
			continue
		fi
		d=$(cd "$T/a" && for f in *; do cmp -s "$f" "$T/b/$f" || echo "$f"; done)
		[ "$(ls "$T/a" | wc -l)" = "$(ls "$T/b" | wc -l)" ] || d="$d (file count)"
		[ -z "$d" ] && ok "$name ($lay tp $tp): passes of $n ranks write the same files" ||
			notok "$name ($lay tp $tp): passes of $n: differ: $d"
	done
done

# a DeepSeek-shaped checkpoint (3k tensors: the automatic choice, past 131072 pairs, is
# bench/deepseek.sh's to show) in passes of 3 ranks, read back by check and verify
python3 "$TOP/bench/gen_deepseek.py" "$T/m" --layers 6 --experts 256 --bf16 >"$OUT" 2>"$ERR" ||
	{ notok "bench/gen_deepseek.py"; diag "$ERR"; finish; }
rm -rf "$T/a" "$T/b"
expect_exit 0 "deepseek vllm tp 8: one pass" -- tps split "$T/m" --tp 8 --layout vllm --ranks-per-pass 8 -o "$T/a" -q
expect_exit 0 "deepseek vllm tp 8: passes of 3" -- tps split "$T/m" --tp 8 --layout vllm --ranks-per-pass 3 -o "$T/b" -q
d=$(cd "$T/a" && for f in *; do cmp -s "$f" "$T/b/$f" || echo "$f"; done)
[ -z "$d" ] && ok "deepseek: passes of 3 write the same files" || notok "deepseek: differ: $d"
expect_exit 0 "check reads the split in passes" -- tps check "$T/b"
expect_exit 0 "verify reads it" -- tps verify "$T/b" -q
ls -a "$T/b" | grep -q "tmp" && notok "a pass's temporary left behind" || ok "no pass's temporary left behind"

# verify in passes of tensors (--tensors-per-pass): the checks of passes cut at every layer
# are those of one pass, in the same order, in both layouts; a shard damaged in the last
# layer's pass fails there
for lay in vllm dtensor; do
	d="$T/b"
	[ "$lay" = dtensor ] && { d="$T/d"; tps split "$T/m" --tp 8 -o "$d" -q 2>"$ERR" || { notok "dtensor split"; diag "$ERR"; }; }
	tps verify "$d" --source "$T/m" --json --tensors-per-pass 100000 >"$T/v1.json" 2>"$ERR" || { notok "$lay: verify in one pass"; diag "$ERR"; }
	tps verify "$d" --source "$T/m" --json --tensors-per-pass 1 -v >"$T/vn.json" 2>"$ERR" || { notok "$lay: verify in passes"; diag "$ERR"; }
	np=$(sed -n 's/.*tensors in \([0-9]*\) passes.*/\1/p' "$ERR")
	[ "${np:-0}" -ge 6 ] && ok "$lay: verify --tensors-per-pass 1 checks in $np passes" || { notok "$lay: passes: '$np'"; diag "$ERR"; }
	if python3 - "$T/v1.json" "$T/vn.json" 2>"$ERR" <<'PY'
import json, sys
a, b = (json.load(open(p))["checks"] for p in sys.argv[1:])
assert len(a) > 3000 and a == b, (len(a), len(b))
PY
	then ok "$lay: the checks in passes are those of one pass"; else notok "$lay: checks differ"; diag "$ERR"; fi
done
# a byte of rank 5's piece of the last layer's expert 200 down_proj flipped
python3 - "$T/d/model-rank-5-part-0.safetensors" model.layers.5.mlp.experts.200.down_proj.weight <<'PY' 2>"$ERR" || { notok "flip a byte"; diag "$ERR"; }
import json, struct, sys
f = open(sys.argv[1], "r+b"); n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
at = 8 + n + h[sys.argv[2]]["data_offsets"][0]
f.seek(at); b = f.read(1); f.seek(at); f.write(bytes([b[0] ^ 0x40]))
PY
tps verify "$T/d" --source "$T/m" --json --tensors-per-pass 1 >"$OUT" 2>"$ERR"
RC=$?
if [ "$RC" = 1 ] && python3 - "$OUT" <<'PY'
import json, sys
bad = [c["check"] for c in json.load(open(sys.argv[1]))["checks"] if not c["ok"]]
assert "model.layers.5.mlp.experts.200.down_proj.weight" in bad, bad
PY
then ok "verify in passes: the flipped byte fails its tensor, in the last pass"; else notok "flipped byte: exit $RC"; diag "$ERR"; fi
expect_exit 2 "verify --tensors-per-pass 0 is a usage error" -- tps verify "$T/d" --tensors-per-pass 0
# a vllm split of 17k tensors at tp 8: verify compiles its layout again in passes of ranks
# (past 131072 tensor-rank pairs, as split does); a style the manifest records wrongly is
# still found
python3 "$TOP/bench/gen_deepseek.py" "$T/y" --layers 15 --experts 256 >"$OUT" 2>"$ERR" ||
	{ notok "gen_deepseek --layers 15"; diag "$ERR"; }
if tps split "$T/y" --tp 8 --layout vllm -o "$T/y8" -q 2>"$ERR"; then
	tps verify "$T/y8" --source "$T/y" -v >"$OUT" 2>"$ERR"
	RC=$?
	[ "$RC" = 0 ] && grep -q "layout vllm compiled again in [2-8] passes of [1-7] rank" "$ERR" &&
		ok "verify: the layout compiled again in passes of ranks, every check passes" ||
		{ notok "verify, layout in passes: exit $RC"; diag "$ERR"; }
	python3 - "$T/y8/tpshard.json" <<'PY' 2>"$ERR" || { notok "edit the manifest"; diag "$ERR"; }
import json, sys
m = json.load(open(sys.argv[1]))
for t in m["tensors"]:
    if t["name"] == "model.layers.2.mlp.down_proj.weight":
        assert t["style"] == "rowwise", t["style"]
        t["style"] = "colwise"
json.dump(m, open(sys.argv[1], "w"))
PY
	tps verify "$T/y8" -v >"$OUT" 2>"$ERR"
	RC=$?
	[ "$RC" = 1 ] && grep -A1 "^model.layers.2.mlp.down_proj.weight .*FAIL" "$OUT" |
		grep -q "layout vllm puts" && ok "verify in passes of ranks: a wrong style is named" ||
		{ notok "wrong style: exit $RC"; diag "$OUT"; }
else notok "vllm split of 17k tensors"; diag "$ERR"; fi

# a tensor of the layer stack's prefix without a layer number ("model.layers.extra.weight"
# lies between layers 1 and 2 in name order): no cut may part the layers it lies among
python3 "$TOP/bench/gen_deepseek.py" "$T/x" --layers 3 --dense 1 --experts 4 --bf16 --parts 1 >"$OUT" 2>"$ERR" ||
	{ notok "gen_deepseek --parts 1"; diag "$ERR"; }
python3 - "$T/x" <<'PY' 2>"$ERR" || { notok "add model.layers.extra.weight"; diag "$ERR"; }
import json, struct, sys
d = sys.argv[1]; part = "model-00001-of-00001.safetensors"; p = d + "/" + part
ix = json.load(open(d + "/model.safetensors.index.json"))
ix["weight_map"]["model.layers.extra.weight"] = part
ix.get("metadata", {}).pop("total_size", None)
json.dump(ix, open(d + "/model.safetensors.index.json", "w"))
raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n]); data = raw[8 + n:]
h["model.layers.extra.weight"] = {"dtype": "F32", "shape": [4], "data_offsets": [len(data), len(data) + 16]}
data += struct.pack("<4f", 1, 2, 3, 4)
j = json.dumps(h).encode(); j += b" " * (-len(j) % 8)
open(p, "wb").write(struct.pack("<Q", len(j)) + j + data)
PY
if tps split "$T/x" --tp 2 -o "$T/x2" -q 2>"$ERR"; then
	tps verify "$T/x2" --source "$T/x" --tensors-per-pass 1 -v >"$OUT" 2>"$ERR"
	RC=$?
	[ "$RC" = 0 ] && grep -q "tensors in 1 pass$" "$ERR" && ok "a digit-less tensor in the layer stack: one pass, verify passes" ||
		{ notok "digit-less tensor: exit $RC"; diag "$ERR"; }
else notok "split of the model with model.layers.extra.weight"; diag "$ERR"; fi

# refusals
expect_exit 2 "--ranks-per-pass with --ranks" -- tps split "$T/m" --tp 8 --layout vllm --ranks 0 --ranks-per-pass 1 -o "$T/c"
expect_exit 2 "--ranks-per-pass with --pp" -- tps split "$T/m" --tp 2 --pp 2 --layout vllm --ranks-per-pass 1 -o "$T/c"
finish
