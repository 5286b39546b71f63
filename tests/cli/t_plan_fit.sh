#!/bin/sh
# A plan for another model is refused, not applied as "replicate everything":
# --family llama on a GPT-2 checkpoint (transformer.h.0.attn.c_attn, ...)
# matches none of the checkpoint's tensors with a split rule, or (with an
# untied lm_head.weight, as GPT-J keeps) none with a per-layer one. plan and split
# refuse it in every layout and at every tp (tp 1 too: the manifest would
# record a plan that does not describe the model), naming the plan and the
# checkpoint's modules, and write nothing. A plan with no split rule at all
# (everything replicated on purpose) is still accepted.
# Also: --untie on an untied checkpoint says it is not tied; --ep with the
# dtensor layout is a usage error naming the layouts that take it.
. "${TOP:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/cli/lib.sh"

# gpt2: as GPT-2 saves it (tied, no lm_head); gptj: with its own lm_head.weight.
for m in gpt2 gptj; do
python3 - "$T/$m" "$TOP/testdata" <<'PY'
import json, os, random, sys
sys.path.insert(0, sys.argv[2])
import gen
out = sys.argv[1]
names = ["transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight",
         "transformer.ln_f.bias"] + (["lm_head.weight"] if out.endswith("gptj") else [])
for i in range(2):
    for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj", "ln_1", "ln_2"):
        names += [f"transformer.h.{i}.{m}.weight", f"transformer.h.{i}.{m}.bias"]
rng = random.Random(7)
shape = lambda n: [8] if n.endswith(".bias") or ".ln_" in n else [16, 8]
gen.write_checkpoint(out, {n: ("F32", shape(n), gen.rand_data(rng, "F32", shape(n))) for n in names}, 0)
with open(os.path.join(out, "config.json"), "w") as f:
    json.dump({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 8,
               "n_head": 2, "n_layer": 2, "vocab_size": 16}, f)
PY
done

for m in gpt2 gptj; do
  for tp in 1 2; do
    for lay in dtensor vllm sglang; do
      o="$T/$m-$tp-$lay"
      expect_exit 1 "split --family llama of $m (tp $tp, layout $lay) is refused" -- \
        tps split "$T/$m" --family llama --tp $tp --layout $lay -o "$o"
      if grep -qF "plan llama matches no tensor" "$ERR" && grep -qF "transformer.h.*.attn.c_attn" "$ERR"; then
        ok "the refusal ($m, tp $tp, $lay) names the plan and the checkpoint's modules"
      else
        notok "the refusal ($m, tp $tp, $lay) names the plan and the checkpoint's modules"; diag "$ERR"
      fi
      [ ! -e "$o" ] && ok "the refused split ($m, tp $tp, $lay) wrote nothing" ||
        notok "the refused split ($m, tp $tp, $lay) left $o"
    done
  done
done
expect_exit 1 "plan --family llama of a GPT-2 is refused" -- tps plan "$T/gpt2" --family llama --tp 2
expect_stderr_has "plan llama matches no tensor" "plan's refusal names the plan"
expect_exit 1 "plan --json --family qwen3 of a GPT-2 is refused" -- tps plan "$T/gpt2" --family qwen3 --tp 2 --json
expect_stdout_has "plan qwen3 matches no tensor" "the JSON error names the plan"

# A plan with only replicated rules matches nothing it would split: accepted.
cat >"$T/replicate.yaml" <<'YAML'
name: all-replicated
rules:
  - match: transformer.h.*.attn.c_attn
    style: replicate
YAML
expect_exit 0 "a plan with no split rule still splits (everything replicated)" -- \
  tps split "$T/gpt2" --plan "$T/replicate.yaml" --tp 2 -o "$T/g-rep" -q
# A plan of the model's own family at tp 1 is untouched.
gen llama "$T/llama" --untied >/dev/null
expect_exit 0 "a llama checkpoint with --family llama at tp 1 splits" -- \
  tps split "$T/llama" --family llama --tp 1 -o "$T/l-tp1" -q

# --untie on an untied checkpoint: the checkpoint is not tied, whatever the plan.
expect_exit 2 "--untie on an untied llama is a usage error" -- \
  tps split "$T/llama" --tp 2 --untie -o "$T/l-untie"
expect_stderr_has "not a tied checkpoint" "--untie on an untied llama says it is not tied"
if grep -qF "names no tied embedding" "$ERR"; then
  notok "--untie on an untied llama does not blame the plan"; diag "$ERR"
else ok "--untie on an untied llama does not blame the plan"; fi
python3 - "$T/llama/config.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1])); j.pop("tie_word_embeddings", None)
json.dump(j, open(sys.argv[1], "w"))
PY
expect_exit 2 "--untie on a llama without tie_word_embeddings (default false) is a usage error" -- \
  tps plan "$T/llama" --tp 2 --untie
expect_stderr_has "not a tied checkpoint" "--untie without tie_word_embeddings: not tied (LlamaConfig's default)"

# --ep is for the serving layouts.
for cmd in split plan; do
  for lay in "" "--layout dtensor"; do
    o=""; [ $cmd = split ] && o="-o $T/l-ep"
    # shellcheck disable=SC2086
    expect_exit 2 "$cmd --ep ${lay:-(default layout)} is a usage error" -- \
      tps $cmd "$T/llama" --tp 2 --ep $lay $o
    expect_stderr_has "--layout vllm or sglang" "$cmd --ep ${lay:-(default layout)} names the layouts that take it"
  done
done
[ ! -e "$T/l-ep" ] && ok "--ep with dtensor wrote nothing" || notok "--ep with dtensor left $T/l-ep"
finish
