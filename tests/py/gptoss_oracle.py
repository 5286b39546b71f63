"""Independent oracle for gpt-oss (GptOssForCausalLM), BF16 and MXFP4 experts:
a tiny checkpoint generator with the Hugging Face names, dtypes and shapes the
published checkpoints use, and the rank files each layout must hold.

Derived from the engines' and transformers' own code, never from tpshard's:
  transformers 5.24.0 models/gpt_oss/configuration_gpt_oss.py
      base_model_tp_plan {"embed_tokens": "embedding_rowwise"} and
      modeling_gpt_oss.py GptOssForCausalLM._tp_plan {"lm_head":
      "colwise_gather_output"}: the vocabulary rows of both split as
      torch.chunk does (Shard(0)); nothing else is in the plan, so attention,
      sinks, router and the packed experts (BF16, or the MXFP4 blocks and
      scales of integrations/mxfp4.py Mxfp4GptOssExperts) are replicated.
      GptOssExperts: gate_up_proj [E, H, 2I], gate/up interleaved
      (gate_up[..., ::2] gate, [..., 1::2] up), down_proj [E, I, H].
  vLLM 0.33.0 models/gpt_oss.py GptOssModel._load_weights_mxfp4 and
      _load_unquantized_expert, quantization/mxfp4.py
      GptOssMxfp4MoEMethod.create_weights, layers/fused_moe/oracle/mxfp4.py
      mxfp4_round_up_hidden_size_and_intermediate_size,
      model_executor/model_loader/weight_utils.py load_attention_sink: what
      vllm_ranks() computes (the rank state before
      process_weights_after_loading).
Python standard library and numpy only (plus testdata/gen.py's reference
safetensors writer).

    checkpoint(out, quant="bf16"|"mxfp4", **dims) -> out
    dtensor_ranks(tensors, tp) -> [{name: (dtype, shape, bytes)}] per rank
    vllm_ranks(config, tensors, tp, backend="triton") -> the same, vLLM 0.33
    ROUND_UP: {backend: (hidden multiple, intermediate multiple)}
"""
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(HERE)), "testdata"))
import gen  # noqa: E402

# mxfp4_round_up_hidden_size_and_intermediate_size, per --moe-backend name
# (map_mxfp4_backend), CUDA platform: (hidden multiple, intermediate multiple)
ROUND_UP = {"triton": (1, 64), "triton_unfused": (1, 64), "marlin": (256, 128),
            "flashinfer_trtllm": (256, 128), "flashinfer_cutlass": (128, 128),
            "cutlass": (128, 128), "deep_gemm": (128, 128), "deepgemm": (128, 128),
            "cpu": (32, 32), "emulation": (32, 32)}


def _bf16(rng, shape):
    f = (rng.random(int(np.prod(shape)), dtype=np.float32) * 2 - 1).astype("<f4")
    return ("BF16", list(shape), (f.view("<u4") >> 16).astype("<u2").tobytes())


def _u8(rng, shape, lo=0, hi=256):
    return ("U8", list(shape), rng.integers(lo, hi, size=int(np.prod(shape)),
                                            dtype=np.uint8).tobytes())


