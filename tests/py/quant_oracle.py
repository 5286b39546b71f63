"""Independent oracle for quantized checkpoints (block FP8 and
compressed-tensors FP8) in every layout of `tpshard split`: the DTensor
layout (default) and the serving layouts vllm and sglang.

Built from the quantization formats and from the engines' own code (vLLM
0.33.0 and SGLang 0.5.23 as published on PyPI), never from tpshard's
sources.  Python standard library, numpy, and serving_oracle.py for the
unquantized tensors of the serving layouts.

    make_model(outdir, preset_or_spec) -> outdir     # config.json + model.safetensors
    PRESETS                                          # the tiny models the tests use
    expected_ranks(model_dir, layout, tp) -> [ {name: (dtype, shape, bytes)} per rank ]
    accepts(model_dir, tp, layout) -> (ok, reason, names)
        # names: the tensors/fields an error must name (any one of them)
    scheme_of(config) -> dict | None                 # the quantization, or Refused
    check_input(config, tensors)                     # bad input -> Refused
    dequantize(weight, scale, block) -> np.ndarray float32
    to_f32(dtype, bytes) -> np.ndarray float32
    LAYOUTS = ("dtensor", "vllm", "sglang")

Refused(reason, names, rule): tpshard must refuse the split before writing
anything; rule is "quant_method" (an unsupported quantization), "input" (a bad
checkpoint), "block" (a shard boundary that is not a multiple of the block),
"layout" (the engine's state cannot be written from the checkpoint on a
CPU), or "engine" (the unquantized rules: heads, KV heads, ...).

The rules, and where they come from:

DTensor layout (the NeMo plans in plans/*.yaml; PyTorch DTensor Shard(d) is
torch.chunk along d): a colwise module's weight is split along dim 0, its
block scale along dim 0 in block rows, its per-channel scale [out, 1] along
dim 0; a rowwise module's weight along dim 1, its block scale along dim 1 in
block columns, its per-channel scale whole; per-tensor scales and
input_scale whole on every rank; all in the checkpoint's dtypes.  Every
shard boundary of a block-quantized weight must fall on a block boundary
(rank r's block rows = torch.chunk of the scale = the blocks of its weight
rows).

vLLM 0.33 (load_format="sharded_state" reads the state before
process_weights_after_loading):
  - fp8 (quantization/fp8.py Fp8LinearMethod.create_weights): weight
    F8_E4M3; block: weight_scale_inv BlockQuantScaleParameter
    [ceil(rows_r/bn), ceil(cols_r/bk)] F32 (utils/fp8_utils.py
    create_fp8_scale_parameter); no block: weight_scale
    PerTensorScaleParameter [n logical parts] F32, input_scale the same when
    activation_scheme is static (create_fp8_input_scale).
  - compressed-tensors (schemes/compressed_tensors_w8a8_fp8.py,
    w8a16_fp8.py): weight_scale Block/Channel/PerTensor as above (channel:
    [rows_r, 1]), input_scale [n parts] when input_activations are static.
  - Loaders (layers/linear.py QKVParallelLinear.weight_loader_v2,
    MergedColumnParallelLinear.weight_loader_v2, adjust_block_scale_shard;
    parameter.py _ColumnvLLMParameter.load_qkv_weight, RowvLLMParameter,
    PerTensorScaleParameter._load_into_shard_id): block rows of each part at
    ceil(offset/bn), the KV part of rank r from KV head r // replicas; block
    columns of a row-parallel layer; per-tensor scalars into slot q/k/v
    (0, 1, 2) or gate/up (0, 1); a row-parallel layer's per-tensor and
    per-channel scales whole.  copy_ casts: every scale is F32.
  - Attention extras: Fp8Config -> Fp8KVCacheMethod (kv_cache.py
    BaseKVCacheMethod.create_weights): attn.q_scale, k_scale, v_scale,
    prob_scale = KVCacheScaleParameter(): 0-dim, -1.0, created under the
    model's default dtype.  CompressedTensorsConfig ->
    CompressedTensorsKVCacheMethod.create_weights: attn.k_scale, v_scale,
    q_scale = torch.ones(1) F32 and attn.k_zero_point, v_zero_point,
    q_zero_point = torch.zeros(1) in the model's dtype.  Both beside the
    _k_scale buffers (attention.py set_default_quant_scales).
  - validate_fp8_block_shape refuses a misaligned column or row split, but
    linear.py _maybe_allow_fp8_block_shape_mismatch skips it for merged
    layers (qkv, gate_up) whose parts are misaligned, which then read the
    wrong scale rows (vLLM issue #52997): the oracle refuses those too.

SGLang 0.5.23 (model_loader/loader.py ShardedStateLoader runs
process_weights_after_loading BEFORE reading the files, so the files hold
the post-processed state):
  - fp8 block and compressed-tensors block: process_weights_after_loading
    keeps weight and block scale in place on CUDA GPUs with FP8 (the UE8M0
    requantization for DeepGEMM is in place): same tensors as vLLM
    (quantization/fp8.py create_fp8_weight_, linear.py
    MergedColumnParallelLinear/QKVParallelLinear.weight_loader_v2 block
    branches); scales F32.  Fp8Config gives RadixAttention an
    Fp8KVCacheMethod (kv_cache.py): attn.k_scale and v_scale, 0-dim F32,
    1.0 after processing, in the families whose RadixAttention gets the
    quant_config (llama, mistral, qwen2, gemma3; not qwen3).
    compressed-tensors gives RadixAttention nothing without kv_cache_scheme.
    Fp8LinearMethod.validate_block_quant_shapes checks every part of a
    merged layer (no exception).
  - per-channel and per-tensor FP8 (fp8 without weight_block_size,
    compressed-tensors channel/tensor): processing replaces the weight by
    weight.t() ([in, out]), per-tensor weights are requantized to one max
    scale (requantize_with_max_scale), input_scale becomes its 0-dim max;
    the result depends on the GPU (cutlass, SM120, Marlin, AITER paths).
    Not a split of the checkpoint: Refused(rule="layout").
"""
import json
import os
import re
import struct

import numpy as np

import serving_oracle as so

LAYOUTS = ("dtensor", "vllm", "sglang")
FP8_DTYPES = ("F8_E4M3", "F8_E5M2")


class Refused(ValueError):
    """tpshard must refuse this split before writing anything."""

    def __init__(self, reason, names=(), rule=""):
        super().__init__(reason)
        self.reason = reason
        self.names = list(names)
        self.rule = rule


