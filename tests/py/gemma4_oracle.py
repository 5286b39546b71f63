"""Independent oracle for Gemma 4 text models in `tpshard split --layout vllm`.

What vLLM 0.33's Gemma4ForCausalLM (models/gemma4.py) holds on each
tensor-parallel rank when it loads a checkpoint with load_format="sharded_state":
the keys of `_filter_subtensors(model.state_dict())`, with dtypes, shapes and
bytes.  Read from the engine's model code, never from tpshard's sources; Python
standard library and numpy only.  The facts it encodes:

- Gemma4Attention: non-KV-shared layers fuse q/k/v into `self_attn.qkv_proj`
  (QKVParallelLinear, whole heads, fewer KV heads than ranks replicated); a
  full-attention layer of an `attention_k_eq_v` model has no v_proj and its
  k_proj is loaded into both the K and the V slot (_gemma4_layer_weights_mapper);
  KV-shared layers (the last num_kv_shared_layers) build only `q_proj`
  (ColumnParallelLinear, rows split) and no k_norm, and the checkpoint's
  k_proj/v_proj/k_norm of those layers are mapped to None.  Head size and KV
  heads are the layer's own (config.per_layer_config: head_dim/global_head_dim,
  num_key_value_heads/num_global_key_value_heads on full-attention layers when
  attention_k_eq_v).  Every attention registers the F32 0-dim buffers
  `attn._k_scale/_v_scale/_q_scale/_prob_scale` = 1.0.
- Gemma4MLP: gate/up fused into `mlp.gate_up_proj`; the intermediate size is
  doubled on KV-shared layers when use_double_wide_mlp is set.
- Gemma4Model: `embed_tokens` and `embed_tokens_per_layer` are
  VocabParallelEmbedding (rows padded to a multiple of 64, zeros past the
  vocabulary; the per-layer table's vocabulary is vocab_size_per_layer_input);
  `per_layer_model_projection` is ColumnParallelLinear (its rows split);
  `per_layer_projection_norm`, each layer's `per_layer_input_gate`,
  `per_layer_projection`, `post_per_layer_input_norm`, every norm and the
  persistent `layer_scalar` buffer are whole on every rank.
- The decoder layers are registered three times (model.layers, and
  model.self_decoder.decoder_layers / model.cross_decoder.decoder_layers split at
  the first KV-shared layer); _filter_subtensors keeps the smallest name, so the
  KV-shared layers are written as `model.cross_decoder.decoder_layers.{i - first}`.
- Tied (Gemma4TextConfig's default): only `lm_head.weight` (the embedding).

    make_checkpoint(outdir, **shape) -> outdir
    expected_ranks(model_dir, tp) -> [{name: (dtype, shape, bytes)} per rank]
"""
import json
import os
import re

import numpy as np

from serving_oracle import load_checkpoint, Rejected  # the safetensors reader only

VOCAB_PADDING = 64  # layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE
ATTN_BUFFERS = ("_k_scale", "_v_scale", "_q_scale", "_prob_scale")


# ------------------------------------------------------------------ tiny checkpoints

def _bf16(rng, shape):
    """Random BF16 bytes (finite values)."""
    f = rng.standard_normal(int(np.prod(shape))).astype(np.float32)
    return (f.view(np.uint32) >> 16).astype(np.uint16).tobytes()