def config_of(quant="bf16", hidden=64, heads=4, kv_heads=2, head_dim=16, experts=4, inter=64,
              vocab=100, layers=2, top_k=2):
    c = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
         "hidden_size": hidden, "intermediate_size": inter, "num_attention_heads": heads,
         "num_key_value_heads": kv_heads, "head_dim": head_dim, "num_local_experts": experts,
         "num_experts_per_tok": top_k, "experts_per_token": top_k, "num_hidden_layers": layers,
         "vocab_size": vocab, "rms_norm_eps": 1e-5, "sliding_window": 8,
         "layer_types": ["sliding_attention" if i % 2 == 0 else "full_attention"
                         for i in range(layers)],
         "max_position_embeddings": 256, "initial_context_length": 256,
         "rope_theta": 150000.0, "rope_scaling": {"rope_type": "yarn", "factor": 4.0,
                                                  "beta_fast": 32.0, "beta_slow": 1.0,
                                                  "truncate": False,
                                                  "original_max_position_embeddings": 64},
         "attention_bias": True, "attention_dropout": 0.0, "swiglu_limit": 7.0,
         "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
         "router_aux_loss_coef": 0.9, "output_router_logits": False, "use_cache": True,
         "pad_token_id": 0, "eos_token_id": 1, "initializer_range": 0.02}
    if quant == "mxfp4":
        c["quantization_config"] = {
            "quant_method": "mxfp4",
            "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                       "model.embed_tokens", "lm_head"]}
    return c


def tensors_of(config, quant="bf16", seed=0):
    c = config
    H, I, E, A, K, D = (c["hidden_size"], c["intermediate_size"], c["num_local_experts"],
                        c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"])
    rng = np.random.default_rng(seed)
    t = {"model.embed_tokens.weight": _bf16(rng, [c["vocab_size"], H]),
         "model.norm.weight": _bf16(rng, [H]),
         "lm_head.weight": _bf16(rng, [c["vocab_size"], H])}
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        t[p + "input_layernorm.weight"] = _bf16(rng, [H])
        t[p + "post_attention_layernorm.weight"] = _bf16(rng, [H])
        for m, rows in (("q_proj", A * D), ("k_proj", K * D), ("v_proj", K * D)):
            t[p + f"self_attn.{m}.weight"] = _bf16(rng, [rows, H])
            t[p + f"self_attn.{m}.bias"] = _bf16(rng, [rows])
        t[p + "self_attn.o_proj.weight"] = _bf16(rng, [H, A * D])
        t[p + "self_attn.o_proj.bias"] = _bf16(rng, [H])
        t[p + "self_attn.sinks"] = _bf16(rng, [A])
        t[p + "mlp.router.weight"] = _bf16(rng, [E, H])
        t[p + "mlp.router.bias"] = _bf16(rng, [E])
        x = p + "mlp.experts."
        t[x + "gate_up_proj_bias"] = _bf16(rng, [E, 2 * I])
        t[x + "down_proj_bias"] = _bf16(rng, [E, H])
        if quant == "mxfp4":
            t[x + "gate_up_proj_blocks"] = _u8(rng, [E, 2 * I, H // 32, 16])
            t[x + "gate_up_proj_scales"] = _u8(rng, [E, 2 * I, H // 32], 118, 128)
            t[x + "down_proj_blocks"] = _u8(rng, [E, H, I // 32, 16])
            t[x + "down_proj_scales"] = _u8(rng, [E, H, I // 32], 118, 128)
        else:
            t[x + "gate_up_proj"] = _bf16(rng, [E, H, 2 * I])
            t[x + "down_proj"] = _bf16(rng, [E, I, H])
    return t


def checkpoint(out, quant="bf16", seed=0, parts=0, **dims):
    """A tiny gpt-oss model folder: config.json and model.safetensors (or
    `parts` index parts)."""
    config = config_of(quant, **dims)
    tensors = tensors_of(config, quant, seed)
    gen.write_checkpoint(out, tensors, parts)
    with open(os.path.join(out, "config.json"), "w") as f:
        f.write(json.dumps(config, indent=2) + "\n")
    return out


def _chunk(n, tp, r):
    """torch.chunk / DTensor Shard: rank r's [start, stop)."""
    c = -(-n // tp)
    return min(r * c, n), min((r + 1) * c, n)


def _rows(t, lo, hi):
    dt, shape, data = t
    row = len(data) // shape[0] if shape[0] else 0
    return (dt, [hi - lo] + shape[1:], data[lo * row:hi * row])


def dtensor_ranks(tensors, tp):
    """transformers 5.24.0's plan: embed_tokens and lm_head Shard(0), the rest
    whole on every rank."""
    out = []
    for r in range(tp):
        mine = {}
        for n, t in tensors.items():
            if n in ("model.embed_tokens.weight", "lm_head.weight"):
                mine[n] = _rows(t, *_chunk(t[1][0], tp, r))
            else:
                mine[n] = t
        out.append(mine)
    return out


# ------------------------------------------------------------------ vLLM 0.33

def _np(t):
    dt, shape, data = t
    return np.frombuffer(data, dtype={"BF16": "<u2", "U8": "u1", "F32": "<f4"}[dt]).reshape(shape)


def _t(dt, a):
    return (dt, list(a.shape), np.ascontiguousarray(a).tobytes())


def _round_up(x, m):
    return -(-x // m) * m


def vllm_ranks(config, tensors, tp, backend="triton"):
    """The state dict vLLM 0.33.0 holds on each rank for this checkpoint,
    before process_weights_after_loading (ShardedStateLoader's key set)."""
    c = config
    H, I, E, A, K, D, V = (c["hidden_size"], c["intermediate_size"], c["num_local_experts"],
                           c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                           c["vocab_size"])
    mx = "quantization_config" in c
    if A % tp or K % tp:
        raise ValueError("heads % tp")
    if I % tp:
        raise ValueError("intermediate_size % tp (MLPBlock)")
    Vp = _round_up(V, 64)
    out = []
    for r in range(tp):
        s = {}
        per = Vp // tp
        for name, key in (("model.embed_tokens.weight", "model.embedding.weight"),
                          ("lm_head.weight", "lm_head.weight")):
            w = _np(tensors[name])
            z = np.zeros((per, H), dtype=w.dtype)
            lo, hi = min(r * per, V), min((r + 1) * per, V)
            z[:hi - lo] = w[lo:hi]
            s[key] = _t("BF16", z)
        s["model.norm.weight"] = tensors["model.norm.weight"]
        for n in range(c["num_hidden_layers"]):
            p, q = f"model.layers.{n}.", f"model.layers.{n}."
            for k in ("input_layernorm.weight", "post_attention_layernorm.weight"):
                s[q + k] = tensors[p + k]
            a, kv = A // tp, K // tp
            for part in ("weight", "bias"):
                qw, kw, vw = (_np(tensors[p + f"self_attn.{m}.{part}"])
                              for m in ("q_proj", "k_proj", "v_proj"))
                s[q + f"attn.qkv_proj.{part}"] = _t("BF16", np.concatenate(
                    [qw[r * a * D:(r + 1) * a * D], kw[r * kv * D:(r + 1) * kv * D],
                     vw[r * kv * D:(r + 1) * kv * D]]))
            ow = _np(tensors[p + "self_attn.o_proj.weight"])
            s[q + "attn.o_proj.weight"] = _t("BF16", ow[:, r * a * D:(r + 1) * a * D])
            s[q + "attn.o_proj.bias"] = tensors[p + "self_attn.o_proj.bias"]
            s[q + "attn.sinks"] = _t("BF16", _np(tensors[p + "self_attn.sinks"])[r * a:(r + 1) * a])
            for b in ("_k_scale", "_v_scale", "_q_scale", "_prob_scale"):
                s[q + f"attn.attn.{b}"] = ("F32", [], np.float32(1.0).tobytes())
            s[q + "mlp.router.weight"] = tensors[p + "mlp.router.weight"]
            s[q + "mlp.router.bias"] = tensors[p + "mlp.router.bias"]
            x, y = p + "mlp.experts.", q + "mlp.experts.routed_experts."
            gub, db = _np(tensors[x + "gate_up_proj_bias"]), _np(tensors[x + "down_proj_bias"])
            if mx:
                ha, ia = ROUND_UP[backend]
                Hp, Ip = _round_up(H, ha), _round_up(I // tp, ia)
                pr = -(-(I // 32) // tp) * 32
                lo, hi = r * pr, min((r + 1) * pr, I)
                n_r = max(hi - lo, 0)
                gb = _np(tensors[x + "gate_up_proj_blocks"]).reshape(E, 2 * I, H // 2)
                gs = _np(tensors[x + "gate_up_proj_scales"])
                dnb = _np(tensors[x + "down_proj_blocks"]).reshape(E, H, I // 2)
                dns = _np(tensors[x + "down_proj_scales"])
                w13 = np.zeros((E, 2 * Ip, Hp // 2), np.uint8)
                w13s = np.zeros((E, 2 * Ip, Hp // 32), np.uint8)
                w13b = np.zeros((E, 2 * Ip), np.uint16)
                w2 = np.zeros((E, Hp, Ip // 2), np.uint8)
                w2s = np.zeros((E, Hp, Ip // 32), np.uint8)
                w2b = np.zeros((E, Hp), np.uint16)
                if n_r:
                    w13[:, :2 * n_r, :H // 2] = gb[:, 2 * lo:2 * hi]
                    w13s[:, :2 * n_r, :H // 32] = gs[:, 2 * lo:2 * hi]
                    w13b[:, :2 * n_r] = gub[:, 2 * lo:2 * hi]
                    w2[:, :H, :n_r // 2] = dnb[:, :, lo // 2:hi // 2]
                    w2s[:, :H, :n_r // 32] = dns[:, :, lo // 32:hi // 32]
                if r == 0:
                    w2b[:, :H] = db
                s[y + "w13_weight"] = _t("U8", w13)
                s[y + "w13_weight_scale"] = _t("U8", w13s)
                s[y + "w13_bias"] = _t("BF16", w13b)
                s[y + "w2_weight"] = _t("U8", w2)
                s[y + "w2_weight_scale"] = _t("U8", w2s)
                s[y + "w2_bias"] = _t("BF16", w2b)
            else:
                Ir = I // tp
                gu = _np(tensors[x + "gate_up_proj"])  # [E, H, 2I]
                dn = _np(tensors[x + "down_proj"])  # [E, I, H]
                s[y + "w13_weight"] = _t("BF16", gu[:, :, 2 * r * Ir:2 * (r + 1) * Ir]
                                         .transpose(0, 2, 1))
                s[y + "w13_bias"] = _t("BF16", gub[:, 2 * r * Ir:2 * (r + 1) * Ir])
                s[y + "w2_weight"] = _t("BF16", dn[:, r * Ir:(r + 1) * Ir, :].transpose(0, 2, 1))
                s[y + "w2_bias"] = _t("BF16", db if r == 0 else np.zeros_like(db))
        out.append(s)
    return out

