#!/bin/sh
# Gemma3 and Gemma4 as issue 4 states them: both Gemma3 namings, the tied
# rejection, Gemma4's vocabulary-sharded per-layer table, the 31B lm_head,
# KV-shared layers and layers without v_proj, MoE and head-count rejections.
. "$TOP/tests/cli/lib.sh"

placement() { # DIR TENSOR -> its manifest placement, or "absent"
  python3 - "$1/tpshard.json" "$2" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
print(next((t["placement"] for t in m["tensors"] if t["name"] == sys.argv[2]), "absent"))
PY
}
expect_placement() { # DIR TENSOR WANT
  got=$(placement "$1" "$2")
  [ "$got" = "$3" ] && ok "$2 is $3" || notok "$2 is $got, expected $3"
}

# Gemma3: Hub names, new names and the text-only model; untied ones split at tp 2.
for naming in hub new causal; do
  gen gemma3 "$T/g3$naming" --gemma3-naming $naming --untied --seed 11 >/dev/null
  expect_exit 0 "gemma3 ($naming naming, untied) splits at tp 2" -- tps split "$T/g3$naming" --tp 2 -o "$T/g3$naming-tp2" -q
  expect_exit 0 "gemma3 ($naming naming) verifies" -- tps verify "$T/g3$naming-tp2" --source "$T/g3$naming" -q
done
expect_placement "$T/g3hub-tp2" language_model.model.layers.0.self_attn.q_proj.weight "Shard(0)"
expect_placement "$T/g3hub-tp2" language_model.model.layers.0.mlp.down_proj.weight "Shard(1)"
expect_placement "$T/g3hub-tp2" language_model.model.embed_tokens.weight "Shard(0)"
expect_placement "$T/g3new-tp2" model.language_model.layers.1.self_attn.o_proj.weight "Shard(1)"
expect_placement "$T/g3causal-tp2" model.layers.0.mlp.gate_proj.weight "Shard(0)"
vt=$(python3 -c "import json,sys; print(next(t['name'] for t in json.load(open(sys.argv[1]))['tensors'] if 'vision' in t['name'] and t['name'].endswith('q_proj.weight')))" "$T/g3hub-tp2/tpshard.json" 2>/dev/null)
[ -n "$vt" ] && expect_placement "$T/g3hub-tp2" "$vt" "Replicate"

# Tied Gemma3: rejected at tp > 1 with the reason and the way out; tp 1 works.
gen gemma3 "$T/g3tied" --tied --seed 12 >/dev/null
expect_exit 1 "tied gemma3 at tp 2 is rejected" -- tps split "$T/g3tied" --tp 2 -o "$T/g3tied-tp2"
expect_stderr_has "tied" "the rejection says the model ties its embeddings"
expect_stderr_has "--tp 1" "the rejection says how to proceed"
[ ! -e "$T/g3tied-tp2" ] && ok "the rejected split wrote nothing" || notok "the rejected split wrote something"
expect_exit 1 "plan shows the tied rejection as a failed check" -- tps plan "$T/g3tied" --tp 2 --json
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert not d['ok'] and any(c['verdict']=='fail' and 'tied' in (c['check']+c['detail']).lower() for c in d['checks'])" "$OUT" &&
  ok "plan --json lists the failed tied check" || { notok "plan --json tied check"; diag "$OUT"; }
expect_exit 0 "tied gemma3 at tp 1 writes one full rank" -- tps split "$T/g3tied" --tp 1 -o "$T/g3tied-tp1" -q
expect_exit 1 "the refusal names --untie" -- tps split "$T/g3tied" --tp 2 -o "$T/g3tied-tp2"
expect_stderr_has "--untie" "the tied refusal offers --untie"

