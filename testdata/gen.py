#!/usr/bin/env python3
"""Tiny, deterministic Hugging Face-style checkpoints for tpshard's tests.

Python standard library only (no numpy), so it runs wherever python3 does.

    python3 testdata/gen.py FAMILY OUTDIR [options]
    python3 testdata/gen.py --all-dtypes OUTDIR [options]

FAMILY: llama | mistral | qwen2 | qwen3 | gemma3 | gemma4.  OUTDIR gets
config.json (real HF field names; Gemma3/Gemma4 text fields under text_config,
except with --gemma3-naming causal, which writes a Gemma3ForCausalLM) and either
model.safetensors or, with --index PARTS, model.safetensors.index.json plus
model-0000K-of-0000N.safetensors.  Files are written in the reference layout
(what safetensors' save_file produces): tensors sorted by dtype alignment
descending, then by name; compact JSON header with __metadata__ first,
space-padded to a multiple of 8.  Same arguments and seed -> same bytes.
Float data is finite and in [-1, 1).
"""
import argparse
import json
import os
import random
import struct
import sys

# safetensors' Dtype enum order == increasing alignment.
DTYPES = ["BOOL", "F4", "F6_E2M3", "F6_E3M2", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0",
          "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32",
          "C64", "F64", "I64", "U64"]
BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8,
        "F8_E4M3": 8, "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16,
        "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64,
        "I64": 64, "U64": 64}
# The dtypes --all-dtypes writes (the byte-sized ones every tool handles).
ALL_DTYPES = ["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ",
              "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "C64", "F64",
              "I64", "U64"]


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def nbytes(dtype, shape):
    bits = numel(shape) * BITS[dtype]
    if bits % 8:
        raise ValueError(f"{dtype}{list(shape)}: {bits} bits is not a whole number of bytes")
    return bits // 8


# ------------------------------------------------------------------ data

def _f32_values(rng, n):
    # k / 2^23 with k in [-2^23, 2^23): exact in f32, in [-1, 1).
    return [(rng.getrandbits(24) - (1 << 23)) / float(1 << 23) for _ in range(n)]


def _pack_nibbles(codes, bits):
    """LSB-first bit packing of `bits`-wide codes (F4, F6)."""
    acc = 0
    for i, c in enumerate(codes):
        acc |= c << (i * bits)
    nb = (len(codes) * bits + 7) // 8
    return acc.to_bytes(nb, "little")


def rand_data(rng, dtype, shape):
    """Row-major little-endian bytes; floats finite in [-1, 1)."""
    n = numel(shape)
    if dtype == "F32":
        return struct.pack(f"<{n}f", *_f32_values(rng, n))
    if dtype == "BF16":
        # truncating an f32 toward zero keeps it in [-1, 1)
        f = struct.pack(f"<{n}f", *_f32_values(rng, n))
        return b"".join(f[i + 2:i + 4] for i in range(0, len(f), 4))
    if dtype == "F16":
        # k / 1024, k in [-1024, 1024): exact in f16
        return struct.pack(f"<{n}e", *[(rng.getrandbits(11) - 1024) / 1024.0 for _ in range(n)])
    if dtype == "F64":
        return struct.pack(f"<{n}d", *[(rng.getrandbits(53) - (1 << 52)) / float(1 << 52)
                                       for _ in range(n)])
    if dtype == "C64":
        return struct.pack(f"<{2 * n}f", *_f32_values(rng, 2 * n))
    if dtype == "BOOL":
        return bytes(rng.getrandbits(1) for _ in range(n))
    # 8-bit floats: sign | exponent below the bias (|x| < 1) | mantissa; never NaN
    if dtype == "F8_E4M3":      # bias 7: exponent field 0..6
        return bytes(rng.getrandbits(1) << 7 | rng.randrange(7) << 3 | rng.getrandbits(3)
                     for _ in range(n))
    if dtype == "F8_E5M2":      # bias 15: exponent field 0..14
        return bytes(rng.getrandbits(1) << 7 | rng.randrange(15) << 2 | rng.getrandbits(2)
                     for _ in range(n))
    if dtype == "F8_E4M3FNUZ":  # bias 8, 0x80 is NaN
        return bytes(_nonnan(rng.getrandbits(1) << 7 | rng.randrange(8) << 3 | rng.getrandbits(3))
                     for _ in range(n))
    if dtype == "F8_E5M2FNUZ":  # bias 16, 0x80 is NaN
        return bytes(_nonnan(rng.getrandbits(1) << 7 | rng.randrange(16) << 2 | rng.getrandbits(2))
                     for _ in range(n))
    if dtype == "F8_E8M0":      # 2^(e-127), 0xFF is NaN: e in 0..126
        return bytes(rng.randrange(127) for _ in range(n))
    if dtype == "F4":           # e2m1: 0 and 0.5 with either sign
        return _pack_nibbles([rng.getrandbits(1) << 3 | rng.getrandbits(1) for _ in range(n)], 4)
    if dtype == "F6_E2M3":      # exponent 0: subnormals m/8 < 1
        return _pack_nibbles([rng.getrandbits(1) << 5 | rng.getrandbits(3) for _ in range(n)], 6)
    if dtype == "F6_E3M2":      # bias 3: exponent 0..2
        return _pack_nibbles([rng.getrandbits(1) << 5 | rng.randrange(3) << 2 | rng.getrandbits(2)
                              for _ in range(n)], 6)
    # integers: any bits
    return bytes(rng.getrandbits(8) for _ in range(nbytes(dtype, shape)))


