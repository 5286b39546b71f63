"""Independent oracle for the model families of issue 20: Phi-3 (packed
qkv_proj / gate_up_proj), Qwen3-MoE and Mixtral (experts), a family written by
a user (--plan FILE), and Mistral's DTensor plan.  Tiny checkpoint generators
with the real Hugging Face tensor names and config fields, and the exact rank
files tpshard must write for them, in the DTensor layout and in the vLLM 0.33 /
SGLang 0.5.23 sharded_state layouts (tensor parallel, and with expert
parallelism over the same ranks).

Derived from the engines' and transformers' own code, never from tpshard's:
  vLLM 0.33.0   models/phi3.py (Phi3ForCausalLM(LlamaForCausalLM)), llama.py,
                qwen3_moe.py, mixtral.py, layers/linear.py (QKVParallelLinear
                and MergedColumnParallelLinear .weight_loader with
                loaded_shard_id None: a packed checkpoint tensor is cut into
                its q/k/v or gate/up sections by the config's sizes, each then
                sharded like a separate one), layers/fused_moe/layer.py
                (FusedMoEFactory -> MoERunner: .gate, .routed_experts),
                routed_experts.py (_load_w13: w1 = gate into the first half
                of w13, w3 = up into the second; _load_w2), unquantized_fused_
                moe_method.py create_weights (w13_weight [E_local, 2*I_pp, H],
                w2_weight [E_local, H, I_pp]), config.py FusedMoEParallelConfig
                .make (EP: ep_size = tp, MoE tp_size = 1; I_pp = I // tp),
                expert_map_manager.py determine_expert_map ("linear": rank r
                holds experts [r*E/ep, (r+1)*E/ep)),
                model_loader/sharded_state_loader.py _filter_subtensors.
  SGLang 0.5.23 models/llama.py (Phi3ForCausalLM(LlamaForCausalLM)),
                qwen3_moe.py, mixtral.py, layers/linear.py,
                layers/moe/fused_moe_triton/layer.py (FusedMoE: asserts
                intermediate % moe_tp_size and experts % moe_ep_size;
                _map_global_expert_id_to_local_expert_id: contiguous ranges;
                _load_w13 / _load_w2), layers/quantization/unquant.py
                UnquantizedFusedMoEMethod.create_weights.
  transformers 5.24.0 models/phi3/configuration_phi3.py base_model_tp_plan
                (qkv_proj and gate_up_proj "colwise_gather_output": Shard(0)
                of the packed tensor as one block; o_proj and down_proj
                "rowwise_split_input": Shard(1)), modeling_phi3.py _tp_plan
                (lm_head colwise_gather_output); models/qwen3_moe and
                models/mixtral configuration_*.py base_model_tp_plan (q/k/v
                colwise, o rowwise, experts.gate_up_proj "packed_colwise",
                experts.down_proj "rowwise", experts "moe_tp_experts"; no
                embed_tokens entry: the embedding is replicated);
                distributed/tensor_parallel.py (ColwiseParallel.shard_param
                Shard(ndim-2), RowwiseParallel Shard(-1) and bias Replicate,
                PackedColwiseParallel _StridedShard(split_factor=2));
                conversion_mapping.py (the checkpoint's per-expert w1/w3 or
                gate_proj/up_proj become the fused gate_up_proj).
Python standard library and numpy only (plus serving_oracle.py's sharders and
testdata/gen.py's reference safetensors writer).

    expected_ranks(model_dir, layout, tp, ep=False, plan=None)
        -> [ {name: (dtype, shape, bytes)} per rank ]
    expected_ranks_from(config, tensors, layout, tp, ep=False, plan=None)
    accepts(config, tp, layout="dtensor", ep=False, tensors=None) -> (ok, reason)
        reason starts with the config field (or the tensor) at fault
    family_of(config) -> "phi3" | "qwen3_moe" | "mixtral" | "mistral"
    experts_of(rank, tp, n_experts) -> range      # --ep: the rank's experts
    phi3_checkpoint / qwen3_moe_checkpoint / mixtral_checkpoint /
    user_checkpoint(out, **dims) -> out           # write a tiny model folder
    USER_PLAN (YAML text of the user family's plan), USER_RULES, MISTRAL_RULES,
    PHI3_RULES / PHI3_RULES_NEMO / QWEN3_MOE_RULES / MIXTRAL_RULES: DTensor
    (module pattern, style) rules; placement(name, rules) -> ("shard", dim) |
    ("replicate", None); dtensor_ranks(tensors, rules, tp)

layout: "dtensor", "vllm" or "sglang".  ep=True is expert parallelism over
the tp ranks (vLLM --enable-expert-parallel, SGLang --ep-size = --tp):
attention, embedding and head stay tensor parallel, every expert lives whole
on one rank.

Exceptions (serving_oracle's): Rejected (the layout refuses the model at this
tp: the reason names the rule), Unsupported (outside what this oracle models).

Choices the engines leave open, taken here (each one is a rule tpshard must
follow; see the notes at the rules):
  * DTensor Phi-3 follows transformers' plan: packed tensors Shard(0) as one
    block, any tp (torch.chunk; the plan gathers the outputs), embedding
    replicated (the plan has no embed_tokens entry).  NeMo AutoModel's own
    Phi-3 plan differs (qkv_proj Shard(1), o_proj Shard(0), embedding
    Shard(0), whole heads): PHI3_DTENSOR = "nemo" selects it.
  * DTensor Qwen3-MoE / Mixtral follow transformers' plan, which does shard
    every expert (moe_tp_experts): under the checkpoint's per-expert names,
    gate/up (w1/w3) Shard(0), down (w2) Shard(1), router replicated; the
    packed_colwise split is only right when the expert intermediate size
    divides by tp, and attention needs whole heads (no KV replication in
    DTensor), so those are refused.  --ep is not defined for DTensor here.
  * Serving layouts refuse what the engine would load wrongly: vLLM floors
    moe_intermediate_size / tp (rows lost), vLLM accepts experts not divisible
    by the EP size (the first E % ep ranks get one more) but SGLang asserts,
    and issue 20 refuses it for both; SGLang's Qwen3-MoE makes every layer
    sparse (mlp_only_layers / decoder_sparse_step ignored); SGLang's Mixtral
    takes head_dim = hidden_size / num_attention_heads whatever the config
    says; SGLang's Qwen3-MoE and Mixtral never tie lm_head to the embedding.
  * The expert tensors are the ones the default kernels load (vLLM Triton on
    Hopper, SGLang's triton runner): FlashInfer TRT-LLM (Blackwell) pads the
    per-rank intermediate size to a multiple of 128, SGLang's triton_kernels
    runner transposes, FlashInfer CUTLASS puts up before gate.
"""
import fnmatch
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.environ.get("TOP") or os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(TOP, "testdata"))
import gen  # noqa: E402
import serving_oracle as so  # noqa: E402
from serving_oracle import Rejected, Unsupported  # noqa: E402,F401

