#!/bin/sh
# DeepSeek-V3 in BF16 (MLA with a q LoRA, a dense first layer, shared and routed experts, the
# F32 noaux_tc router bias, an MTP layer): the deepseek_v3 plan and the vllm / sglang layouts
# split it at tp 1, 2 and 4 (and --ep), check, verify --source and merge pass; merge gives
# back the source less the MTP layer the engines drop; the refusals name the field and the
# tp values that work, exit 1 and write nothing.
. "$TOP/tests/cli/lib.sh"

SRC="$TOP/testdata/conformance/vllm-deepseekv3-bf16-tp2/model"
cp -r "$SRC" "$T/m"

# same_less SRC MERGED PREFIX: MERGED holds every tensor of SRC whose name does not start
# with PREFIX ("" keeps all), byte for byte, and nothing else.
same_less() {
  python3 - "$@" <<'PY'
import json, struct, sys
def load(p):
    raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n]); h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}
src, got, pre = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
want = {k: v for k, v in src.items() if not (pre and k.startswith(pre))}
assert got == want, sorted(set(got) ^ set(want))[:5]
PY
}

for lay in dtensor vllm sglang; do
  for tp in 1 2 4; do
    d="$T/$lay-$tp"
    expect_exit 0 "$lay tp $tp: split" -- tps split "$T/m" --tp "$tp" --layout "$lay" -o "$d" -q || continue
    expect_exit 0 "$lay tp $tp: check" -- tps check "$d"
    expect_exit 0 "$lay tp $tp: verify --source" -- tps verify "$d" --source "$T/m"
    expect_exit 0 "$lay tp $tp: merge" -- tps merge "$d" -o "$d.merged" -q || continue
    pre=model.layers.2.
    [ "$lay" = dtensor ] && pre=
    if same_less "$T/m/model.safetensors" "$d.merged/model.safetensors" "$pre" 2>"$ERR"; then
      ok "$lay tp $tp: merge gives back every tensor the rank files hold"
    else notok "$lay tp $tp: merge"; diag "$ERR"; fi
  done
done

# the manifest lists the MTP layer as dropped, and merge names it
if python3 - "$T/vllm-2/tpshard.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
d = m.get("dropped")
names = [e["name"] if isinstance(e, dict) else e for e in (d if isinstance(d, list) else (d or {}))]
assert "model.layers.2.eh_proj.weight" in names and "model.layers.2.shared_head.head.weight" in names, names[:4]
assert not any(n.startswith("model.layers.1.") for n in names)
PY
then ok "vllm: the manifest lists the MTP layer as dropped"; else notok "vllm: manifest dropped"; fi

for lay in vllm sglang; do
  for tp in 2 4; do
    d="$T/$lay-ep$tp"
    expect_exit 0 "$lay --ep tp $tp: split" -- tps split "$T/m" --tp "$tp" --ep --layout "$lay" -o "$d" -q || continue
    expect_exit 0 "$lay --ep tp $tp: verify --source" -- tps verify "$d" --source "$T/m"
  done
  # 4 heads: tp 8 splits none whole
  expect_exit 1 "$lay: tp 8 refused (4 heads)" -- tps split "$T/m" --tp 8 --layout "$lay" -o "$T/$lay-8"
  expect_stderr_has "num_attention_heads = 4 is not divisible by tp 8 (tp values that work: 1, 2, 4)" "$lay: tp 8 names the heads and the tp values that work"
  [ -z "$(ls "$T/$lay-8" 2>/dev/null)" ] && ok "$lay: tp 8 wrote nothing" || notok "$lay: tp 8 wrote files"
done