# ------------------------------------------------------------------ numbers

def _e4m3_table():
    t = np.zeros(256, dtype=np.float64)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 3) & 0xF, b & 7
        if e == 15 and m == 7:
            t[b] = np.nan
        elif e == 0:
            t[b] = s * m / 8 * 2.0 ** -6
        else:
            t[b] = s * (1 + m / 8) * 2.0 ** (e - 7)
    return t.astype(np.float32)


def _e5m2_table():
    t = np.zeros(256, dtype=np.float64)
    for b in range(256):
        s = -1.0 if b & 0x80 else 1.0
        e, m = (b >> 2) & 0x1F, b & 3
        if e == 31:
            t[b] = s * np.inf if m == 0 else np.nan
        elif e == 0:
            t[b] = s * m / 4 * 2.0 ** -14
        else:
            t[b] = s * (1 + m / 4) * 2.0 ** (e - 15)
    return t.astype(np.float32)


E4M3 = _e4m3_table()
E5M2 = _e5m2_table()


def to_f32(dtype, data):
    """Values of a tensor's bytes as float32 (flat)."""
    if dtype == "F32":
        return np.frombuffer(data, dtype="<f4").astype(np.float32)
    if dtype == "F16":
        return np.frombuffer(data, dtype="<f2").astype(np.float32)
    if dtype == "BF16":
        u = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
        return u.view(np.float32)
    if dtype == "F8_E8M0":  # 2^(e-127); 0xFF is NaN (torch float8_e8m0fnu)
        e = np.frombuffer(data, dtype=np.uint8).astype(np.int32)
        out = np.ldexp(np.float32(1.0), e - 127).astype(np.float32)
        out[e == 255] = np.nan
        return out
    if dtype == "F8_E4M3":
        return E4M3[np.frombuffer(data, dtype=np.uint8)]
    if dtype == "F8_E5M2":
        return E5M2[np.frombuffer(data, dtype=np.uint8)]
    raise so.Unsupported(f"no float value for dtype {dtype}")


def f32_bytes(values):
    return np.asarray(values, dtype="<f4").tobytes()


def as_f32(t):
    """(dtype, shape, bytes) -> the same tensor as F32 (what copy_ into an F32
    parameter stores)."""
    dt, shape, data = t
    return ("F32", list(shape), f32_bytes(to_f32(dt, data)))


def scalar_bytes(dtype, value):
    """One value in a floating dtype (the model's dtype for the engine extras)."""
    if dtype == "F32":
        return struct.pack("<f", value)
    if dtype == "F16":
        return np.array([value], dtype="<f2").tobytes()
    if dtype == "BF16":
        return struct.pack("<I", struct.unpack("<I", struct.pack("<f", value))[0])[2:]
    raise so.Unsupported(f"model dtype {dtype}")


def dequantize(weight, scale, block=None):
    """w[i][j] = q[i][j] * s[i // bn][j // bk] (block), * s[i] (per channel
    [out, 1]) or * s (per tensor); weight and scale as (dtype, shape, bytes)."""
    wd, ws, wb = weight
    q = to_f32(wd, wb).reshape(ws)
    sd, ss, sb = scale
    s = to_f32(sd, sb)
    if block is not None:
        bn, bk = block
        s = s.reshape(ss)
        return q * np.repeat(np.repeat(s, bn, axis=0), bk, axis=1)[:ws[0], :ws[1]]
    if len(ss) == 2 and ss[0] == ws[0] and ss[1] == 1:
        return q * s.reshape(-1, 1)
    if s.size == 1:
        return q * s[0]
    raise so.Unsupported(f"scale {ss} for weight {ws}")


# ------------------------------------------------------------------ writing
#
# The reference layout (what safetensors' save_file writes): tensors ordered
# by dtype alignment descending (safetensors' Dtype enum order), then by name;
# a compact JSON header with __metadata__ first, space-padded to 8 bytes.

DTYPE_ORDER = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
               "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32",
               "C64", "F64", "I64", "U64"]