# --untie: lm_head written from the embedding, config.json untied, merge gives the original back.
for naming in hub new causal; do
  gen gemma3 "$T/g3t$naming" --gemma3-naming $naming --tied --index 2 --seed 21 >/dev/null
  head=lm_head.weight
  [ $naming = hub ] && head=language_model.lm_head.weight
  expect_exit 0 "tied gemma3 ($naming naming) splits at tp 2 with --untie" -- tps split "$T/g3t$naming" --tp 2 -o "$T/g3t$naming-tp2" --untie -q
  expect_placement "$T/g3t$naming-tp2" "$head" "Shard(0)"
  python3 - "$T/g3t$naming-tp2" "$head" <<'PY' && ok "gemma3 ($naming) --untie: config.json untied at both levels, manifest records the head" || notok "gemma3 ($naming) --untie: config or manifest"
import json, sys
d, head = sys.argv[1], sys.argv[2]
c = json.load(open(d + "/config.json"))
m = json.load(open(d + "/tpshard.json"))
assert c["tie_word_embeddings"] is False, c
assert c.get("text_config", {}).get("tie_word_embeddings", False) is False
assert m["untie"]["head"] == head and json.loads(m["untie"]["config"])["tie_word_embeddings"] is True
t = next(t for t in m["tensors"] if t["name"] == head)
assert t["derived_from"] == m["untie"]["embedding"], t
PY
  expect_exit 0 "gemma3 ($naming) --untie: check passes" -- tps check "$T/g3t$naming-tp2"
  expect_exit 0 "gemma3 ($naming) --untie: verify --source passes" -- tps verify "$T/g3t$naming-tp2" --source "$T/g3t$naming"
  expect_stdout_has "verify: PASS"
  expect_exit 0 "gemma3 ($naming) --untie: merge" -- tps merge "$T/g3t$naming-tp2" -o "$T/g3t$naming-m"
  same=1
  for f in config.json model-00001-of-00002.safetensors model-00002-of-00002.safetensors; do
    cmp -s "$T/g3t$naming/$f" "$T/g3t$naming-m/$f" || same=0
  done
  [ $same = 1 ] && ok "gemma3 ($naming) --untie: merge gives back the tied original byte for byte" ||
    notok "gemma3 ($naming) --untie: merged files differ from the original"
  python3 -c "import json,sys; w=json.load(open(sys.argv[1]))['weight_map']; assert sys.argv[2] not in w" \
    "$T/g3t$naming-m/model.safetensors.index.json" "$head" &&
    ok "gemma3 ($naming) --untie: the merged index has no head" || notok "gemma3 ($naming): merged index lists the head"
done
# Reshard the untied directory: the head stays derived, merge still gives the tied original.
expect_exit 0 "an untied split reshards to tp 1" -- tps split "$T/g3tnew-tp2" --tp 1 -o "$T/g3tnew-tp1" -q
expect_exit 0 "the reshard merges" -- tps merge "$T/g3tnew-tp1" -o "$T/g3tnew-m4"
cmp -s "$T/g3tnew/config.json" "$T/g3tnew-m4/config.json" && cmp -s "$T/g3tnew/model-00001-of-00002.safetensors" "$T/g3tnew-m4/model-00001-of-00002.safetensors" &&
  ok "resharded untied split merges into the tied original" || notok "resharded untied split: merge differs"