def _write(outdir, tensors, config):
    os.makedirs(outdir, exist_ok=True)
    hdr, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name in sorted(tensors):
        dt, shape, data = tensors[name]
        hdr[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(outdir, "model.safetensors"), "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))
    with open(os.path.join(outdir, "config.json"), "w") as f:
        f.write(json.dumps(config, indent=2) + "\n")
    return outdir


VISION = dict(hidden=32, inter=64, heads=2, head_dim=16, layers=1, positions=16, patch=4)


def _vision_tensors(add, prefix, H_text):
    """The tensors of transformers' Gemma4VisionModel (and its embedder into
    the text model) for the VISION sizes, under prefix."""
    v = VISION
    h = v["hidden"]
    add(prefix + "vision_tower.patch_embedder.position_embedding_table", 2, v["positions"], h)
    add(prefix + "vision_tower.patch_embedder.input_proj.weight", h, 3 * v["patch"] ** 2)
    for i in range(v["layers"]):
        p = f"{prefix}vision_tower.encoder.layers.{i}."
        for m in ("q_proj", "k_proj", "v_proj", "o_proj"):
            add(p + f"self_attn.{m}.linear.weight", h, h)
        add(p + "self_attn.q_norm.weight", v["head_dim"])
        add(p + "self_attn.k_norm.weight", v["head_dim"])
        add(p + "mlp.gate_proj.linear.weight", v["inter"], h)
        add(p + "mlp.up_proj.linear.weight", v["inter"], h)
        add(p + "mlp.down_proj.linear.weight", h, v["inter"])
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            add(p + n + ".weight", h)
    add(prefix + "embed_vision.embedding_projection.weight", H_text, h)


def make_checkpoint(outdir, hidden=64, heads=4, kv_heads=2, head_dim=16, global_head_dim=32,
                    global_kv_heads=1, inter=96, vocab=250, vocab_pl=200, layers=4, ple=8,
                    kv_shared=2, k_eq_v=True, double_wide=True, ship_shared_kv=False,
                    tied=True, per_layer_config=False, multimodal=False, seed=0, experts=0,
                    moe_inter=0):
    """A Gemma4ForCausalLM checkpoint (model_type gemma4_text, tensors model.*):
    layers alternate sliding/full attention (the last one full), the last
    kv_shared share KV, ple the per-layer input width (0: none). With
    per_layer_config the full layers' sizes are said there (transformers 5's
    form) instead of in global_head_dim / num_global_key_value_heads. With
    multimodal, a Gemma4ForConditionalGeneration: the text model's tensors under
    model.language_model., a vision tower and its embedder, the text config
    under text_config."""
    rng = np.random.default_rng(seed)
    H, L = hidden, layers
    types = ["full_attention" if (i % 2 == 1 or i == L - 1) else "sliding_attention"
             for i in range(L)]
    first_shared = L - kv_shared
    t = {}

    def add(name, *shape):
        if multimodal and name.startswith("model."):
            name = "model.language_model." + name[len("model."):]
        t[name] = ("BF16", list(shape), _bf16(rng, shape))

    add("model.embed_tokens.weight", vocab, H)
    if ple:
        add("model.embed_tokens_per_layer.weight", vocab_pl, L * ple)
        add("model.per_layer_model_projection.weight", L * ple, H)
        add("model.per_layer_projection_norm.weight", ple)
    for i in range(L):
        p = f"model.layers.{i}."
        full = types[i] == "full_attention"
        hd = global_head_dim if full else head_dim
        kv = global_kv_heads if (full and k_eq_v and global_kv_heads) else kv_heads
        shared = i >= first_shared
        I = inter * (2 if (double_wide and shared and kv_shared) else 1)
        add(p + "input_layernorm.weight", H)
        add(p + "post_attention_layernorm.weight", H)
        add(p + "pre_feedforward_layernorm.weight", H)
        add(p + "post_feedforward_layernorm.weight", H)
        add(p + "layer_scalar", 1)
        add(p + "self_attn.q_proj.weight", heads * hd, H)
        add(p + "self_attn.q_norm.weight", hd)
        if not shared or ship_shared_kv:
            add(p + "self_attn.k_proj.weight", kv * hd, H)
            add(p + "self_attn.k_norm.weight", hd)
            if not (full and k_eq_v) or shared:
                add(p + "self_attn.v_proj.weight", kv * hd, H)
        add(p + "self_attn.o_proj.weight", H, heads * hd)
        add(p + "mlp.gate_proj.weight", I, H)
        add(p + "mlp.up_proj.weight", I, H)
        add(p + "mlp.down_proj.weight", H, I)
        if ple:
            add(p + "per_layer_input_gate.weight", ple, H)
            add(p + "per_layer_projection.weight", H, ple)
            add(p + "post_per_layer_input_norm.weight", H)
        if experts:  # the 26B-A4B style MoE block beside the dense MLP (Gemma4TextExperts)
            add(p + "router.proj.weight", experts, H)
            add(p + "router.scale", H)
            add(p + "router.per_expert_scale", experts)
            add(p + "experts.gate_up_proj", experts, 2 * moe_inter, H)
            add(p + "experts.down_proj", experts, H, moe_inter)
            for n in ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2",
                      "pre_feedforward_layernorm_2"):
                add(p + n + ".weight", H)
    add("model.norm.weight", H)
    if not tied:
        add("lm_head.weight", vocab, H)
    config = {
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "hidden_size": H,
        "intermediate_size": inter,
        "num_hidden_layers": L,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "global_head_dim": global_head_dim,
        "num_global_key_value_heads": global_kv_heads if k_eq_v else None,
        "attention_k_eq_v": k_eq_v,
        "layer_types": types,
        "num_kv_shared_layers": kv_shared,
        "use_double_wide_mlp": double_wide,
        "hidden_size_per_layer_input": ple,
        "vocab_size": vocab,
        "vocab_size_per_layer_input": vocab_pl,
        "max_position_embeddings": 512,
        "sliding_window": 64,
        "rms_norm_eps": 1e-6,
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": tied,
        "torch_dtype": "bfloat16",
        "enable_moe_block": bool(experts),
    }
    if experts:
        config.update({"num_experts": experts, "top_k_experts": 2, "moe_intermediate_size": moe_inter})
    if multimodal:
        def add_raw(name, *shape):
            t[name] = ("BF16", list(shape), _bf16(rng, shape))
        _vision_tensors(add_raw, "model.", H)
    if per_layer_config:
        del config["global_head_dim"], config["num_global_key_value_heads"]
        config["per_layer_config"] = {
            str(i): {"head_dim": global_head_dim,
                     **({"num_key_value_heads": global_kv_heads} if k_eq_v else {})}
            for i in range(L) if types[i] == "full_attention"}
    if multimodal:
        v = VISION
        text = {k: val for k, val in config.items() if k not in ("architectures", "torch_dtype")}
        config = {
            "architectures": ["Gemma4ForConditionalGeneration"],
            "model_type": "gemma4",
            "torch_dtype": "bfloat16",
            "tie_word_embeddings": tied,
            "text_config": text,
            "vision_config": {"model_type": "gemma4_vision", "hidden_size": v["hidden"],
                              "intermediate_size": v["inter"], "num_hidden_layers": v["layers"],
                              "num_attention_heads": v["heads"],
                              "num_key_value_heads": v["heads"], "head_dim": v["head_dim"],
                              "position_embedding_size": v["positions"],
                              "patch_size": v["patch"], "pooling_kernel_size": 2},
            "audio_config": None,
        }
    return _write(outdir, t, config)