LAYOUTS = ("dtensor", "vllm", "sglang")

ARCH = {"Phi3ForCausalLM": "phi3", "Qwen3MoeForCausalLM": "qwen3_moe",
        "MixtralForCausalLM": "mixtral", "MistralForCausalLM": "mistral"}
MOE = ("qwen3_moe", "mixtral")

# transformers' config defaults when config.json has no tie_word_embeddings
TIED_BY_DEFAULT = {"phi3": False, "qwen3_moe": False, "mixtral": False, "mistral": False}


def family_of(config):
    for a in config.get("architectures") or []:
        if a in ARCH:
            return ARCH[a]
    raise Unsupported(f"architecture {config.get('architectures')} is not one of {sorted(ARCH)}")


def _tied(config, fam):
    v = config.get("tie_word_embeddings")
    return TIED_BY_DEFAULT[fam] if v is None else bool(v)


# ------------------------------------------------------------------ geometry

def _dims(c, fam, layout):
    """(H, A, K, D, I, V): I is the expert intermediate size for MoE families."""
    H = c["hidden_size"]
    A = c["num_attention_heads"]
    K = c.get("num_key_value_heads") or A
    if fam == "mixtral" and layout == "sglang":
        D = H // A  # sglang mixtral.py MixtralAttention: head_dim = hidden_size // heads
    else:
        # vllm llama.py / mixtral.py / qwen3_moe.py: config head_dim or hidden // heads;
        # sglang llama.py / qwen3_moe.py: getattr(config, "head_dim", hidden // heads)
        D = c.get("head_dim") or H // A
    if fam == "qwen3_moe":
        I = c["moe_intermediate_size"]
    else:
        I = c["intermediate_size"]
    return H, A, K, D, I, c["vocab_size"]


def n_experts(c, fam):
    return c["num_experts"] if fam == "qwen3_moe" else c["num_local_experts"]


def experts_field(fam):
    return "num_experts" if fam == "qwen3_moe" else "num_local_experts"


def moe_inter_field(fam):
    return "moe_intermediate_size" if fam == "qwen3_moe" else "intermediate_size"


def sparse_layers(c, fam, layout):
    """Indices of the layers with experts.  vllm qwen3_moe.py Qwen3MoeDecoderLayer:
    not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0.  SGLang's
    Qwen3MoeDecoderLayer.stage_facts: every layer.  Mixtral: every layer."""
    L = c["num_hidden_layers"]
    if fam != "qwen3_moe" or layout == "sglang":
        return list(range(L))
    only = set(c.get("mlp_only_layers") or [])
    step = c.get("decoder_sparse_step") or 1
    E = c.get("num_experts") or 0
    return [i for i in range(L) if i not in only and E > 0 and (i + 1) % step == 0]


def experts_of(rank, tp, n):
    """Experts rank `rank` holds whole under --ep (vLLM determine_expert_map
    "linear"; SGLang FusedMoE._map_global_expert_id_to_local_expert_id):
    a contiguous range; n % tp == 0 is required here."""
    per = n // tp
    return range(rank * per, (rank + 1) * per)


def packed_rows(c):
    """Phi-3: rows of qkv_proj ((A + 2K) * D) and gate_up_proj (2 * I)."""
    H, A, K, D, I, _ = _dims(c, "phi3", "vllm")
    return (A + 2 * K) * D, 2 * I


# ------------------------------------------------------------------ acceptance

def _attn_reason(A, K, tp, replicate_kv):
    if A % tp:
        return f"num_attention_heads ({A}) is not divisible by tp {tp}"
    if replicate_kv:
        # QKVParallelLinear: kv % tp when kv >= tp, else tp % kv (replicas)
        if K >= tp and K % tp:
            return f"num_key_value_heads ({K}) is not divisible by tp {tp}"
        if K < tp and tp % K:
            return (f"num_key_value_heads ({K}) < tp {tp} and tp is not a multiple of it "
                    f"(KV heads are replicated tp/kv times)")
    elif K % tp:
        return (f"num_key_value_heads ({K}) is not divisible by tp {tp} "
                f"(DTensor cannot replicate KV heads)")
    return ""