def safetensors_bytes(tensors, metadata=None):
    """tensors: {name: (dtype, shape, bytes)} -> the file's bytes."""
    order = sorted(tensors, key=lambda n: (-DTYPE_ORDER.index(tensors[n][0]), n.encode("utf-8")))
    hdr, off = {}, 0
    if metadata is not None:
        hdr["__metadata__"] = metadata
    for n in order:
        dt, shape, data = tensors[n]
        want = so.ITEMSIZE[dt] * int(np.prod(shape, dtype=np.int64))
        if len(data) != want:
            raise ValueError(f"{n}: {len(data)} bytes for {dt}{list(shape)}")
        hdr[n] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
    js = json.dumps(hdr, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js + b"".join(tensors[n][2] for n in order)


def write_model(outdir, config, tensors):
    os.makedirs(outdir, exist_ok=True)
    with open(os.path.join(outdir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    tmp = os.path.join(outdir, "model.safetensors.tmp")
    with open(tmp, "wb") as f:
        f.write(safetensors_bytes(tensors, {"format": "pt"}))
    os.replace(tmp, os.path.join(outdir, "model.safetensors"))
    return outdir


# ------------------------------------------------------------------ generators

# quant kinds: fp8-block (DeepSeek-V3 / Qwen3-FP8), fp8-tensor (AutoFP8:
# quant_method fp8 without weight_block_size), ct-block, ct-channel,
# ct-tensor (compressed-tensors float-quantized).
PRESETS = {
    # Block FP8, F32 scales.  Aligned at every tp the heads allow: DTensor
    # tp 1, 2; vLLM/SGLang tp 1, 2, 4 (at tp 4 one 128-row KV head per rank,
    # replicated twice).  q_proj 4 blocks, k/v_proj 2, everything 128-aligned.
    "fp8-block-llama": dict(family="llama", H=512, A=4, K=2, D=128, I=512, V=300,
                            quant="fp8-block", scale_dtype="F32"),
    # Qwen3-FP8 style: BF16 weight_scale_inv, tied embeddings, intermediate 384
    # (3 blocks): at tp 2 gate/up rows and down columns are 192 per rank, not
    # 128-aligned -> refused in every layout; tp 1 works.
    "fp8-block-qwen3-i384": dict(family="qwen3", H=256, A=4, K=2, D=128, I=384, V=300,
                                 tied=True, quant="fp8-block", scale_dtype="BF16"),
    # hidden 320: every linear has a partial last block (columns of
    # q/k/v/gate/up, rows of o/down) yet the shards align at tp 2 and 4.
    # E8M0 scales; layer 1's down_proj stays BF16 (modules_to_not_convert).
    "fp8-block-h320-e8m0": dict(family="llama", H=320, A=4, K=2, D=128, I=512, V=300,
                                quant="fp8-block", scale_dtype="F8_E8M0",
                                not_converted=["model.layers.1.mlp.down_proj"]),
    # head_dim 80: q_proj 320 rows (partial last block).  DTensor tp 1 splits
    # nothing; the fused qkv_proj of vLLM/SGLang needs every part 128-aligned
    # even at tp 1 -> refused; DTensor tp 2 cuts q_proj at row 160 -> refused.
    "fp8-block-hd80": dict(family="llama", H=256, A=4, K=2, D=80, I=256, V=300,
                           quant="fp8-block", scale_dtype="F32"),
    # compressed-tensors FP8 per channel, dynamic activations (llm-compressor
    # FP8_DYNAMIC), BF16 scales; layer 1's down_proj ignored.  No alignment
    # rule: tp 4 replicates 64-row KV heads.
    "ct-channel-qwen3": dict(family="qwen3", H=256, A=4, K=2, D=64, I=384, V=300,
                             quant="ct-channel", scale_dtype="BF16",
                             not_converted=["model.layers.1.mlp.down_proj"]),
    # compressed-tensors FP8 per tensor, static activations (W8A8 FP8):
    # weight_scale [1] F32, input_scale [1] BF16.
    "ct-tensor-static-llama": dict(family="llama", H=256, A=4, K=2, D=64, I=384, V=300,
                                   quant="ct-tensor", scale_dtype="F32", static=True,
                                   input_dtype="BF16"),
    # per tensor with 0-dim scales (the [] form), dynamic activations.
    "ct-tensor-scalar": dict(family="llama", H=256, A=4, K=2, D=64, I=256, V=300,
                             quant="ct-tensor", scale_dtype="F32", scalar=True),
    # compressed-tensors block [128, 128]: the scale is named weight_scale.
    "ct-block-llama": dict(family="llama", H=256, A=2, K=2, D=128, I=256, V=300,
                           quant="ct-block", scale_dtype="F32"),
    # AutoFP8: quant_method fp8 without weight_block_size, 0-dim F32 scales,
    # static activation scales.  Outside issue 18's list of formats.
    "fp8-tensor-autofp8": dict(family="llama", H=256, A=4, K=2, D=64, I=256, V=300,
                               quant="fp8-tensor", scale_dtype="F32", static=True,
                               scalar=True),
}

ARCHS = {"llama": ("LlamaForCausalLM", "llama"), "qwen3": ("Qwen3ForCausalLM", "qwen3")}
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")


def _ct_args(strategy, block=None, dynamic=False, group=None):
    return {"num_bits": 8, "type": "float", "symmetric": True, "dynamic": dynamic,
            "strategy": strategy, "group_size": group, "block_structure": block,
            "actorder": None, "observer": None if dynamic else "minmax", "observer_kwargs": {}}


def quantization_config(spec):
    q = spec["quant"]
    ignore = ["lm_head"] + list(spec.get("not_converted", []))
    if q == "fp8-block":
        return {"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
                "weight_block_size": [128, 128], "modules_to_not_convert": ignore}
    if q == "fp8-tensor":
        return {"quant_method": "fp8",
                "activation_scheme": "static" if spec.get("static") else "dynamic",
                "ignored_layers": ignore}
    if q.startswith("ct-"):
        strategy = q[3:]
        block = [128, 128] if strategy == "block" else None
        if strategy == "block":
            ia = _ct_args("group", dynamic=True, group=128)
        elif spec.get("static"):
            ia = _ct_args("tensor")
        else:
            ia = _ct_args("token", dynamic=True)
        return {"quant_method": "compressed-tensors", "format": "float-quantized",
                "quantization_status": "compressed", "global_compression_ratio": None,
                "config_groups": {"group_0": {"targets": ["Linear"],
                                              "weights": _ct_args(strategy, block),
                                              "input_activations": ia,
                                              "output_activations": None, "format": None}},
                "ignore": ignore, "kv_cache_scheme": None, "sparsity_config": {}}
    raise ValueError(f"quant {q!r}")


def build(spec, seed=1):
    """(config, tensors) of a tiny quantized checkpoint described by spec (a
    PRESETS entry: family, H, A, K, D, I, V, quant, scale_dtype, ...)."""
    rng = np.random.default_rng(seed)
    fam = spec["family"]
    H, A, K, D, I, V = (spec[k] for k in ("H", "A", "K", "D", "I", "V"))
    L = spec.get("layers", 2)
    tied = bool(spec.get("tied", False))
    arch, mtype = ARCHS[fam]
    config = {"architectures": [arch], "model_type": mtype, "hidden_size": H,
              "intermediate_size": I, "num_attention_heads": A, "num_key_value_heads": K,
              "head_dim": D, "num_hidden_layers": L, "vocab_size": V,
              "max_position_embeddings": 4096, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
              "hidden_act": "silu", "attention_bias": False, "tie_word_embeddings": tied,
              "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
              "quantization_config": quantization_config(spec)}
    if fam == "llama":
        config["mlp_bias"] = False

    def bf16(*shape):
        f = rng.uniform(-1, 1, size=shape).astype(np.float32)
        return ("BF16", list(shape), (f.view(np.uint32) >> 16).astype("<u2").tobytes())

    def fp8(*shape):  # every E4M3 code but the two NaNs
        codes = np.array([b for b in range(256) if b not in (0x7F, 0xFF)], dtype=np.uint8)
        return ("F8_E4M3", list(shape), codes[rng.integers(0, len(codes), size=shape)].tobytes())

    def scales(dtype, shape):
        """Positive scales, all different, exact in every scale dtype (powers of
        two for E8M0, 8 significant bits otherwise)."""
        n = int(np.prod(shape, dtype=np.int64))
        if dtype == "F8_E8M0":
            e = 112 + rng.permutation(max(n, 12))[:n] % 12  # 2^-15 .. 2^-4
            return ("F8_E8M0", list(shape), e.astype(np.uint8).tobytes())
        mant = 1 + rng.permutation(max(n, 128))[:n] % 128 / 128.0
        v = (mant * 2.0 ** -rng.integers(5, 9, size=n)).astype(np.float32)
        if dtype == "F32":
            return ("F32", list(shape), v.astype("<f4").tobytes())
        if dtype == "BF16":
            return ("BF16", list(shape), (v.view(np.uint32) >> 16).astype("<u2").tobytes())
        if dtype == "F16":
            return ("F16", list(shape), v.astype("<f2").tobytes())
        raise ValueError(dtype)

    q = spec["quant"]
    sdt = spec.get("scale_dtype", "F32")
    skip = set(spec.get("not_converted", []))
    t = {"model.embed_tokens.weight": bf16(V, H), "model.norm.weight": bf16(H)}
    if not tied:
        t["lm_head.weight"] = bf16(V, H)
    shapes = {"self_attn.q_proj": (A * D, H), "self_attn.k_proj": (K * D, H),
              "self_attn.v_proj": (K * D, H), "self_attn.o_proj": (H, A * D),
              "mlp.gate_proj": (I, H), "mlp.up_proj": (I, H), "mlp.down_proj": (H, I)}
    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = bf16(H)
        t[p + "post_attention_layernorm.weight"] = bf16(H)
        if fam == "qwen3":
            t[p + "self_attn.q_norm.weight"] = bf16(D)
            t[p + "self_attn.k_norm.weight"] = bf16(D)
        for m in LINEARS:
            out, inn = shapes[m]
            if p + m in skip:
                t[p + m + ".weight"] = bf16(out, inn)
                continue
            t[p + m + ".weight"] = fp8(out, inn)
            if q in ("fp8-block", "ct-block"):
                name = "weight_scale_inv" if q == "fp8-block" else "weight_scale"
                t[p + m + "." + name] = scales(sdt, (-(-out // 128), -(-inn // 128)))
            elif q == "ct-channel":
                t[p + m + ".weight_scale"] = scales(sdt, (out, 1))
            else:  # per tensor
                t[p + m + ".weight_scale"] = scales(sdt, () if spec.get("scalar") else (1,))
                if spec.get("static"):
                    t[p + m + ".input_scale"] = scales(spec.get("input_dtype", sdt),
                                                       () if spec.get("scalar") else (1,))
    return config, t


# Quantizations tpshard must refuse, as their checkpoints store them (tensor
# names and dtypes of each format, on a dense LLaMA): quantization_config and
# {suffix: (dtype, shape as a function of (out, in))} per linear module.
UNSUPPORTED = {
    "gptq": ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False,
              "sym": True, "damp_percent": 0.01, "true_sequential": True},
             {"qweight": lambda o, i: ("I32", (i // 8, o)),
              "qzeros": lambda o, i: ("I32", (i // 128, o // 8)),
              "scales": lambda o, i: ("F16", (i // 128, o)), "g_idx": lambda o, i: ("I32", (i,))}),
    "awq": ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm",
             "zero_point": True},
            {"qweight": lambda o, i: ("I32", (i, o // 8)),
             "qzeros": lambda o, i: ("I32", (i // 128, o // 8)),
             "scales": lambda o, i: ("F16", (i // 128, o))}),
    "bitsandbytes": ({"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
                      "bnb_4bit_quant_type": "nf4", "bnb_4bit_use_double_quant": False,
                      "bnb_4bit_compute_dtype": "bfloat16"},
                     {"weight": lambda o, i: ("U8", (o * i // 2, 1)),
                      "weight.absmax": lambda o, i: ("F32", (o * i // 64,)),
                      "weight.quant_map": lambda o, i: ("F32", (16,)),
                      "weight.quant_state.bitsandbytes__nf4": lambda o, i: ("U8", (64,))}),
    "mxfp4": ({"quant_method": "mxfp4", "modules_to_not_convert": ["lm_head"]},
              {"weight_blocks": lambda o, i: ("U8", (o, i // 32, 16)),
               "weight_scales": lambda o, i: ("U8", (o, i // 32))}),
    "nvfp4 (modelopt)": ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                          "exclude_modules": ["lm_head"]},
                         {"weight": lambda o, i: ("U8", (o, i // 2)),
                          "weight_scale": lambda o, i: ("F8_E4M3", (o, i // 16)),
                          "weight_scale_2": lambda o, i: ("F32", ()),
                          "input_scale": lambda o, i: ("F32", ())}),
    "nvfp4 (compressed-tensors)": (
        {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
         "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
             "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
             "symmetric": True, "dynamic": False}, "input_activations": {
             "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
             "symmetric": True, "dynamic": "local"}}}, "ignore": ["lm_head"]},
        {"weight_packed": lambda o, i: ("U8", (o, i // 2)),
         "weight_scale": lambda o, i: ("F8_E4M3", (o, i // 16)),
         "weight_global_scale": lambda o, i: ("F32", (1,)),
         "input_global_scale": lambda o, i: ("F32", (1,))}),
    "int4 w4a16 (compressed-tensors)": (
        {"quant_method": "compressed-tensors", "format": "pack-quantized",
         "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
             "num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
             "symmetric": True, "dynamic": False}, "input_activations": None}},
         "ignore": ["lm_head"]},
        {"weight_packed": lambda o, i: ("I32", (o, i // 8)),
         "weight_scale": lambda o, i: ("BF16", (o, i // 128)),
         "weight_shape": lambda o, i: ("I64", (2,))}),
}


def unsupported_model(outdir, kind, seed=3):
    """A one-layer LLaMA (hidden 256) stored in an unsupported quantization;
    returns (outdir, the quant_method an error must name)."""
    qc, fmt = UNSUPPORTED[kind]
    spec = dict(family="llama", H=256, A=4, K=2, D=64, I=256, V=300, layers=1,
                quant="ct-tensor", scale_dtype="F32")
    config, plain = build(spec, seed)
    config["quantization_config"] = json.loads(json.dumps(qc))
    rng = np.random.default_rng(seed)
    tensors = {}
    for n, t in plain.items():
        m = _module(n)
        if m.rsplit(".", 1)[-1] not in [x.rsplit(".", 1)[1] for x in LINEARS]:
            tensors[n] = t
            continue
        if not n.endswith(".weight"):
            continue
        out, inn = t[1]
        for suffix, f in fmt.items():
            dt, shape = f(out, inn)
            nb = so.ITEMSIZE[dt] * int(np.prod(shape, dtype=np.int64))
            tensors[m + "." + suffix] = (dt, list(shape),
                                         rng.integers(0, 0x7E, size=nb, dtype=np.uint8).tobytes())
    write_model(outdir, config, tensors)
    return outdir, qc["quant_method"]


def make_model(outdir, spec, seed=1):
    """Writes the checkpoint (spec: a PRESETS name or dict) and returns outdir."""
    if isinstance(spec, str):
        spec = PRESETS[spec]
    config, tensors = build(spec, seed)
    return write_model(outdir, config, tensors)


# ------------------------------------------------------------------ the quantization

# What `quant_method` values name: the ones tpshard must refuse (issue 18:
# "refused before writing, with the quant_method named").
UNSUPPORTED_METHODS = ("gptq", "awq", "bitsandbytes", "mxfp4", "modelopt", "gptq_marlin",
                       "awq_marlin", "marlin", "hqq", "eetq", "aqlm", "quark", "torchao",
                       "fbgemm_fp8", "auto-round", "gguf", "fp_quant")


def scheme_of(config):
    """The checkpoint's quantization as a dict, or None when it has none:
    method ("fp8" | "compressed-tensors"), kind ("block" | "channel" |
    "tensor"), block (bn, bk) or None, scale (the scale's suffix),
    static_input (input_scale present), ignore (module names left
    unquantized).  Raises Refused for what is not supported or malformed."""
    c = so.text_config(config)
    qc = config.get("quantization_config") or c.get("quantization_config")
    if not qc:
        return None
    method = qc.get("quant_method")
    if method == "fp8":
        if "weight_block_size" in qc and qc["weight_block_size"] is not None:
            bs = qc["weight_block_size"]
            if (not isinstance(bs, list) or len(bs) != 2
                    or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                               for x in bs)):
                raise Refused(f"quantization_config.weight_block_size {json.dumps(bs)} is not "
                              f"two positive integers", ["weight_block_size"], "input")
            kind, block = "block", tuple(bs)
        else:
            kind, block = "tensor", None
        ignore = qc.get("ignored_layers") or qc.get("modules_to_not_convert") or []
        return dict(method="fp8", kind=kind, block=block,
                    scale="weight_scale_inv" if kind == "block" else "weight_scale",
                    static_input=qc.get("activation_scheme") == "static", ignore=list(ignore))
    if method == "compressed-tensors":
        fmt = qc.get("format")
        groups = list((qc.get("config_groups") or {}).values())
        if fmt not in ("float-quantized", "naive-quantized") or len(groups) != 1:
            raise Refused(f"quant_method compressed-tensors with format {fmt!r} is not supported "
                          f"yet (only FP8 float-quantized)", ["compressed-tensors"], "quant_method")
        w = groups[0].get("weights") or {}
        ia = groups[0].get("input_activations")
        if w.get("type") != "float" or w.get("num_bits") != 8:
            raise Refused(f"quant_method compressed-tensors with {w.get('num_bits')}-bit "
                          f"{w.get('type')} weights is not supported yet",
                          ["compressed-tensors"], "quant_method")
        kind = w.get("strategy")
        block = tuple(w["block_structure"]) if kind == "block" else None
        if kind not in ("block", "channel", "tensor"):
            raise Refused(f"compressed-tensors strategy {kind!r} is not supported yet",
                          ["compressed-tensors"], "quant_method")
        return dict(method="compressed-tensors", kind=kind, block=block, scale="weight_scale",
                    static_input=bool(ia) and not ia.get("dynamic", True),
                    ignore=list(qc.get("ignore") or []))
    raise Refused(f"quant_method {method!r} is not supported yet", [str(method)], "quant_method")


def _module(name):
    return name.rsplit(".", 1)[0]


def scale_names(sch, module):
    """The checkpoint's scale tensors of one quantized module."""
    out = [module + "." + sch["scale"]]
    if sch["static_input"]:
        out.append(module + ".input_scale")
    return out


def check_input(config, tensors):
    """Bad quantized input -> Refused(rule="input") naming the tensor."""
    sch = scheme_of(config)
    if sch is None:
        return None
    suffixes = (".weight_scale_inv", ".weight_scale", ".input_scale")
    for n in sorted(tensors):
        if n.endswith(suffixes) and _module(n) + ".weight" not in tensors:
            raise Refused(f"{n}: a scale without its weight ({_module(n)}.weight is not in the "
                          f"checkpoint)", [n], "input")
    for n in sorted(tensors):
        if not n.endswith(".weight"):
            continue
        dt, shape, _ = tensors[n]
        m = _module(n)
        sn = m + "." + sch["scale"]
        if dt in FP8_DTYPES:
            if sn not in tensors:
                raise Refused(f"{n}: an {dt} weight without its {sch['scale']}", [n], "input")
            if len(shape) != 2:
                raise Refused(f"{n}: a quantized weight must be 2-D, not {shape}", [n], "input")
            ss = tensors[sn][1]
            if sch["kind"] == "block":
                bn, bk = sch["block"]
                want = [[-(-shape[0] // bn), -(-shape[1] // bk)]]
            elif sch["kind"] == "channel":
                want = [[shape[0], 1]]
            else:
                want = [[], [1]]
            if ss not in want:
                raise Refused(f"{sn}: shape {ss} does not match {n} {shape}"
                              + (f" with blocks {list(sch['block'])}" if sch["block"] else "")
                              + f" (expected {' or '.join(map(str, want))})", [sn], "input")
            if sch["static_input"]:
                isn = m + ".input_scale"
                if isn not in tensors or tensors[isn][1] not in ([], [1]):
                    raise Refused(f"{isn}: missing or not a single value", [isn], "input")
        elif sn in tensors:
            raise Refused(f"{sn}: a scale beside the unquantized ({dt}) {n}", [sn], "input")
    return sch


def model_dtype(config):
    c = so.text_config(config)
    d = config.get("torch_dtype") or config.get("dtype") or c.get("torch_dtype") or "bfloat16"
    # vLLM's dtype "auto" serves float32 checkpoints as bfloat16
    return {"bfloat16": "BF16", "float16": "F16", "float32": "BF16"}[d]


# ------------------------------------------------------------------ DTensor layout

# The NeMo plans of plans/llama.yaml and plans/qwen3.yaml: module path -> style.
DTENSOR_RULES = [
    (re.compile(r"model\.embed_tokens"), "embedding_rowwise"),
    (re.compile(r"model\.layers\.\d+\.self_attn\.(q|k|v)_proj"), "colwise"),
    (re.compile(r"model\.layers\.\d+\.self_attn\.o_proj"), "rowwise"),
    (re.compile(r"model\.layers\.\d+\.mlp\.(gate|up)_proj"), "colwise"),
    (re.compile(r"model\.layers\.\d+\.mlp\.down_proj"), "rowwise"),
    (re.compile(r"lm_head"), "colwise"),
]
SUFFIXES = ("weight_scale_inv", "weight_scale", "input_scale", "weight", "bias")


def dtensor_style(module):
    for pat, style in DTENSOR_RULES:
        if pat.fullmatch(module):
            return style
    return "replicate"


def chunk(n, tp, r):
    """torch.chunk / DTensor Shard extent of rank r: (start, length)."""
    c = -(-n // tp) if n else 0
    s = min(r * c, n)
    return s, min((r + 1) * c, n) - s


def _slice(t, dim, start, count):
    """count rows (dim 0) or columns (dim 1) of t from start."""
    if dim == 0:
        return so._rows(t, start, count)
    return so._cols(t, start, count)


def _block_misaligned(n, tp, blk, nblocks):
    """The ranks whose torch.chunk boundary of n elements does not fall on a
    block of blk (or whose blocks differ from torch.chunk of the scale)."""
    bad = []
    for r in range(tp):
        s, ln = chunk(n, tp, r)
        bs, bl = chunk(nblocks, tp, r)
        want_bs = s // blk
        want_bl = (-(-(s + ln) // blk) - want_bs) if ln else 0
        if (s % blk and ln) or (ln and (bs, bl) != (want_bs, want_bl)) or (not ln and bl):
            bad.append((r, s))
    return bad


def _dtensor_checks(config, tp):
    c = so.text_config(config)
    A = c["num_attention_heads"]
    K = c.get("num_key_value_heads") or A
    if A % tp:
        raise Refused(f"num_attention_heads ({A}) is not divisible by tp {tp}",
                      ["num_attention_heads"], "engine")
    if K % tp:
        raise Refused(f"num_key_value_heads ({K}) is not divisible by tp {tp}",
                      ["num_key_value_heads"], "engine")


def _dtensor_block_check(sch, tensors, tp):
    bad = []
    for n in sorted(tensors):
        if not n.endswith(".weight") or tensors[n][0] not in FP8_DTYPES:
            continue
        m = _module(n)
        style = dtensor_style(m)
        if style not in ("colwise", "rowwise", "embedding_rowwise"):
            continue
        dim = 1 if style == "rowwise" else 0
        shape = tensors[n][1]
        blk = sch["block"][dim]
        sshape = tensors[m + "." + sch["scale"]][1]
        for r, s in _block_misaligned(shape[dim], tp, blk, sshape[dim]):
            bad.append((n, r, s, blk, "rows" if dim == 0 else "columns"))
    if bad:
        n, r, s, blk, what = bad[0]
        raise Refused(f"{n}: rank {r}'s {what} start at {s}, not a multiple of the quantization "
                      f"block {blk} (the scale's blocks would not pair with the weight's "
                      f"{what})", sorted({b[0] for b in bad} | {_module(b[0]) for b in bad}),
                      "block")


def dtensor_ranks(config, tensors, tp):
    sch = check_input(config, tensors)
    _dtensor_checks(config, tp)
    if sch is not None and sch["kind"] == "block":
        _dtensor_block_check(sch, tensors, tp)
    ranks = [dict() for _ in range(tp)]
    for n, t in tensors.items():
        if n.endswith(so.SKIPPED_SUFFIXES):
            continue
        m, suffix = n.rsplit(".", 1)
        style = dtensor_style(m)
        quantized = (sch is not None and m + ".weight" in tensors
                     and tensors[m + ".weight"][0] in FP8_DTYPES)
        dim = None  # None: whole on every rank
        if suffix in ("weight", "bias") or suffix not in SUFFIXES:
            if style in ("colwise", "embedding_rowwise"):
                dim = 0
            elif style == "rowwise" and suffix == "weight":
                dim = 1
        elif quantized and suffix == sch["scale"]:
            if sch["kind"] == "block":
                dim = {"colwise": 0, "embedding_rowwise": 0, "rowwise": 1}.get(style)
            elif sch["kind"] == "channel" and style in ("colwise", "embedding_rowwise"):
                dim = 0
        for r in range(tp):
            if dim is None:
                ranks[r][n] = t
            else:
                s, ln = chunk(t[1][dim], tp, r)
                ranks[r][n] = _slice(t, dim, s, ln)
    return ranks


# ------------------------------------------------------------------ serving layouts

# SGLang 0.5.23: which families hand quant_config to RadixAttention (models/*.py).
SGLANG_ATTN_QUANT = {"llama": True, "mistral": True, "qwen2": True, "qwen3": False,
                     "gemma3": True}
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
ROW = ("o_proj", "down_proj")


def _geometry(config, layout):
    fam = so.family_of(config)
    c = so.text_config(config)
    H, A, K, D, I, V = so._dims(c, fam, layout)
    return dict(fam=fam, H=H, A=A, K=K, D=D, I=I, V=V, L=c["num_hidden_layers"])


def part_rows(g, tp, r):
    """Rows of each source of the fused layers on rank r: {proj: (start, count)}
    (QKVParallelLinear with num_kv_head_replicas; MergedColumnParallelLinear)."""
    A, K, D, I = g["A"], g["K"], g["D"], g["I"]
    qh = A // tp
    if tp >= K:
        kh, ks = 1, r // (tp // K)
    else:
        kh = K // tp
        ks = r * kh
    n = I // tp
    return {"q_proj": (r * qh * D, qh * D), "k_proj": (ks * D, kh * D),
            "v_proj": (ks * D, kh * D), "gate_proj": (r * n, n), "up_proj": (r * n, n)}


def _layer_modules(i):
    p = f"model.layers.{i}."
    fused = {p + "self_attn.qkv_proj": [p + "self_attn." + x for x in FUSED["qkv_proj"]],
             p + "mlp.gate_up_proj": [p + "mlp." + x for x in FUSED["gate_up_proj"]]}
    row = {p + "self_attn.o_proj": p + "self_attn.o_proj", p + "mlp.down_proj": p + "mlp.down_proj"}
    return fused, row


def _serving_block_check(sch, g, tensors, tp, layout):
    """Every rank's rows of every fused part a multiple of bn (both engines'
    validate_*block_shape, without vLLM's merged-layer exception); a
    row-parallel rank's input width a multiple of bk when tp > 1."""
    bn, bk = sch["block"]
    bad = []
    rows = part_rows(g, tp, 0)
    for i in range(g["L"]):
        fused, row = _layer_modules(i)
        for into, srcs in fused.items():
            for s in srcs:
                if tensors.get(s + ".weight", ("",))[0] not in FP8_DTYPES:
                    continue
                n = rows[s.rsplit(".", 1)[1]][1]
                if n % bn:
                    bad.append((s + ".weight", into, f"{n} rows per rank", bn))
        for m in row.values():
            t = tensors.get(m + ".weight")
            if t is None or t[0] not in FP8_DTYPES or tp == 1:
                continue
            n = t[1][1] // tp
            if n % bk:
                bad.append((m + ".weight", m, f"{n} input columns per rank", bk))
    if bad:
        n, into, what, blk = bad[0]
        names = sorted({b[0] for b in bad} | {_module(b[0]) for b in bad} | {b[1] for b in bad})
        raise Refused(f"{n}: {what} at tp {tp} is not a multiple of the quantization block "
                      f"{blk} ({layout} would pair scale blocks with the wrong rows)", names,
                      "block")


def _fused_scale(sch, srcs, rows, tensors):
    """The rank's scale of a fused layer (block rows, channel rows, or one slot
    per part), F32; None when the layer is unquantized."""
    q = [tensors.get(s + ".weight", ("",))[0] in FP8_DTYPES for s in srcs]
    if not any(q):
        return None
    if not all(q):
        raise Refused(f"{srcs}: some but not all parts of a fused layer are quantized "
                      f"(both engines refuse)", srcs, "input")
    parts = []
    for s in srcs:
        st, n = rows[s.rsplit(".", 1)[1]]
        sc = tensors[s + "." + sch["scale"]]
        if sch["kind"] == "block":
            bn = sch["block"][0]
            parts.append(so._rows(sc, st // bn, -(-n // bn)))
        elif sch["kind"] == "channel":
            parts.append(so._rows(sc, st, n))
        else:
            parts.append((sc[0], [1], sc[2]))
    return as_f32(so._cat0([(p[0], p[1], p[2]) for p in parts]))


def _row_scale(sch, m, tensors, tp, r):
    if tensors.get(m + ".weight", ("",))[0] not in FP8_DTYPES:
        return None
    sc = tensors[m + "." + sch["scale"]]
    if sch["kind"] == "block":
        bk = sch["block"][1]
        n = tensors[m + ".weight"][1][1] // tp
        return as_f32(so._cols(sc, r * n // bk, -(-n // bk)))
    if sch["kind"] == "channel":
        return as_f32(sc)
    return as_f32((sc[0], [1], sc[2]))


def serving_ranks(config, tensors, layout, tp):
    sch = check_input(config, tensors)
    g = _geometry(config, layout)
    if sch is not None and layout == "sglang" and sch["kind"] != "block":
        raise Refused(f"SGLang's sharded_state loader runs process_weights_after_loading before "
                      f"reading the files: {sch['method']} per-{sch['kind']} FP8 weights are "
                      f"stored there transposed ([in, out]) and per-tensor ones requantized to one "
                      f"scale, depending on the GPU", [sch["method"], "sglang"], "layout")
    try:
        ok, why = so.accepts(config, tp, layout)
    except so.Unsupported as e:
        raise Refused(str(e), [], "engine")
    if not ok:
        raise Refused(why, [why.split(" ", 1)[0]], "engine")
    if sch is not None and sch["kind"] == "block":
        _serving_block_check(sch, g, tensors, tp, layout)
    # the unquantized picture: weights (F8 bytes cut like any other), norms, vocab
    plain = {n: t for n, t in tensors.items()
             if not n.endswith((".weight_scale_inv", ".weight_scale", ".input_scale"))}
    cfg = {k: v for k, v in config.items() if k != "quantization_config"}
    ranks = so.expected_ranks_from(cfg, plain, layout, tp)
    if sch is None:
        return ranks
    mdt = model_dtype(config)
    for r in range(tp):
        rows = part_rows(g, tp, r)
        out = ranks[r]
        for i in range(g["L"]):
            fused, row = _layer_modules(i)
            for into, srcs in fused.items():
                s = _fused_scale(sch, srcs, rows, tensors)
                if s is not None:
                    out[into + "." + sch["scale"]] = s
                    if sch["static_input"]:
                        out[into + ".input_scale"] = as_f32(so._cat0(
                            [(tensors[x + ".input_scale"][0], [1], tensors[x + ".input_scale"][2])
                             for x in srcs]))
            for m in row.values():
                s = _row_scale(sch, m, tensors, tp, r)
                if s is not None:
                    out[m + "." + sch["scale"]] = s
                    if sch["static_input"]:
                        t = tensors[m + ".input_scale"]
                        out[m + ".input_scale"] = as_f32((t[0], [1], t[2]))
            a = f"model.layers.{i}.self_attn.attn."
            if layout == "vllm" and sch["method"] == "fp8":
                for x in ("q_scale", "k_scale", "v_scale", "prob_scale"):
                    out[a + x] = (mdt, [], scalar_bytes(mdt, -1.0))
            elif layout == "vllm":
                for x in ("k_scale", "v_scale", "q_scale"):
                    out[a + x] = ("F32", [1], scalar_bytes("F32", 1.0))
                for x in ("k_zero_point", "v_zero_point", "q_zero_point"):
                    out[a + x] = (mdt, [1], scalar_bytes(mdt, 0.0))
            elif sch["method"] == "fp8" and SGLANG_ATTN_QUANT[g["fam"]]:
                for x in ("k_scale", "v_scale"):
                    out[a + x] = ("F32", [], scalar_bytes("F32", 1.0))
    return ranks


# ------------------------------------------------------------------ entry points

_CACHE = {}


def load(model_dir):
    key = os.path.abspath(model_dir)
    if key not in _CACHE:
        _CACHE[key] = so.load_checkpoint(model_dir)
    return _CACHE[key]


def expected_ranks_from(config, tensors, layout, tp):
    if layout not in LAYOUTS:
        raise ValueError(f"layout {layout!r}")
    if tp < 1:
        raise Refused(f"tp {tp} < 1", ["tp"], "engine")
    if layout == "dtensor":
        return dtensor_ranks(config, tensors, tp)
    return serving_ranks(config, tensors, layout, tp)


def expected_ranks(model_dir, layout, tp):
    """Per rank r, {name: (dtype, shape, bytes)}: exactly rank r's tensors.
    Raises Refused when tpshard must refuse."""
    config, tensors = load(model_dir)
    return expected_ranks_from(config, tensors, layout, tp)


def accepts(model_dir, tp, layout):
    """(True, "", []) or (False, reason, names): names lists the tensors or
    fields of which the error must name one."""
    try:
        expected_ranks(model_dir, layout, tp)
    except Refused as e:
        return False, e.reason, e.names
    return True, "", []


def working_tps(model_dir, layout, upto=16):
    return [tp for tp in range(1, upto + 1) if accepts(model_dir, tp, layout)[0]]


def describe(model_dir):
    """One line: method, kind, block size (for test names)."""
    config, _ = load(model_dir)
    sch = scheme_of(config)
    if sch is None:
        return "unquantized"
    return f"{sch['method']} {sch['kind']}" + (f" {list(sch['block'])}" if sch["block"] else "")


# ------------------------------------------------------------------ GPTQ

def gptq_model(bits=4, group=128, seed=5, H=256, I=512, A=4, K=2, D=64, V=300):
    """A one-layer LLaMA in GPTQ as AutoGPTQ writes it: per linear (out, in)
    qweight I32 [in / pf, out] (pf = 32 // bits codes a word, along in),
    scales F16 [groups, out], qzeros I32 [groups, out / pf] (along out),
    g_idx I32 [in]; groups = in // group (1 for -1). Codes and zeros are
    real packed integers: zero point 2**(bits-1) - 1 stored (sym GPTQ)."""
    rng = np.random.default_rng(seed)
    pf = 32 // bits
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
              "intermediate_size": I, "num_attention_heads": A, "num_key_value_heads": K,
              "head_dim": D, "num_hidden_layers": 1, "vocab_size": V, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": False, "torch_dtype": "float16",
              "quantization_config": {"quant_method": "gptq", "bits": bits, "group_size": group,
                                      "desc_act": False, "sym": True,
                                      "checkpoint_format": "gptq"}}
    t = {}

    def f16(*shape):
        return ("F16", list(shape), rng.standard_normal(shape).astype(np.float16).tobytes())

    def pack(codes, axis):
        """codes (unsigned, < 2**bits) packed pf to an int32 word along axis."""
        c = np.moveaxis(codes.astype(np.uint32), axis, -1)
        c = c.reshape(c.shape[:-1] + (c.shape[-1] // pf, pf))
        w = np.zeros(c.shape[:-1], dtype=np.uint32)
        for k in range(pf):
            w |= c[..., k] << np.uint32(bits * k)
        return np.moveaxis(w, -1, axis).astype("<u4").view("<i4")

    t["model.embed_tokens.weight"] = f16(V, H)
    t["lm_head.weight"] = f16(V, H)
    t["model.norm.weight"] = f16(H)
    p = "model.layers.0."
    t[p + "input_layernorm.weight"] = f16(H)
    t[p + "post_attention_layernorm.weight"] = f16(H)
    shapes = {"self_attn.q_proj": (A * D, H), "self_attn.k_proj": (K * D, H),
              "self_attn.v_proj": (K * D, H), "self_attn.o_proj": (H, A * D),
              "mlp.gate_proj": (I, H), "mlp.up_proj": (I, H), "mlp.down_proj": (H, I)}
    for m, (out, inn) in shapes.items():
        groups = 1 if group == -1 else inn // group
        q = rng.integers(0, 2 ** bits, size=(inn, out))
        z = np.full((groups, out), 2 ** (bits - 1) - 1)
        t[p + m + ".qweight"] = ("I32", [inn // pf, out], pack(q, 0).tobytes())
        t[p + m + ".qzeros"] = ("I32", [groups, out // pf], pack(z, 1).tobytes())
        t[p + m + ".scales"] = ("F16", [groups, out],
                                (rng.random((groups, out)) * 0.01 + 1e-3).astype(np.float16)
                                .tobytes())
        t[p + m + ".g_idx"] = ("I32", [inn],
                               (np.arange(inn) // (inn if group == -1 else group))
                               .astype("<i4").tobytes())
    return config, t


def gptq_check(config, tensors):
    """What vLLM 0.33 refuses of a GPTQ checkpoint, and shapes that disagree
    with its config: Refused(rule "input" or "quant_method") naming the
    field or tensor; None when it is one vLLM loads."""
    qc = config["quantization_config"]
    bits, group = qc.get("bits"), qc.get("group_size")
    if bits not in (4, 8):
        raise Refused(f"bits = {bits}: only 4 and 8", ["bits"], "quant_method")
    if group not in (-1, 32, 64, 128):
        raise Refused(f"group_size = {group}", ["group_size"], "quant_method")
    if qc.get("sym") is False:
        raise Refused("asymmetric GPTQ", ["sym"], "quant_method")
    if qc.get("desc_act") and group != -1:
        raise Refused("desc_act with groups", ["desc_act"], "quant_method")
    pf = 32 // bits
    for n in sorted(tensors):
        for suf in (".qzeros", ".scales", ".g_idx"):
            if n.endswith(suf) and n[: -len(suf)] + ".qweight" not in tensors:
                raise Refused(f"{n} without its qweight", [n], "input")
    for n in sorted(tensors):
        if not n.endswith(".qweight"):
            continue
        m = n[: -len(".qweight")]
        dt, (rows, out), _ = tensors[n]
        inn = rows * pf
        if group != -1 and inn % group:
            raise Refused(f"{n}: {inn} input features, group {group}", [n], "input")
        groups = 1 if group == -1 else inn // group
        want = {".scales": [groups, out], ".qzeros": [groups, out // pf], ".g_idx": [inn]}
        for suf, shape in want.items():
            if m + suf not in tensors:
                if suf == ".g_idx":
                    continue
                raise Refused(f"{n} without {m + suf}", [n, m + suf], "input")
            if list(tensors[m + suf][1]) != shape or (suf == ".qzeros" and out % pf):
                raise Refused(f"{m + suf} is {tensors[m + suf][1]}, not {shape}", [m + suf],
                              "input")
    return None
