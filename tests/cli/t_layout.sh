#!/bin/sh
# split/plan/check/verify/merge with --layout vllm|sglang (the engine-made
# conformance cases and generated models): verify passes and catches one
# flipped bit in a fused tensor, a replica, the padding and a constant;
# directories reshard through their manifest; refusals write nothing; a
# user's own layout file works; --ranks runs join into one directory.
# (The bytes are compared with an independent oracle in tests/py.)
. "$TOP/tests/cli/lib.sh"
CONF="$TOP/testdata/conformance"
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], ""))' "$1/case.json" "$2"; }

# flip FILE TENSOR BYTE: flips bit 0 of byte BYTE of TENSOR's data (BYTE < 0: from its end)
flip() {
  python3 - "$@" <<'EOF'
import json, struct, sys
path, name, at = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    s, e = json.loads(f.read(n))[name]["data_offsets"]
    pos = 8 + n + (s + at if at >= 0 else e + at)
    f.seek(pos); v = f.read(1)[0]; f.seek(pos); f.write(bytes([v ^ 1]))
EOF
}

for c in "$CONF"/vllm-* "$CONF"/sglang-*; do
  name=$(basename "$c") tp=$(field "$c" tp) lay=$(field "$c" layout)
  run tps split "$c/model" --tp "$tp" --layout "$lay" -o "$T/$name" -q
  [ "$RC" = 0 ] || { notok "split $name"; diag "$ERR"; continue; }
  run tps check "$T/$name"
  [ "$RC" = 0 ] && ok "check $name" || { notok "check $name"; diag "$ERR"; }
  run tps verify "$T/$name" --source "$c/model" --json
  if [ "$RC" = 0 ] && grep -q '"kind":"padding"' "$OUT"; then
    ok "verify $name: reconstruction, products, replicas, padding"
  else
    notok "verify $name"; diag "$OUT"; diag "$ERR"
  fi
  run tps merge "$T/$name" -o "$T/$name-m"
  # byte for byte, less the tensors the manifest lists as dropped (DeepSeek's MTP layer)
  python3 - "$c/model/model.safetensors" "$T/$name-m/model.safetensors" "$T/$name/tpshard.json" <<'PY' &&
import json, struct, sys
def load(p):
    raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}
d = json.load(open(sys.argv[3])).get("dropped") or []
gone = {e["name"] if isinstance(e, dict) else e for e in d}
src = load(sys.argv[1])
if not gone:
    assert open(sys.argv[1], "rb").read() == open(sys.argv[2], "rb").read()
else:
    assert gone <= set(src) and load(sys.argv[2]) == {k: v for k, v in src.items() if k not in gone}
PY
    ok "merge $name gives back the source byte for byte, less what it drops" || notok "merge $name"
done