def _packed_reason(c, tensors):
    """A Phi-3 checkpoint whose packed tensors disagree with its config: the
    engines cut qkv_proj at A*D and (A+K)*D and gate_up_proj at I from the
    config (QKVParallelLinear/_load_fused... shard_offsets), so any other row
    count would be cut wrongly.  transformers cannot load it either."""
    if tensors is None:
        return ""
    qkv, gu = packed_rows(c)
    H = c["hidden_size"]
    for i in range(c["num_hidden_layers"]):
        for name, rows, how in (
                (f"model.layers.{i}.self_attn.qkv_proj.weight", qkv,
                 "(num_attention_heads + 2 x num_key_value_heads) x head_dim"),
                (f"model.layers.{i}.mlp.gate_up_proj.weight", gu, "2 x intermediate_size")):
            t = tensors.get(name)
            if t is None:
                continue
            if t[1] != [rows, H]:
                return f"{name.split('.', 3)[3]}: layer {i} holds {t[1]}, {how} gives {[rows, H]}"
    return ""


def accepts(config, tp, layout="dtensor", ep=False, tensors=None):
    """(True, "") when the layout writes this model at this tp, else (False,
    reason).  The reason starts with the config field at fault, or with the
    tensor (self_attn.qkv_proj.weight, mlp.gate_up_proj.weight) for a packed
    Phi-3 tensor whose rows disagree with the config."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}")
    if tp < 1:
        return False, f"tp {tp} < 1"
    fam = family_of(config)
    c = config
    H, A, K, D, I, V = _dims(c, fam, layout)
    if ep and fam not in MOE:
        raise Unsupported("--ep is for the MoE families")
    if ep and layout == "dtensor":
        raise Unsupported("--ep is defined for the serving layouts here")
    if fam == "phi3":
        why = _packed_reason(c, tensors)
        if why:
            return False, why
    if layout == "dtensor":
        if fam == "phi3" and PHI3_DTENSOR != "nemo":
            # transformers' Phi-3 plan gathers the outputs of the packed colwise
            # layers and splits the rowwise inputs itself: any tp holds.
            return True, ""
        why = _attn_reason(A, K, tp, replicate_kv=False)
        if why:
            return False, why
        if fam in MOE and I % tp:
            # PackedColwiseParallel: _StridedShard(dim, split_factor=2) cuts gate
            # and up apart only when each divides by tp
            return False, (f"{moe_inter_field(fam)} ({I}) is not divisible by tp {tp} "
                           f"(every expert's gate and up rows are split in whole halves)")
        return True, ""
    # ---- serving layouts
    why = _attn_reason(A, K, tp, replicate_kv=True)
    if why:
        return False, why
    if fam == "phi3" and I % tp:
        return False, f"intermediate_size ({I}) is not divisible by tp {tp}"
    if fam in MOE:
        E = n_experts(c, fam)
        if fam == "qwen3_moe" and layout == "sglang":
            if c.get("mlp_only_layers"):
                return False, (f"mlp_only_layers ({c['mlp_only_layers']}) is set, but SGLang's "
                               f"Qwen3-MoE gives every layer experts")
            if (c.get("decoder_sparse_step") or 1) != 1:
                return False, (f"decoder_sparse_step ({c['decoder_sparse_step']}) is not 1, but "
                               f"SGLang's Qwen3-MoE gives every layer experts")
        if fam == "mixtral" and layout == "sglang" and c.get("head_dim") not in (None, H // A):
            return False, (f"head_dim ({c['head_dim']}) differs from hidden_size/num_attention_heads "
                           f"({H // A}), which SGLang's Mixtral uses")
        moe_tp = 1 if ep else tp
        # vllm Qwen3MoeSparseMoeBlock: tp (the attention's) > num_experts raises;
        # sglang: moe_tp_size > num_experts raises
        if fam == "qwen3_moe" and (tp if layout == "vllm" else moe_tp) > E:
            return False, f"num_experts ({E}) < tp {tp}: the engine refuses more ranks than experts"
        if ep and E % tp:
            return False, (f"{experts_field(fam)} ({E}) is not divisible by the EP size {tp} "
                           f"(each rank holds the same number of whole experts)")
        if not ep and I % tp:
            return False, f"{moe_inter_field(fam)} ({I}) is not divisible by tp {tp}"
        if fam == "qwen3_moe" and layout == "vllm":
            dense = set(range(c["num_hidden_layers"])) - set(sparse_layers(c, fam, layout))
            if dense and c["intermediate_size"] % tp:
                return False, (f"intermediate_size ({c['intermediate_size']}) of the dense layers "
                               f"is not divisible by tp {tp}")
    if layout == "vllm" and so.padded_vocab(V, tp, layout) % tp:
        return False, (f"vocab_size ({V}) padded to a multiple of {so.VOCAB_PADDING} "
                       f"({so.padded_vocab(V, tp, layout)}) is not divisible by tp {tp}")
    return True, ""


# ------------------------------------------------------------------ byte helpers

def _chunk(n, tp, r):
    """torch.chunk / DTensor Shard extent of rank r: (start, length)."""
    c = -(-n // tp) if n else 0
    s = min(r * c, n)
    return s, min((r + 1) * c, n) - s


def _dim1(t, start, count):
    dt, shape, data = t
    es = so.ITEMSIZE[dt]
    a = np.frombuffer(data, dtype=np.uint8).reshape(shape[0], shape[1], es)
    return (dt, [shape[0], count], a[:, start:start + count, :].tobytes())


def _shard(t, dim, tp, r):
    s, n = _chunk(t[1][dim], tp, r)
    if dim == 0:
        return so._rows(t, s, n)
    if len(t[1]) != 2:
        raise Unsupported(f"Shard(1) of a {len(t[1])}-dim tensor")
    return _dim1(t, s, n)


def _stack(parts):
    """[E, ...] from per-expert tensors of one shape and dtype."""
    dts = {p[0] for p in parts}
    shapes = {tuple(p[1]) for p in parts}
    if len(dts) != 1 or len(shapes) != 1:
        raise Unsupported(f"experts of different dtypes or shapes: {sorted(dts)} {sorted(shapes)}")
    return (parts[0][0], [len(parts)] + list(parts[0][1]), b"".join(p[2] for p in parts))


def _split_rows(t, sizes):
    out, s = [], 0
    for n in sizes:
        out.append(so._rows(t, s, n))
        s += n
    return out


# ------------------------------------------------------------------ DTensor

# (module pattern, style).  Patterns as in parallelize_module / tpshard-plan(5):
# one fnmatch per dotted component.  First match wins; no match: replicate.
PHI3_RULES = [  # transformers Phi3Config.base_model_tp_plan (prefix "model.") + Phi3ForCausalLM._tp_plan
    ("model.layers.*.self_attn.qkv_proj", "colwise"),   # colwise_gather_output: Shard(0), one block
    ("model.layers.*.self_attn.o_proj", "rowwise"),     # rowwise_split_input: Shard(1)
    ("model.layers.*.mlp.gate_up_proj", "colwise"),     # colwise_gather_output
    ("model.layers.*.mlp.down_proj", "rowwise"),        # rowwise_split_input
    ("lm_head", "colwise"),                             # colwise_gather_output
]
# NeMo AutoModel has a plan of its own for HF Phi3ForCausalLM (optimized_tp_plans.py
# _parallelize_phi3, registered in PARALLELIZE_FUNCTIONS; "Fused Attention can not be
# sharded"): the packed qkv_proj is RowwiseParallel (Shard(1), the hidden columns) and
# o_proj ColwiseParallel (Shard(0)), the embedding vocab-parallel, and validate_tp_mesh
# asserts both head counts divide by tp.  Issue 20 asks for transformers' plan; set
# PHI3_DTENSOR = "nemo" to check a plans/phi3.yaml that follows NeMo instead.
PHI3_RULES_NEMO = [
    ("model.embed_tokens", "embedding_rowwise"),        # VocabParallelEmbedding
    ("model.layers.*.self_attn.qkv_proj", "rowwise"),
    ("model.layers.*.self_attn.o_proj", "colwise"),
    ("model.layers.*.mlp.gate_up_proj", "colwise"),
    ("model.layers.*.mlp.down_proj", "rowwise"),
    ("lm_head", "colwise"),
]
PHI3_DTENSOR = "transformers"
QWEN3_MOE_RULES = [  # transformers Qwen3MoeConfig.base_model_tp_plan under checkpoint names
    ("model.layers.*.self_attn.q_proj", "colwise"),
    ("model.layers.*.self_attn.k_proj", "colwise"),
    ("model.layers.*.self_attn.v_proj", "colwise"),
    ("model.layers.*.self_attn.o_proj", "rowwise"),
    # experts.gate_up_proj packed_colwise = per expert gate rows and up rows Shard(0)
    ("model.layers.*.mlp.experts.*.gate_proj", "colwise"),
    ("model.layers.*.mlp.experts.*.up_proj", "colwise"),
    ("model.layers.*.mlp.experts.*.down_proj", "rowwise"),  # experts.down_proj rowwise: Shard(-1)
    ("model.layers.*.mlp.gate_proj", "colwise"),    # dense layers (mlp_only_layers)
    ("model.layers.*.mlp.up_proj", "colwise"),
    ("model.layers.*.mlp.down_proj", "rowwise"),
    ("lm_head", "colwise"),
    # q_norm/k_norm replicated_with_grad_allreduce, router mlp.gate: replicated
]
MIXTRAL_RULES = [  # transformers MixtralConfig.base_model_tp_plan (mlp. = block_sparse_moe.)
    ("model.layers.*.self_attn.q_proj", "colwise"),
    ("model.layers.*.self_attn.k_proj", "colwise"),
    ("model.layers.*.self_attn.v_proj", "colwise"),
    ("model.layers.*.self_attn.o_proj", "rowwise"),
    ("model.layers.*.block_sparse_moe.experts.*.w1", "colwise"),
    ("model.layers.*.block_sparse_moe.experts.*.w3", "colwise"),
    ("model.layers.*.block_sparse_moe.experts.*.w2", "rowwise"),
    ("lm_head", "colwise"),
]
MISTRAL_RULES = [  # NeMo AutoModel _parallelize_llama (plans.md 1.1), which MistralForCausalLM shares
    ("model.embed_tokens", "embedding_rowwise"),
    ("model.layers.*.self_attn.q_proj", "colwise"),
    ("model.layers.*.self_attn.k_proj", "colwise"),
    ("model.layers.*.self_attn.v_proj", "colwise"),
    ("model.layers.*.self_attn.o_proj", "rowwise"),
    ("model.layers.*.mlp.gate_proj", "colwise"),
    ("model.layers.*.mlp.up_proj", "colwise"),
    ("model.layers.*.mlp.down_proj", "rowwise"),
    ("lm_head", "colwise"),
]
DTENSOR_RULES = {"phi3": PHI3_RULES, "qwen3_moe": QWEN3_MOE_RULES, "mixtral": MIXTRAL_RULES,
                 "mistral": MISTRAL_RULES}


def dtensor_rules(fam):
    if fam == "phi3" and PHI3_DTENSOR == "nemo":
        return PHI3_RULES_NEMO
    return DTENSOR_RULES[fam]


def _matches(pattern, module):
    p, m = pattern.split("."), module.split(".")
    return len(p) == len(m) and all(fnmatch.fnmatchcase(b, a) for a, b in zip(p, m))


def placement(name, rules):
    """("shard", dim) or ("replicate", None) of a tensor under (pattern, style) rules."""
    if "." not in name:
        return "replicate", None
    module, _, param = name.rpartition(".")
    for pattern, style in rules:
        if _matches(pattern, module):
            if style == "colwise":
                return "shard", 0
            if style == "rowwise":
                return ("replicate", None) if param == "bias" else ("shard", 1)
            if style in ("embedding_rowwise", "vocab"):
                return "shard", 0
            if style == "embedding_colwise":
                return "shard", 1
            return "replicate", None
    return "replicate", None


def dtensor_ranks(tensors, rules, tp):
    """Every tensor on every rank: its torch.chunk shard, or whole."""
    out = [dict() for _ in range(tp)]
    for name, t in tensors.items():
        kind, dim = placement(name, rules)
        for r in range(tp):
            out[r][name] = t if kind == "replicate" else _shard(t, dim, tp, r)
    return out


# ------------------------------------------------------------------ serving layouts

def _serving(config, tensors, layout, tp, ep):
    fam = family_of(config)
    c = config
    H, A, K, D, I, V = _dims(c, fam, layout)
    L = c["num_hidden_layers"]
    tied = _tied(config, fam)
    if tied and fam in MOE and layout == "sglang":
        # sglang qwen3_moe.py / mixtral.py: lm_head is always its own ParallelLMHead,
        # never tied, and a tied checkpoint has no lm_head.weight to load into it
        raise Unsupported(f"SGLang's {fam} does not tie lm_head to the embedding")
    used = set()
    rules = []  # (engine name, function(rank) -> tensor)

    def src(name):
        if name not in tensors:
            raise Unsupported(f"the checkpoint has no {name}")
        used.add(name)
        return tensors[name]

    def add(name, fn):
        rules.append((name, fn))

    def replicated(name, source):
        t = src(source)
        add(name, lambda r, t=t: t)

    def row(name, source):
        t = src(source)
        add(name, lambda r, t=t: so._row_parallel(t, r, tp))

    def qkv(name, sources, packed=False):
        if packed:
            q, k, v = _split_rows(src(sources), [A * D, K * D, K * D])
        else:
            q, k, v = (src(s) for s in sources)
        add(name, lambda r, q=q, k=k, v=v: so._qkv(q, k, v, r, tp, A, K, D))

    def merged(name, sources, rows=None):
        if rows is not None:
            parts = _split_rows(src(sources), [rows, rows])
        else:
            parts = [src(s) for s in sources]
        add(name, lambda r, parts=parts: so._merged(parts, r, tp))

    E = n_experts(c, fam) if fam in MOE else 0
    sparse = set(sparse_layers(c, fam, layout)) if fam in MOE else set()
    if fam == "mixtral":
        gate_src, moe, w1, w3, w2 = "block_sparse_moe.gate", "block_sparse_moe", "w1", "w3", "w2"
    else:
        gate_src, moe, w1, w3, w2 = "mlp.gate", "mlp", "gate_proj", "up_proj", "down_proj"

    for i in range(L):
        p = f"model.layers.{i}."
        replicated(p + "input_layernorm.weight", p + "input_layernorm.weight")
        replicated(p + "post_attention_layernorm.weight", p + "post_attention_layernorm.weight")
        if fam == "phi3":
            # llama.py: the packed tensor goes to weight_loader(param, w) with no shard id
            qkv(p + "self_attn.qkv_proj.weight", p + "self_attn.qkv_proj.weight", packed=True)
        else:
            qkv(p + "self_attn.qkv_proj.weight",
                [p + f"self_attn.{x}_proj.weight" for x in "qkv"])
            if fam == "qwen3_moe" and c.get("attention_bias"):
                qkv(p + "self_attn.qkv_proj.bias",
                    [p + f"self_attn.{x}_proj.bias" for x in "qkv"])
        row(p + "self_attn.o_proj.weight", p + "self_attn.o_proj.weight")
        if fam == "qwen3_moe" and layout == "sglang" and c.get("attention_bias"):
            # sglang Qwen3MoeAttention: o_proj bias=attention_bias (vLLM's has none)
            replicated(p + "self_attn.o_proj.bias", p + "self_attn.o_proj.bias")
        if fam == "qwen3_moe":
            replicated(p + "self_attn.q_norm.weight", p + "self_attn.q_norm.weight")
            replicated(p + "self_attn.k_norm.weight", p + "self_attn.k_norm.weight")
        for name, t in so.LAYER_BUFFERS[layout]:
            add(p + name, lambda r, t=t: t)
        if fam == "phi3":
            merged(p + "mlp.gate_up_proj.weight", p + "mlp.gate_up_proj.weight", rows=I)
            row(p + "mlp.down_proj.weight", p + "mlp.down_proj.weight")
            continue
        if i not in sparse:  # vLLM Qwen3MoeMLP on the dense layers
            merged(p + "mlp.gate_up_proj.weight", [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"])
            row(p + "mlp.down_proj.weight", p + "mlp.down_proj.weight")
            continue
        # the router: replicated, full [E, H] on every rank
        if fam == "qwen3_moe" and layout == "vllm":
            # FusedMoEFactory(gate=self.gate): MoERunner.gate is the same module, so
            # state_dict() has mlp.gate.weight and mlp.experts.gate.weight;
            # _filter_subtensors keeps the smaller key
            replicated(p + "mlp.experts.gate.weight", p + "mlp.gate.weight")
        else:
            replicated(p + gate_src + ".weight", p + gate_src + ".weight")
        g = [src(p + f"{moe}.experts.{e}.{w1}.weight") for e in range(E)]
        u = [src(p + f"{moe}.experts.{e}.{w3}.weight") for e in range(E)]
        d = [src(p + f"{moe}.experts.{e}.{w2}.weight") for e in range(E)]
        for e in range(E):
            if g[e][1] != [I, H] or u[e][1] != [I, H] or d[e][1] != [H, I]:
                raise Unsupported(f"{p}{moe}.experts.{e}: shapes {g[e][1]} {u[e][1]} {d[e][1]}, "
                                  f"the config implies [{I},{H}] and [{H},{I}]")
        base = p + moe + (".experts.routed_experts." if layout == "vllm" else ".experts.")

        def w13(r, g=g, u=u):
            if ep:
                # moe tp_size 1: each local expert whole, [gate (w1); up (w3)]
                return _stack([so._cat0([g[e], u[e]]) for e in experts_of(r, tp, E)])
            # _load_w13: w1 -> w13[e][0:I/tp], w3 -> w13[e][I/tp:2I/tp], rows r*I/tp of each
            return _stack([so._merged([g[e], u[e]], r, tp) for e in range(E)])

        def w2fn(r, d=d):
            if ep:
                return _stack([d[e] for e in experts_of(r, tp, E)])
            return _stack([so._row_parallel(d[e], r, tp) for e in range(E)])

        add(base + "w13_weight", w13)
        add(base + "w2_weight", w2fn)

    replicated("model.norm.weight", "model.norm.weight")
    if tensors.get("model.embed_tokens.weight", (None, None))[1] != [V, H]:
        raise Unsupported(f"model.embed_tokens.weight is not [{V},{H}]")
    if tied:
        t = src("model.embed_tokens.weight")
        add("lm_head.weight", lambda r, t=t: so._vocab(t, r, tp, layout))
    else:
        t = src("model.embed_tokens.weight")
        add("model.embed_tokens.weight", lambda r, t=t: so._vocab(t, r, tp, layout))
        h = src("lm_head.weight")
        add("lm_head.weight", lambda r, h=h: so._vocab(h, r, tp, layout))

    left = sorted(n for n in tensors if n not in used and not n.endswith(so.SKIPPED_SUFFIXES))
    if left:
        raise Unsupported(f"{layout} has no place for {len(left)} checkpoint tensor(s), "
                          f"e.g. {left[:3]} (the engine would drop them)")
    names = [n for n, _ in rules]
    if len(set(names)) != len(names):
        raise AssertionError("duplicate rule")
    return [{n: fn(r) for n, fn in rules} for r in range(tp)]


# ------------------------------------------------------------------ entry points

def expected_ranks(model_dir, layout, tp, ep=False, plan=None):
    """Per rank r, {name: (dtype, shape, bytes)}: exactly the tensors of rank r's
    files.  plan: (pattern, style) rules for a DTensor split with --plan (the
    model's family then does not matter)."""
    config, tensors = so.load_checkpoint(model_dir)
    return expected_ranks_from(config, tensors, layout, tp, ep, plan)


def expected_ranks_from(config, tensors, layout, tp, ep=False, plan=None):
    if plan is not None:
        if layout != "dtensor":
            raise Unsupported("--plan is a DTensor plan")
        return dtensor_ranks(tensors, plan, tp)
    ok, why = accepts(config, tp, layout, ep, tensors)
    if not ok:
        raise Rejected(why)
    fam = family_of(config)
    if layout == "dtensor":
        return dtensor_ranks(tensors, dtensor_rules(fam), tp)
    if fam == "mistral":
        raise Unsupported("serving_oracle.py covers Mistral's serving layouts")
    return _serving(config, tensors, layout, tp, ep)


# ------------------------------------------------------------------ generators

def _data(rng, dtype, shape):
    n = 1
    for d in shape:
        n *= d
    f = (rng.random(n, dtype=np.float32) * 2 - 1).astype("<f4")
    if dtype == "F32":
        return f.tobytes()
    if dtype == "BF16":
        return (f.view("<u4") >> 16).astype("<u2").tobytes()  # truncation stays in [-1, 1)
    if dtype == "F16":
        return f.astype("<f2").tobytes()
    raise ValueError(f"dtype {dtype}")


def write_model(out, shapes, config, dtype="BF16", seed=0, index=0):
    """shapes: {name: shape}.  Reference safetensors layout (testdata/gen.py's
    writer), deterministic bytes, config.json beside."""
    rng = np.random.default_rng(seed)
    tensors = {n: (dtype, list(shapes[n]), _data(rng, dtype, shapes[n])) for n in sorted(shapes)}
    gen.write_checkpoint(out, tensors, index)
    config = dict(config)
    config.setdefault("torch_dtype", gen.TORCH_DTYPE.get(dtype, "bfloat16"))
    with open(os.path.join(out, "config.json"), "w") as f:
        f.write(json.dumps(config, indent=2) + "\n")
    return out


def phi3_checkpoint(out, hidden=64, heads=4, kv_heads=2, inter=96, vocab=256, layers=2,
                    tied=False, dtype="BF16", seed=0, index=0, qkv_extra_rows=0):
    """Phi3ForCausalLM (Phi-3/3.5 mini, Phi-4-mini with tied=True): packed
    self_attn.qkv_proj [(A+2K)*D, H] = [q; k; v] and mlp.gate_up_proj [2I, H] =
    [gate; up], head_dim = hidden / heads (Phi3Config has no head_dim field).
    qkv_extra_rows: a checkpoint whose packed rows disagree with its config."""
    H, A, K, I, V, L = hidden, heads, kv_heads, inter, vocab, layers
    D = H // A
    s = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    for i in range(L):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = (H,)
        s[p + "self_attn.qkv_proj.weight"] = ((A + 2 * K) * D + qkv_extra_rows, H)
        s[p + "self_attn.o_proj.weight"] = (H, A * D)
        s[p + "post_attention_layernorm.weight"] = (H,)
        s[p + "mlp.gate_up_proj.weight"] = (2 * I, H)
        s[p + "mlp.down_proj.weight"] = (H, I)
    if not tied:
        s["lm_head.weight"] = (V, H)
    cfg = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": H,
           "num_attention_heads": A, "num_key_value_heads": K, "intermediate_size": I,
           "vocab_size": V, "num_hidden_layers": L, "hidden_act": "silu",
           "max_position_embeddings": 4096, "original_max_position_embeddings": 4096,
           "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 2047,
           "tie_word_embeddings": bool(tied), "bos_token_id": 1, "eos_token_id": 32000,
           "pad_token_id": 32000}
    if tied:
        cfg["partial_rotary_factor"] = 0.75  # Phi-4-mini
    return write_model(out, s, cfg, dtype, seed, index)


