#!/bin/sh
# The serving layouts write exactly the engine's key set: source tensors the
# engine's own load_weights skips (rotary caches) are left out, listed in the
# manifest as dropped, shown by plan and named by merge; a tensor the
# engine's model has no place for (an unknown extra, Qwen2's o_proj.bias, a
# q/k/v or MLP bias its config does not enable) is refused before anything is
# written; the DTensor layout keeps every tensor.
. "$TOP/tests/cli/lib.sh"

# addt FILE NAME DTYPE SHAPE: adds tensor NAME (F32 or BF16, SHAPE "4" or "2,3")
# to the safetensors FILE, in the reference writer's order.
addt() {
  python3 - "$@" <<'EOF'
import json, struct, sys
path, name, dtype, shape = sys.argv[1], sys.argv[2], sys.argv[3], [int(x) for x in sys.argv[4].split(",")]
raw = open(path, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n]); data = raw[8 + n:]
meta = h.pop("__metadata__", None)
size = {"F32": 4, "BF16": 2}[dtype]
for d in shape: size *= d
blobs = {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in h.items()}
blobs[name] = bytes((i * 37 + 11) & 0x3F for i in range(size))
h[name] = {"dtype": dtype, "shape": shape}
order = sorted(h, key=lambda k: ({"F32": 0, "BF16": 1}.get(h[k]["dtype"], 2), k))
out, off, body = {}, 0, b""
if meta: out["__metadata__"] = meta
for k in order:
    out[k] = {"dtype": h[k]["dtype"], "shape": h[k]["shape"], "data_offsets": [off, off + len(blobs[k])]}
    off += len(blobs[k]); body += blobs[k]
j = json.dumps(out, separators=(",", ":")).encode(); j += b" " * (-len(j) % 8)
open(path, "wb").write(struct.pack("<Q", len(j)) + j + body)
EOF
}

# holds FILE NAME: does the rank file hold tensor NAME?
holds() {
  python3 - "$1" "$2" <<'EOF'
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]
sys.exit(0 if sys.argv[2] in json.loads(f.read(n)) else 1)
EOF
}

# same_less SRC MERGED NAME...: MERGED holds every tensor of SRC but the NAMEs,
# byte for byte, and nothing else.
same_less() {
  python3 - "$@" <<'EOF'
import json, struct, sys
def load(p):
    raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}
src, got, gone = load(sys.argv[1]), load(sys.argv[2]), set(sys.argv[3:])
assert gone <= set(src), gone - set(src)
want = {k: v for k, v in src.items() if k not in gone}
assert got == want, (sorted(set(got) ^ set(want)), [k for k in want if got.get(k) != want[k]][:3])
EOF
}

INV0=model.layers.0.self_attn.rotary_emb.inv_freq
INV1=model.layers.1.self_attn.rotary_emb.inv_freq
COS=model.layers.1.self_attn.rotary_emb.cos_cached
gen llama "$T/m" --layers 2 >/dev/null 2>&1
addt "$T/m/model.safetensors" "$INV0" F32 8
addt "$T/m/model.safetensors" "$INV1" F32 8
addt "$T/m/model.safetensors" "$COS" BF16 16,8

for lay in vllm sglang; do
  run tps split "$T/m" --tp 2 --layout "$lay" -o "$T/$lay" -q
  [ "$RC" = 0 ] && ok "$lay: a checkpoint with rotary caches splits" || { notok "$lay: split with rotary caches"; diag "$ERR"; continue; }
  if ! holds "$T/$lay/model-rank-0-part-0.safetensors" "$INV0" &&
     ! holds "$T/$lay/model-rank-1-part-0.safetensors" "$COS" &&
     holds "$T/$lay/model-rank-1-part-0.safetensors" model.norm.weight; then
    ok "$lay: no rank file holds inv_freq or cos_cached"
  else
    notok "$lay: a rank file holds a rotary cache"
  fi
  if python3 - "$T/$lay/tpshard.json" "$lay" "$INV0" "$INV1" "$COS" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1])); lay = sys.argv[2]; want = sorted(sys.argv[3:])
d = m["dropped"]
assert sorted(e["name"] for e in d) == want, d
assert all(e["layout"] == lay and e["source_file"] == "model.safetensors" and "rotary" in e["reason"]
           for e in d), d
