"""Independent oracle for the serving layouts of `tpshard split --layout vllm|sglang`.

What each tensor-parallel rank's state dict holds when vLLM 0.33 or SGLang
0.5.23 load a checkpoint with load_format="sharded_state": the keys of
`_filter_subtensors(model.state_dict())` of the engine's already TP-sharded
model, with their dtypes, shapes and bytes.  Derived from the engines' model
code (vllm/model_executor/models/{llama,mistral,qwen2,qwen3,gemma3}.py,
layers/linear.py, layers/vocab_parallel_embedding.py,
layers/attention/attention.py; sglang/srt/models/{llama,mistral,qwen2,qwen3,
gemma3_causal}.py, srt/layers/vocab_parallel_embedding.py), never from
tpshard's sources.  Python standard library and numpy only.

    expected_ranks(model_dir, layout, tp) -> [ {name: (dtype, shape, bytes)} per rank ]
    accepts(config, tp, layout) -> (ok, reason)      # reason starts with the config field
    padded_vocab(vocab, tp, layout), vocab_rows(vocab, tp, rank, layout)
    read_safetensors(path), load_checkpoint(model_dir)

Exceptions: Rejected (the engine refuses this model at this tp: the reason
names the config field), Unsupported (this oracle does not model it, e.g. a
checkpoint tensor the engine would silently drop, a family not listed).

Dtypes are the checkpoint's (the engines cast on copy_ with a warning; vLLM
serves float32 checkpoints as bfloat16 with dtype=auto), except the vLLM
attention scale buffers, which are always float32.
"""
import json
import os
import struct

import numpy as np

LAYOUTS = ("vllm", "sglang")

ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1,
            "F8_E4M3FNUZ": 1, "F8_E5M2FNUZ": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
            "I32": 4, "U32": 4, "F32": 4, "C64": 8, "F64": 8, "I64": 8, "U64": 8}

# vllm/model_executor/layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE,
# same constant in sglang/srt/layers/vocab_parallel_embedding.py
VOCAB_PADDING = 64


class Rejected(ValueError):
    """The engine refuses this model at this tp (its divide()/assert fails)."""


class Unsupported(ValueError):
    """Outside what this oracle models."""


# ------------------------------------------------------------------ reading

def read_safetensors(path):
    """(metadata, {name: (dtype, shape, bytes)}) of one safetensors file."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n].decode("utf-8"))
    base = 8 + n
    meta = hdr.pop("__metadata__", None) or {}
    out = {}
    for name, info in hdr.items():
        b, e = info["data_offsets"]
        out[name] = (info["dtype"], list(info["shape"]), raw[base + b:base + e])
    return meta, out


def load_checkpoint(model_dir):
    """(config dict, {name: (dtype, shape, bytes)}) of a Hugging Face model folder
    (model.safetensors, or an index and its parts)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for fn in files:
        _, t = read_safetensors(os.path.join(model_dir, fn))
        for k, v in t.items():
            if k in tensors:
                raise ValueError(f"{k} is in two files")
            tensors[k] = v
    return config, tensors


# ------------------------------------------------------------------ families
#
# One entry per architecture: the bias switches and norms of each engine's
# model class.  Keyed by (architecture, layout); the values are functions of
# the text config so that a field's absence reads as the engine reads it.

def _attn_bias(c):
    # vllm llama.py LlamaDecoderLayer / sglang llama.py: attention_bias or bias
    return bool(c.get("attention_bias", False) or c.get("bias", False))


def _llama_vllm(c):
    qkv = _attn_bias(c)
    if "qkv_bias" in c:  # vllm llama.py: internlm3's qkv_bias overrides q/k/v only
        qkv = bool(c["qkv_bias"])
    return dict(qkv_bias=qkv, o_bias=_attn_bias(c), mlp_bias=bool(c.get("mlp_bias", False)))