# config-only variants: no MTP layer declared, fewer experts declared than the file holds
python3 - "$T/m/config.json" "$T/h6" <<'PY'
import json, os, shutil, sys
c = json.load(open(sys.argv[1]))
out = sys.argv[2]
# the config alone decides the refusals below; no tensor changes shape
def variant(name, **kw):
    d = os.path.join(out, name); os.makedirs(d, exist_ok=True)
    shutil.copy(os.path.join(os.path.dirname(sys.argv[1]), "model.safetensors"), d)
    json.dump(dict(c, **kw), open(os.path.join(d, "config.json"), "w"))
variant("nonextn", num_nextn_predict_layers=0)
variant("fewexperts", n_routed_experts=3)
PY
for lay in vllm sglang; do
  # tp 3 divides neither the 4 heads nor the 4 experts
  expect_exit 1 "$lay: --ep tp 3 refused" -- tps split "$T/m" --tp 3 --ep --layout "$lay" -o "$T/$lay-ep3"
  [ -z "$(ls "$T/$lay-ep3" 2>/dev/null)" ] && ok "$lay: --ep tp 3 wrote nothing" || notok "$lay: --ep tp 3 wrote files"
  expect_exit 1 "$lay: MTP tensors with num_nextn_predict_layers 0 refused" -- \
    tps split "$T/h6/nonextn" --tp 2 --layout "$lay" -o "$T/$lay-nonextn"
  expect_stderr_has "model.layers.2." "$lay: the MTP refusal names the tensor"
  expect_stderr_has "num_nextn_predict_layers = 0" "$lay: the MTP refusal names the field"
  [ -z "$(ls "$T/$lay-nonextn" 2>/dev/null)" ] && ok "$lay: nothing written" || notok "$lay: MTP refusal wrote files"
  expect_exit 1 "$lay: an expert past n_routed_experts refused" -- \
    tps split "$T/h6/fewexperts" --tp 2 --layout "$lay" -o "$T/$lay-few"
  expect_stderr_has "experts.3" "$lay: the refusal names expert 3"
done

# the DTensor layout refuses the MTP layer too when config.json declares none
expect_exit 1 "dtensor: MTP tensors with num_nextn_predict_layers 0 refused" -- \
  tps split "$T/h6/nonextn" --tp 2 -o "$T/dtensor-nonextn"
expect_stderr_has "model.layers.2." "dtensor: the MTP refusal names the tensor"
expect_stderr_has "num_nextn_predict_layers = 0" "dtensor: the MTP refusal names the field"
[ -z "$(ls "$T/dtensor-nonextn" 2>/dev/null)" ] && ok "dtensor: nothing written" || notok "dtensor: MTP refusal wrote files"
expect_exit 1 "dtensor: plan refuses the MTP tensors with num_nextn_predict_layers 0" -- \
  tps plan "$T/h6/nonextn" --tp 2
expect_stderr_has "num_nextn_predict_layers = 0"