e = [e for e in d if e["name"].endswith("inv_freq")][0]
assert e["dtype"] == "F32" and e["shape"] == [8], e
assert not set(want) & {t["name"] for t in m["tensors"]}
EOF
  then ok "$lay: the manifest lists the rotary caches as dropped, with the reason"
  else notok "$lay: manifest dropped"; fi
  run tps check "$T/$lay"
  [ "$RC" = 0 ] && ok "$lay: check passes" || { notok "$lay: check"; diag "$ERR"; }
  run tps verify "$T/$lay" --source "$T/m"
  if [ "$RC" = 0 ] && ! grep -q "missing from the shards" "$OUT"; then
    ok "$lay: verify --source passes and does not call the dropped tensors missing"
  else
    notok "$lay: verify"; diag "$OUT"
  fi
  run tps plan "$T/m" --tp 2 --layout "$lay"
  if [ "$RC" = 0 ] && grep -q "^  $INV0 .* dropped " "$OUT" && grep -q "^dropped" "$OUT" &&
     grep -q "^  $COS: a rotary cache" "$OUT"; then
    ok "$lay: plan shows the dropped tensors and why"
  else
    notok "$lay: plan dropped"; diag "$OUT"
  fi
  run tps plan "$T/m" --tp 2 --layout "$lay" --json
  python3 - "$OUT" "$INV0" "$INV1" "$COS" <<'EOF' && ok "$lay: plan --json lists them under dropped, not under tensors" || notok "$lay: plan --json dropped"
import json, sys
d = json.load(open(sys.argv[1])); want = sorted(sys.argv[2:])
assert sorted(e["name"] for e in d["dropped"]) == want, d["dropped"]
assert not set(want) & {t["name"] for t in d["tensors"]}
assert all(e["reason"] for e in d["dropped"])
EOF
  run tps merge "$T/$lay" -o "$T/$lay-m"
  if [ "$RC" = 0 ] && grep -q "$INV0" "$ERR" && grep -q "$COS" "$ERR" && grep -q "not given back" "$ERR"; then
    ok "$lay: merge names the dropped tensors"
  else
    notok "$lay: merge names dropped"; diag "$ERR"
  fi
  same_less "$T/m/model.safetensors" "$T/$lay-m/model.safetensors" "$INV0" "$INV1" "$COS" &&
    ok "$lay: merge gives back the source less exactly the dropped tensors" || notok "$lay: merge content"
  run tps merge "$T/$lay" -o "$T/$lay-m" --force --json
  python3 - "$OUT" "$INV0" "$INV1" "$COS" <<'EOF' && ok "$lay: merge --json lists them" || notok "$lay: merge --json dropped"
import json, sys
d = json.load(open(sys.argv[1]))
assert sorted(e["name"] for e in d["dropped"]) == sorted(sys.argv[2:]), d
EOF
done

# a directory resharded from a serving one keeps the list: merge still names them
run tps split "$T/vllm" --tp 1 -o "$T/re" -q
run tps merge "$T/re" -o "$T/re-m"
[ "$RC" = 0 ] && grep -q "$INV1" "$ERR" && same_less "$T/m/model.safetensors" "$T/re-m/model.safetensors" "$INV0" "$INV1" "$COS" &&
  ok "a vllm directory resharded to dtensor still names the tensors dropped from the source" ||
  { notok "reshard keeps dropped"; diag "$ERR"; }

# the DTensor layout keeps every tensor
run tps split "$T/m" --tp 2 -o "$T/dt" -q
if [ "$RC" = 0 ] && holds "$T/dt/model-rank-1-part-0.safetensors" "$INV0" &&
   ! grep -q '"dropped"' "$T/dt/tpshard.json"; then
  ok "dtensor keeps the rotary caches in every rank file"
else
  notok "dtensor keeps every tensor"; diag "$ERR"
fi
run tps merge "$T/dt" -o "$T/dt-m"
[ "$RC" = 0 ] && [ ! -s "$ERR" ] && cmp -s "$T/dt-m/model.safetensors" "$T/m/model.safetensors" &&
  ok "dtensor: merge gives back the source byte for byte" || { notok "dtensor merge"; diag "$ERR"; }