FAMILY = {
    # qkv_bias / o_bias / mlp_bias: which biases the engine's modules have.
    # norms: per-layer norms besides input_layernorm and post_attention_layernorm
    # (replicated).  embed: "vocab" (vocab parallel, padded) or "full" (plain
    # nn.Embedding on every rank).
    # head_dim: how the engine derives head_dim from the config.
    ("llama", "vllm"): dict(bias=_llama_vllm, norms=(), embed="vocab", head_dim="config"),
    ("llama", "sglang"): dict(  # sglang LlamaMLP is built with bias=False
        bias=lambda c: dict(qkv_bias=_attn_bias(c), o_bias=_attn_bias(c), mlp_bias=False),
        norms=(), embed="vocab", head_dim="config"),
    ("qwen2", "vllm"): dict(  # vllm qwen2.py: head_dim = hidden // heads, always
        bias=lambda c: dict(qkv_bias=True, o_bias=False, mlp_bias=False),
        norms=(), embed="vocab", head_dim="hidden/heads"),
    ("qwen2", "sglang"): dict(
        bias=lambda c: dict(qkv_bias=True, o_bias=False, mlp_bias=False),
        norms=(), embed="vocab", head_dim="config"),
    ("qwen3", "vllm"): dict(  # vllm qwen3.py: o_proj bias=False whatever attention_bias
        bias=lambda c: dict(qkv_bias=bool(c.get("attention_bias", False)), o_bias=False,
                            mlp_bias=False),
        norms=("self_attn.q_norm", "self_attn.k_norm"), embed="vocab", head_dim="config"),
    ("qwen3", "sglang"): dict(  # sglang qwen3.py: o_proj bias=attention_bias
        bias=lambda c: dict(qkv_bias=bool(c.get("attention_bias", False)),
                            o_bias=bool(c.get("attention_bias", False)), mlp_bias=False),
        norms=("self_attn.q_norm", "self_attn.k_norm"), embed="vocab", head_dim="config"),
    ("gemma3", "vllm"): dict(
        bias=lambda c: dict(qkv_bias=bool(c.get("attention_bias", False)),
                            o_bias=bool(c.get("attention_bias", False)), mlp_bias=False),
        norms=("self_attn.q_norm", "self_attn.k_norm", "pre_feedforward_layernorm",
               "post_feedforward_layernorm"), embed="vocab", head_dim="config"),
    ("gemma3", "sglang"): dict(  # Gemma3TextScaledWordEmbedding(nn.Embedding): not vocab parallel
        bias=lambda c: dict(qkv_bias=bool(c.get("attention_bias", False)),
                            o_bias=bool(c.get("attention_bias", False)), mlp_bias=False),
        norms=("self_attn.q_norm", "self_attn.k_norm", "pre_feedforward_layernorm",
               "post_feedforward_layernorm"), embed="full", head_dim="config"),
}
FAMILY[("mistral", "vllm")] = FAMILY[("llama", "vllm")]      # MistralForCausalLM(LlamaForCausalLM)
FAMILY[("mistral", "sglang")] = FAMILY[("llama", "sglang")]

# transformers' config defaults when config.json has no tie_word_embeddings
TIED_BY_DEFAULT = {"llama": False, "mistral": False, "qwen2": False, "qwen3": False,
                   "gemma3": True}

ARCH = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
        "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3",
        "Gemma3ForCausalLM": "gemma3"}

# Checkpoint tensors every engine skips on a normal load (not in its state).
SKIPPED_SUFFIXES = ("rotary_emb.inv_freq",)

# vllm layers/attention/attention.py set_default_quant_scales(register_buffer=True):
# four 0-dim float32 buffers = 1.0 on every Attention layer, in state_dict().
# SGLang's RadixAttention has none.
VLLM_ATTN_BUFFERS = ("_k_scale", "_v_scale", "_q_scale", "_prob_scale")
F32_ONE = struct.pack("<f", 1.0)