# MLA's sizes: each field missing from config.json, or contradicting the tensors' shapes, is
# refused in every layout, by plan and split, naming the tensor and the field
python3 - "$T/m" "$T/mla" <<'PY2'
import json, os, shutil, sys
src, out = sys.argv[1], sys.argv[2]
c = json.load(open(os.path.join(src, "config.json")))
def variant(name, cfg):
    d = os.path.join(out, name); os.makedirs(d, exist_ok=True)
    shutil.copy(os.path.join(src, "model.safetensors"), d)
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
for f in ["kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "q_lora_rank"]:
    assert isinstance(c.get(f), int) and c[f] > 0, f
    variant("no-" + f, {k: v for k, v in c.items() if k != f})
    variant("bad-" + f, dict(c, **{f: c[f] * 2}))
PY2
# field: the tensor whose shape it decides first (kv_a_proj_with_mqa = [kv_lora_rank +
# qk_rope_head_dim], kv_b_proj = [heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank],
# q_a_proj = [q_lora_rank]), in the order the checkpoint stores them
for fv in kv_lora_rank:kv_a_proj_with_mqa qk_rope_head_dim:kv_a_proj_with_mqa \
          qk_nope_head_dim:kv_b_proj v_head_dim:kv_b_proj q_lora_rank:q_a_proj; do
  f=${fv%%:*} t=${fv#*:}
  for kind in no bad; do
    for lay in dtensor vllm sglang; do
      expect_exit 1 "$lay: $kind $f refused" -- \
        tps split "$T/mla/$kind-$f" --tp 2 --layout "$lay" -o "$T/mla-$lay-$kind-$f"
      expect_stderr_has "model.layers.0.self_attn.$t.weight" "$lay: $kind $f: names the tensor"
      expect_stderr_has "$f" "$lay: $kind $f: names the field"
      [ -z "$(ls "$T/mla-$lay-$kind-$f" 2>/dev/null)" ] && ok "$lay: $kind $f: nothing written" ||
        notok "$lay: $kind $f wrote files"
      expect_exit 1 "$lay: plan: $kind $f refused" -- \
        tps plan "$T/mla/$kind-$f" --tp 2 --layout "$lay"
      expect_stderr_has "model.layers.0.self_attn.$t.weight" "$lay: plan: $kind $f: names the tensor"
    done
  done
done

# the family is detected from config.json
expect_exit 0 "plan detects deepseek_v3" -- tps plan "$T/m" --tp 2
expect_stdout_has "deepseek_v3"

# One flipped byte in rank 1's copy of an MLA projection or the fused latent projection (a
# replica on every rank): check names the file, verify --source fails.
flip() { # FILE-GLOB-DIR TENSOR-SUFFIX: flips the first data byte of the tensor ending so
  python3 - "$@" <<'PY'
import glob, json, struct, sys
for p in sorted(glob.glob(sys.argv[1] + "/model-rank-1-part-*.safetensors")):
    raw = bytearray(open(p, "rb").read()); n = struct.unpack("<Q", raw[:8])[0]
    h = json.loads(raw[8:8 + n])
    for k, v in h.items():
        if k != "__metadata__" and k.endswith(sys.argv[2]):
            raw[8 + n + v["data_offsets"][0]] ^= 0x10
            open(p, "wb").write(raw)
            sys.exit(0)
sys.exit("no tensor ending with " + sys.argv[2])
PY
}
for lay in vllm sglang; do
  for t in q_b_proj.weight fused_qkv_a_proj.weight fused_qkv_a_proj_with_mqa.weight w13_weight; do
    case $lay/$t in vllm/fused_qkv_a_proj_with_mqa.weight|sglang/fused_qkv_a_proj.weight) continue;; esac
    d="$T/flip-$lay-${t%%.*}"
    rm -rf "$d"; cp -r "$T/$lay-2" "$d" || { notok "$lay: copy for $t"; continue; }
    if ! flip "$d" ".$t" 2>"$ERR"; then notok "$lay: flip $t"; diag "$ERR"; continue; fi
    expect_exit 1 "$lay tp 2: check fails on one flipped byte of rank 1's $t" -- tps check "$d"
    expect_stderr_has "model-rank-1"
    expect_exit 1 "$lay tp 2: verify --source fails on it" -- tps verify "$d" --source "$T/m"
  done
done

# DeepSeek-V2-Lite's MLA, no q LoRA (q_lora_rank null: q_proj, kv_a_proj_with_mqa alone): every
# layout splits it at tp 1, 2 and 4, check, verify --source and merge (byte for byte) pass.
# The engines' own rank files at tp 2 are conformance cases (vllm/sglang-deepseekv2-lite-*).
V2="$TOP/testdata/conformance/vllm-deepseekv2-lite-bf16-tp2/model"
for lay in dtensor vllm sglang; do
  for tp in 1 2 4; do
    d="$T/v2-$lay-$tp"
    expect_exit 0 "V2-Lite $lay tp $tp: split" -- tps split "$V2" --tp "$tp" --layout "$lay" -o "$d" -q || continue
    expect_exit 0 "V2-Lite $lay tp $tp: check" -- tps check "$d"
    expect_exit 0 "V2-Lite $lay tp $tp: verify --source" -- tps verify "$d" --source "$V2"
    expect_exit 0 "V2-Lite $lay tp $tp: merge" -- tps merge "$d" -o "$d.merged" -q || continue
    if cmp -s "$V2/model.safetensors" "$d.merged/model.safetensors"; then
      ok "V2-Lite $lay tp $tp: merge gives back the source byte for byte"
    else notok "V2-Lite $lay tp $tp: merge differs from the source"; fi
  done
done
for lay in vllm sglang; do
  for tp in 2 4; do
    d="$T/v2-$lay-ep$tp"
    expect_exit 0 "V2-Lite $lay --ep tp $tp: split" -- tps split "$V2" --tp "$tp" --ep --layout "$lay" -o "$d" -q || continue
    expect_exit 0 "V2-Lite $lay --ep tp $tp: verify --source" -- tps verify "$d" --source "$V2"
  done
done
# vLLM's wrapper holds q_proj (mla_attn.q_proj); kv_a_proj_with_mqa keeps its name
if python3 - "$T/v2-vllm-2" <<'PY'
import json, struct, sys
raw = open(sys.argv[1] + "/model-rank-0-part-0.safetensors", "rb").read()
h = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
assert h["model.layers.0.self_attn.mla_attn.q_proj.weight"]["shape"] == [192, 128], h.get("model.layers.0.self_attn.mla_attn.q_proj.weight")
assert h["model.layers.0.self_attn.kv_a_proj_with_mqa.weight"]["shape"] == [96, 128]
assert not any("fused_qkv_a_proj" in k or "q_a_proj" in k for k in h)
PY
then ok "V2-Lite vllm: q_proj by heads under mla_attn, kv_a_proj_with_mqa whole"; else notok "V2-Lite vllm names"; fi
# one flipped byte of rank 1's q_proj or kv_a_proj_with_mqa: check and verify --source fail
for lay in vllm sglang; do
  for t in q_proj.weight kv_a_proj_with_mqa.weight; do
    d="$T/v2-flip-$lay-${t%%.*}"
    rm -rf "$d"; cp -r "$T/v2-$lay-2" "$d" || { notok "V2-Lite $lay: copy for $t"; continue; }
    if ! flip "$d" ".$t" 2>"$ERR"; then notok "V2-Lite $lay: flip $t"; diag "$ERR"; continue; fi
    expect_exit 1 "V2-Lite $lay tp 2: check fails on one flipped byte of rank 1's $t" -- tps check "$d"
    expect_exit 1 "V2-Lite $lay tp 2: verify --source fails on it" -- tps verify "$d" --source "$V2"
  done
done
# config.json says no q LoRA, the checkpoint has one: the engines would build q_proj and
# leave q_a_proj unloaded; the serving layouts refuse it, naming the field
python3 - "$T/m" "$T/v3-nolora" <<'PY'
import json, os, shutil, sys
os.makedirs(sys.argv[2], exist_ok=True)
shutil.copy(os.path.join(sys.argv[1], "model.safetensors"), sys.argv[2])
c = json.load(open(os.path.join(sys.argv[1], "config.json")))
json.dump(dict(c, q_lora_rank=None), open(os.path.join(sys.argv[2], "config.json"), "w"))
PY
for lay in vllm sglang; do
  expect_exit 1 "$lay: a q LoRA with q_lora_rank null refused" --     tps split "$T/v3-nolora" --tp 2 --layout "$lay" -o "$T/$lay-nolora"
  expect_stderr_has "q_lora_rank" "$lay: the refusal names q_lora_rank"
  expect_stderr_has "q_a_proj" "$lay: the refusal names q_a_proj"
  [ -z "$(ls "$T/$lay-nolora" 2>/dev/null)" ] && ok "$lay: nothing written" || notok "$lay: wrote files"
done

finish