V=$T/vllm-llama-tp8-kv-replicated-vocab250
S=$CONF/vllm-llama-tp8-kv-replicated-vocab250/model
if [ -d "$V" ]; then
  # qkv_proj on rank 5 (tp 8, 4 KV heads): q rows [0, 1024), then KV head 2,
  # which rank 4 holds too (rank 5's copy is a replica)
  for what in "q:model.layers.0.self_attn.qkv_proj.weight:10:q_proj" \
              "replica:model.layers.0.self_attn.qkv_proj.weight:1100:k_proj" \
              "padding:model.embed_tokens.weight:-3:padding" \
              "constant:model.layers.1.self_attn.attn._v_scale:3:constant"; do
    label=${what%%:*} rest=${what#*:}
    tensor=${rest%%:*} rest=${rest#*:}
    byte=${rest%%:*} want=${rest#*:}
    rk=5; [ "$label" = padding ] && rk=7
    rm -rf "$T/flip"
    cp -r "$V" "$T/flip"
    flip "$T/flip/model-rank-$rk-part-0.safetensors" "$tensor" "$byte"
    run tps verify "$T/flip" --source "$S"
    if [ "$RC" = 1 ] && grep -q "FAIL" "$OUT" && grep -qi "$want" "$OUT"; then
      ok "verify fails on one flipped bit ($label), naming $want"
    else
      notok "verify on a flipped bit ($label)"; diag "$OUT"
    fi
    run tps check "$T/flip"
    [ "$RC" = 1 ] && ok "check fails on one flipped bit ($label)" || { notok "check on a flipped bit ($label)"; diag "$ERR"; }
  done
  # the colwise product of a corrupted q row fails too, not only its bytes
  rm -rf "$T/flip"; cp -r "$V" "$T/flip"
  flip "$T/flip/model-rank-5-part-0.safetensors" model.layers.0.self_attn.qkv_proj.weight 11
  run tps verify "$T/flip" --source "$S"
  grep -q "q_proj.weight *colwise.*FAIL" "$OUT" && ok "the q products catch it as well" ||
    { notok "q products"; diag "$OUT"; }

  # reshard through the manifest: to DTensor tp 2, to sglang tp 4
  run tps split "$V" --tp 2 -o "$T/re-dt" -q
  run tps merge "$T/re-dt" -o "$T/re-dt-m" -q
  cmp -s "$T/re-dt-m/model.safetensors" "$S/model.safetensors" &&
    ok "a vllm directory reshards to dtensor tp 2 and merges back" || { notok "reshard to dtensor"; diag "$ERR"; }
  run tps split "$V" --tp 4 --layout sglang -o "$T/re-sg" -q
  run tps verify "$T/re-sg" --source "$S"
  [ "$RC" = 0 ] && ok "a vllm directory reshards to sglang tp 4 and verifies" || { notok "reshard to sglang"; diag "$OUT"; }

  # plan shows where each byte comes from
  run tps plan "$S" --tp 8 --layout vllm
  grep -q "qkv_proj.weight .*<- model.layers.0.self_attn.q_proj.weight\[0:8) + model.layers.0.self_attn.k_proj.weight\[0:8)" "$OUT" &&
    grep -q "lm_head.weight .*zeros" "$OUT" &&
    ok "plan --layout vllm shows each rank tensor's pieces" || { notok "plan --layout pieces"; diag "$OUT"; }
  run tps plan "$S" --tp 8 --layout vllm --json
  python3 - "$OUT" <<'EOF' && ok "plan --layout --json lists every rank's tensors and pieces" || notok "plan --json rank_tensors"
import json, sys
d = json.load(open(sys.argv[1]))
rts = d["rank_tensors"]
assert d["layout"] == "vllm" and d["target"].startswith("vllm ")
assert sorted({r["rank"] for r in rts}) == list(range(8))
q = [r for r in rts if r["rank"] == 3 and r["name"].endswith("0.self_attn.qkv_proj.weight")][0]
assert [p["source"].split(".")[-2] for p in q["pieces"]] == ["q_proj", "k_proj", "v_proj"]
assert q["pieces"][1]["replica"] is True and q["pieces"][1]["lo"] == 8
EOF

  # --ranks runs of a layout join into one directory, as one split
  run tps split "$S" --tp 8 --layout vllm --ranks 0-3 -o "$T/join" -q
  run tps check "$T/join"
  grep -q "not written" "$OUT" && ok "a half-written layout directory is reported partial by check" || { notok "partial check"; diag "$OUT"; }
  run tps split "$S" --tp 8 --layout vllm --ranks 4-7 -o "$T/join" -q
  run tps check "$T/join"
  [ "$RC" = 0 ] && cmp -s "$T/join/tpshard.json" "$V/tpshard.json" &&
    ok "two --ranks runs make the same manifest as one split" || { notok "--ranks join"; diag "$ERR"; }
fi

# refusals: nothing written, the rule named
gen llama "$T/m-kv3" --heads 12 --kv-heads 3 --hidden 48 >/dev/null 2>&1
expect_exit 1 "vllm refuses tp 4 with 3 KV heads" -- tps split "$T/m-kv3" --tp 4 --layout vllm -o "$T/r1"
expect_stderr_has "num_key_value_heads" "the refusal names num_key_value_heads"
expect_stderr_has "tp values that work" "and the tp values that work"
[ -z "$(ls "$T/r1" 2>/dev/null | grep safetensors)" ] && ok "the refused split wrote no rank file" || notok "refused split wrote files"
gen llama "$T/m-nov" >/dev/null 2>&1
python3 - "$T/m-nov" <<'EOF'
import json, struct, sys
p = sys.argv[1] + "/model.safetensors"
raw = open(p, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n]); meta = h.pop("__metadata__", None)
gone = "model.layers.0.self_attn.v_proj.weight"
s0, e0 = h.pop(gone)["data_offsets"]
data = raw[8 + n:]
out, off = {}, 0
for k in sorted(h, key=lambda k: h[k]["data_offsets"][0]):
    s, e = h[k]["data_offsets"]; out[k] = dict(h[k], data_offsets=[off, off + e - s]); off += e - s
body = b"".join(data[h[k]["data_offsets"][0]:h[k]["data_offsets"][1]] for k in sorted(h, key=lambda k: h[k]["data_offsets"][0]))
if meta: out["__metadata__"] = meta
j = json.dumps(out, separators=(",", ":")).encode(); j += b" " * (-len(j) % 8)
open(p, "wb").write(struct.pack("<Q", len(j)) + j + body)
EOF
expect_exit 1 "a checkpoint missing v_proj is refused by the fused layout" -- tps split "$T/m-nov" --tp 2 --layout vllm -o "$T/r2"
expect_stderr_has "lacks 'model.layers.0.self_attn.v_proj.weight'" "the refusal names the missing part"
expect_exit 1 "vllm does not cover multimodal Gemma3" -- tps plan "$CONF/gemma3-tp1/model" --tp 2 --layout vllm
expect_stderr_has "covers" "the refusal names the architectures the layout covers"
expect_exit 1 "an unknown layout name is an error" -- tps plan "$S" --tp 2 --layout vlm
expect_stderr_has "built in: dtensor" "it lists the layouts"

# a user's own layout file: LLaMA with q/k/v fused only, torch.chunk elsewhere, no padding
cat >"$T/mine.yaml" <<'EOF'
name: qkv-only
target: "an engine of mine 1.0"
serves:
  architectures: [LlamaForCausalLM]
split: chunk
fuse:
  - into: qkv
    parts:
      - {module: q_proj, heads: num_attention_heads}
      - {module: k_proj, heads: num_key_value_heads, replicate: true}
      - {module: v_proj, heads: num_key_value_heads, replicate: true}
EOF
run tps split "$S" --tp 4 --layout "$T/mine.yaml" -o "$T/mine" -q
if [ "$RC" = 0 ] && python3 - "$T/mine/model-rank-1-part-0.safetensors" <<'EOF'
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]
h = json.loads(f.read(n))
assert h["model.layers.0.self_attn.qkv.weight"]["shape"] == [32, 64], h["model.layers.0.self_attn.qkv.weight"]
assert "model.layers.0.mlp.gate_proj.weight" in h and "model.layers.0.mlp.gate_up_proj.weight" not in h
assert h["__metadata__"]["layout"] == "qkv-only"
EOF
then ok "a layout file of one's own splits as written"; else notok "own layout file"; diag "$ERR"; fi
run tps verify "$T/mine" --source "$S"
[ "$RC" = 0 ] && ok "and verifies (the manifest keeps the layout file)" || { notok "own layout verify"; diag "$OUT"; }
# fuse entries under `when`: the one whose condition holds applies (attention_bias is false
# here); two entries may share a module only when their conditions never hold together
for w in "truthy: true" "falsy: true"; do
  n=$( [ "$w" = "truthy: true" ] && echo qkv_b || echo qkv_nb )
  printf '  - into: %s\n    when: {field: attention_bias, %s}\n    parts:\n      - {module: q_proj, heads: num_attention_heads}\n      - {module: k_proj, heads: num_key_value_heads, replicate: true}\n      - {module: v_proj, heads: num_key_value_heads, replicate: true}\n' "$n" "$w"
done >"$T/when.fuse"
{ printf 'name: qkv-when\ntarget: "an engine of mine 1.0"\nserves:\n  architectures: [LlamaForCausalLM]\nsplit: chunk\nfuse:\n'; cat "$T/when.fuse"; } >"$T/when.yaml"
run tps split "$S" --tp 4 --layout "$T/when.yaml" -o "$T/when" -q
if [ "$RC" = 0 ] && python3 - "$T/when/model-rank-1-part-0.safetensors" <<'EOF'
import json, struct, sys
f = open(sys.argv[1], "rb"); n = struct.unpack("<Q", f.read(8))[0]
h = json.loads(f.read(n))
assert "model.layers.0.self_attn.qkv_nb.weight" in h and not any(".qkv_b." in k for k in h), sorted(h)[:8]
EOF
then ok "a fuse entry applies only where its when holds"; else notok "fuse when"; diag "$ERR"; fi
sed 's/falsy: true/truthy: true/' "$T/when.yaml" >"$T/when2.yaml"
expect_exit 1 "two fuse entries of one module that may both apply are an error" -- \
  tps plan "$S" --tp 2 --layout "$T/when2.yaml"
expect_stderr_has "already fused" "naming the module fused twice"
printf 'name: bad\ntarget: x\nfuse:\n  - into: a\n    parts: [{module: q_proj}]\n' >"$T/bad.yaml"
expect_exit 1 "a malformed layout file is an error" -- tps plan "$S" --tp 2 --layout "$T/bad.yaml"
expect_stderr_has "bad.yaml:5" "naming the file and line"
# A rejected plan is not laid out, yet plan still shows what its shards would be.
expect_exit 1 "a rejected plan exits 1" -- tps plan "$TOP/testdata/conformance/llama-tp8-gqa-reject/model" --tp 8
expect_stdout_has "all ranks 192.50 KiB; replication overhead 4.8%" "and shows the shards' bytes and overhead"
finish