def _nonnan(b):
    return 0 if b == 0x80 else b


# ------------------------------------------------------------------ writer

def header_bytes(entries, metadata):
    """entries: [(name, dtype, shape, begin, end)] in file order."""
    hdr = {}
    if metadata is not None:
        hdr["__metadata__"] = metadata
    for name, dtype, shape, b, e in entries:
        hdr[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [b, e]}
    js = json.dumps(hdr, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    js += b" " * (-len(js) % 8)
    return struct.pack("<Q", len(js)) + js


def file_order(tensors):
    """Reference order: dtype by descending alignment, then name (byte-wise)."""
    return sorted(tensors, key=lambda n: (-DTYPES.index(tensors[n][0]), n.encode("utf-8")))


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: (dtype, shape, bytes)}."""
    entries, off = [], 0
    order = file_order(tensors)
    for name in order:
        dt, shape, data = tensors[name]
        assert len(data) == nbytes(dt, shape), name
        entries.append((name, dt, shape, off, off + len(data)))
        off += len(data)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header_bytes(entries, metadata))
        for name in order:
            f.write(tensors[name][2])
    os.replace(tmp, path)


def write_checkpoint(outdir, tensors, parts, metadata=None):
    """One model.safetensors, or an index and `parts` part files (round robin by name)."""
    os.makedirs(outdir, exist_ok=True)
    if metadata is None:
        metadata = {"format": "pt"}
    parts = min(parts, len(tensors))  # no empty parts: HF never writes one
    if parts <= 1:
        write_safetensors(os.path.join(outdir, "model.safetensors"), tensors, metadata)
        return ["model.safetensors"]
    names = sorted(tensors)
    files = [f"model-{k + 1:05d}-of-{parts:05d}.safetensors" for k in range(parts)]
    weight_map, total = {}, 0
    for k, fname in enumerate(files):
        mine = {n: tensors[n] for i, n in enumerate(names) if i % parts == k}
        write_safetensors(os.path.join(outdir, fname), mine, metadata)
        for n in mine:
            weight_map[n] = fname
            total += len(mine[n][2])
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    with open(os.path.join(outdir, "model.safetensors.index.json"), "w") as f:
        f.write(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return files


# ------------------------------------------------------------------ families

TORCH_DTYPE = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64"}


class Spec:
    """Collects (name -> shape) in insertion order."""

    def __init__(self):
        self.shapes = {}

    def add(self, name, *shape):
        if name in self.shapes:
            raise ValueError(f"duplicate tensor {name}")
        self.shapes[name] = list(shape)


def llama_like(a, family):
    H, A, K, V, I, L = a.hidden, a.heads, a.kv_heads, a.vocab, a.inter, a.layers
    D = a.head_dim or H // A
    s = Spec()
    s.add("model.embed_tokens.weight", V, H)
    for i in range(L):
        p = f"model.layers.{i}."
        s.add(p + "input_layernorm.weight", H)
        s.add(p + "self_attn.q_proj.weight", A * D, H)
        s.add(p + "self_attn.k_proj.weight", K * D, H)
        s.add(p + "self_attn.v_proj.weight", K * D, H)
        if family == "qwen2" or a.attention_bias:
            s.add(p + "self_attn.q_proj.bias", A * D)
            s.add(p + "self_attn.k_proj.bias", K * D)
            s.add(p + "self_attn.v_proj.bias", K * D)
        if a.attention_bias and family != "qwen2":  # HF: o_proj bias = attention_bias
            s.add(p + "self_attn.o_proj.bias", H)
        if family == "qwen3":
            s.add(p + "self_attn.q_norm.weight", D)
            s.add(p + "self_attn.k_norm.weight", D)
        s.add(p + "self_attn.o_proj.weight", H, A * D)
        s.add(p + "post_attention_layernorm.weight", H)
        s.add(p + "mlp.gate_proj.weight", I, H)
        s.add(p + "mlp.up_proj.weight", I, H)
        s.add(p + "mlp.down_proj.weight", H, I)
        if a.mlp_bias:
            s.add(p + "mlp.gate_proj.bias", I)
            s.add(p + "mlp.up_proj.bias", I)
            s.add(p + "mlp.down_proj.bias", H)
    s.add("model.norm.weight", H)
    if not a.tied:
        s.add("lm_head.weight", V, H)
    arch = {"llama": ("LlamaForCausalLM", "llama"), "qwen2": ("Qwen2ForCausalLM", "qwen2"),
            "qwen3": ("Qwen3ForCausalLM", "qwen3"),
            "mistral": ("MistralForCausalLM", "mistral")}[family]
    cfg = {
        "architectures": [arch[0]],
        "model_type": arch[1],
        "hidden_size": H,
        "num_attention_heads": A,
        "num_key_value_heads": K,
        "head_dim": D,
        "intermediate_size": I,
        "vocab_size": V,
        "num_hidden_layers": L,
        "max_position_embeddings": 128,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": bool(a.tied),
        "torch_dtype": TORCH_DTYPE.get(a.dtype, "bfloat16"),
    }
    if family == "qwen2":
        cfg["attention_bias"] = True  # informational: Qwen2 always has q/k/v biases
    elif a.attention_bias:
        cfg["attention_bias"] = True
    if a.mlp_bias:
        cfg["mlp_bias"] = True
    if family == "mistral":
        cfg["sliding_window"] = None
    return s, cfg


def gemma3(a):
    H, A, K, V, I, L = a.hidden, a.heads, a.kv_heads, a.vocab, a.inter, a.layers
    D = a.head_dim or H // A
    VH = 32  # vision hidden size
    naming = a.gemma3_naming
    tm = {"hub": "language_model.model.", "new": "model.language_model.",
          "causal": "model."}[naming]
    s = Spec()
    s.add(tm + "embed_tokens.weight", V, H)
    for i in range(L):
        p = f"{tm}layers.{i}."
        s.add(p + "input_layernorm.weight", H)
        s.add(p + "self_attn.q_proj.weight", A * D, H)
        s.add(p + "self_attn.k_proj.weight", K * D, H)
        s.add(p + "self_attn.v_proj.weight", K * D, H)
        if a.attention_bias:
            s.add(p + "self_attn.q_proj.bias", A * D)
            s.add(p + "self_attn.k_proj.bias", K * D)
            s.add(p + "self_attn.v_proj.bias", K * D)
            s.add(p + "self_attn.o_proj.bias", H)
        s.add(p + "self_attn.o_proj.weight", H, A * D)
        s.add(p + "self_attn.q_norm.weight", D)
        s.add(p + "self_attn.k_norm.weight", D)
        s.add(p + "post_attention_layernorm.weight", H)
        s.add(p + "pre_feedforward_layernorm.weight", H)
        s.add(p + "post_feedforward_layernorm.weight", H)
        s.add(p + "mlp.gate_proj.weight", I, H)
        s.add(p + "mlp.up_proj.weight", I, H)
        s.add(p + "mlp.down_proj.weight", H, I)
    s.add(tm + "norm.weight", H)
    if not a.tied:
        s.add("language_model.lm_head.weight" if naming == "hub" else "lm_head.weight", V, H)
    text = {
        "model_type": "gemma3_text",
        "hidden_size": H,
        "num_attention_heads": A,
        "num_key_value_heads": K,
        "head_dim": D,
        "intermediate_size": I,
        "vocab_size": V,
        "num_hidden_layers": L,
        "rms_norm_eps": 1e-06,
        "sliding_window": 512,
    }
    if a.attention_bias:
        text["attention_bias"] = True
    if naming == "causal":
        cfg = {"architectures": ["Gemma3ForCausalLM"]}
        cfg.update(text)
        cfg["tie_word_embeddings"] = bool(a.tied)
        cfg["torch_dtype"] = TORCH_DTYPE.get(a.dtype, "bfloat16")
        return s, cfg
    vt = "vision_tower.vision_model." if naming == "hub" else "model.vision_tower.vision_model."
    mp = "multi_modal_projector." if naming == "hub" else "model.multi_modal_projector."
    s.add(vt + "embeddings.patch_embedding.weight", VH, 3, 2, 2)
    s.add(vt + "embeddings.patch_embedding.bias", VH)
    s.add(vt + "encoder.layers.0.self_attn.q_proj.weight", VH, VH)
    s.add(vt + "encoder.layers.0.self_attn.q_proj.bias", VH)
    s.add(vt + "encoder.layers.0.mlp.fc1.weight", 2 * VH, VH)
    s.add(vt + "encoder.layers.0.mlp.fc2.weight", VH, 2 * VH)
    s.add(vt + "post_layernorm.weight", VH)
    s.add(mp + "mm_input_projection_weight", VH, H)
    s.add(mp + "mm_soft_emb_norm.weight", VH)
    cfg = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "tie_word_embeddings": bool(a.tied),
        "torch_dtype": TORCH_DTYPE.get(a.dtype, "bfloat16"),
        "text_config": text,
        "vision_config": {"model_type": "siglip_vision_model", "hidden_size": VH,
                          "num_hidden_layers": 1, "patch_size": 2},
    }
    return s, cfg


def gemma4(a):
    H, A, K, V, I, L = a.hidden, a.heads, a.kv_heads, a.vocab, a.inter, a.layers
    D = a.head_dim or H // A
    GD = 2 * D  # global_head_dim
    variant = a.gemma4_variant
    k_eq_v = variant in ("dense", "moe") or a.no_v_proj_full
    gkv = None
    if variant in ("dense", "moe"):
        gkv = a.global_kv_heads if a.global_kv_heads else max(1, K // 2)
    ple = 8 if variant == "e" else None
    kv_shared = a.kv_shared if a.kv_shared is not None else (L // 2 if variant == "e" else 0)
    layer_types = ["full_attention" if (i % 2 == 1 or i == L - 1) else "sliding_attention"
                   for i in range(L)]
    E, MI = 4, 24  # experts, moe_intermediate_size
    tm = "model.language_model."
    s = Spec()
    s.add(tm + "embed_tokens.weight", V, H)
    if ple:
        s.add(tm + "embed_tokens_per_layer.weight", V, L * ple)
        s.add(tm + "per_layer_model_projection.weight", L * ple, H)
        s.add(tm + "per_layer_projection_norm.weight", ple)
    for i in range(L):
        p = f"{tm}layers.{i}."
        full = layer_types[i] == "full_attention"
        hd = GD if full else D
        kvh = (gkv if (full and gkv) else K)
        shared = i >= L - kv_shared
        s.add(p + "input_layernorm.weight", H)
        s.add(p + "layer_scalar", 1)
        s.add(p + "self_attn.q_proj.weight", A * hd, H)
        s.add(p + "self_attn.q_norm.weight", hd)
        if not shared:
            s.add(p + "self_attn.k_proj.weight", kvh * hd, H)
            s.add(p + "self_attn.k_norm.weight", hd)
            if not (full and k_eq_v):
                s.add(p + "self_attn.v_proj.weight", kvh * hd, H)
        s.add(p + "self_attn.o_proj.weight", H, A * hd)
        s.add(p + "post_attention_layernorm.weight", H)
        s.add(p + "pre_feedforward_layernorm.weight", H)
        s.add(p + "post_feedforward_layernorm.weight", H)
        s.add(p + "mlp.gate_proj.weight", I, H)
        s.add(p + "mlp.up_proj.weight", I, H)
        s.add(p + "mlp.down_proj.weight", H, I)
        if ple:
            s.add(p + "per_layer_input_gate.weight", ple, H)
            s.add(p + "per_layer_projection.weight", H, ple)
            s.add(p + "post_per_layer_input_norm.weight", H)
        if variant == "moe":
            s.add(p + "router.proj.weight", E, H)
            s.add(p + "router.scale", H)
            s.add(p + "experts.gate_up_proj", E, 2 * MI, H)
            s.add(p + "experts.down_proj", E, H, MI)
            s.add(p + "experts.per_expert_scale", E)
    s.add(tm + "norm.weight", H)
    if not a.tied:
        s.add("lm_head.weight", V, H)
    s.add("model.vision_tower.encoder.layers.0.self_attn.q_proj.weight", 32, 32)
    s.add("model.vision_tower.encoder.layers.0.self_attn.q_proj.bias", 32)
    s.add("model.embed_vision.embedding_projection.weight", H, 32)
    text = {
        "model_type": "gemma4_text",
        "hidden_size": H,
        "num_attention_heads": A,
        "num_key_value_heads": K,
        "num_global_key_value_heads": gkv,
        "head_dim": D,
        "global_head_dim": GD,
        "intermediate_size": I,
        "vocab_size": V,
        "num_hidden_layers": L,
        "layer_types": layer_types,
        "hidden_size_per_layer_input": ple,
        "vocab_size_per_layer_input": V if ple else None,
        "num_kv_shared_layers": kv_shared,
        "attention_k_eq_v": k_eq_v,
        "enable_moe_block": variant == "moe",
        "tie_word_embeddings": bool(a.tied),
    }
    if variant == "moe":
        text.update({"num_experts": E, "top_k_experts": 2, "moe_intermediate_size": MI})
    cfg = {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "tie_word_embeddings": bool(a.tied),
        "torch_dtype": TORCH_DTYPE.get(a.dtype, "bfloat16"),
        "text_config": text,
        "vision_config": {"model_type": "gemma4_vision", "hidden_size": 32},
    }
    return s, cfg


def build(a):
    """-> (tensors {name: (dtype, shape, bytes)}, config dict)."""
    fam = "llama" if a.all_dtypes else a.family
    if fam in ("llama", "mistral", "qwen2", "qwen3"):
        spec, cfg = llama_like(a, fam)
    elif fam == "gemma3":
        spec, cfg = gemma3(a)
    elif fam == "gemma4":
        spec, cfg = gemma4(a)
    else:
        raise SystemExit(f"gen.py: unknown family {fam!r} (llama mistral qwen2 qwen3 gemma3 gemma4)")
    rng = random.Random(a.seed)
    tensors = {}
    names = sorted(spec.shapes)
    for i, name in enumerate(names):
        dt = ALL_DTYPES[i % len(ALL_DTYPES)] if a.all_dtypes else a.dtype
        shape = spec.shapes[name]
        tensors[name] = (dt, shape, rand_data(rng, dt, shape))
    if a.all_dtypes:
        # make sure every dtype is present even with few layers
        for j in range(len(names), len(ALL_DTYPES)):
            dt = ALL_DTYPES[j]
            name = f"extra.{dt.lower()}"
            tensors[name] = (dt, [3, 5], rand_data(rng, dt, [3, 5]))
    return tensors, cfg


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("family", nargs="?", help="llama mistral qwen2 qwen3 gemma3 gemma4")
    ap.add_argument("outdir", nargs="?")
    ap.add_argument("--all-dtypes", action="store_true",
                    help="llama names, one dtype per tensor cycling over every byte-sized dtype")
    ap.add_argument("--dtype", default="BF16", choices=DTYPES)
    ap.add_argument("--layers", type=int)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=0, help="default hidden/heads")
    ap.add_argument("--global-kv-heads", type=int, default=0,
                    help="gemma4 dense/moe num_global_key_value_heads (default kv-heads/2)")
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--inter", type=int, default=96)
    ap.add_argument("--index", type=int, default=0, metavar="PARTS",
                    help="write an index and PARTS part files")
    ap.add_argument("--tied", action="store_true", default=None,
                    help="tie_word_embeddings, no lm_head (default for gemma3/gemma4)")
    ap.add_argument("--untied", dest="tied", action="store_false",
                    help="write lm_head.weight (default for llama/qwen)")
    ap.add_argument("--attention-bias", action="store_true",
                    help="q/k/v/o_proj biases and attention_bias in config.json"
                         " (llama mistral qwen3 gemma3; qwen2 always has q/k/v biases)")
    ap.add_argument("--mlp-bias", action="store_true",
                    help="gate/up/down_proj biases and mlp_bias in config.json (llama mistral)")
    ap.add_argument("--no-config", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gemma4-variant", choices=["e", "dense", "moe"], default="e")
    ap.add_argument("--kv-shared", type=int, default=None,
                    help="gemma4: last N layers share KV (no k/v_proj); default layers/2 for e")
    ap.add_argument("--no-v-proj-full", action="store_true",
                    help="gemma4: full-attention layers have no v_proj (attention_k_eq_v)"
                         " (default for dense and moe)")
    ap.add_argument("--gemma3-naming", choices=["hub", "new", "causal"], default="hub")
    ap.add_argument("--metadata", default=None,
                    help="JSON object for __metadata__ (default {\"format\":\"pt\"})")
    a = ap.parse_args(argv)
    if a.all_dtypes:
        if a.family and not a.outdir:  # gen.py --all-dtypes OUTDIR
            a.outdir, a.family = a.family, "llama"
        a.family = a.family or "llama"
    if not a.family or not a.outdir:
        ap.error("FAMILY and OUTDIR are required")
    if a.layers is None:
        a.layers = 4 if a.family == "gemma4" else 2
    if a.tied is None:
        a.tied = a.family in ("gemma3", "gemma4")
    for k in ("hidden", "heads", "kv_heads", "vocab", "inter", "layers"):
        if getattr(a, k) < 0:
            ap.error(f"--{k.replace('_', '-')} must be >= 0")
    if a.heads == 0 and not a.head_dim:
        ap.error("--heads 0 needs --head-dim")
    if a.attention_bias and a.family not in ("llama", "mistral", "qwen3", "gemma3"):
        ap.error("--attention-bias is for llama, mistral, qwen3 and gemma3")
    if a.mlp_bias and a.family not in ("llama", "mistral"):
        ap.error("--mlp-bias is for llama and mistral")
    return a


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    tensors, cfg = build(a)
    os.makedirs(a.outdir, exist_ok=True)
    meta = json.loads(a.metadata) if a.metadata is not None else None
    write_checkpoint(a.outdir, tensors, a.index, meta)
    if not a.no_config:
        with open(os.path.join(a.outdir, "config.json"), "w") as f:
            f.write(json.dumps(cfg, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
