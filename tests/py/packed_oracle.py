"""An independent model of vLLM 0.33's rank state for packed integer checkpoints
(GPTQ and AWQ LLaMA / Qwen2 / Mistral), written from vLLM's code
(layers/quantization/auto_gptq.py, auto_awq.py, model_executor/parameter.py,
layers/linear.py), not from tpshard's. numpy and the standard library only.

build(dir, method, ...) writes a tiny checkpoint; expected_ranks(dir, tp)
gives every rank's {name: (dtype, shape, bytes)} or raises Refused with the
words vLLM's refusal (or tpshard's, where vLLM would mis-slice) must say.

The rules:
  GPTQ  qweight I32 [in/8, out], scales [G, out], qzeros I32 [G, out/8],
        g_idx dropped. QKV / gate-up: columns of each part for the rank,
        concatenated (qzeros in words: a part's rank width must be a
        multiple of 8). o_proj / down_proj: rows (qweight in words, scales
        and qzeros in groups: in/tp must be a multiple of the group); with
        group_size -1 scales [1, out] and qzeros [1, out/8] whole on every
        rank (marlin_repeat_scales_on_all_ranks).
  AWQ   qweight I32 [in, out/8], qzeros I32 [G, out/8], scales [G, out]:
        column-parallel cuts columns in words (qweight, qzeros) or features
        (scales); row-parallel cuts rows; group_size -1 at tp > 1 on a
        row-parallel layer raises "The input size is not aligned".
  Both  vocabulary padded to a multiple of 64 and split evenly, KV heads
        replicated when fewer than ranks, attention's _k/_v/_q/_prob_scale
        F32 [] = 1.0, norms whole, scales in the model's dtype.
"""
import json
import os

import numpy as np

DT = {"F16": np.float16, "I32": np.int32, "BF16": np.uint16, "F32": np.float32, "I64": np.int64}


class Refused(Exception):
    def __init__(self, reason, *words):
        super().__init__(reason)
        self.reason = reason
        self.words = list(words)


