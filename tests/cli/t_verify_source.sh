#!/bin/sh
# verify --source of another checkpoint than the one split: one error first,
# saying that SOURCE is not the checkpoint the manifest records and naming
# the file or tensor that differs (exit 1), never a report of per-tensor
# failures. Other tensor names or shapes, other files, another size or
# header, and the same names and shapes with other values (a fine-tune): in
# a tensor verify compares up front, and in one it meets only while checking.
. "$TOP/tests/cli/lib.sh"

# not_split NAME DIR SOURCE WORD...: exit 1, nothing on stdout, one error
# saying SOURCE is not what DIR was split from, with every WORD.
not_split() {
  name=$1 d=$2 s=$3; shift 3
  run tps verify "$d" --source "$s"
  good=1
  [ "$RC" = 1 ] && [ ! -s "$OUT" ] && [ "$(wc -l <"$ERR")" = 1 ] &&
    grep -qF "tpshard: error: verify: $s is not the checkpoint $d was split from" "$ERR" || good=0
  for w in "$@"; do grep -qF -- "$w" "$ERR" || good=0; done
  if [ $good = 1 ]; then ok "$name"; else
    notok "$name (exit $RC; wanted: $*)"; diag "$ERR"; diag "$OUT"; fi
}
small() { gen llama "$@" --hidden 16 --heads 2 --kv-heads 2 --inter 16 --vocab 10 --layers 1 >/dev/null; }

small "$T/a" --seed 1
small "$T/b" --seed 2
run tps split "$T/a" --tp 2 -o "$T/a2" -q
[ "$RC" = 0 ] || { notok "split"; diag "$ERR"; finish; }
expect_exit 0 "verify --source the checkpoint split passes" -- tps verify "$T/a2" --source "$T/a"

# same names, shapes and file sizes, other values
if cmp -s "$T/a/model.safetensors" "$T/b/model.safetensors"; then notok "seeds 1 and 2 gave the same model"; fi
not_split "a checkpoint with other values (same shapes) is named, with a tensor" "$T/a2" "$T/b" "tensor '" "differs"
run tps verify "$T/a2" --source "$T/b" --json
[ "$RC" = 1 ] && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"] is False and "is not the checkpoint" in d["error"], d' "$OUT" &&
  ok "verify --json: the error document says so" || { notok "--json of another source: exit $RC"; diag "$OUT"; }

# one value of one tensor that verify compares up front (a norm, replicated)
# and of one it compares only while checking (down_proj, Shard(1))
for t in model.norm.weight model.layers.0.mlp.down_proj.weight; do
  rm -rf "$T/c"; cp -r "$T/a" "$T/c"
  python3 - "$T/c/model.safetensors" "$t" <<'PY'
import json, struct, sys
path, name = sys.argv[1], sys.argv[2]
b = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
s, e = json.loads(b[8:8 + n])[name]["data_offsets"]
b[8 + n + s + (e - s) // 2] ^= 0x01
open(path, "wb").write(b)
PY
  not_split "one bit of the source's $t changed: named" "$T/a2" "$T/c" "tensor '$t'"
done

# other shapes, names, files, sizes and headers
gen llama "$T/v12" --hidden 16 --heads 2 --kv-heads 2 --inter 16 --vocab 12 --layers 1 --seed 1 >/dev/null
sed -i 's/"vocab_size": 12/"vocab_size": 10/' "$T/v12/config.json"
not_split "another vocabulary: the tensor and both shapes are named" "$T/a2" "$T/v12" \
  "tensor 'lm_head.weight' is BF16 [10, 16] in the manifest, BF16 [12, 16]"
gen llama "$T/l2" --hidden 16 --heads 2 --kv-heads 2 --inter 16 --vocab 10 --layers 2 --seed 1 >/dev/null
not_split "an extra layer: a tensor of it is named" "$T/a2" "$T/l2" "tensor 'model.layers.1." \
  "the manifest does not list"
gen llama "$T/i2" --hidden 16 --heads 2 --kv-heads 2 --inter 16 --vocab 10 --layers 1 --seed 1 --index 2 >/dev/null
not_split "the same tensors in two part files: the file split is named" "$T/a2" "$T/i2" \
  "the source file model.safetensors is not there"
run tps split "$T/i2" --tp 2 -o "$T/i22" -q
not_split "split from two parts, verified against one file: the missing part is named" "$T/i22" "$T/a" \
  "the source file model-0000" "is not there"
small "$T/meta" --seed 1 --metadata '{"note": "x"}'
not_split "other __metadata__ in the source header: the file is named" "$T/a2" "$T/meta" \
  "the header of model.safetensors"

# a single file under another name is the same checkpoint
cp "$T/a/model.safetensors" "$T/renamed.safetensors"
expect_exit 0 "the split file under another name passes" -- tps verify "$T/a2" --source "$T/renamed.safetensors"
# a reshard is verified against its tpshard source and against the original
run tps split "$T/a2" --tp 1 --family llama -o "$T/a1" -q
expect_exit 0 "a reshard verifies against the directory it was split from" -- tps verify "$T/a1" --source "$T/a2"
run tps split "$T/b" --tp 2 -o "$T/b2" -q
not_split "a reshard verified against another split directory: named" "$T/a1" "$T/b2" "differs"

finish
