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
# A dim of 2^32 elements or more (a vocabulary of 2^32 + 8, the embedding and head sparse
# files of 64 GiB): the compiled layout keeps 32-bit bounds, so split refuses, naming the
# tensor, its dim and its length, and writes nothing.
gen llama "$T/big" --layers 1 --hidden 8 --heads 2 --kv-heads 2 --inter 16 --vocab 16 --untied \
  >/dev/null 2>"$ERR" || { notok "gen.py"; diag "$ERR"; }
if python3 - "$T/big" <<'PY' 2>"$ERR"
import json, struct, sys
d = sys.argv[1]
p = d + "/model.safetensors"
with open(p, "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    h = json.loads(f.read(n))
    data = f.read()
V = 2**32 + 8
big = ("model.embed_tokens.weight", "lm_head.weight")
meta = h.pop("__metadata__", None)
out, blob = {}, b""
for k, v in sorted(h.items(), key=lambda kv: kv[1]["data_offsets"][0]):
    if k in big:
        continue
    b = data[v["data_offsets"][0]:v["data_offsets"][1]]
    out[k] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [len(blob), len(blob) + len(b)]}
    blob += b
end = len(blob)
for k in big:
    out[k] = {"dtype": "BF16", "shape": [V, 8], "data_offsets": [end, end + V * 16]}
    end += V * 16
if meta:
    out["__metadata__"] = meta
hj = json.dumps(out, separators=(",", ":")).encode()
hj += b" " * ((8 - len(hj) % 8) % 8)
try:
    with open(p, "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + blob)
        f.truncate(8 + len(hj) + end)
except OSError as e:
    print(e, file=sys.stderr)
    sys.exit(2)
c = json.load(open(d + "/config.json"))
c["vocab_size"] = V
json.dump(c, open(d + "/config.json", "w"))
PY
then
  expect_exit 1 "a dim of 2^32 + 8 elements: split refuses" -- tps split "$T/big" --tp 2 -o "$T/bigout"
  expect_stderr_has "tensor 'lm_head.weight' cannot be split along dim 0: it is 4294967304 elements long" \
    "it names the tensor, the dim and its length"
  [ ! -e "$T/bigout" ] && ok "nothing written" || notok "$T/bigout was made"
else
  echo "skip - a dim of 2^32 elements: this file system will not hold a 128 GiB sparse file"
  diag "$ERR"
fi
rm -rf "$T/big"
finish