# ------------------------------------------------------------------ the engine's state per rank

def _cfg(config, field, default=None):
    v = config.get(field)
    if v is None and isinstance(config.get("text_config"), dict):
        v = config["text_config"].get(field)
    return default if v is None else v


def layer_geometry(config, i):
    """(kv heads, head_dim) of layer i as Gemma4TextConfig gives vLLM's
    per_layer_config: per_layer_config[i] when it says, else the global
    fields on full-attention layers (global_head_dim always, the global KV
    heads when attention_k_eq_v), else the config's own."""
    types = _cfg(config, "layer_types")
    plc = _cfg(config, "per_layer_config") or {}
    over = plc.get(str(i)) or plc.get(f"{i:02d}") or {}
    full = types[i] == "full_attention"
    kv, hd = _cfg(config, "num_key_value_heads"), _cfg(config, "head_dim")
    if full:
        hd = _cfg(config, "global_head_dim", hd)
        if _cfg(config, "attention_k_eq_v", False) and _cfg(config, "num_global_key_value_heads"):
            kv = _cfg(config, "num_global_key_value_heads")
    return over.get("num_key_value_heads", kv), over.get("head_dim", hd)


def _rows(t, lo, hi):
    """Rows [lo, hi) of a (dtype, shape, bytes) tensor, as raw bytes."""
    dt, shape, data = t
    row = len(data) // shape[0]
    return data[lo * row:hi * row]


