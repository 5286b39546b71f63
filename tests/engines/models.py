"""Tiny Hugging Face checkpoints for the engine oracle, by name.

The project's own generators make the plain ones (testdata/gen.py for the dense
families, tests/py/family_oracle.py for Phi-3, Qwen3-MoE and Mixtral,
tests/py/quant_oracle.py for the dense FP8 presets, the DeepSeek-V3 model of
testdata/conformance).  The FP8 mixture-of-experts and FP8 DeepSeek-V3 models
are made here: the bf16 generator's model with its linear weights replaced by
random E4M3 codes and scales, as the published FP8 checkpoints store them.
Runs with the project's test venv (numpy).  Deterministic: same name, same bytes.

    make(name, outdir) -> outdir
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(TOP, "tests", "py"))
sys.path.insert(0, os.path.join(TOP, "testdata"))
import family_oracle  # noqa: E402
import packed_oracle  # noqa: E402
import gemma4_oracle  # noqa: E402
import gptoss_oracle  # noqa: E402
import quant_oracle  # noqa: E402
import serving_oracle  # noqa: E402


def _gen(args):
    def make(out):
        subprocess.run([sys.executable, os.path.join(TOP, "testdata", "gen.py")] + args.split()[:1]
                       + [out] + args.split()[1:], check=True)
        return out
    return make


def _copy(rel):
    def make(out):
        src = os.path.join(TOP, rel)
        os.makedirs(out, exist_ok=True)
        for f in os.listdir(src):
            shutil.copy(os.path.join(src, f), os.path.join(out, f))
        return out
    return make


def _fam(fn, **kw):
    return lambda out: fn(out, **kw)


def _quant(preset, **over):
    def make(out):
        spec = dict(quant_oracle.PRESETS[preset], **over)
        return quant_oracle.make_model(out, spec)
    return make


# ------------------------------------------------------------------ FP8 of a bf16 model

E4M3_CODES = np.array([b for b in range(256) if b not in (0x7F, 0xFF)], dtype=np.uint8)


def _scales(rng, shape, dtype="F32"):
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    mant = 1 + rng.integers(0, 128, size=n) / 128.0
    v = (mant * 2.0 ** -rng.integers(5, 9, size=n)).astype(np.float32)
    if dtype == "F32":
        return ("F32", list(shape), v.astype("<f4").tobytes())
    if dtype == "BF16":
        return ("BF16", list(shape), (v.view(np.uint32) >> 16).astype("<u2").tobytes())
    raise ValueError(dtype)


def fp8_of(src_make, method, keep, seed=7, scale_dtype="F32"):
    """A maker: src_make's bf16 model with every 2-D `.weight` whose module
    `keep(module)` is false (norms, embeddings, lm_head, routers stay) turned
    into E4M3 with the scales of `method`:
      "block":      quant_method fp8, weight_block_size [128, 128],
                    X.weight_scale_inv [ceil(out/128), ceil(in/128)]
      "tensor":     quant_method fp8 (AutoFP8), static activations,
                    X.weight_scale [] and X.input_scale [] (F32)
      "ct-channel": compressed-tensors float-quantized, per-channel weights,
                    dynamic per-token activations: X.weight_scale [out, 1]"""
    def make(out):
        rng = np.random.default_rng(seed)
        tmp = tempfile.mkdtemp(prefix="bf16.")
        try:
            src_make(tmp)
            config, tensors = serving_oracle.load_checkpoint(tmp)
        finally:
            shutil.rmtree(tmp)
        ignored = []
        qt = {}
        for name in sorted(tensors):
            dt, shape, data = tensors[name]
            module = name[:-len(".weight")] if name.endswith(".weight") else None
            if module is None or len(shape) != 2 or keep(module):
                if module is not None and len(shape) == 2 and "embed" not in module \
                        and not module.endswith("lm_head"):
                    ignored.append(module)
                qt[name] = (dt, shape, data)
                continue
            o, i = shape
            qt[name] = ("F8_E4M3", [o, i], E4M3_CODES[rng.integers(0, len(E4M3_CODES),
                                                                   size=(o, i))].tobytes())
            if method == "block":
                qt[module + ".weight_scale_inv"] = _scales(rng, (-(-o // 128), -(-i // 128)),
                                                           scale_dtype)
            elif method == "tensor":
                qt[module + ".weight_scale"] = _scales(rng, ())
                qt[module + ".input_scale"] = _scales(rng, ())
            elif method == "ct-channel":
                qt[module + ".weight_scale"] = _scales(rng, (o, 1), scale_dtype)
            else:
                raise ValueError(method)
        ignore = ["lm_head"] + sorted(ignored)
        if method == "block":
            qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                  "weight_block_size": [128, 128], "modules_to_not_convert": ignore}
        elif method == "tensor":
            qc = {"quant_method": "fp8", "activation_scheme": "static", "ignored_layers": ignore}
        else:
            w = {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": False,
                 "strategy": "channel", "group_size": None, "block_structure": None,
                 "actorder": None, "observer": "minmax", "observer_kwargs": {}}
            ia = dict(w, dynamic=True, strategy="token", observer=None)
            qc = {"quant_method": "compressed-tensors", "format": "float-quantized",
                  "quantization_status": "compressed", "global_compression_ratio": None,
                  "config_groups": {"group_0": {"targets": ["Linear"], "weights": w,
                                                "input_activations": ia,
                                                "output_activations": None, "format": None}},
                  "ignore": ignore, "kv_cache_scheme": None, "sparsity_config": {}}
        config["quantization_config"] = qc
        return quant_oracle.write_model(out, config, qt)
    return make


def _router(module):
    """What FP8 MoE checkpoints leave unquantized besides embeddings and lm_head:
    the routers (Qwen3-MoE, DeepSeek mlp.gate; Mixtral block_sparse_moe.gate)."""
    return module.endswith(".mlp.gate") or module.endswith(".block_sparse_moe.gate") \
        or module.endswith("lm_head") or "embed" in module


def deepseek_v3(out, H=256, heads=4, q_lora=128, kv_lora=128, nope=128, rope=64, v=128,
                inter=512, moe_inter=256, experts=4, shared=1, vocab=190, layers=2, seed=3,
                v2_lite=False):
    """DeepseekV3ForCausalLM in HF names (layer 0 dense, the rest MoE with the
    noaux_tc F32 router bias), sizes that block-FP8 can split at tp 2.
    v2_lite: DeepseekV2ForCausalLM as DeepSeek-V2-Lite ships it instead (no
    query LoRA: q_proj; a greedy softmax router without a bias)."""
    if v2_lite:
        q_lora = None
    s = {"model.embed_tokens.weight": (vocab, H), "model.norm.weight": (H,),
         "lm_head.weight": (vocab, H)}
    for i in range(layers):
        p = f"model.layers.{i}."
        s[p + "input_layernorm.weight"] = (H,)
        s[p + "post_attention_layernorm.weight"] = (H,)
        if q_lora:
            s[p + "self_attn.q_a_proj.weight"] = (q_lora, H)
            s[p + "self_attn.q_a_layernorm.weight"] = (q_lora,)
            s[p + "self_attn.q_b_proj.weight"] = (heads * (nope + rope), q_lora)
        else:  # DeepSeek-V2-Lite: no query LoRA, one q_proj
            s[p + "self_attn.q_proj.weight"] = (heads * (nope + rope), H)
        s[p + "self_attn.kv_a_proj_with_mqa.weight"] = (kv_lora + rope, H)
        s[p + "self_attn.kv_a_layernorm.weight"] = (kv_lora,)
        s[p + "self_attn.kv_b_proj.weight"] = (heads * (nope + v), kv_lora)
        s[p + "self_attn.o_proj.weight"] = (H, heads * v)
        if i == 0:
            s[p + "mlp.gate_proj.weight"] = (inter, H)
            s[p + "mlp.up_proj.weight"] = (inter, H)
            s[p + "mlp.down_proj.weight"] = (H, inter)
            continue
        s[p + "mlp.gate.weight"] = (experts, H)
        for e in range(experts):
            s[p + f"mlp.experts.{e}.gate_proj.weight"] = (moe_inter, H)
            s[p + f"mlp.experts.{e}.up_proj.weight"] = (moe_inter, H)
            s[p + f"mlp.experts.{e}.down_proj.weight"] = (H, moe_inter)
        s[p + "mlp.shared_experts.gate_proj.weight"] = (moe_inter * shared, H)
        s[p + "mlp.shared_experts.up_proj.weight"] = (moe_inter * shared, H)
        s[p + "mlp.shared_experts.down_proj.weight"] = (H, moe_inter * shared)
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
           "hidden_size": H, "intermediate_size": inter, "moe_intermediate_size": moe_inter,
           "num_attention_heads": heads, "num_key_value_heads": heads, "num_hidden_layers": layers,
           "q_lora_rank": q_lora, "kv_lora_rank": kv_lora, "qk_nope_head_dim": nope,
           "qk_rope_head_dim": rope, "v_head_dim": v, "head_dim": rope,
           "n_routed_experts": experts, "n_shared_experts": shared, "num_experts_per_tok": 2,
           "n_group": 2, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
           "norm_topk_prob": True, "routed_scaling_factor": 2.5, "first_k_dense_replace": 1,
           "moe_layer_freq": 1, "num_nextn_predict_layers": 0, "vocab_size": vocab,
           "hidden_act": "silu", "max_position_embeddings": 16384, "rms_norm_eps": 1e-06,
           "rope_theta": 10000.0, "rope_interleave": True, "attention_bias": False,
           # YaRN as DeepSeek-V3 ships it (SGLang's CPU rope path requires a rope_scaling)
           "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096,
                            "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                            "mscale_all_dim": 1.0},
           "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": 1}
    if v2_lite:
        cfg.update({"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
                    "q_lora_rank": None, "topk_method": "greedy", "scoring_func": "softmax",
                    "n_group": 1, "topk_group": 1, "norm_topk_prob": False,
                    "routed_scaling_factor": 1.0})
        del cfg["rope_interleave"]
        family_oracle.write_model(out, s, cfg, "BF16", seed)
        return None
    family_oracle.write_model(out, s, cfg, "BF16", seed)
    # the router bias is F32 in the published checkpoints
    config, tensors = serving_oracle.load_checkpoint(out)
    rng = np.random.default_rng(seed + 1)
    for i in range(1, layers):
        tensors[f"model.layers.{i}.mlp.gate.e_score_correction_bias"] = (
            "F32", [experts], rng.uniform(-1, 1, experts).astype("<f4").tobytes())
    os.remove(os.path.join(out, "model.safetensors"))
    return quant_oracle.write_model(out, config, tensors)


def gemma4_per_expert(src_make):
    """A maker: src_make's Gemma 4 MoE with its experts as per-expert 2-D
    tensors (experts.{e}.gate_proj / up_proj [I, H], down_proj [H, I]), the
    form quantizers that linearize Gemma4TextExperts write; vLLM's expert
    mapping loads both forms."""
    def make(out):
        tmp = tempfile.mkdtemp(prefix="fused.")
        try:
            src_make(tmp)
            config, tensors = serving_oracle.load_checkpoint(tmp)
        finally:
            shutil.rmtree(tmp)
        t = {}
        for name, (dt, shape, data) in tensors.items():
            if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                a = np.frombuffer(data, np.uint16).reshape(shape)
                base = name.rsplit(".", 1)[0]
                for e in range(shape[0]):
                    if name.endswith("gate_up_proj"):
                        half = shape[1] // 2
                        t[f"{base}.{e}.gate_proj.weight"] = (dt, [half, shape[2]], a[e, :half].tobytes())
                        t[f"{base}.{e}.up_proj.weight"] = (dt, [half, shape[2]], a[e, half:].tobytes())
                    else:
                        t[f"{base}.{e}.down_proj.weight"] = (dt, list(shape[1:]), a[e].tobytes())
                continue
            t[name] = (dt, shape, data)
        return quant_oracle.write_model(out, config, t)
    return make


def gemma4_fused_fp8(src_make, seed=7):
    """A maker: src_make's block-FP8 Gemma 4 MoE (fp8_of: every 2-D linear) with
    its fused 3-D experts in E4M3 too, beside block scales of their own shape:
    experts.gate_up_proj_scale_inv [E, 2I/128, ceil(H/128)] and
    experts.down_proj_scale_inv [E, ceil(H/128), I/128]."""
    def make(out):
        tmp = tempfile.mkdtemp(prefix="fp8.")
        try:
            src_make(tmp)
            config, tensors = serving_oracle.load_checkpoint(tmp)
        finally:
            shutil.rmtree(tmp)
        rng = np.random.default_rng(seed)
        t = {}
        for name, (dt, shape, data) in tensors.items():
            if len(shape) == 3 and (name.endswith("experts.gate_up_proj") or
                                    name.endswith("experts.down_proj")):
                E, o, i = shape
                t[name] = ("F8_E4M3", shape, E4M3_CODES[rng.integers(0, len(E4M3_CODES),
                                                                     size=(E, o, i))].tobytes())
                t[name + "_scale_inv"] = _scales(rng, (E, -(-o // 128), -(-i // 128)))
                continue
            t[name] = (dt, shape, data)
        return quant_oracle.write_model(out, config, t)
    return make


GEMMA4_MOE_FP8 = dict(hidden=256, head_dim=128, global_head_dim=256, inter=256, ple=0,
                      kv_shared=0, double_wide=False, vocab=300, heads=4, kv_heads=2,
                      global_kv_heads=2, experts=4, moe_inter=256, seed=8)


GEMMA4_FP8 = dict(hidden=256, head_dim=128, global_head_dim=256, inter=256, ple=64, vocab=300,
                  vocab_pl=260, seed=5)
GPT_OSS = dict(hidden=64, heads=4, kv_heads=4, head_dim=64, experts=4, vocab=100)

QWEN3_MOE = dict(hidden=256, heads=4, kv_heads=2, head_dim=128, experts=4, inter=256,
                 vocab=300, layers=2)

MODELS = {
    "llama": _gen("llama --hidden 64 --heads 8 --kv-heads 2 --head-dim 8 --inter 96 --vocab 250"),
    # pipeline cases: 5 layers split unevenly (vLLM's get_pp_indices: [3, 2] at pp 2,
    # [2, 2, 1] at pp 3)
    "llama-5": _gen("llama --hidden 64 --heads 8 --kv-heads 2 --head-dim 8 --inter 96 --vocab 250"
                    " --layers 5"),
    "llama-tied": _gen("llama --hidden 64 --heads 8 --kv-heads 2 --head-dim 8 --inter 96"
                       " --vocab 250 --tied --layers 3"),
    "qwen2": _gen("qwen2 --hidden 64 --heads 4 --kv-heads 2 --inter 96 --vocab 250"),
    "qwen3-tied": _gen("qwen3 --hidden 64 --heads 4 --kv-heads 2 --head-dim 32 --inter 96"
                       " --vocab 250 --tied"),
    "mistral": _gen("mistral --hidden 64 --heads 8 --kv-heads 2 --head-dim 16 --inter 64"
                    " --vocab 1007"),
    "gemma3-tied": _gen("gemma3 --gemma3-naming causal --hidden 64 --heads 4 --kv-heads 1"
                        " --head-dim 32 --inter 96 --vocab 262"),
    "phi3": _fam(family_oracle.phi3_checkpoint, hidden=64, heads=4, kv_heads=2, inter=96,
                 vocab=256),
    "qwen3_moe": _fam(family_oracle.qwen3_moe_checkpoint, hidden=32, heads=4, kv_heads=4,
                      head_dim=8, experts=4, moe_inter=16, vocab=256, layers=3),
    "mixtral": _fam(family_oracle.mixtral_checkpoint, hidden=32, heads=4, kv_heads=4,
                    experts=4, inter=16, vocab=256),
    "deepseek_v3": _copy("testdata/conformance/vllm-deepseekv3-bf16-tp2/model"),
    "deepseek_v3-yarn": deepseek_v3,
    # the conformance case's sizes (testdata/conformance/vllm-deepseekv2-lite-bf16-tp2)
    "deepseek_v2-lite": lambda out: deepseek_v3(out, H=128, kv_lora=64, nope=64, rope=32, v=64,
                                                inter=256, moe_inter=64, v2_lite=True),
    # dense FP8
    "llama-fp8-block": _quant("fp8-block-llama"),
    "qwen3-fp8-block-bf16scale": _quant("fp8-block-qwen3-i384", I=512),
    "qwen3-ct-fp8-channel": _quant("ct-channel-qwen3"),
    # FP8 experts
    "qwen3_moe-fp8-block-i256": fp8_of(_fam(family_oracle.qwen3_moe_checkpoint, moe_inter=256,
                                            **QWEN3_MOE), "block", _router),
    "qwen3_moe-fp8-block-i384": fp8_of(_fam(family_oracle.qwen3_moe_checkpoint, moe_inter=384,
                                            **QWEN3_MOE), "block", _router),
    "mixtral-fp8-tensor": fp8_of(_fam(family_oracle.mixtral_checkpoint, hidden=64, heads=4,
                                      kv_heads=2, experts=4, inter=64, vocab=256),
                                 "tensor", _router),
    "qwen3_moe-ct-fp8-channel": fp8_of(_fam(family_oracle.qwen3_moe_checkpoint, hidden=64, heads=4,
                                            kv_heads=2, head_dim=16, experts=4, moe_inter=64,
                                            vocab=256), "ct-channel", _router,
                                       scale_dtype="BF16"),
    "deepseek_v3-fp8-block": fp8_of(deepseek_v3, "block", _router),
    # packed integer methods (GPTQ, AWQ), F16 like their releases
    # H 512 and I 1024: tp 4 keeps whole groups of 128 in o_proj and down_proj (at H 256
    # vLLM's CPU kernel builds o_proj with zero-element scales, which tpshard refuses)
    "llama-gptq-g128": lambda out: packed_oracle.build(out, "gptq", H=512, I=1024, heads=8, kv=2,
                                                       hd=64),
    "llama-gptq-ch": lambda out: packed_oracle.build(out, "gptq", H=256, I=512, heads=4, kv=2,
                                                     hd=64, group=-1, desc_act=True),
    "qwen2-gptq-g32": lambda out: packed_oracle.build(out, "gptq", family="qwen2", H=128, I=256,
                                                      heads=4, kv=2, hd=32, group=32),
    "llama-awq-g128": lambda out: packed_oracle.build(out, "awq", H=512, I=1024, heads=8, kv=2,
                                                      hd=64),
    # compressed-tensors W4A16 (RedHatAI's w4a16 releases), tp 2 and 8
    "llama-ct-w4a16": lambda out: packed_oracle.build(out, "ct", H=1024, I=2048, heads=8, kv=8,
                                                      hd=128),
    "qwen2-ct-w4a16-asym": lambda out: packed_oracle.build(out, "ct", family="qwen2", H=256,
                                                           I=512, heads=4, kv=2, hd=64,
                                                           sym=False, group=32),
    "llama-nvfp4": lambda out: packed_oracle.build(out, "nvfp4", H=256, I=512, heads=4, kv=2,
                                                   hd=64),
    "llama-ct-nvfp4": lambda out: packed_oracle.build(out, "ct-nvfp4", H=256, I=512, heads=4,
                                                      kv=2, hd=64),
    # packed experts (Kimi-K2 style: experts W4A16, the rest BF16); H 128 for Marlin's MoE
    "qwen3_moe-ct-w4a16": lambda out: packed_oracle.build_moe(out, "ct", E=4, H=128, I=256,
                                                              group=32),
    "qwen3_moe-gptq": lambda out: packed_oracle.build_moe(out, "gptq", E=4, H=128, I=256,
                                                          group=32),
    "qwen3_moe-awq": lambda out: packed_oracle.build_moe(out, "awq", E=4, H=128, I=256,
                                                         group=32),
    # Gemma 4 MoE (26B-A4B style): router and 4 stacked experts beside every dense MLP
    "gemma4-moe": _fam(gemma4_oracle.make_checkpoint, heads=8, kv_heads=4, global_kv_heads=2,
                       ple=0, kv_shared=0, double_wide=False, vocab=256, experts=4,
                       moe_inter=32, seed=7),
    # Gemma 4 (Gemma4ForCausalLM): the E series (per-layer inputs, KV-shared layers with a
    # double-wide MLP, k_eq_v full layers with their own head size and one global KV head, a
    # per-layer vocabulary of its own size), the same shipping the KV-shared layers' K/V
    # (vLLM skips them), and the 31B style (no per-layer inputs, none shared, untied)
    "gemma4-e": _fam(gemma4_oracle.make_checkpoint),
    "gemma4-e-shipkv": _fam(gemma4_oracle.make_checkpoint, ship_shared_kv=True, k_eq_v=False,
                            vocab_pl=250, seed=1),
    "gemma4-dense": _fam(gemma4_oracle.make_checkpoint, heads=8, kv_heads=4, global_kv_heads=2,
                         ple=0, kv_shared=0, double_wide=False, tied=False, vocab=320, seed=2),
    # the full layers' sizes in per_layer_config (transformers 5's form), not global_* fields
    "gemma4-e-plc": _fam(gemma4_oracle.make_checkpoint, per_layer_config=True, seed=3),
    # the multimodal Gemma4ForConditionalGeneration (text model, vision tower, no audio)
    "gemma4-mm-e": _fam(gemma4_oracle.make_checkpoint, multimodal=True, seed=6),
    # FP8 Gemma 4 E series: every linear weight but the embeddings', 128-row heads so that
    # block scales split on whole blocks (per_layer_model_projection 256 rows)
    "gemma4-e-fp8-block": fp8_of(_fam(gemma4_oracle.make_checkpoint, **GEMMA4_FP8), "block",
                                 _router),
    "gemma4-e-ct-fp8-channel": fp8_of(_fam(gemma4_oracle.make_checkpoint, **GEMMA4_FP8),
                                      "ct-channel", _router, scale_dtype="BF16"),
    # Gemma 4 MoE with per-expert 2-D experts (experts.{e}.gate_proj...), BF16 and block
    # FP8, and with its fused 3-D experts in block FP8 (experts.gate_up_proj_scale_inv)
    "gemma4-moe-pe": gemma4_per_expert(_fam(gemma4_oracle.make_checkpoint, heads=8, kv_heads=4,
                                            global_kv_heads=2, ple=0, kv_shared=0,
                                            double_wide=False, vocab=256, experts=4,
                                            moe_inter=32, seed=7)),
    "gemma4-moe-pe-fp8-block": fp8_of(gemma4_per_expert(_fam(gemma4_oracle.make_checkpoint,
                                                             **GEMMA4_MOE_FP8)), "block",
                                      lambda m: _router(m) or m.endswith("router.proj")),
    "gemma4-moe-fp8-block": gemma4_fused_fp8(fp8_of(_fam(gemma4_oracle.make_checkpoint,
                                                         **GEMMA4_MOE_FP8), "block",
                                                    lambda m: _router(m) or m.endswith("router.proj"))),
    # gpt-oss: head_dim 64 for the CPU attention backend, KV heads 4 (gpt-oss has no KV
    # replication). BF16: intermediate 128, as vLLM's CPU MoE kernels want 32 per rank.
    # MXFP4: intermediate 160 = 5 blocks, so vLLM's cdiv(5, tp) * 32 row cut is uneven
    # (tp 2: 96 + 64 rows; tp 4: 64, 64, 32, 0) and its round-up pads (cpu backend: x32).
    "gpt_oss": _fam(gptoss_oracle.checkpoint, quant="bf16", inter=128, **GPT_OSS),
    "gpt_oss-mxfp4": _fam(gptoss_oracle.checkpoint, quant="mxfp4", inter=160, **GPT_OSS),
}


def make(name, outdir):
    if os.path.exists(os.path.join(outdir, "config.json")):
        return outdir
    tmp = outdir + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    MODELS[name](tmp)
    shutil.rmtree(outdir, ignore_errors=True)
    os.replace(tmp, outdir)
    return outdir


if __name__ == "__main__":
    for n in sys.argv[2:] or MODELS:
        print(make(n, os.path.join(sys.argv[1], n)))