# no place in the engine's model: refused before anything is written
gen llama "$T/x" >/dev/null 2>&1
addt "$T/x/model.safetensors" model.layers.0.mlp.extra_gate.weight BF16 64
for lay in vllm sglang; do
  expect_exit 1 "$lay refuses an unknown extra tensor" -- tps split "$T/x" --tp 2 --layout "$lay" -o "$T/x-$lay"
  expect_stderr_has "tensor 'model.layers.0.mlp.extra_gate.weight'" "$lay: the refusal names the tensor"
  expect_stderr_has "(layout $lay" "$lay: and the layout"
  [ ! -e "$T/x-$lay" ] && ok "$lay: the refused split wrote nothing" || notok "$lay: refused split wrote $(ls "$T/x-$lay")"
  expect_exit 1 "$lay: plan refuses it too" -- tps plan "$T/x" --tp 2 --layout "$lay"
done
expect_exit 0 "dtensor keeps an unknown extra tensor" -- tps split "$T/x" --tp 2 -o "$T/x-dt" -q

gen qwen2 "$T/q2" >/dev/null 2>&1
addt "$T/q2/model.safetensors" model.layers.0.self_attn.o_proj.bias BF16 64
for lay in vllm sglang; do
  expect_exit 1 "$lay refuses Qwen2's o_proj.bias" -- tps split "$T/q2" --tp 2 --layout "$lay" -o "$T/q2-$lay"
  expect_stderr_has "tensor 'model.layers.0.self_attn.o_proj.bias'" "$lay: naming the tensor"
  expect_stderr_has "Qwen2 has no o_proj.bias" "$lay: and that the engine's Qwen2 has none"
  [ ! -e "$T/q2-$lay" ] && ok "$lay: nothing written for it" || notok "$lay: q2 refused split wrote files"
done
expect_exit 0 "dtensor keeps Qwen2's o_proj.bias" -- tps split "$T/q2" --tp 2 -o "$T/q2-dt" -q

# a bias the engine's model does not build (LLaMA without attention_bias) is
# refused, not dropped: the engine would compute without it
gen llama "$T/lb" >/dev/null 2>&1
addt "$T/lb/model.safetensors" model.layers.0.self_attn.o_proj.bias BF16 64
expect_exit 1 "vllm refuses an o_proj.bias LLaMA's config does not give it" -- tps split "$T/lb" --tp 2 --layout vllm -o "$T/lb-v"
expect_stderr_has "would ignore this bias" "saying the engine would ignore it"

# setcfg DIR KEY VALUE: sets KEY of DIR/config.json to VALUE (a JSON literal),
# or with VALUE "-" removes it.
setcfg() {
  python3 - "$@" <<'EOF'
import json, sys
p = sys.argv[1] + "/config.json"; c = json.load(open(p))
if sys.argv[3] == "-": c.pop(sys.argv[2], None)
else: c[sys.argv[2]] = json.loads(sys.argv[3])
json.dump(c, open(p, "w"), indent=2)
EOF
}

# delt FILE SUFFIX...: removes from the safetensors FILE every tensor whose name
# ends with one of the SUFFIXes.
delt() {
  python3 - "$@" <<'EOF'
import json, struct, sys
p = sys.argv[1]; raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n]); data = raw[8 + n:]
out, off, body = {}, 0, b""
for k, v in h.items():
    if k == "__metadata__": out[k] = v; continue
    if k.endswith(tuple(sys.argv[2:])): continue
    b = data[v["data_offsets"][0]:v["data_offsets"][1]]
    out[k] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [off, off + len(b)]}
    off += len(b); body += b
j = json.dumps(out, separators=(",", ":")).encode(); j += b" " * (-len(j) % 8)
open(p, "wb").write(struct.pack("<Q", len(j)) + j + body)
EOF
}