def qwen3_moe_checkpoint(out, hidden=32, heads=4, kv_heads=2, head_dim=8, experts=8,
                         moe_inter=16, inter=48, top_k=2, vocab=256, layers=2, mlp_only_layers=(),
                         decoder_sparse_step=1, tied=False, dtype="BF16", seed=0, index=0):
    """Qwen3MoeForCausalLM: router mlp.gate [E, H], experts
    mlp.experts.{e}.gate_proj/up_proj [moe_inter, H] and down_proj [H, moe_inter];
    layers in mlp_only_layers (or off the decoder_sparse_step) have a dense
    mlp.gate_proj/up_proj/down_proj of intermediate_size."""
    H, A, K, D, E, MI, I, V, L = hidden, heads, kv_heads, head_dim, experts, moe_inter, inter, vocab, layers
    s = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    for i in range(L):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = (H,)
        s[p + "self_attn.q_proj.weight"] = (A * D, H)
        s[p + "self_attn.k_proj.weight"] = (K * D, H)
        s[p + "self_attn.v_proj.weight"] = (K * D, H)
        s[p + "self_attn.o_proj.weight"] = (H, A * D)
        s[p + "self_attn.q_norm.weight"] = (D,)
        s[p + "self_attn.k_norm.weight"] = (D,)
        s[p + "post_attention_layernorm.weight"] = (H,)
        if i not in mlp_only_layers and E > 0 and (i + 1) % decoder_sparse_step == 0:
            s[p + "mlp.gate.weight"] = (E, H)
            for e in range(E):
                s[p + f"mlp.experts.{e}.gate_proj.weight"] = (MI, H)
                s[p + f"mlp.experts.{e}.up_proj.weight"] = (MI, H)
                s[p + f"mlp.experts.{e}.down_proj.weight"] = (H, MI)
        else:
            s[p + "mlp.gate_proj.weight"] = (I, H)
            s[p + "mlp.up_proj.weight"] = (I, H)
            s[p + "mlp.down_proj.weight"] = (H, I)
    if not tied:
        s["lm_head.weight"] = (V, H)
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": H,
           "num_attention_heads": A, "num_key_value_heads": K, "head_dim": D,
           "intermediate_size": I, "moe_intermediate_size": MI, "num_experts": E,
           "num_experts_per_tok": top_k, "norm_topk_prob": True,
           "decoder_sparse_step": decoder_sparse_step, "mlp_only_layers": list(mlp_only_layers),
           "vocab_size": V, "num_hidden_layers": L, "hidden_act": "silu", "attention_bias": False,
           "max_position_embeddings": 4096, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
           "tie_word_embeddings": bool(tied), "output_router_logits": False}
    return write_model(out, s, cfg, dtype, seed, index)