# Per decoder layer: (engine name, kind, Hugging Face sources, switch).
# The prefix model.layers.N. is the same on both sides for these families.
# kind names a sharder in SHARDERS; switch names a key of the family's bias
# dict (the rule applies when it is true), "norms" (one rule per entry of the
# family's norms), or None (always).
LAYER_RULES = [
    ("self_attn.qkv_proj.weight", "qkv",
     ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"), None),
    ("self_attn.qkv_proj.bias", "qkv",
     ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"), "qkv_bias"),
    ("self_attn.o_proj.weight", "row", ("self_attn.o_proj.weight",), None),
    ("self_attn.o_proj.bias", "replicated", ("self_attn.o_proj.bias",), "o_bias"),
    ("mlp.gate_up_proj.weight", "merged", ("mlp.gate_proj.weight", "mlp.up_proj.weight"), None),
    ("mlp.gate_up_proj.bias", "merged", ("mlp.gate_proj.bias", "mlp.up_proj.bias"), "mlp_bias"),
    ("mlp.down_proj.weight", "row", ("mlp.down_proj.weight",), None),
    ("mlp.down_proj.bias", "replicated", ("mlp.down_proj.bias",), "mlp_bias"),
    ("input_layernorm.weight", "replicated", ("input_layernorm.weight",), None),
    ("post_attention_layernorm.weight", "replicated", ("post_attention_layernorm.weight",), None),
    ("{norm}.weight", "replicated", ("{norm}.weight",), "norms"),
]
# vLLM only: 0-dim float32 buffers per layer, no source (see VLLM_ATTN_BUFFERS).
LAYER_BUFFERS = {"vllm": [("self_attn.attn." + b, ("F32", [], F32_ONE)) for b in VLLM_ATTN_BUFFERS],
                 "sglang": []}

# Extension points (not implemented yet):
#  * block-FP8 (quant_method fp8, weight_block_size [128,128]): each linear's
#    `X.weight_scale_inv` follows its weight: column-parallel and fused ones
#    in 128-row blocks per section (qkv: [qS_r; kS_(r//rep); vS_(r//rep)],
#    vllm linear.py adjust_block_scale_shard), row-parallel in 128-column
#    blocks; vLLM keeps them as F32 whatever the checkpoint stored.  Add
#    "qkv_blocks" / "merged_blocks" / "row_blocks" sharders and a rule per
#    linear whose sources are the `.weight_scale_inv` twins of the weight rule's.
#  * compressed-tensors: per-channel `weight_scale` [out,1] follows the weight
#    rows ("qkv"/"merged" on [out,1] work as they are; row-parallel: whole);
#    per-tensor scales become one F32 slot per logical part ("slots" sharder:
#    qkv [3], gate_up [2], o/down [1]); plus the attention's k/v/q_scale and
#    zero points as LAYER_BUFFERS-like entries.
#  * MoE expert stacks (vLLM 0.33): mlp.experts.routed_experts.w13_weight
#    [E, 2*I/tp, H] = per expert [gate_r; up_r], w2_weight [E, H, I/tp]: an
#    "experts_merged" sharder (the "merged" rule on dim 1 of each expert,
#    sources mlp.experts.{e}.gate_proj/up_proj stacked) and "experts_row".
#  * Phi-3 packed qkv_proj / gate_up_proj: a "packed_qkv" kind that cuts the
#    packed tensor into its sections (A*D, K*D, K*D) / (I, I) and hands them
#    to _qkv() / _merged().


def text_config(config):
    """The text model's fields (Gemma3ForCausalLM keeps them top level)."""
    return config.get("text_config") or config


def family_of(config):
    archs = config.get("architectures") or []
    for a in archs:
        if a in ARCH:
            return ARCH[a]
    raise Unsupported(f"architecture {archs} is not one of {sorted(ARCH)}")


def _dims(c, fam, layout):
    H = c["hidden_size"]
    A = c["num_attention_heads"]
    K = c.get("num_key_value_heads") or A
    spec = FAMILY[(fam, layout)]
    if spec["head_dim"] == "hidden/heads":
        D = H // A
    else:
        D = c.get("head_dim") or H // A
    return H, A, K, D, c["intermediate_size"], c["vocab_size"]


# ------------------------------------------------------------------ rules

def padded_vocab(vocab, tp, layout):
    """Rows of the whole padded vocab-parallel table.

    vLLM: ceil(V/64)*64 (pad_vocab_size); it must then divide by tp.
    SGLang: the same, but when that is not a multiple of tp the padding size
    becomes 64*tp (VocabParallelEmbedding.__init__: "Support the case where
    the vocab size is not divisible by the TP size")."""
    pad = VOCAB_PADDING
    if layout == "sglang" and (-(-vocab // pad) * pad) % tp:
        pad *= tp
    return -(-vocab // pad) * pad


def vocab_rows(vocab, tp, rank, layout):
    """(first real row, real rows, rows per rank) of rank's vocab shard:
    rows [r*per, min((r+1)*per, V)) of the real vocabulary, zeros after
    (VocabParallelEmbedding._get_indices and weight_loader's fill_(0))."""
    per = padded_vocab(vocab, tp, layout) // tp
    start = min(rank * per, vocab)
    end = min((rank + 1) * per, vocab)
    return start, end - start, per


def accepts(config, tp, layout="vllm"):
    """(True, "") when the engine builds this model at this tp, else
    (False, reason); the reason starts with the config field at fault."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}")
    if tp < 1:
        return False, f"tp {tp} < 1"
    fam = family_of(config)
    c = text_config(config)
    H, A, K, D, I, V = _dims(c, fam, layout)
    # QKVParallelLinear / *Attention.__init__ asserts
    if A % tp:
        return False, f"num_attention_heads ({A}) is not divisible by tp {tp}"
    if K >= tp and K % tp:
        return False, f"num_key_value_heads ({K}) is not divisible by tp {tp}"
    if K < tp and tp % K:
        return False, (f"num_key_value_heads ({K}) < tp {tp} and tp is not a multiple of it "
                       f"(KV heads are replicated tp/kv times)")
    # MergedColumnParallelLinear: all(output_size % tp == 0)
    if I % tp:
        return False, f"intermediate_size ({I}) is not divisible by tp {tp}"
    if layout == "vllm" and padded_vocab(V, tp, layout) % tp:
        return False, (f"vocab_size ({V}) padded to a multiple of {VOCAB_PADDING} "
                       f"({padded_vocab(V, tp, layout)}) is not divisible by tp {tp}")
    if fam == "qwen2" and layout == "vllm" and c.get("head_dim") not in (None, H // A):
        # vllm qwen2.py Qwen2Attention: head_dim = hidden_size // num_heads
        return False, (f"head_dim ({c['head_dim']}) differs from hidden_size/num_attention_heads "
                       f"({H // A}), which vLLM's Qwen2 uses")
    return True, ""


# ------------------------------------------------------------------ byte slicing

def _arr(t):
    """uint8 view [rows, row_bytes] (1-D tensors: [n, itemsize])."""
    dt, shape, data = t
    if dt not in ITEMSIZE:
        raise Unsupported(f"dtype {dt} (sub-byte) cannot be cut by rows here")
    rows = shape[0] if shape else 1
    a = np.frombuffer(data, dtype=np.uint8)
    return a.reshape(rows, -1) if rows else a.reshape(0, 0)


def _rows(t, start, count):
    dt, shape, data = t
    a = _arr(t)
    return (dt, [count] + list(shape[1:]), a[start:start + count].tobytes())


def _cols(t, start, count):
    dt, shape, data = t
    if len(shape) != 2:
        raise Unsupported(f"column split of a {len(shape)}-dim tensor")
    es = ITEMSIZE[dt]
    a = np.frombuffer(data, dtype=np.uint8).reshape(shape[0], shape[1], es)
    return (dt, [shape[0], count], a[:, start:start + count, :].tobytes())


def _cat0(parts):
    dts = {p[0] for p in parts}
    if len(dts) != 1:
        raise Unsupported(f"fused parts of different dtypes {sorted(dts)}")
    shape = [sum(p[1][0] for p in parts)] + list(parts[0][1][1:])
    return (parts[0][0], shape, b"".join(p[2] for p in parts))


def _zeros_rows(t, count):
    dt, shape, _ = t
    row = ITEMSIZE[dt]
    for d in shape[1:]:
        row *= d
    return (dt, [count] + list(shape[1:]), bytes(row * count))


# ------------------------------------------------------------------ sharders
#
# Each takes the source tensors and (rank, tp, geometry) and returns the
# rank's (dtype, shape, bytes).

def _qkv(q, k, v, r, tp, A, K, D):
    """QKVParallelLinear: [q rows of this rank's heads; its KV head rows for k; for v].
    tp >= K: one KV head per rank, head r // (tp / K) (num_kv_head_replicas)."""
    qh = A // tp
    if tp >= K:
        kh, kstart = 1, r // (tp // K)
    else:
        kh = K // tp
        kstart = r * kh
    return _cat0([_rows(q, r * qh * D, qh * D), _rows(k, kstart * D, kh * D),
                  _rows(v, kstart * D, kh * D)])


def _merged(parts, r, tp):
    """MergedColumnParallelLinear: [part0_r; part1_r; ...], each out/tp rows."""
    out = []
    for p in parts:
        n = p[1][0] // tp
        out.append(_rows(p, r * n, n))
    return _cat0(out)


def _row_parallel(t, r, tp):
    """RowParallelLinear weight: input features (dim 1) split in tp equal parts."""
    n = t[1][1] // tp
    return _cols(t, r * n, n)


def _vocab(t, r, tp, layout):
    """VocabParallelEmbedding / ParallelLMHead: the rank's real rows, then zeros."""
    V = t[1][0]
    start, real, per = vocab_rows(V, tp, r, layout)
    parts = [_rows(t, start, real)]
    if per > real:
        parts.append(_zeros_rows(t, per - real))
    return _cat0(parts)


# kind -> function(sources, rank, geometry) -> (dtype, shape, bytes)
SHARDERS = {
    "qkv": lambda s, r, g: _qkv(s[0], s[1], s[2], r, g["tp"], g["A"], g["K"], g["D"]),
    "merged": lambda s, r, g: _merged(s, r, g["tp"]),
    "row": lambda s, r, g: _row_parallel(s[0], r, g["tp"]),
    "vocab": lambda s, r, g: _vocab(s[0], r, g["tp"], g["layout"]),
    "replicated": lambda s, r, g: s[0],  # whole on every rank (norms, RowParallelLinear biases)
}


# ------------------------------------------------------------------ the state

def expected_ranks(model_dir, layout, tp):
    """Per rank r, {name: (dtype, shape, bytes)}: exactly the tensors of rank
    r's sharded_state files for `layout` ("vllm" or "sglang")."""
    config, tensors = load_checkpoint(model_dir)
    return expected_ranks_from(config, tensors, layout, tp)


def expected_ranks_from(config, tensors, layout, tp):
    ok, why = accepts(config, tp, layout)
    if not ok:
        raise Rejected(why)
    fam = family_of(config)
    c = text_config(config)
    spec = FAMILY[(fam, layout)]
    bias = spec["bias"](c)
    H, A, K, D, I, V = _dims(c, fam, layout)
    L = c["num_hidden_layers"]
    tied = bool(config.get("tie_word_embeddings",
                           c.get("tie_word_embeddings", TIED_BY_DEFAULT[fam])))
    used = set()

    def src(name):
        if name not in tensors:
            raise Unsupported(f"the checkpoint has no {name}")
        used.add(name)
        return tensors[name]

    def expect_shape(name, shape):
        got = tensors[name][1] if name in tensors else None
        if got != list(shape):
            raise Unsupported(f"{name}: shape {got}, the config implies {list(shape)}")

    geo = dict(tp=tp, A=A, K=K, D=D, layout=layout)
    rules = []  # [(engine name, function(rank) -> (dtype, shape, bytes))]

    def add(name, kind, sources):
        ts = [src(x) for x in sources]
        rules.append((name, lambda r, f=SHARDERS[kind], ts=ts: f(ts, r, geo)))

    for nm, shp in (("q_proj", A * D), ("k_proj", K * D), ("v_proj", K * D)):
        for i in range(L):
            expect_shape(f"model.layers.{i}.self_attn.{nm}.weight", (shp, H))
    for i in range(L):
        p = f"model.layers.{i}."
        for name, kind, sources, switch in LAYER_RULES:
            if switch == "norms":
                for n in spec["norms"]:
                    add(p + name.format(norm=n), kind, [p + x.format(norm=n) for x in sources])
            elif switch is None or bias[switch]:
                add(p + name, kind, [p + x for x in sources])
        for name, t in LAYER_BUFFERS[layout]:
            rules.append((p + name, lambda r, t=t: t))
    add("model.norm.weight", "replicated", ["model.norm.weight"])

    # The embedding: vocab parallel (padded), or SGLang Gemma3's plain nn.Embedding.
    table = "vocab" if spec["embed"] == "vocab" else "replicated"
    expect_shape("model.embed_tokens.weight", (V, H))
    if tied:
        # lm_head shares the embedding's Parameter (vLLM tie_weights, SGLang
        # lm_head = model.embed_tokens); _filter_subtensors keeps the smaller
        # key, "lm_head.weight".
        add("lm_head.weight", table, ["model.embed_tokens.weight"])
    else:
        add("model.embed_tokens.weight", table, ["model.embed_tokens.weight"])
        expect_shape("lm_head.weight", (V, H))
        # ParallelLMHead is vocab parallel in every family, SGLang Gemma3's too
        add("lm_head.weight", "vocab", ["lm_head.weight"])

    left = sorted(n for n in tensors if n not in used and not n.endswith(SKIPPED_SUFFIXES))
    if left:
        raise Unsupported(f"{layout} has no place for {len(left)} checkpoint tensor(s), "
                          f"e.g. {left[:3]} (the engine would drop them)")
    names = [n for n, _ in rules]
    if len(set(names)) != len(names):
        raise AssertionError("duplicate rule")
    return [{n: fn(r) for n, fn in rules} for r in range(tp)]