# q/k/v and MLP biases fuse only where the engine's model builds the fused
# bias (its config field enables it); else they are refused before anything is
# written, naming the tensor, the layout and the field that would enable it
gen llama "$T/ab" --attention-bias --mlp-bias >/dev/null 2>&1
setcfg "$T/ab" attention_bias -
setcfg "$T/ab" mlp_bias -
for lay in vllm sglang; do
  expect_exit 1 "$lay refuses LLaMA q/k/v biases without attention_bias" -- tps split "$T/ab" --tp 2 --layout "$lay" -o "$T/ab-$lay"
  expect_stderr_has "tensor 'model.layers.0.self_attn.k_proj.bias'" "$lay: naming the bias"
  expect_stderr_has "self_attn.qkv_proj without a bias" "$lay: and that the engine's qkv_proj has none"
  expect_stderr_has "set attention_bias: true" "$lay: and the field that would enable it"
  expect_stderr_has "layout $lay" "$lay: and the layout"
  [ ! -e "$T/ab-$lay" ] && ok "$lay: nothing written for the q/k/v biases" || notok "$lay: ab refused split wrote files"
  expect_exit 1 "$lay: plan refuses them too" -- tps plan "$T/ab" --tp 2 --layout "$lay"
done
setcfg "$T/ab" attention_bias false
expect_exit 1 "vllm refuses them with attention_bias false" -- tps split "$T/ab" --tp 2 --layout vllm -o "$T/ab-f"
expect_stderr_has "k_proj.bias" "naming the bias"

# attention_bias true: the MLP biases are the ones refused
setcfg "$T/ab" attention_bias true
for lay in vllm sglang; do
  expect_exit 1 "$lay refuses LLaMA MLP biases without mlp_bias" -- tps split "$T/ab" --tp 2 --layout "$lay" -o "$T/abm-$lay"
  expect_stderr_has "tensor 'model.layers.0.mlp.gate_proj.bias'" "$lay: naming the MLP bias"
  expect_stderr_has "mlp.gate_up_proj without a bias" "$lay: and that gate_up_proj has none"
  [ ! -e "$T/abm-$lay" ] && ok "$lay: nothing written for the MLP biases" || notok "$lay: abm refused split wrote files"
done
expect_stderr_has "whatever config.json says" "sglang: its LlamaMLP has no bias whatever the config says"
run tps split "$T/ab" --tp 2 --layout vllm -o "$T/abm-v2"
grep -q "set mlp_bias: true in config.json" "$ERR" && ok "vllm: the MLP refusal names mlp_bias" || { notok "vllm mlp_bias named"; diag "$ERR"; }

# enabled: the split goes through, and the rank files hold the fused biases
gen llama "$T/ab2" --attention-bias --mlp-bias >/dev/null 2>&1
setcfg "$T/ab2" mlp_bias -
delt "$T/ab2/model.safetensors" mlp.gate_proj.bias mlp.up_proj.bias mlp.down_proj.bias
for lay in vllm sglang; do
  run tps split "$T/ab2" --tp 2 --layout "$lay" -o "$T/ab2-$lay" -q
  if [ "$RC" = 0 ] && holds "$T/ab2-$lay/model-rank-0-part-0.safetensors" model.layers.0.self_attn.qkv_proj.bias &&
     holds "$T/ab2-$lay/model-rank-1-part-0.safetensors" model.layers.1.self_attn.qkv_proj.bias &&
     holds "$T/ab2-$lay/model-rank-1-part-0.safetensors" model.layers.0.self_attn.o_proj.bias; then
    ok "$lay: with attention_bias true the rank files hold qkv_proj.bias and o_proj.bias"
  else
    notok "$lay: attention_bias true split"; diag "$ERR"
  fi
  run tps verify "$T/ab2-$lay" --source "$T/ab2"
  [ "$RC" = 0 ] && ok "$lay: verify --source passes on the fused biases" || { notok "$lay: verify ab2"; diag "$OUT"; }
done
# vLLM's LlamaDecoderLayer: a config's qkv_bias decides the q/k/v biases alone
# (o_proj keeps attention_bias); SGLang's does not read it
setcfg "$T/ab2" attention_bias false
setcfg "$T/ab2" qkv_bias true
run tps plan "$T/ab2" --tp 2 --layout vllm
[ "$RC" = 1 ] && grep -q "tensor 'model.layers.0.self_attn.o_proj.bias'" "$ERR" && ! grep -q "k_proj.bias" "$ERR" &&
  ok "vllm: qkv_bias true gives LLaMA q/k/v biases, its o_proj.bias stays refused" ||
  { notok "vllm qkv_bias"; diag "$ERR"; }