def mixtral_checkpoint(out, hidden=32, heads=4, kv_heads=2, experts=8, inter=16, top_k=2,
                       vocab=256, layers=2, head_dim=None, dtype="BF16", seed=0, index=0):
    """MixtralForCausalLM: router block_sparse_moe.gate [E, H], experts
    block_sparse_moe.experts.{e}.w1 (gate) / w3 (up) [inter, H], w2 (down) [H, inter].
    head_dim: written to config.json (and used for q/k/v rows) when given."""
    H, A, K, E, I, V, L = hidden, heads, kv_heads, experts, inter, vocab, layers
    D = head_dim or H // A
    s = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H)}
    for i in range(L):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = (H,)
        s[p + "self_attn.q_proj.weight"] = (A * D, H)
        s[p + "self_attn.k_proj.weight"] = (K * D, H)
        s[p + "self_attn.v_proj.weight"] = (K * D, H)
        s[p + "self_attn.o_proj.weight"] = (H, A * D)
        s[p + "post_attention_layernorm.weight"] = (H,)
        s[p + "block_sparse_moe.gate.weight"] = (E, H)
        for e in range(E):
            s[p + f"block_sparse_moe.experts.{e}.w1.weight"] = (I, H)
            s[p + f"block_sparse_moe.experts.{e}.w2.weight"] = (H, I)
            s[p + f"block_sparse_moe.experts.{e}.w3.weight"] = (I, H)
    cfg = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": H,
           "num_attention_heads": A, "num_key_value_heads": K, "intermediate_size": I,
           "num_local_experts": E, "num_experts_per_tok": top_k, "vocab_size": V,
           "num_hidden_layers": L, "hidden_act": "silu", "max_position_embeddings": 4096,
           "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": None,
           "tie_word_embeddings": False, "router_aux_loss_coef": 0.02}
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    return write_model(out, s, cfg, dtype, seed, index)


