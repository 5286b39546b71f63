#!/bin/sh
# Kimi-K2's tensor count (61 layers, the first dense, 384 routed experts and a shared one,
# an MTP layer: 71k tensors) at tiny BF16 dims, split by the vLLM layout at tp 16: 1.12M
# tensor-rank entries and a 340 MB manifest, more than a manifest could hold before
# (1,048,576 entries, 256 MiB of text). The split is written, and check, merge (every part
# the source's but the one holding the MTP layer, which vLLM drops) and verify --source
# read it back; two --ranks runs into one directory make the same manifest, the second
# reading the first's a piece at a time (as a tree it took 1.7 GB at DeepSeek-V3's size).
. "$TOP/tests/cli/lib.sh"

python3 "$TOP/bench/gen_deepseek.py" "$T/m" --experts 384 --dense 1 --hidden 32 --moe-inter 16 \
  --inter 32 --q-lora 16 --kv-lora 16 --nope 8 --rope 8 --v-head 8 --heads 16 --vocab 64 \
  --bf16 --parts 4 >"$OUT" 2>"$ERR" && ok "a Kimi-K2-shaped checkpoint made" ||
  { notok "bench/gen_deepseek.py"; diag "$ERR"; finish; }

expect_exit 0 "vllm tp 16: split" -- tps split "$T/m" --tp 16 --layout vllm -o "$T/o" -q
if python3 - "$T/o/tpshard.json" <<'PY' 2>"$ERR"
import json, sys
m = json.load(open(sys.argv[1]))
n = sum(len(t["ranks"]) for t in m["tensors"])
assert n > 1048576, n
d = [e["name"] for e in m["dropped"]]
assert d and all(x.startswith("model.layers.61.") for x in d), d[:3]
PY
then ok "the manifest lists over 1,048,576 tensor-rank entries, and the MTP layer as dropped"
else notok "manifest"; diag "$ERR"; fi
expect_exit 0 "check reads it back" -- tps check "$T/o"
expect_exit 0 "merge reads it back" -- tps merge "$T/o" -o "$T/mg" -q
same=0 differ=
for f in "$T/m"/*.safetensors; do
  if cmp -s "$f" "$T/mg/$(basename "$f")"; then same=$((same + 1)); else differ="$differ $(basename "$f")"; fi
done
[ "$same" = 3 ] && [ "$differ" = " model-00004-of-00004.safetensors" ] &&
  ok "merge gives back every part byte for byte but the MTP layer's" ||
  notok "merge: $same parts identical, differ:$differ"
rm -rf "$T/mg"
expect_exit 0 "verify --source reads it back" -- tps verify "$T/o" --source "$T/m"
expect_exit 0 "--ranks 0-7" -- tps split "$T/m" --tp 16 --layout vllm --ranks 0-7 -o "$T/j" -q
expect_exit 0 "--ranks 8-15 joins it" -- tps split "$T/m" --tp 16 --layout vllm --ranks 8-15 -o "$T/j" -q
cmp -s "$T/j/tpshard.json" "$T/o/tpshard.json" && ok "two --ranks runs make the manifest one split makes" ||
  notok "--ranks join: another manifest"
finish