def _st_write(path, tensors):
    """A safetensors file of {name: (dtype, shape, bytes)}, sorted, 'pt' metadata."""
    hdr, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for n in sorted(tensors):
        d, s, b = tensors[n]
        hdr[n] = {"dtype": d, "shape": list(s), "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def _st_read(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = int.from_bytes(raw[:8], "little")
    hdr = json.loads(raw[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        b, e = v["data_offsets"]
        out[k] = (v["dtype"], list(v["shape"]), raw[8 + n + b:8 + n + e])
    return out


def _arr(t):
    d, s, b = t
    return np.frombuffer(b, dtype=DT[d]).reshape(s)


def _t(a, dtype):
    a = np.asarray(a)
    return (dtype, list(a.shape), a.tobytes())


def build(d, method, family="llama", H=128, I=512, heads=4, kv=2, hd=32, layers=2, V=270,
          group=128, bits=4, sym=True, desc_act=False, scale_dtype="F16", bias=False, seed=1,
          bad=None):
    """A tiny packed checkpoint in d; bad: one defect to plant ('qzeros-shape',
    'no-scales'). Returns d."""
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(seed)
    pf = 32 // bits
    t = {}

    def f16(*shape):
        return _t(rng.standard_normal(shape).astype(np.float16), "F16")

    def words(*shape):
        return _t(rng.integers(-2**31, 2**31 - 1, size=shape, dtype=np.int64).astype(np.int32), "I32")

    def scales(*shape):
        a = (rng.random(shape) * 0.02 + 0.001).astype(np.float16)
        if scale_dtype == "BF16":
            return _t((a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16), "BF16")
        return _t(a, "F16")

    def f8(*shape):
        # finite E4M3 codes (not 0x7F/0xFF, the NaNs)
        a = rng.integers(0, 0x7E, size=shape, dtype=np.int64).astype(np.uint8)
        a |= (rng.integers(0, 2, size=shape, dtype=np.int64).astype(np.uint8) << 7)
        return ("F8_E4M3", list(a.shape), a.tobytes())

    def f32(v):
        return _t(np.array(v, np.float32), "F32")

    def linear(name, n_in, n_out, with_bias=False):
        g = 1 if group == -1 else n_in // group
        if method in ("nvfp4", "ct-nvfp4"):
            wn = ".weight" if method == "nvfp4" else ".weight_packed"
            t[name + wn] = _t(rng.integers(0, 256, size=(n_out, n_in // 2), dtype=np.int64)
                              .astype(np.uint8), "U8")
            t[name + ".weight_scale"] = f8(n_out, n_in // 16)
            if method == "nvfp4":
                t[name + ".weight_scale_2"] = f32(rng.random() * 0.01)
                t[name + ".input_scale"] = f32(rng.random() * 0.1)
            else:
                t[name + ".weight_global_scale"] = _t(np.array([rng.random() * 100], np.float32), "F32")
                t[name + ".input_global_scale"] = _t(np.array([rng.random() * 100], np.float32), "F32")
        elif method == "ct":
            t[name + ".weight_packed"] = words(n_out, n_in // pf)
            t[name + ".weight_scale"] = scales(n_out, g)
            if not sym:
                t[name + ".weight_zero_point"] = words(n_out // pf, g)
            t[name + ".weight_shape"] = _t(np.array([n_out, n_in], np.int64), "I64")
        elif method == "gptq":
            t[name + ".qweight"] = words(n_in // pf, n_out)
            t[name + ".scales"] = scales(g, n_out)
            t[name + ".qzeros"] = words(g, n_out // pf)
            t[name + ".g_idx"] = _t(np.arange(n_in, dtype=np.int32) // (n_in if group == -1 else group), "I32")
        else:
            t[name + ".qweight"] = words(n_in, n_out // pf)
            t[name + ".scales"] = scales(g, n_out)
            t[name + ".qzeros"] = words(g, n_out // pf)
        if with_bias:
            t[name + ".bias"] = f16(n_out)

    t["model.embed_tokens.weight"] = f16(V, H)
    t["lm_head.weight"] = f16(V, H)
    t["model.norm.weight"] = f16(H)
    qkv_bias = bias or family == "qwen2"
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = f16(H)
        t[p + "post_attention_layernorm.weight"] = f16(H)
        linear(p + "self_attn.q_proj", H, heads * hd, qkv_bias)
        linear(p + "self_attn.k_proj", H, kv * hd, qkv_bias)
        linear(p + "self_attn.v_proj", H, kv * hd, qkv_bias)
        linear(p + "self_attn.o_proj", heads * hd, H)
        linear(p + "mlp.gate_proj", H, I)
        linear(p + "mlp.up_proj", H, I)
        linear(p + "mlp.down_proj", I, H)
    if bad == "zp-shape":
        n = "model.layers.1.self_attn.o_proj.weight_zero_point"
        d0, s, b = t[n]
        t[n] = (d0, [s[0] * 2, s[1]], b + b)
    if bad == "qzeros-shape":
        n = "model.layers.1.self_attn.o_proj.qzeros"
        d0, s, b = t[n]
        t[n] = (d0, [s[0], s[1] * 2], b + b)
    if bad == "no-scales":
        del t["model.layers.0.mlp.up_proj.scales"]
    _st_write(os.path.join(d, "model.safetensors"), t)
    qc = {"quant_method": method, "bits": bits, "group_size": group}
    if method == "gptq":
        qc.update({"sym": sym, "desc_act": desc_act, "checkpoint_format": "gptq"})
    elif method == "awq":
        qc.update({"zero_point": True, "version": "gemm"})
    elif method == "ct":
        qc = {"quant_method": "compressed-tensors", "format": "pack-quantized",
              "quantization_status": "compressed", "ignore": ["lm_head"], "kv_cache_scheme": None,
              "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                            "output_activations": None,
                                            "weights": {"num_bits": bits, "type": "int",
                                                        "symmetric": sym,
                                                        "strategy": "channel" if group == -1 else "group",
                                                        "group_size": None if group == -1 else group,
                                                        "actorder": None, "dynamic": False,
                                                        "observer": "minmax"}}}}
    elif method == "nvfp4":
        qc = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
              "kv_cache_quant_algo": None, "exclude_modules": ["lm_head"]}
    else:
        qc = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
              "quantization_status": "compressed", "ignore": ["lm_head"],
              "config_groups": {"group_0": {"targets": ["Linear"],
                                            "weights": {"num_bits": 4, "type": "float",
                                                        "symmetric": True, "strategy": "tensor_group",
                                                        "group_size": 16, "dynamic": False},
                                            "input_activations": {"num_bits": 4, "type": "float",
                                                                  "strategy": "tensor_group",
                                                                  "group_size": 16,
                                                                  "dynamic": "local"}}}}
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "mistral": "MistralForCausalLM"}[family]
    cfg = {"architectures": [arch], "model_type": family, "hidden_size": H,
           "intermediate_size": I, "num_attention_heads": heads, "num_key_value_heads": kv,
           "head_dim": hd, "num_hidden_layers": layers, "vocab_size": V, "torch_dtype": "float16",
           "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "quantization_config": qc}
    if family == "llama":
        cfg["attention_bias"] = bias
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return d


def dropped(d):
    """What vLLM never holds: GPTQ's g_idx; compressed-tensors' weight_shape of every part of
    a fused module but the last in name order (v_proj, up_proj), which each part's load
    overwrites."""
    names = _st_read(os.path.join(d, "model.safetensors"))
    out = [n for n in names if n.endswith(".g_idx")]
    out += [n for n in names if n.endswith(".weight_shape") and
            any(p in n for p in ("q_proj", "k_proj", "gate_proj"))]
    return sorted(out)


def _span(n, tp, r, what, name):
    if n % tp:
        raise Refused(f"{name}: {n} {what} features do not divide by tp {tp}", name.rsplit(".", 1)[0])
    return r * n // tp, n // tp


def _parts(method, pf, group):
    """(suffix, dim of the output features, their unit, input unit (0: one group), kind)
    of each tensor a method stores per linear: w codes, s scales, z zero points,
    shape (weight_shape), t one F32 value (global and input scales)."""
    g = 0 if group == -1 else group
    return {
        "gptq": [("qweight", 1, 1, pf, "w"), ("scales", 1, 1, g, "s"), ("qzeros", 1, pf, g, "z")],
        "awq": [("qweight", 1, pf, 1, "w"), ("scales", 1, 1, g, "s"), ("qzeros", 1, pf, g, "z")],
        "ct": [("weight_packed", 0, 1, pf, "w"), ("weight_scale", 0, 1, g, "s"),
               ("weight_zero_point", 0, pf, g, "z"), ("weight_shape", 0, 0, 0, "shape")],
        "nvfp4": [("weight", 0, 1, 2, "w"), ("weight_scale", 0, 1, 16, "s"),
                  ("weight_scale_2", 0, 0, 0, "t"), ("input_scale", 0, 0, 0, "t")],
        "ct-nvfp4": [("weight_packed", 0, 1, 2, "w"), ("weight_scale", 0, 1, 16, "s"),
                     ("weight_global_scale", 0, 0, 0, "t"), ("input_global_scale", 0, 0, 0, "t")],
    }[method]


def _method(qc):
    m = qc["quant_method"]
    if m == "compressed-tensors":
        return "ct" if qc["format"] == "pack-quantized" else "ct-nvfp4"
    return "nvfp4" if m == "modelopt" else m


def _zero_word(method, kind, bits):
    """A word of codes that dequantize to 0 in vLLM: GPTQ's and symmetric
    compressed-tensors' codes are biased by 2^(bits-1) (uint4b8); GPTQ's
    stored zero points are that minus one; the rest zero bytes."""
    if method not in ("gptq", "ct-sym") or kind not in ("w", "z") or (kind == "z" and method != "gptq"):
        return 0
    code = (1 << (bits - 1)) - (1 if kind == "z" else 0)
    w = 0
    for k in range(0, 32, bits):
        w |= code << k
    return w


def padded_size(I, tp, parts):
    """The smallest n >= I whose split at tp puts every rank's gate/up output
    features and down input features on whole units of every part."""
    n = I
    while True:
        ok = n % tp == 0
        for _, _, ou, iu, kind in parts:
            if kind in ("w", "s", "z"):
                ok = ok and (n // tp) % ou == 0 and (iu == 0 or (n // tp) % iu == 0)
        if ok:
            return n
        n += 1


def expected_ranks(d, tp, pad=False):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    src = _st_read(os.path.join(d, "model.safetensors"))
    qc = cfg["quantization_config"]
    method = _method(qc)
    if method == "ct":
        w = qc["config_groups"]["group_0"]["weights"]
        bits, group = w["num_bits"], (-1 if w["strategy"] == "channel" else w["group_size"])
    elif method in ("nvfp4", "ct-nvfp4"):
        bits, group = 4, 16
    else:
        bits, group = qc["bits"], qc["group_size"]
    pf = 32 // bits
    if method == "gptq" and not qc.get("sym", True):
        raise Refused("asymmetric GPTQ: vLLM raises Unsupported quantization config", "sym")
    if method == "gptq" and qc.get("desc_act") and group != -1:
        raise Refused("desc_act with groups: vLLM no longer supports it", "desc_act")
    if bits not in (4, 8) or (method == "awq" and bits != 4):
        raise Refused("bits vLLM does not load", "bits")
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or cfg["hidden_size"] // heads
    V, layers = cfg["vocab_size"], cfg["num_hidden_layers"]
    if heads % tp:
        raise Refused("heads", "num_attention_heads")
    if not (kv % tp == 0 or (kv < tp and tp % kv == 0)):
        raise Refused("kv heads", "num_key_value_heads")
    parts = _parts(method, pf, group)
    md = "BF16" if cfg.get("torch_dtype", cfg.get("dtype")) == "bfloat16" else "F16"
    if method in ("gptq", "awq", "ct"):  # scales in the model's dtype (params_dtype)
        for n, (dt, _, _) in src.items():
            if n.endswith("." + parts[1][0]) and dt != md:
                raise Refused("scales not in the model's dtype", n)
    one = lambda v: _t(np.array(v, np.float32), "F32")  # noqa: E731
    extras = {"_k_scale": one(1.0), "_v_scale": one(1.0), "_q_scale": one(1.0), "_prob_scale": one(1.0)}
    if method in ("ct", "ct-nvfp4"):  # CompressedTensorsKVCacheMethod
        for x in "kvq":
            extras[f"{x}_scale"] = _t(np.array([1.0], np.float32), "F32")
            extras[f"{x}_zero_point"] = _t(np.array([0], np.float16), "F16")
    if method == "nvfp4":  # ModelOpt's KV cache method, as Fp8Config's
        for x in ("q", "k", "v", "prob"):
            extras[f"{x}_scale"] = _t(np.array(-1.0, np.float16), "F16")
    ranks = []
    for r in range(tp):
        out = {}
        per = -(-V // 64) * 64 // tp
        for n in ("model.embed_tokens.weight", "lm_head.weight"):
            a = _arr(src[n])
            lo = min(r * per, V)
            hi = min((r + 1) * per, V)
            x = np.zeros((per, a.shape[1]), a.dtype)
            x[:hi - lo] = a[lo:hi]
            out[n] = _t(x, src[n][0])
        out["model.norm.weight"] = src["model.norm.weight"]
        for i in range(layers):
            p = f"model.layers.{i}."
            for n in ("input_layernorm.weight", "post_attention_layernorm.weight"):
                out[p + n] = src[p + n]
            for n, v in extras.items():
                out[p + "self_attn.attn." + n] = v
            # column-parallel parts: the rank's output features of each
            kvr = r // (tp // kv) if tp >= kv else None
            q_lo, q_n = r * heads // tp * hd, heads // tp * hd
            k_lo, k_n = (kvr * hd, hd) if kvr is not None else (r * kv // tp * hd, kv // tp * hd)
            inter = cfg["intermediate_size"]
            pinter = padded_size(inter, tp, parts) if pad else inter
            g_lo, g_n = _span(pinter, tp, r, "output", p + "mlp.gate_proj")
            fused = {
                "self_attn.qkv_proj": [("self_attn.q_proj", q_lo, q_n), ("self_attn.k_proj", k_lo, k_n),
                                       ("self_attn.v_proj", k_lo, k_n)],
                "mlp.gate_up_proj": [("mlp.gate_proj", g_lo, g_n), ("mlp.up_proj", g_lo, g_n)],
            }
            for into, mods in fused.items():
                for suf, oax, ou, iu, kind in parts:
                    names = [f"{p}{mod}.{suf}" for mod, _, _ in mods]
                    if names[0] not in src:
                        continue
                    if kind == "t":
                        out[f"{p}{into}.{suf}"] = _t(np.concatenate(
                            [_arr(src[n]).reshape(1) for n in names]).astype(np.float32), "F32")
                        continue
                    if kind == "shape":  # the last part loaded, in name order
                        out[f"{p}{into}.{suf}"] = src[max(names)]
                        continue
                    cut = []
                    for (mod, lo, n), name in zip(mods, names):
                        if lo % ou or n % ou:
                            raise Refused(f"{mod}.{suf}: a rank's output features [{lo}, {lo + n}) "
                                          f"are not whole packed words", name, "packed words")
                        real = src[name][1][oax] * ou
                        rn = max(0, min(lo + n, real) - lo)
                        sl = [slice(None)] * 2
                        sl[oax] = slice(lo // ou, (lo + rn) // ou)
                        piece = _cut(src[name], sl)
                        if rn < n:  # --pad-intermediate: zeros that dequantize to 0
                            piece = _pad(piece, oax, (n - rn) // ou,
                                         _zero_word("gptq" if method == "gptq" else
                                                    "ct-sym" if method == "ct" and "weight_zero_point" not in
                                                    "".join(src) else method, kind, bits))
                        cut.append(piece)
                    out[f"{p}{into}.{suf}"] = _cat(cut, oax)
                if f"{p}{mods[0][0]}.bias" in src:
                    out[f"{p}{into}.bias"] = _t(np.concatenate(
                        [_arr(src[f"{p}{mod}.bias"])[lo:lo + n] for mod, lo, n in mods]),
                        src[f"{p}{mods[0][0]}.bias"][0])
            # row-parallel: the rank's input features
            for mod, n_in in (("self_attn.o_proj", heads * hd), ("mlp.down_proj", pinter)):
                lo, n = _span(n_in, tp, r, "input", f"{p}{mod}")
                real_in = inter if mod == "mlp.down_proj" else n_in
                rn = max(0, min(lo + n, real_in) - lo)
                for suf, oax, ou, iu, kind in parts:
                    name = f"{p}{mod}.{suf}"
                    if name not in src:
                        continue
                    if kind == "t":
                        out[name] = _t(_arr(src[name]).reshape(1), "F32")
                        continue
                    if kind == "shape" or (iu == 0 and kind in "sz"):
                        if iu == 0 and method == "awq" and tp > 1:
                            raise Refused("AWQ group -1 on a row-parallel layer",
                                          "input size is not aligned", "row-parallel")
                        out[name] = src[name]
                        continue
                    if lo % iu or n % iu:
                        # the first tensor in name order tpshard meets: down_proj before o_proj
                        raise Refused(f"{mod}.{suf}: input features [{lo}, {lo + n}) not whole "
                                      f"{'groups' if kind != 'w' else 'words'}",
                                      "groups" if kind != "w" else "packed words", "input features")
                    sl = [slice(None)] * 2
                    sl[1 - oax] = slice(lo // iu, (lo + rn) // iu)
                    piece = _cut(src[name], sl)
                    if rn < n:
                        piece = _pad(piece, 1 - oax, (n - rn) // iu,
                                     _zero_word("gptq" if method == "gptq" else
                                                "ct-sym" if method == "ct" and "weight_zero_point" not in
                                                "".join(src) else method, kind, bits))
                    out[name] = piece
        ranks.append(out)
    return ranks


def _cut(t, sl):
    """t (dtype, shape, bytes) sliced by sl, as raw bytes of its elements."""
    d, s, b = t
    es = {"I32": 4, "F16": 2, "BF16": 2, "U8": 1, "F8_E4M3": 1, "I64": 8, "F32": 4}[d]
    a = np.frombuffer(b, dtype=np.dtype(f"V{es}")).reshape(s)[tuple(sl)]
    a = np.ascontiguousarray(a)
    return (d, list(a.shape), a.tobytes())


def _cat(ts, axis):
    d = ts[0][0]
    es = {"I32": 4, "F16": 2, "BF16": 2, "U8": 1, "F8_E4M3": 1, "I64": 8, "F32": 4}[d]
    a = np.concatenate([np.frombuffer(b, dtype=np.dtype(f"V{es}")).reshape(s) for _, s, b in ts],
                       axis=axis)
    return (d, list(a.shape), a.tobytes())


def _not_converted(names):
    """vLLM's AutoAWQConfig.maybe_update_config from a checkpoint's dtypes: the
    modules whose tensors are all F16, BF16 or F32."""
    mods = {}
    for n, (dt, _, _) in names.items():
        m = n.rsplit(".", 1)[0]
        mods[m] = mods.get(m, True) and dt in ("F16", "BF16", "F32")
    return sorted(m for m, f in mods.items() if f)


def expected_config(d):
    """The config.json vLLM needs beside GPTQ rank files: the source's, its
    quantization_config naming the quantized modules
    (modules_in_block_to_quantize), which vLLM otherwise looks for by dtype in
    the files and, the fused modules' parts absent there, does not find."""
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    qc = cfg["quantization_config"]
    if qc["quant_method"] == "gptq" and not qc.get("modules_in_block_to_quantize"):
        names = _st_read(os.path.join(d, "model.safetensors"))
        qc["modules_in_block_to_quantize"] = sorted(n[:-len(".qweight")] for n in names
                                                    if n.endswith(".qweight"))
    if qc["quant_method"] == "awq" and not qc.get("modules_to_not_convert"):
        qc["modules_to_not_convert"] = _not_converted(_st_read(os.path.join(d, "model.safetensors")))
    return cfg


# ------------------------------------------------------------------ mixtures of experts

def build_moe(d, method, E=4, H=128, I=256, heads=4, kv=2, hd=32, layers=2, group=32, sym=True,
              bits=4, seed=3):
    """A tiny Qwen3-MoE checkpoint (family_oracle's BF16 one) whose experts are
    packed (method as build's), the attention, router, norms and embeddings
    BF16, as Kimi-K2's W4A16 releases keep them. Returns d."""
    import family_oracle as fo
    import serving_oracle as so
    base = d + "-bf16"
    fo.qwen3_moe_checkpoint(base, hidden=H, heads=heads, kv_heads=kv, head_dim=hd, experts=E,
                            moe_inter=I, vocab=128, layers=layers)
    config, tensors = so.load_checkpoint(base)
    rng = np.random.default_rng(seed)
    pf = 32 // bits
    os.makedirs(d, exist_ok=True)
    out = {}
    for n, t in tensors.items():
        if ".mlp.experts." not in n:
            out[n] = t
            continue
        stem = n[:-len(".weight")]
        n_out, n_in = t[1]
        g = 1 if group == -1 else n_in // group

        def words(*shape):
            return _t(rng.integers(-2**31, 2**31 - 1, size=shape, dtype=np.int64).astype(np.int32), "I32")

        def bf16s(*shape):
            a = (rng.random(shape) * 0.02 + 0.001).astype(np.float32)
            return _t((a.view(np.uint32) >> 16).astype(np.uint16), "BF16")
        if method == "gptq":
            out[stem + ".qweight"] = words(n_in // pf, n_out)
            out[stem + ".scales"] = bf16s(g, n_out)
            out[stem + ".qzeros"] = words(g, n_out // pf)
        elif method == "awq":
            out[stem + ".qweight"] = words(n_in, n_out // pf)
            out[stem + ".scales"] = bf16s(g, n_out)
            out[stem + ".qzeros"] = words(g, n_out // pf)
        elif method == "ct":
            out[stem + ".weight_packed"] = words(n_out, n_in // pf)
            out[stem + ".weight_scale"] = bf16s(n_out, g)
            if not sym:
                out[stem + ".weight_zero_point"] = words(n_out // pf, g)
            out[stem + ".weight_shape"] = _t(np.array([n_out, n_in], np.int64), "I64")
        else:  # nvfp4
            out[stem + ".weight"] = _t(rng.integers(0, 256, size=(n_out, n_in // 2),
                                                    dtype=np.int64).astype(np.uint8), "U8")
            a = rng.integers(0, 0x7E, size=(n_out, n_in // 16), dtype=np.int64).astype(np.uint8)
            out[stem + ".weight_scale"] = ("F8_E4M3", list(a.shape), a.tobytes())
            out[stem + ".weight_scale_2"] = _t(np.array(rng.random() * 0.01, np.float32), "F32")
            out[stem + ".input_scale"] = _t(np.array(rng.random() * 0.1, np.float32), "F32")
    _st_write(os.path.join(d, "model.safetensors"), out)
    if method == "gptq":
        qc = {"quant_method": "gptq", "bits": bits, "group_size": group, "sym": True,
              "desc_act": False}
    elif method == "awq":
        qc = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True,
              "version": "gemm"}
    elif method == "ct":
        qc = {"quant_method": "compressed-tensors", "format": "pack-quantized",
              "ignore": ["lm_head", "re:.*self_attn.*", "re:.*mlp.gate$"],
              "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None,
                                            "weights": {"num_bits": bits, "type": "int",
                                                        "symmetric": sym,
                                                        "strategy": "channel" if group == -1 else "group",
                                                        "group_size": None if group == -1 else group,
                                                        "actorder": None}}}}
    else:
        qc = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
              "kv_cache_quant_algo": None, "exclude_modules": ["lm_head", "*self_attn*", "*mlp.gate"]}
    config["quantization_config"] = qc
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return d


def expected_moe_ranks(d, tp, ep=False):
    """vLLM's rank state of build_moe's checkpoint: family_oracle's BF16 picture
    of the same model with the packed stacks in place of w13_weight/w2_weight
    (AutoGPTQMoEMethod, CompressedTensorsWNA16MoEMethod, ModelOptNvFp4FusedMoE
    create_weights; routed_experts.py's loaders):
      w13_<part> per expert the rank's rows of gate then up along the output
      dim (GPTQ: the last, [E, H/pf, 2 I_p]; compressed-tensors and NVFP4: the
      rows, [E, 2 I_p, ...]); w2_<part> the rank's input features (GROUP and
      the codes cut, CHANNEL scales whole); NVFP4's scale_2 / input_scale
      [E, 2] and [E]; compressed-tensors' weight_shape [E, 2] in the model's
      dtype ([I, H] and [H, I]); GPTQ's w13_bias [E, 2 I_p] and w2_bias
      [E, H] zeros."""
    import family_oracle as fo
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    src = _st_read(os.path.join(d, "model.safetensors"))
    qc = cfg["quantization_config"]
    method = _method(qc)
    if method == "ct":
        w = qc["config_groups"]["group_0"]["weights"]
        bits, group = w["num_bits"], (-1 if w["strategy"] == "channel" else w["group_size"])
    elif method == "nvfp4":
        bits, group = 4, 16
    else:
        bits, group = qc["bits"], qc["group_size"]
    pf = 32 // bits
    E, I, H = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["hidden_size"]
    # the BF16 picture, its experts any BF16 bytes of the right shapes
    plain = {n: t for n, t in src.items() if ".mlp.experts." not in n}
    for i in range(cfg["num_hidden_layers"]):
        for e in range(E):
            p = f"model.layers.{i}.mlp.experts.{e}."
            plain[p + "gate_proj.weight"] = ("BF16", [I, H], bytes(2 * I * H))
            plain[p + "up_proj.weight"] = ("BF16", [I, H], bytes(2 * I * H))
            plain[p + "down_proj.weight"] = ("BF16", [H, I], bytes(2 * I * H))
    bcfg = {k: v for k, v in cfg.items() if k != "quantization_config"}
    try:
        ranks = fo.expected_ranks_from(bcfg, plain, "vllm", tp, ep)
    except fo.Rejected as e:
        raise Refused(str(e), "")
    mtp = 1 if ep else tp
    if I % mtp:
        raise Refused("moe_intermediate_size not divisible", "moe_intermediate_size")
    Ip = I // mtp
    Er = E // tp if ep else E
    parts = _parts(method, pf, group)
    for r in range(tp):
        out = ranks[r]
        e0 = r * Er if ep else 0
        lo = 0 if ep else r * Ip
        for n in [n for n in out if ".routed_experts.w13_weight" in n or ".routed_experts.w2_weight" in n]:
            del out[n]
        for i in range(cfg["num_hidden_layers"]):
            P = f"model.layers.{i}.mlp.experts."
            base = P + "routed_experts."
            if method == "ct":
                for x in "kvq":
                    out[f"model.layers.{i}.self_attn.attn.{x}_scale"] = _t(np.array([1.0], np.float32), "F32")
                    out[f"model.layers.{i}.self_attn.attn.{x}_zero_point"] = _t(np.array([0], np.uint16), "BF16")
            if method == "nvfp4":
                for x in ("q", "k", "v", "prob"):
                    out[f"model.layers.{i}.self_attn.attn.{x}_scale"] = (
                        "BF16", [], (np.array([-1.0], np.float32).view(np.uint32) >> 16)
                        .astype(np.uint16).tobytes())
            for stack, leaves, cols in (("w13", ("gate_proj", "up_proj"), False),
                                        ("w2", ("down_proj",), True)):
                for suf, oax, ou, iu, kind in parts:
                    first = f"{P}{e0}.{leaves[0]}.{suf}"
                    if first not in src:
                        continue
                    name = f"{base}{stack}_{suf}"
                    if kind == "shape":
                        v = [H, I] if cols else [I, H]
                        a = np.array([v] * Er, np.float32)
                        out[name] = ("BF16", [Er, 2], (a.view(np.uint32) >> 16).astype(np.uint16).tobytes())
                        continue
                    if kind == "t":
                        a = np.array([[_arr(src[f"{P}{e}.{lf}.{suf}"]).item() for lf in leaves]
                                      for e in range(e0, e0 + Er)], np.float32)
                        out[name] = _t(a.reshape(Er) if cols else a, "F32")
                        continue
                    per = []
                    for e in range(e0, e0 + Er):
                        cut = []
                        for lf in leaves:
                            t = src[f"{P}{e}.{lf}.{suf}"]
                            sl = [slice(None)] * 2
                            if ep:
                                pass
                            elif cols:
                                if iu == 0:
                                    pass
                                else:
                                    if lo % iu or Ip % iu:
                                        raise Refused("experts' input features not whole groups",
                                                      "groups" if kind != "w" else "packed words")
                                    sl[1 - oax] = slice(lo // iu, (lo + Ip) // iu)
                            else:
                                if lo % ou or Ip % ou:
                                    raise Refused("experts' output features not whole words",
                                                  "packed words")
                                sl[oax] = slice(lo // ou, (lo + Ip) // ou)
                            cut.append(_cut(t, sl))
                        per.append(_cat(cut, oax) if len(cut) > 1 else cut[0])
                    d0 = per[0][0]
                    out[name] = (d0, [Er] + per[0][1], b"".join(x[2] for x in per))
                if method == "gptq":
                    out[f"{base}{stack}_bias"] = ("BF16", [Er, H if cols else 2 * Ip],
                                                  bytes(2 * Er * (H if cols else 2 * Ip)))
    return ranks


def moe_dropped(d):
    names = _st_read(os.path.join(d, "model.safetensors"))
    return sorted(n for n in names if n.endswith(".weight_shape"))


def moe_expected_config(d):
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    qc = cfg["quantization_config"]
    if qc["quant_method"] == "gptq" and not qc.get("modules_in_block_to_quantize"):
        names = _st_read(os.path.join(d, "model.safetensors"))
        qc["modules_in_block_to_quantize"] = sorted(n[:-len(".qweight")] for n in names
                                                    if n.endswith(".qweight"))
    if qc["quant_method"] == "awq" and not qc.get("modules_to_not_convert"):
        qc["modules_to_not_convert"] = _not_converted(_st_read(os.path.join(d, "model.safetensors")))
    return cfg


def _pad(t, axis, n, word):
    """t with n more elements along axis, each the 32-bit word (I32 parts) or zero bytes."""
    d, sh, b = t
    es = {"I32": 4, "F16": 2, "BF16": 2, "U8": 1, "F8_E4M3": 1, "I64": 8, "F32": 4}[d]
    a = np.frombuffer(b, dtype=np.dtype(f"V{es}")).reshape(sh)
    psh = list(sh)
    psh[axis] = n
    if d == "I32":
        z = np.full(psh, np.uint32(word), dtype=np.uint32).view(np.dtype("V4"))
    else:
        z = np.zeros(psh, dtype=np.dtype(f"V{es}"))
    a = np.concatenate([a, z], axis=axis)
    return (d, list(a.shape), a.tobytes())


def gptq_dequant(qweight, scales, bits=4, group=32):
    """W [out, in] in float64 of a GPTQ linear as vLLM's symmetric kernels read
    it: codes biased by 2^(bits-1) (uint4b8), the stored zero points unused."""
    q = _arr(qweight).view(np.uint32)
    pf = 32 // bits
    codes = np.stack([(q >> (bits * k)) & ((1 << bits) - 1) for k in range(pf)], axis=1)
    codes = codes.reshape(q.shape[0] * pf, q.shape[1]).astype(np.float64)  # [in, out]
    sc = _arr(scales).astype(np.float64)  # [groups, out]
    g = np.arange(codes.shape[0]) // group if sc.shape[0] > 1 else np.zeros(codes.shape[0], int)
    return ((codes - (1 << (bits - 1))) * sc[g]).T