# A family no built-in plan serves: LLaMA's shapes under other module names.
USER_RULES = [
    ("foo.tok_embeddings", "embedding_rowwise"),
    ("foo.blocks.*.attn.wq", "colwise"),
    ("foo.blocks.*.attn.wk", "colwise"),
    ("foo.blocks.*.attn.wv", "colwise"),
    ("foo.blocks.*.attn.wo", "rowwise"),
    ("foo.blocks.*.ffn.w_gate", "colwise"),
    ("foo.blocks.*.ffn.w_in", "colwise"),
    ("foo.blocks.*.ffn.w_out", "rowwise"),
    ("output", "colwise"),
]

USER_PLAN = """\
# A plan for FooForCausalLM, which no built-in plan serves (format: man 5 tpshard-plan).
name: foo
description: "FooForCausalLM: LLaMA-shaped, its own module names"
serves:
  architectures: [FooForCausalLM]
  model_types: [foo]
rules:
  - match: foo.tok_embeddings
    style: embedding_rowwise
  - match: [foo.blocks.*.attn.wq, foo.blocks.*.attn.wk, foo.blocks.*.attn.wv]
    style: colwise
  - match: foo.blocks.*.attn.wo
    style: rowwise
  - match: [foo.blocks.*.ffn.w_gate, foo.blocks.*.ffn.w_in]
    style: colwise
  - match: foo.blocks.*.ffn.w_out
    style: rowwise
  - match: output
    style: colwise
checks:
  - divisible: n_heads
    reason: "wq rows and wo columns must split on whole heads"
  - divisible: n_kv_heads
    reason: "wk and wv rows must split on whole KV heads"
"""