# A head that no longer equals its embedding shard is caught without the source.
python3 - "$T/g3tnew-tp2" <<'PY'
import json, struct, sys
d = sys.argv[1]
m = json.load(open(d + "/tpshard.json"))
e = next(t for t in m["tensors"] if t["name"] == "lm_head.weight")["ranks"][1]
p = d + "/" + e["file"]
b = bytearray(open(p, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
off = 8 + n + h["lm_head.weight"]["data_offsets"][0]
b[off] ^= 1
open(p, "wb").write(b)
e["crc32"] = __import__("zlib").crc32(bytes(b[off:8 + n + h["lm_head.weight"]["data_offsets"][1]]))
json.dump(m, open(d + "/tpshard.json", "w"))
PY
expect_exit 1 "check catches an untied head that differs from its embedding (CRC rewritten)" -- tps check "$T/g3tnew-tp2"
expect_stderr_has "differs from 'model.language_model.embed_tokens.weight'"
# --untie where it does not apply: usage errors, nothing written.
expect_exit 2 "--untie on an untied gemma3 is a usage error" -- tps split "$T/g3hub" --tp 2 -o "$T/never" --untie
expect_stderr_has "not a tied checkpoint"
gen llama "$T/lt" --tied --seed 22 >/dev/null
expect_exit 2 "--untie with a plan without untie entries is a usage error" -- tps plan "$T/lt" --tp 2 --untie
expect_stderr_has "names no tied embedding"
expect_exit 2 "--untie twice (on an untied split) is a usage error" -- tps split "$T/g3tnew-tp1" --tp 2 -o "$T/never" --untie
expect_stderr_has "already untied"
expect_exit 2 "--untie with a serving layout is a usage error" -- tps split "$T/g3tied" --tp 2 -o "$T/never" --layout vllm --untie
expect_stderr_has "--untie is for the dtensor layout"
[ ! -e "$T/never" ] && ok "usage errors wrote nothing" || notok "a usage error wrote something"
expect_exit 0 "plan --untie shows the untied split" -- tps plan "$T/g3tied" --tp 2 --untie
expect_stdout_has "untie: language_model.lm_head.weight is written from language_model.model.embed_tokens.weight"

# Gemma4 E-series: the per-layer table is Shard(0), lm_head left out, the
# per-layer projections replicated; KV-shared layers lack k/v_proj.
gen gemma4 "$T/g4e" --gemma4-variant e --kv-heads 2 --kv-shared 2 --seed 13 >/dev/null
expect_exit 0 "gemma4 E-series with KV-shared layers splits at tp 2" -- tps split "$T/g4e" --tp 2 -o "$T/g4e-tp2" -q
expect_placement "$T/g4e-tp2" model.language_model.embed_tokens_per_layer.weight "Shard(0)"
expect_placement "$T/g4e-tp2" model.language_model.embed_tokens.weight "Shard(0)"
expect_placement "$T/g4e-tp2" model.language_model.per_layer_model_projection.weight "Replicate"
expect_placement "$T/g4e-tp2" model.language_model.layers.0.per_layer_input_gate.weight "Replicate"
expect_placement "$T/g4e-tp2" lm_head.weight "absent"
expect_exit 0 "gemma4 E-series verifies (per-layer table lookup included)" -- tps verify "$T/g4e-tp2" --source "$T/g4e"
expect_stdout_has "verify: PASS" "gemma4 E-series verify passes"
expect_exit 1 "gemma4 E-series at tp 4 is rejected (2 KV heads)" -- tps split "$T/g4e" --tp 4 -o "$T/g4e-tp4"
expect_stderr_has "num_key_value_heads" "the rejection names num_key_value_heads"

# Gemma4 31B-like (tied, as Gemma4ForConditionalGeneration must be): full-attention layers
# without v_proj, with their own head size and KV heads in the older top-level fields.
for dt in BF16 F16 F32; do
  gen gemma4 "$T/g4d$dt" --gemma4-variant dense --kv-heads 4 --global-kv-heads 2 --no-v-proj-full --dtype $dt --seed 14 >/dev/null
  expect_exit 0 "gemma4 dense ($dt, no v_proj on full layers) splits at tp 2" -- tps split "$T/g4d$dt" --tp 2 -o "$T/g4d$dt-tp2" -q
  expect_exit 0 "gemma4 dense ($dt) verifies" -- tps verify "$T/g4d$dt-tp2" --source "$T/g4d$dt" -q
done
expect_placement "$T/g4dBF16-tp2" lm_head.weight "absent"
expect_exit 1 "gemma4 dense at tp 4 is rejected on the global KV heads" -- tps split "$T/g4dBF16" --tp 4 -o "$T/g4d-tp4"
expect_stderr_has "num_global_key_value_heads" "the rejection names num_global_key_value_heads"
expect_stderr_has "layer 1 (full_attention)" "the rejection names the layer"
expect_stderr_has "1, 2" "the rejection lists the tp values that work"
[ ! -e "$T/g4d-tp4" ] && ok "the rejected split wrote nothing" || notok "the rejected split wrote something"

# Untied Gemma4: NeMo refuses Gemma4ForConditionalGeneration with tie_word_embeddings false.
gen gemma4 "$T/g4u" --gemma4-variant dense --kv-heads 4 --global-kv-heads 2 --untied --seed 14 >/dev/null
expect_exit 1 "untied gemma4 is refused at tp 2" -- tps split "$T/g4u" --tp 2 -o "$T/g4u-tp2"
expect_stderr_has "tie_word_embeddings=False" "the refusal says Gemma4 does not support untied embeddings"
[ ! -e "$T/g4u-tp2" ] && ok "the refused untied gemma4 wrote nothing" || notok "the refused untied gemma4 wrote something"

# Vocabulary must divide by tp for Gemma4's balanced vocab-parallel offsets.
gen gemma4 "$T/g4v" --gemma4-variant dense --kv-heads 4 --global-kv-heads 4 --vocab 250 --seed 15 >/dev/null
expect_exit 1 "gemma4 with vocab 250 at tp 4 is rejected" -- tps split "$T/g4v" --tp 4 -o "$T/g4v-tp4"
expect_stderr_has "vocab_size" "the rejection names vocab_size"

# per_layer_config (as transformers 5 writes Gemma4 configs): every layer's own KV heads.
gen gemma4 "$T/g4p" --gemma4-variant dense --kv-heads 4 --global-kv-heads 2 --seed 17 >/dev/null
python3 - "$T/g4p/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
t = c["text_config"]
full = [i for i, x in enumerate(t["layer_types"]) if x == "full_attention"]
t["per_layer_config"] = {str(i): {"head_dim": t.pop("global_head_dim") if i == full[-1] else t["global_head_dim"],
                                  "num_key_value_heads": t["num_global_key_value_heads"]} for i in full}
del t["num_global_key_value_heads"]
json.dump(c, open(sys.argv[1], "w"), indent=2)
PY
expect_exit 1 "per_layer_config: tp 4 is refused on the full-attention layers" -- tps split "$T/g4p" --tp 4 -o "$T/g4p-tp4"
expect_stderr_has "layer 1 (full_attention): num_key_value_heads = 2 (per_layer_config)"
expect_exit 0 "per_layer_config: tp 2 splits and verifies" -- tps split "$T/g4p" --tp 2 -o "$T/g4p-tp2" -q
expect_exit 0 "per_layer_config: verify" -- tps verify "$T/g4p-tp2" --source "$T/g4p" -q
# A config whose per-layer heads do not describe the tensors: refused, naming the tensor.
python3 - "$T/g4p/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["text_config"]["per_layer_config"]["1"]["head_dim"] *= 2
json.dump(c, open(sys.argv[1], "w"), indent=2)
PY
expect_exit 1 "tensors that disagree with per_layer_config are refused" -- tps split "$T/g4p" --tp 2 -o "$T/g4p-bad"
expect_stderr_has "head shapes"
expect_stderr_has "model.language_model.layers.1.self_attn."
[ ! -e "$T/g4p-bad" ] && ok "the refused split wrote nothing" || notok "the refused split wrote something"
python3 - "$T/g4p/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["text_config"]["per_layer_config"]["one"] = {}
json.dump(c, open(sys.argv[1], "w"), indent=2)
PY
expect_exit 1 "a per_layer_config key that is not a layer index is an error" -- tps plan "$T/g4p" --tp 2
expect_stderr_has "config.json: text_config.per_layer_config: key \"one\" is not a layer index"

# MoE: expert parallelism, not TP.
gen gemma4 "$T/g4m" --gemma4-variant moe --kv-heads 4 --seed 16 >/dev/null
expect_exit 1 "gemma4 MoE is rejected at tp 2" -- tps split "$T/g4m" --tp 2 -o "$T/g4m-tp2"
expect_stderr_has "expert parallelism" "the rejection points at expert parallelism"
finish