def _cols(t, lo, hi):
    dt, shape, data = t
    item = len(data) // (shape[0] * shape[1])
    a = np.frombuffer(data, dtype=np.uint8).reshape(shape[0], shape[1] * item)
    return np.ascontiguousarray(a[:, lo * item:hi * item]).tobytes()


def _f32(t):
    """A scale as F32 (vLLM 0.33 holds every scale so): (dtype, shape, bytes)."""
    dt, shape, data = t
    if dt == "F32":
        return t
    if dt == "BF16":
        v = (np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        return ("F32", shape, v.astype("<f4").tobytes())
    raise ValueError(f"scale dtype {dt}")


def _heads(heads, hd, tp, r, replicate):
    """Rank r's rows [lo, hi) of a projection of `heads` heads of hd rows:
    its heads, or (fewer heads than ranks) head r // (tp // heads) whole."""
    if heads >= tp:
        if heads % tp:
            raise Rejected(f"heads {heads} % tp {tp}")
        n = heads // tp
        return r * n * hd, (r + 1) * n * hd
    if not replicate or tp % heads:
        raise Rejected(f"tp {tp} % heads {heads}")
    h = r // (tp // heads)
    return h * hd, (h + 1) * hd


def _even(n, tp, r):
    if n % tp:
        raise Rejected(f"{n} % tp {tp}")
    return r * (n // tp), (r + 1) * (n // tp)


class _Lin:
    """A checkpoint linear (weight, and its FP8 scale: block weight_scale_inv
    or per-channel compressed-tensors weight_scale [out, 1])."""

    def __init__(self, t, module, block):
        self.w = t[module + ".weight"]
        self.block = block
        self.scale_name = None
        for leaf in ("weight_scale_inv", "weight_scale"):
            if module + "." + leaf in t:
                self.scale_name, self.scale = leaf, _f32(t[module + "." + leaf])

    def rows(self, ranges):
        """The weight's rows of every range in turn, and the scale's."""
        w = b"".join(_rows(self.w, lo, hi) for lo, hi in ranges)
        n = sum(hi - lo for lo, hi in ranges)
        out = {"weight": (self.w[0], [n] + self.w[1][1:], w)}
        if self.scale_name == "weight_scale_inv":
            bn = self.block[0]
            for lo, hi in ranges:
                if lo % bn or hi % bn:
                    raise Rejected(f"rows [{lo}, {hi}) are not whole {bn}-row blocks")
            sb = b"".join(_rows(self.scale, lo // bn, hi // bn) for lo, hi in ranges)
            out[self.scale_name] = ("F32", [n // bn, self.scale[1][1]], sb)
        elif self.scale_name:
            sb = b"".join(_rows(self.scale, lo, hi) for lo, hi in ranges)
            out[self.scale_name] = ("F32", [n, 1], sb)
        return out

    def cols(self, lo, hi):
        out = {"weight": (self.w[0], [self.w[1][0], hi - lo], _cols(self.w, lo, hi))}
        if self.scale_name == "weight_scale_inv":
            bk = self.block[1]
            if lo % bk or hi % bk:
                raise Rejected(f"columns [{lo}, {hi}) are not whole {bk}-column blocks")
            out[self.scale_name] = ("F32", [self.scale[1][0], (hi - lo) // bk],
                                    _cols(self.scale, lo // bk, hi // bk))
        elif self.scale_name:
            out[self.scale_name] = self.scale  # per channel: whole on every rank
        return out

    def whole(self):
        out = {"weight": self.w}
        if self.scale_name:
            out[self.scale_name] = self.scale
        return out


def _put(out, module, parts):
    for leaf, v in parts.items():
        out[module + "." + leaf] = v


def _vocab(t, tp, r):
    """Rank r's rows of a vocabulary: padded to a multiple of 64, Vp / tp rows a
    rank, its real rows then zeros."""
    dt, shape, data = t
    padded = -(-shape[0] // VOCAB_PADDING) * VOCAB_PADDING
    if padded % tp:
        raise Rejected(f"padded vocabulary {padded} % tp {tp}")
    per = padded // tp
    lo, hi = r * per, min((r + 1) * per, shape[0])
    real = _rows(t, lo, hi) if hi > lo else b""
    row = len(data) // shape[0]
    return (dt, [per] + shape[1:], real + b"\0" * (per * row - len(real)))


def _scalar(dtype, value, shape):
    if dtype == "F32":
        b = np.float32(value).tobytes()
    else:  # BF16
        b = (np.array([value], dtype=np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
    return (dtype, shape, b * (shape[0] if shape else 1))


def attention_entries(config):
    """What vLLM 0.33's Attention registers beside every attention layer: the
    F32 0-dim _k/_v/_q/_prob_scale buffers (1.0), and for FP8 checkpoints
    the KV-cache scale parameters (quantization/kv_cache.py: fp8 0-dim in the
    model's dtype at -1.0; compressed-tensors [1] F32 scales 1.0 and zero
    points 0 in the model's dtype)."""
    out = {"attn." + b: ("F32", [], np.float32(1.0).tobytes()) for b in ATTN_BUFFERS}
    qm = (config.get("quantization_config") or {}).get("quant_method")
    if qm == "fp8":
        for n in ("q_scale", "k_scale", "v_scale", "prob_scale"):
            out["attn." + n] = _scalar("BF16", -1.0, [])
    elif qm == "compressed-tensors":
        for n in ("k_scale", "v_scale", "q_scale"):
            out["attn." + n] = _scalar("F32", 1.0, [1])
        for n in ("k_zero_point", "v_zero_point", "q_zero_point"):
            out["attn." + n] = _scalar("BF16", 0.0, [1])
    return out


def dropped(config, names):
    """The checkpoint tensors vLLM's weights mapper skips: a KV-shared
    layer's k_proj, v_proj and k_norm."""
    L = _cfg(config, "num_hidden_layers")
    first = L - (_cfg(config, "num_kv_shared_layers", 0) or 0)
    out = []
    for n in names:
        m = re.match(r"model\.(?:language_model\.)?layers\.(\d+)\.self_attn\."
                     r"(?:k_proj|v_proj|k_norm)\.", n)
        if m and int(m.group(1)) >= first:
            out.append(n)
    return out


_NP = {"BF16": np.uint16, "F16": np.uint16, "F8_E4M3": np.uint8, "F32": np.float32}


def _arr3(t, name):
    dt, sh, raw = t[name]
    return np.frombuffer(raw, _NP[dt]).reshape(sh)


def _experts(t, src, E):
    """A MoE layer's experts as [E, 2I, H] gate-then-up rows and [E, H, I] down,
    with their block scales ([E, 2I/bn, H/bk], [E, H/bn, I/bk]) or None, and the
    weights' dtype: from the fused 3-D tensors or the per-expert 2-D ones."""
    if src + "experts.gate_up_proj" in t:
        gu, dn = _arr3(t, src + "experts.gate_up_proj"), _arr3(t, src + "experts.down_proj")
        wdt = t[src + "experts.gate_up_proj"][0]
        sn = src + "experts.gate_up_proj_scale_inv"
        gus = _arr3(t, sn) if sn in t else None
        dns = _arr3(t, src + "experts.down_proj_scale_inv") if sn in t else None
        return gu, gus, dn, dns, wdt
    pe = src + "experts.{}.{}.{}"
    wdt = t[pe.format(0, "gate_proj", "weight")][0]
    gu = np.stack([np.concatenate([_arr3(t, pe.format(e, "gate_proj", "weight")),
                                   _arr3(t, pe.format(e, "up_proj", "weight"))]) for e in range(E)])
    dn = np.stack([_arr3(t, pe.format(e, "down_proj", "weight")) for e in range(E)])
    if pe.format(0, "gate_proj", "weight_scale_inv") not in t:
        return gu, None, dn, None, wdt
    gus = np.stack([np.concatenate([_arr3(t, pe.format(e, "gate_proj", "weight_scale_inv")),
                                    _arr3(t, pe.format(e, "up_proj", "weight_scale_inv"))])
                    for e in range(E)])
    dns = np.stack([_arr3(t, pe.format(e, "down_proj", "weight_scale_inv")) for e in range(E)])
    return gu, gus, dn, dns, wdt


def expected_ranks(model_dir, tp):
    _config, t = load_checkpoint(model_dir)
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    E = _cfg(config, "num_experts") or 0
    MI = _cfg(config, "moe_intermediate_size") or 0
    if E and MI % tp:
        raise Rejected(f"moe_intermediate_size {MI} % tp {tp}")
    qc = config.get("quantization_config") or {}
    block = qc.get("weight_block_size")
    A = _cfg(config, "num_attention_heads")
    L = _cfg(config, "num_hidden_layers")
    first = L - (_cfg(config, "num_kv_shared_layers", 0) or 0)
    k_eq_v = bool(_cfg(config, "attention_k_eq_v", False))
    types = _cfg(config, "layer_types")
    tied = _cfg(config, "tie_word_embeddings", True)
    if A % tp:
        raise Rejected(f"num_attention_heads {A} % tp {tp}")
    skip = set(dropped(config, t))
    whole_norms = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                   "post_feedforward_layernorm", "post_per_layer_input_norm",
                   "self_attn.q_norm", "self_attn.k_norm")
    attn = attention_entries(config)
    ranks = [dict() for _ in range(tp)]
    # Gemma4ForConditionalGeneration (models/gemma4_mm.py hf_to_vllm_mapper): the text model
    # model.language_model. -> language_model.model., lm_head -> language_model.lm_head, the
    # vision tower and its embedder whole at the top (model.vision_tower -> vision_tower)
    mm = "text_config" in config
    SP, DP = ("model.language_model.", "language_model.model.") if mm else ("model.", "model.")
    HEAD = "language_model.lm_head.weight" if mm else "lm_head.weight"
    tower = {n: v for n, v in t.items()
             if n.startswith(("model.vision_tower.", "model.embed_vision."))} if mm else {}

    def lin(module):
        return _Lin(t, module, block)

    for r in range(tp):
        out = ranks[r]
        for n, v in tower.items():
            out[n[len("model."):]] = v
        for top in ("norm.weight", "per_layer_projection_norm.weight"):
            if SP + top in t:
                out[DP + top] = t[SP + top]
        emb = t[SP + "embed_tokens.weight"]
        if tied:
            out[HEAD] = _vocab(emb, tp, r)
        else:
            out[DP + "embed_tokens.weight"] = _vocab(emb, tp, r)
            out[HEAD] = _vocab(t["lm_head.weight"], tp, r)
        if SP + "embed_tokens_per_layer.weight" in t:
            out[DP + "embed_tokens_per_layer.weight"] = _vocab(
                t[SP + "embed_tokens_per_layer.weight"], tp, r)
            p = lin(SP + "per_layer_model_projection")
            _put(out, DP + "per_layer_model_projection", p.rows([_even(p.w[1][0], tp, r)]))
        for i in range(L):
            src = f"{SP}layers.{i}."
            dst = f"{DP}layers.{i}." if i < first else \
                f"{DP}cross_decoder.decoder_layers.{i - first}."
            kv, hd = layer_geometry(config, i)
            for a in whole_norms:
                if src + a + ".weight" in t and src + a + ".weight" not in skip:
                    out[dst + a + ".weight"] = t[src + a + ".weight"]
            for a in ("per_layer_input_gate", "per_layer_projection"):  # ReplicatedLinear
                if src + a + ".weight" in t:
                    _put(out, dst + a, lin(src + a).whole())
            out[dst + "layer_scalar"] = t[src + "layer_scalar"]
            q = lin(src + "self_attn.q_proj")
            if q.w[1][0] != A * hd:
                raise Rejected(f"layer {i}: q_proj rows {q.w[1][0]} != heads x head_dim")
            qr = _heads(A, hd, tp, r, False)
            if i < first:
                k = lin(src + "self_attn.k_proj")
                # k_eq_v full-attention layers: k_proj loaded into the K and the V slot
                v = k if (k_eq_v and types[i] == "full_attention") else \
                    lin(src + "self_attn.v_proj")
                if k.w[1][0] != kv * hd:
                    raise Rejected(f"layer {i}: k_proj rows {k.w[1][0]} != kv x head_dim")
                kr = _heads(kv, hd, tp, r, True)
                parts = [q.rows([qr]), k.rows([kr]), v.rows([kr])]
                fused = {"weight": (q.w[0], [sum(x["weight"][1][0] for x in parts)] + q.w[1][1:],
                                    b"".join(x["weight"][2] for x in parts))}
                if q.scale_name:
                    sc = [x[q.scale_name] for x in parts]
                    fused[q.scale_name] = ("F32", [sum(x[1][0] for x in sc)] + sc[0][1][1:],
                                           b"".join(x[2] for x in sc))
                _put(out, dst + "self_attn.qkv_proj", fused)
            else:
                _put(out, dst + "self_attn.q_proj", q.rows([qr]))
            _put(out, dst + "self_attn", attn)
            o = lin(src + "self_attn.o_proj")
            _put(out, dst + "self_attn.o_proj", o.cols(*_even(o.w[1][1], tp, r)))
            g, u = lin(src + "mlp.gate_proj"), lin(src + "mlp.up_proj")
            gr, ur = g.rows([_even(g.w[1][0], tp, r)]), u.rows([_even(u.w[1][0], tp, r)])
            fused = {leaf: (gr[leaf][0], [gr[leaf][1][0] + ur[leaf][1][0]] + gr[leaf][1][1:],
                            gr[leaf][2] + ur[leaf][2]) for leaf in gr}
            _put(out, dst + "mlp.gate_up_proj", fused)
            d = lin(src + "mlp.down_proj")
            _put(out, dst + "mlp.down_proj", d.cols(*_even(d.w[1][1], tp, r)))
            if E and (src + "experts.gate_up_proj" in t or src + "experts.0.gate_proj.weight" in t):
                # models/gemma4.py: the router whole, the MoE norms whole; the experts'
                # routed_experts.w13_weight [E, 2 I/tp, H] each expert's rank gate rows then
                # up rows, w2_weight [E, H, I/tp] the rank's columns of down_proj. The
                # checkpoint holds them fused in 3-D (experts.gate_up_proj [E, 2I, H],
                # experts.down_proj [E, H, I]) or one 2-D tensor an expert
                # (experts.{e}.gate_proj ...), which vLLM's expert mapping loads alike.
                # Block FP8: the scales [E, rows / 128, cols / 128] (3-D:
                # experts.gate_up_proj_scale_inv; per expert: .weight_scale_inv) follow
                # in whole blocks, F32, as w13_weight_scale_inv / w2_weight_scale_inv.
                for n in ("router.proj.weight", "router.scale", "router.per_expert_scale",
                          "post_feedforward_layernorm_1.weight", "post_feedforward_layernorm_2.weight",
                          "pre_feedforward_layernorm_2.weight"):
                    out[dst + n] = t[src + n]
                gu, gus, dn, dns, wdt = _experts(t, src, E)
                Ir, lo = MI // tp, r * (MI // tp)
                w13 = np.concatenate([gu[:, lo:lo + Ir], gu[:, MI + lo:MI + lo + Ir]], axis=1)
                out[dst + "experts.routed_experts.w13_weight"] = (wdt, list(w13.shape),
                                                                  np.ascontiguousarray(w13).tobytes())
                w2 = dn[:, :, lo:lo + Ir]
                out[dst + "experts.routed_experts.w2_weight"] = (wdt, list(w2.shape),
                                                                 np.ascontiguousarray(w2).tobytes())
                if gus is not None:
                    bn, bk = block
                    if Ir % bn or Ir % bk:
                        raise Rejected(f"the experts' {Ir} rows a rank are not whole {bn}-blocks")
                    b0, nb, Ib = lo // bn, Ir // bn, MI // bn
                    s13 = np.concatenate([gus[:, b0:b0 + nb], gus[:, Ib + b0:Ib + b0 + nb]], axis=1)
                    out[dst + "experts.routed_experts.w13_weight_scale_inv"] = (
                        "F32", list(s13.shape), np.ascontiguousarray(s13).tobytes())
                    s2 = dns[:, :, lo // bk:(lo + Ir) // bk]
                    out[dst + "experts.routed_experts.w2_weight_scale_inv"] = (
                        "F32", list(s2.shape), np.ascontiguousarray(s2).tobytes())
    return ranks