def user_checkpoint(out, dim=32, n_heads=4, n_kv_heads=2, ffn=40, vocab=100, layers=2,
                    dtype="BF16", seed=0, index=0):
    """FooForCausalLM: foo.tok_embeddings, foo.blocks.{i}.attn.wq/wk/wv/wo (+ bias on
    wq/wk/wv), ffn.w_gate/w_in/w_out, attn_norm, ffn_norm, foo.final_norm, output."""
    D = dim // n_heads
    s = {"foo.tok_embeddings.weight": (vocab, dim), "foo.final_norm.weight": (dim,),
         "output.weight": (vocab, dim)}
    for i in range(layers):
        p = f"foo.blocks.{i}."
        s[p + "attn_norm.weight"] = (dim,)
        s[p + "attn.wq.weight"] = (n_heads * D, dim)
        s[p + "attn.wq.bias"] = (n_heads * D,)
        s[p + "attn.wk.weight"] = (n_kv_heads * D, dim)
        s[p + "attn.wk.bias"] = (n_kv_heads * D,)
        s[p + "attn.wv.weight"] = (n_kv_heads * D, dim)
        s[p + "attn.wv.bias"] = (n_kv_heads * D,)
        s[p + "attn.wo.weight"] = (dim, n_heads * D)
        s[p + "attn.wo.bias"] = (dim,)
        s[p + "ffn_norm.weight"] = (dim,)
        s[p + "ffn.w_gate.weight"] = (ffn, dim)
        s[p + "ffn.w_in.weight"] = (ffn, dim)
        s[p + "ffn.w_out.weight"] = (dim, ffn)
    cfg = {"architectures": ["FooForCausalLM"], "model_type": "foo", "dim": dim,
           "n_heads": n_heads, "n_kv_heads": n_kv_heads, "ffn_dim": ffn, "vocab_size": vocab,
           "n_layers": layers}
    return write_model(out, s, cfg, dtype, seed, index)


def user_accepts(config, tp):
    """The user plan's checks: n_heads % tp, n_kv_heads % tp."""
    for f in ("n_heads", "n_kv_heads"):
        if config[f] % tp:
            return False, f"{f} ({config[f]}) is not divisible by tp {tp}"
    return True, ""