expect_exit 1 "sglang: qkv_bias does not give LLaMA q/k/v biases" -- tps plan "$T/ab2" --tp 2 --layout sglang
expect_stderr_has "k_proj.bias" "naming the q/k/v bias"
setcfg "$T/ab2" qkv_bias false
setcfg "$T/ab2" attention_bias true
expect_exit 1 "vllm: qkv_bias false takes the q/k/v biases away from attention_bias true" -- tps plan "$T/ab2" --tp 2 --layout vllm
expect_stderr_has "set qkv_bias: true" "naming qkv_bias"
setcfg "$T/ab2" qkv_bias -
# a fused bias the engine builds must be in the files (else "Missing keys")
setcfg "$T/ab2" mlp_bias true
expect_exit 1 "vllm refuses mlp_bias true without the MLP biases" -- tps split "$T/ab2" --tp 2 --layout vllm -o "$T/ab2-m"
expect_stderr_has "lacks 'model.layers.0.mlp.gate_proj.bias'" "naming the missing bias"
gen qwen2 "$T/q2n" >/dev/null 2>&1
delt "$T/q2n/model.safetensors" model.layers.1.self_attn.q_proj.bias model.layers.1.self_attn.k_proj.bias model.layers.1.self_attn.v_proj.bias
for lay in vllm sglang; do
  expect_exit 1 "$lay refuses a Qwen2 lacking a q_proj.bias (its Qwen2 always builds one)" -- tps split "$T/q2n" --tp 2 --layout "$lay" -o "$T/q2n-$lay"
  expect_stderr_has "lacks 'model.layers.1.self_attn.q_proj.bias'" "$lay: naming it"
  expect_stderr_has "with a bias for this config.json" "$lay: and that the engine's model builds it"
done

# the DTensor layout keeps every bias whatever config.json says
setcfg "$T/ab" attention_bias -
run tps split "$T/ab" --tp 2 -o "$T/ab-dt" -q
if [ "$RC" = 0 ] && holds "$T/ab-dt/model-rank-0-part-0.safetensors" model.layers.0.self_attn.q_proj.bias &&
   holds "$T/ab-dt/model-rank-1-part-0.safetensors" model.layers.0.self_attn.v_proj.bias &&
   holds "$T/ab-dt/model-rank-1-part-0.safetensors" model.layers.0.mlp.up_proj.bias &&
   holds "$T/ab-dt/model-rank-0-part-0.safetensors" model.layers.0.mlp.down_proj.bias; then
  ok "dtensor keeps q/k/v and MLP biases without attention_bias or mlp_bias"
else
  notok "dtensor keeps biases"; diag "$ERR"
fi
# an o_proj.bias, kept under its own name: its refusal names the fields too
gen llama "$T/lo" >/dev/null 2>&1
addt "$T/lo/model.safetensors" model.layers.0.self_attn.o_proj.bias BF16 64
run tps split "$T/lo" --tp 2 --layout sglang -o "$T/lo-s"
[ "$RC" = 1 ] && grep -q "set attention_bias: true, or bias: true in config.json" "$ERR" &&
  ok "sglang: an o_proj.bias refusal names attention_bias and bias" || { notok "o_proj.bias hint"; diag "$ERR"; }

# each engine's model skips its own list: SGLang's Gemma3 skips no rotary cache
gen gemma3 "$T/g3" --gemma3-naming causal >/dev/null 2>&1
addt "$T/g3/model.safetensors" model.layers.0.self_attn.rotary_emb.inv_freq F32 4
run tps split "$T/g3" --tp 2 --layout vllm -o "$T/g3-v" -q
[ "$RC" = 0 ] && ! holds "$T/g3-v/model-rank-0-part-0.safetensors" model.layers.0.self_attn.rotary_emb.inv_freq &&
  ok "vllm (AutoWeightsLoader) drops a Gemma3 rotary cache" || { notok "vllm gemma3 inv_freq"; diag "$ERR"; }
expect_exit 1 "sglang refuses it: gemma3_causal.py load_weights does not skip it" -- tps split "$T/g3" --tp 2 --layout sglang -o "$T/g3-s"
expect_stderr_has "does not skip it" "naming why"
finish
