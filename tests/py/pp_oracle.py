"""Independent oracle for pipeline parallelism in the vLLM layout
(`tpshard split --tp T --pp P --layout vllm`).

What worker (pp_rank, tp_rank) of vLLM 0.33 loads with load_format=
"sharded_state" and a pipeline group of P > 1: the file names
model-pp-{pp_rank}-tp-{tp_rank}-part-{p}.safetensors
(model_loader/sharded_state_loader.py, PP_AND_TP_PATTERN), holding the state
dict of the stage's model, which is the tp rank's state dict restricted to
what the stage builds. Taken from vLLM's code, never from tpshard's:

  * distributed/utils.py get_pp_indices: without VLLM_PP_LAYER_PARTITION,
    L // P layers a stage, then the remainder one each to stages P-2, P-3,
    ... (never the last); with it, the list as given (its length must be P
    and its sum L). models/utils.py make_layers builds only
    [start_layer, end_layer), under the layers' global indices.
  * models/llama.py LlamaModel (Mistral and Phi-3 are LlamaForCausalLM),
    qwen2.py Qwen2Model (Qwen3Model subclasses it) and deepseek_v2.py
    DeepseekV2Model build embed_tokens only when get_pp_group().is_first_rank
    (llama, qwen2: or tie_word_embeddings and is_last_rank), norm only when
    is_last_rank, and their ...ForCausalLM lm_head only when is_last_rank
    (tied: lm_head.tie_weights(model.embed_tokens), which _filter_subtensors
    keeps as lm_head.weight). A tied model's first stage therefore holds
    model.embed_tokens.weight and its last lm_head.weight.
  * qwen3_moe.py Qwen3MoeModel, mixtral.py MixtralModel, gemma3.py
    Gemma3Model (and qwen2_moe.py) build embed_tokens and norm whatever the
    stage, and their ...ForCausalLM lm_head too: every stage holds them.

    partition(num_layers, pp, env=None) -> [layers of each stage]
    stage_rule(config) -> "every" | "first_last"
    split_stages(tp_ranks, config, tp, pp, layers=None)
        -> {(pp_rank, tp_rank): {name: value}}  (values as given per tp rank)
"""
import re

# The model types whose stages all build the embedding, final norm and head.
EVERY_STAGE = ("qwen3_moe", "mixtral", "gemma3_text", "gemma3", "qwen2_moe")

LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def partition(num_layers, pp, env=None):
    if env is not None:
        parts = [int(x) for x in env.split(",")]
        if len(parts) != pp:
            raise ValueError(f"{len(parts)=} does not match {pp=}")
        if sum(parts) != num_layers:
            raise ValueError(f"{sum(parts)=} does not match {num_layers=}")
        return parts
    parts = [num_layers // pp] * pp
    rem = num_layers % pp
    for i in range(2, rem + 2):
        parts[-i] += 1
    return parts


def stage_rule(config):
    mt = config.get("model_type") or (config.get("text_config") or {}).get("model_type")
    return "every" if mt in EVERY_STAGE else "first_last"


def split_stages(tp_ranks, config, tp, pp, layers=None):
    """tp_ranks: [ {name: value} per tp rank ] of the TP-only vLLM layout."""
    L = config.get("num_hidden_layers") or config["text_config"]["num_hidden_layers"]
    parts = layers or partition(L, pp)
    starts = [sum(parts[:s]) for s in range(pp)]

    def stage_of(layer):
        for s in range(pp):
            if starts[s] <= layer < starts[s] + parts[s]:
                return s
        raise ValueError(f"layer {layer} in no stage of {parts}")

    every = stage_rule(config) == "every"
    out = {(s, r): {} for s in range(pp) for r in range(tp)}
    for r in range(tp):
        rank = tp_ranks[r]
        tied = "lm_head.weight" in rank and "model.embed_tokens.weight" not in rank
        for name, value in rank.items():
            m = LAYER.match(name)
            if m:
                out[(stage_of(int(m.group(1))), r)][name] = value
            elif every:
                for s in range(pp):
                    out[(s, r)][name] = value
            elif name == "model.embed_tokens.weight":
                out[(0, r)][name] = value
            elif name == "lm_head.weight":
                out[(pp - 1, r)][name] = value
                if tied:  # the first stage's embedding: the same VocabParallelEmbedding shard
                    out[(0, r)]["model.embed_tokens.weight"] = value
            elif name == "model.norm.weight":
                out[(pp - 1, r)][name] = value
            else:
                raise ValueError(f"{name}: no stage rule for it")
    return out
