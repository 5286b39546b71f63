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

# MoE: expert parallelism, not TP.
gen gemma4 "$T/g4m" --gemma4-variant moe --kv-heads 4 --seed 16 >/dev/null
expect_exit 1 "gemma4 MoE is rejected at tp 2" -- tps split "$T/g4m" --tp 2 -o "$T/g4m-tp2"
expect_stderr_has "expert parallelism" "the rejection points at expert parallelism"
finish
