#!/bin/sh
# tpshard verify of serving layouts (vllm, sglang) where tp exceeds the KV
# heads: the engine replicates each KV head over tp / KV ranks, and the fused
# qkv_proj's k and v biases are replicated with their rows. verify finds each
# rank's bias rows as it finds its weight rows (a Qwen2 split passed check but
# failed verify: "bias ... lacks rank 1").
. "$TOP/tests/cli/lib.sh"

for kt in 1:2 2:4 4:8; do
  kv=${kt%:*} tp=${kt#*:}
  m="$T/qwen2-kv$kv"
  gen qwen2 "$m" --hidden 64 --heads 8 --kv-heads "$kv" --head-dim 8 --inter 64 --vocab 130 \
    --layers 2 --seed "$kv" >/dev/null 2>"$ERR" || { notok "gen.py qwen2 --kv-heads $kv"; diag "$ERR"; continue; }
  for lay in vllm sglang; do
    o="$T/qwen2-kv$kv-$lay-tp$tp"
    run tps split "$m" --tp "$tp" --layout "$lay" -o "$o" -q
    [ "$RC" = 0 ] || { notok "split qwen2 (KV heads $kv) --layout $lay --tp $tp"; diag "$ERR"; continue; }
    expect_exit 0 "check qwen2 KV heads $kv, $lay tp $tp" -- tps check "$o"
    run tps verify "$o" --source "$m" -v
    if [ "$RC" = 0 ] && grep -q '^verify: PASS' "$OUT" &&
       grep 'model.layers.1.self_attn.k_proj.weight *colwise' "$OUT" | grep -q ' ok$' &&
       grep 'model.layers.1.self_attn.v_proj.weight *colwise' "$OUT" | grep -q ' ok$'; then
      ok "verify qwen2 KV heads $kv, $lay tp $tp: k/v colwise with their replicated biases pass"
    else
      notok "verify qwen2 KV heads $kv, $lay tp $tp (exit $RC)"; grep -E 'FAIL|note' "$OUT" | diag; diag "$ERR"
    fi
  done
done

# The replicated bias rows are still checked: one bit of rank 1's copy of
# the k bias flipped fails verify, naming the bias and the rank.
o="$T/qwen2-kv1-vllm-tp2"
if [ -d "$o" ]; then
  python3 - "$o" <<'PY'
import json, struct, sys
d = sys.argv[1]
path = d + "/model-rank-1-part-0.safetensors"
b = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
s, e = h["model.layers.0.self_attn.qkv_proj.bias"]["data_offsets"]
man = json.load(open(d + "/tpshard.json"))
t = next(t for t in man["tensors"] if t["name"] == "model.layers.0.self_attn.k_proj.bias")
r = next(r for r in t["ranks"] if r["rank"] == 1)
b[8 + n + s + r.get("at", 0) + 1] ^= 0x40
open(path, "wb").write(b)
PY
  run tps verify "$o" --source "$T/qwen2-kv1"
  if [ "$RC" = 1 ] && grep 'k_proj.bias' "$OUT" | grep -q FAIL && grep -q 'rank 1' "$OUT"; then
    ok "one flipped bit in rank 1's replica of the k bias fails verify, naming it"
  else notok "flipped k bias replica: exit $RC"; diag "$OUT"; fi
fi

finish
