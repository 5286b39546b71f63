"""Expected vLLM / SGLang rank files of FP8 mixture-of-experts checkpoints
(Qwen3-MoE, Mixtral: experts and attention FP8, routers, norms, embeddings
and lm_head BF16), from the engines' loading code, sharing no code with
tpshard.  The unquantized picture (names, stacking, vocabulary) comes from
family_oracle.py with the FP8 bytes cut like any other bytes; this module
adds what FP8 adds.

vLLM 0.33.0:
  - experts (layers/quantization/fp8.py Fp8MoEMethod.create_weights;
    compressed_tensors_moe_w8a8_fp8.py CompressedTensorsW8A8Fp8MoEMethod;
    layers/fused_moe/routed_experts.py RoutedExperts.weight_loader):
      block: w13_weight_scale_inv (fp8; compressed-tensors: w13_weight_scale)
        F32 [E, 2 * ceil(I_p / bn), ceil(H / bk)], per expert the rank's
        block rows of gate (w1) then up (w3), narrowed at
        (rows // tp) * rank (_load_w13); w2_weight_scale_inv
        [E, ceil(H / bn), ceil(I_p / bk)], the rank's block columns (_load_w2).
        A rank's expert width that is not whole blocks: vLLM refines the
        grid (refine_fp8_moe_block_shape, fp8 only) or refuses
        (validate_fp8_block_shape_moe).
      tensor: w13_weight_scale [E, 2] (slot 0 w1, slot 1 w3),
        w2_weight_scale [E] (_load_per_tensor_weight_scale).
      channel: w13_weight_scale [E, 2 * I_p, 1] (the rank's rows of each),
        w2_weight_scale [E, H, 1] whole (_load_per_channel_weight_scale).
      static activations: w13_input_scale [E] and w2_input_scale [E]:
        _load_single_value writes w1's then w3's into param[e] (the
        checkpoint's names load in sorted order: gate_proj < up_proj,
        w1 < w3), so w3's stays.
      every scale F32 whatever the checkpoint stored (torch.ones(...,
      dtype=float32) and copy_).  --ep: the MoE's tp size is 1, rank r holds
      experts [r E / tp, (r + 1) E / tp) whole.
  - attention: as quant_oracle.py's LLaMA (fused qkv_proj scales, o_proj's,
    and the attention's quantization placeholders).
SGLang 0.5.23 (quantization/fp8.py create_fp8_moe_weight_,
process_weights_after_loading): block FP8 experts as vLLM's
(experts.w13_weight_scale_inv, F32); per-tensor experts are requantized to
one scale per expert after loading and per-channel/per-tensor dense weights
transposed: refused.  Qwen3-MoE's and Mixtral's RadixAttention get no
quantization placeholders.
"""
import os

import numpy as np

import family_oracle as fo
import quant_oracle as qo
import serving_oracle as so

FAMILIES = ("qwen3_moe", "mixtral")
# (moe module, gate/up/down leaf names, router leaf) per family
MOE = {"qwen3_moe": ("mlp", ("gate_proj", "up_proj", "down_proj")),
       "mixtral": ("block_sparse_moe", ("w1", "w3", "w2"))}
ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")


class Refused(ValueError):
    def __init__(self, reason, words=()):
        super().__init__(reason)
        self.reason = reason
        self.words = list(words)


# ------------------------------------------------------------------ models

def build(out, family, quant, H=64, A=4, K=2, D=32, E=4, I=64, block=(32, 32),
          scale_dtype="F32", static=False, seed=1, layers=2):
    """A tiny FP8 MoE checkpoint in out; quant: fp8-block, fp8-tensor,
    ct-block, ct-channel, ct-tensor.  Returns out."""
    base = out + "-bf16"
    if family == "qwen3_moe":
        fo.qwen3_moe_checkpoint(base, hidden=H, heads=A, kv_heads=K, head_dim=D, experts=E,
                                moe_inter=I, vocab=128, layers=layers)
    else:
        fo.mixtral_checkpoint(base, hidden=H, heads=A, kv_heads=K, experts=E, inter=I,
                              vocab=128, layers=layers, head_dim=D)
    config, tensors = so.load_checkpoint(base)
    rng = np.random.default_rng(seed)
    codes = np.array([b for b in range(256) if b not in (0x7F, 0xFF)], dtype=np.uint8)

    def scales(shape):
        n = int(np.prod(shape, dtype=np.int64))
        mant = 1 + rng.permutation(max(n, 128))[:n] % 128 / 128.0
        v = (mant * 2.0 ** -rng.integers(5, 9, size=n)).astype(np.float32)
        if scale_dtype == "F32":
            return ("F32", list(shape), v.astype("<f4").tobytes())
        return ("BF16", list(shape), (v.view(np.uint32) >> 16).astype("<u2").tobytes())

    moe, _ = MOE[family]
    bn, bk = block
    t = {}
    for n, (dt, shape, data) in tensors.items():
        m = n[:-len(".weight")] if n.endswith(".weight") else None
        quantized = m is not None and len(shape) == 2 and (
            any(m.endswith(".self_attn." + a) for a in ATTN) or f".{moe}.experts." in m)
        if not quantized:
            t[n] = (dt, shape, data)
            continue
        o, i = shape
        t[n] = ("F8_E4M3", shape, codes[rng.integers(0, len(codes), size=(o, i))].tobytes())
        kind = quant.split("-", 1)[1]
        sname = "weight_scale_inv" if quant == "fp8-block" else "weight_scale"
        if kind == "block":
            t[m + "." + sname] = scales((-(-o // bn), -(-i // bk)))
        elif kind == "channel":
            t[m + ".weight_scale"] = scales((o, 1))
        else:
            t[m + ".weight_scale"] = scales(() if quant == "fp8-tensor" else (1,))
            if static:
                t[m + ".input_scale"] = scales(() if quant == "fp8-tensor" else (1,))
    routers = [n[:-len(".weight")] for n in t if n.endswith(f"{moe}.gate.weight")]
    ignore = ["lm_head"] + sorted(routers)
    if quant.startswith("fp8"):
        qc = {"quant_method": "fp8", "activation_scheme": "static" if static else "dynamic"}
        if quant == "fp8-block":
            qc["weight_block_size"] = [bn, bk]
            qc["modules_to_not_convert"] = ignore
        else:
            qc["ignored_layers"] = ignore
    else:
        qc = qo.quantization_config(dict(quant=quant, static=static, not_converted=routers[:0]))
        qc["ignore"] = ignore
        if quant == "ct-block":
            qc["config_groups"]["group_0"]["weights"]["block_structure"] = [bn, bk]
    config = dict(config)
    config["quantization_config"] = qc
    qo.write_model(out, config, t)
    return out


# ------------------------------------------------------------------ the engines' rules

def scheme(config):
    qc = config["quantization_config"]
    if qc["quant_method"] == "fp8":
        block = qc.get("weight_block_size")
        return dict(method="fp8", kind="block" if block else "tensor",
                    block=tuple(block) if block else None,
                    scale="weight_scale_inv" if block else "weight_scale",
                    static=qc.get("activation_scheme") == "static")
    w = qc["config_groups"]["group_0"]["weights"]
    ia = qc["config_groups"]["group_0"]["input_activations"]
    return dict(method="compressed-tensors", kind=w["strategy"],
                block=tuple(w["block_structure"]) if w["strategy"] == "block" else None,
                scale="weight_scale", static=bool(ia) and not ia.get("dynamic", True))


def _f32(t):
    return qo.as_f32(t)


def _stack(parts, shape):
    return ("F32", list(shape), b"".join(p[2] for p in parts))


def _dims(config, family):
    c = config
    H, A, K = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    D = c.get("head_dim") or H // A
    if family == "qwen3_moe":
        return H, A, K, D, c["num_experts"], c["moe_intermediate_size"]
    return H, A, K, D, c["num_local_experts"], c["intermediate_size"]


def _expert_block_rule(sch, I, H, t, layout):
    bn, bk = sch["block"]
    if I % t:
        raise Refused(f"experts' {I} rows do not split over {t}", ["expert"])
    ip = I // t
    if ip % bn == 0 and (t == 1 or ip % bk == 0):
        return 0
    g = int(np.gcd.reduce([bn, bk, ip, H]))
    if g >= 32 and sch["method"] == "fp8" and layout == "vllm":
        # refine_fp8_moe_block_shape: the loader upsamples, then narrows at
        # (rows // t) * rank, which lands on the rank's rows only when the
        # experts are whole blocks
        if I % bn or H % bn or I % bk or H % bk:
            raise Refused(f"refined grid {g} x {g} over partial blocks", ["refined", "tp values that work"])
        return g
    raise Refused(f"experts: {ip} rows per rank are not whole blocks of {bn}",
                  ["not whole blocks", "tp values that work"])


def _attention(out, sch, tensors, p, r, tp, A, K, D, layout):
    """The rank's attention scales (fused qkv_proj, o_proj)."""
    qh = A // tp
    if tp >= K:
        ks, kh = r // (tp // K), 1
    else:
        kh = K // tp
        ks = r * kh
    rows = {"q_proj": (r * qh * D, qh * D), "k_proj": (ks * D, kh * D), "v_proj": (ks * D, kh * D)}
    a = p + "self_attn."
    parts = []
    for x in ("q_proj", "k_proj", "v_proj"):
        st, n = rows[x]
        sc = tensors[a + x + "." + sch["scale"]]
        if sch["kind"] == "block":
            bn = sch["block"][0]
            if n % bn:
                raise Refused(f"{a}{x}: {n} rows per rank are not whole blocks", ["blocks"])
            parts.append(so._rows(sc, st // bn, n // bn))
        elif sch["kind"] == "channel":
            parts.append(so._rows(sc, st, n))
        else:
            parts.append((sc[0], [1], sc[2]))
    out[a + "qkv_proj." + sch["scale"]] = _f32(so._cat0(parts))
    if sch["static"]:
        out[a + "qkv_proj.input_scale"] = _f32(so._cat0(
            [(tensors[a + x + ".input_scale"][0], [1], tensors[a + x + ".input_scale"][2])
             for x in ("q_proj", "k_proj", "v_proj")]))
    sc = tensors[a + "o_proj." + sch["scale"]]
    if sch["kind"] == "block":
        bk = sch["block"][1]
        n = tensors[a + "o_proj.weight"][1][1] // tp
        if tp > 1 and n % bk:
            raise Refused(f"{a}o_proj: {n} columns per rank are not whole blocks", ["blocks"])
        out[a + "o_proj." + sch["scale"]] = _f32(so._cols(sc, r * n // bk, -(-n // bk)))
    elif sch["kind"] == "channel":
        out[a + "o_proj." + sch["scale"]] = _f32(sc)
    else:
        out[a + "o_proj." + sch["scale"]] = _f32((sc[0], [1], sc[2]))
    if sch["static"]:
        t = tensors[a + "o_proj.input_scale"]
        out[a + "o_proj.input_scale"] = _f32((t[0], [1], t[2]))
    if layout == "vllm":
        mdt = qo.model_dtype({"torch_dtype": "bfloat16"})
        if sch["method"] == "fp8":  # Fp8KVCacheMethod: KVCacheScaleParameter, -1.0
            for x in ("q_scale", "k_scale", "v_scale", "prob_scale"):
                out[a + "attn." + x] = (mdt, [], qo.scalar_bytes(mdt, -1.0))
        else:  # CompressedTensorsKVCacheMethod
            for x in ("k_scale", "v_scale", "q_scale"):
                out[a + "attn." + x] = ("F32", [1], qo.scalar_bytes("F32", 1.0))
            for x in ("k_zero_point", "v_zero_point", "q_zero_point"):
                out[a + "attn." + x] = (mdt, [1], qo.scalar_bytes(mdt, 0.0))


def _refined(s, fn, fk):
    """RoutedExperts.weight_loader: loaded_weight.repeat_interleave(bn // g,
    dim=-2).repeat_interleave(bk // g, dim=-1), F32 [rows, cols]."""
    dt, shape, data = _f32(s)
    a = np.frombuffer(data, dtype="<f4").reshape(shape)
    return np.repeat(np.repeat(a, fn, axis=0), fk, axis=1)


def _experts(out, sch, tensors, base, pre, leaves, r, tp, ep, E, I, H, grid=0):
    """The rank's expert scale stacks under base (…experts[.routed_experts].)."""
    g, u, d = leaves
    t = 1 if ep else tp
    rank = 0 if ep else r
    local = range(r * E // tp, (r + 1) * E // tp) if ep else range(E)
    ip = I // t
    suffix = sch["scale"]

    def sc(e, leaf):
        return tensors[f"{pre}.{e}.{leaf}.{suffix}"]

    w13, w2 = [], []
    if grid:
        bn, bk = sch["block"]
        fn, fk, P, Hg = bn // grid, bk // grid, ip // grid, -(-H // grid)
        for e in local:
            for leaf in (leaves[0], leaves[1]):  # _load_w13
                u_ = _refined(sc(e, leaf), fn, fk)
                per = u_.shape[0] // t
                if per != P or u_.shape[1] != Hg:
                    raise Refused("refined rows", ["refined"])
                w13.append(("F32", [P, Hg], u_[per * rank:per * rank + per].astype("<f4").tobytes()))
            u_ = _refined(sc(e, leaves[2]), fn, fk)  # _load_w2
            per = u_.shape[1] // t
            if per != P or u_.shape[0] != Hg:
                raise Refused("refined columns", ["refined"])
            w2.append(("F32", [Hg, P], np.ascontiguousarray(
                u_[:, per * rank:per * rank + per]).astype("<f4").tobytes()))
        n = len(local)
        out[base + "w13_" + suffix] = _stack(w13, [n, 2 * P, Hg])
        out[base + "w2_" + suffix] = _stack(w2, [n, Hg, P])
        return
    for e in local:
        if sch["kind"] == "block":
            bn, bk = sch["block"]
            for leaf in (g, u):  # _load_w13: narrow(0, rows // t * rank, rows // t)
                s = sc(e, leaf)
                per = s[1][0] // t
                if per != ip // bn:
                    raise Refused("block rows", ["blocks"])
                w13.append(_f32(so._rows(s, per * rank, per)))
            s = sc(e, d)  # _load_w2: narrow(1, cols // t * rank, cols // t)
            per = s[1][1] // t
            w2.append(_f32(so._cols(s, per * rank, per)))
        elif sch["kind"] == "channel":
            for leaf in (g, u):
                w13.append(_f32(so._rows(sc(e, leaf), ip * rank, ip)))
            w2.append(_f32(sc(e, d)))
        else:
            for leaf in (g, u):
                s = sc(e, leaf)
                w13.append(_f32((s[0], [1], s[2])))
            s = sc(e, d)
            w2.append(_f32((s[0], [1], s[2])))
    n = len(local)
    if sch["kind"] == "block":
        bn, bk = sch["block"]
        s0, d0 = sc(0, g), sc(0, d)
        w13s = [n, 2 * (ip // bn), s0[1][1]]
        w2s = [n, d0[1][0], d0[1][1] // t]
    elif sch["kind"] == "channel":
        w13s, w2s = [n, 2 * ip, 1], [n, H, 1]
    else:
        w13s, w2s = [n, 2], [n]
    out[base + "w13_" + suffix] = _stack(w13, w13s)
    out[base + "w2_" + suffix] = _stack(w2, w2s)
    if sch["static"]:
        out[base + "w13_input_scale"] = _stack(
            [_f32(tensors[f"{pre}.{e}.{u}.input_scale"]) for e in local], [n])
        out[base + "w2_input_scale"] = _stack(
            [_f32(tensors[f"{pre}.{e}.{d}.input_scale"]) for e in local], [n])


def expected_ranks(model_dir, layout, tp, ep=False):
    """[{name: (dtype, shape, bytes)}] per rank, or Refused."""
    config, tensors = so.load_checkpoint(model_dir)
    family = config["model_type"]
    sch = scheme(config)
    H, A, K, D, E, I = _dims(config, family)
    if layout == "sglang" and sch["kind"] != "block":
        raise Refused("SGLang post-processes per-tensor and per-channel FP8 weights",
                      [sch["kind"]])
    g = _expert_block_rule(sch, I, H, 1 if ep else tp, layout) if sch["kind"] == "block" else 0
    plain = {n: t for n, t in tensors.items()
             if not n.endswith((".weight_scale_inv", ".weight_scale", ".input_scale"))}
    cfg = {k: v for k, v in config.items() if k != "quantization_config"}
    try:
        ranks = fo.expected_ranks_from(cfg, plain, layout, tp, ep)
    except fo.Rejected as e:
        raise Refused(str(e), [])
    moe, leaves = MOE[family]
    for r in range(tp):
        for i in range(config["num_hidden_layers"]):
            p = f"model.layers.{i}."
            _attention(ranks[r], sch, tensors, p, r, tp, A, K, D, layout)
            pre = p + moe + ".experts"
            base = pre + (".routed_experts." if layout == "vllm" else ".")
            _experts(ranks[r], sch, tensors, base, pre, leaves, r, tp, ep, E, I, H, g)
    return ranks


def dropped(model_dir):
    """The source tensors a serving layout leaves out: every expert's w1
    (gate) input scale, overwritten by w3's in the engine."""
    config, tensors = so.load_checkpoint(model_dir)
    moe, (g, _, _) = MOE[config["model_type"]]
    return sorted(n for n in tensors if f".{moe}.experts." in n and n.endswith(f".{g}.input_scale"))


# ------------------------------------------------------------------ DeepSeek-V3, block FP8

def e4m3_of_bf16(data):
    """An F8_E4M3 code per BF16 element (its high byte, NaN codes moved off),
    so that cutting and stacking commute with it: an FP8 rank file's weights
    are this map of the BF16 rank file's."""
    hi = np.frombuffer(data, dtype="<u2") >> 8
    c = hi.astype(np.uint8)
    c[(c & 0x7F) == 0x7F] &= 0xFE
    return c.tobytes()


def deepseek_fp8(src, out, block=(32, 32), seed=2):
    """The block-FP8 twin of a BF16 DeepSeek-V3 checkpoint (DeepSeek-V3's own
    format: every 2-D Linear F8_E4M3 with an F32 weight_scale_inv, the router,
    norms, embeddings and lm_head left BF16).  Returns out."""
    config, tensors = so.load_checkpoint(src)
    rng = np.random.default_rng(seed)
    bn, bk = block
    t = {}
    for n, (dt, shape, data) in tensors.items():
        m = n[:-len(".weight")] if n.endswith(".weight") else None
        linear = (m is not None and len(shape) == 2 and dt == "BF16" and ".layers." in n
                  and not m.endswith((".gate", "layernorm")) and "embed" not in n
                  and "eh_proj" not in n)
        if not linear:
            t[n] = (dt, shape, data)
            continue
        t[n] = ("F8_E4M3", shape, e4m3_of_bf16(data))
        sh = (-(-shape[0] // bn), -(-shape[1] // bk))
        v = (1 + rng.permutation(max(int(np.prod(sh)), 128))[:int(np.prod(sh))] % 128 / 128.0)
        t[m + ".weight_scale_inv"] = ("F32", list(sh), (v * 2.0 ** -6).astype("<f4").tobytes())
    config = dict(config)
    config["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                     "fmt": "e4m3", "weight_block_size": [bn, bk]}
    qo.write_model(out, config, t)
    return out


# engine name (after model.layers.N.) -> (how it is cut, source modules); per layout
DS_RULES = {
    "vllm": {
        "self_attn.fused_qkv_a_proj": ("whole", ["self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa"]),
        "self_attn.kv_b_proj": ("rows", ["self_attn.kv_b_proj"]),
        "self_attn.mla_attn.q_b_proj": ("rows", ["self_attn.q_b_proj"]),
        "self_attn.mla_attn.o_proj": ("cols", ["self_attn.o_proj"]),
        "mlp.gate_up_proj": ("rows", ["mlp.gate_proj", "mlp.up_proj"]),
        "mlp.down_proj": ("cols", ["mlp.down_proj"]),
        "mlp.experts._shared_experts._layer.gate_up_proj":
            ("rows", ["mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj"]),
        "mlp.experts._shared_experts._layer.down_proj": ("cols", ["mlp.shared_experts.down_proj"]),
    },
    "sglang": {
        "self_attn.fused_qkv_a_proj_with_mqa":
            ("whole", ["self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa"]),
        "self_attn.kv_b_proj": ("rows", ["self_attn.kv_b_proj"]),
        "self_attn.q_b_proj": ("rows", ["self_attn.q_b_proj"]),
        "self_attn.o_proj": ("cols", ["self_attn.o_proj"]),
        "mlp.gate_up_proj": ("rows", ["mlp.gate_proj", "mlp.up_proj"]),
        "mlp.down_proj": ("cols", ["mlp.down_proj"]),
        "mlp.shared_experts.gate_up_proj":
            ("rows", ["mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj"]),
        "mlp.shared_experts.down_proj": ("cols", ["mlp.shared_experts.down_proj"]),
    },
}


def deepseek_expected(bf16_ranks, fp8_model, layout, tp):
    """The block-FP8 twin's rank files from the BF16 checkpoint's rank files
    (the engines' own, testdata/conformance/*-deepseekv3-bf16-tp2/expected):
    every quantized weight the e4m3_of_bf16 map of the BF16 one, and beside
    it its F32 scale, the rank's block rows (rows split: the rank's rows are
    a contiguous range of each source, MLA on whole heads), block columns, or
    the whole scales of every part in turn (fused_qkv_a_proj)."""
    config, tensors = so.load_checkpoint(fp8_model)
    bn, bk = config["quantization_config"]["weight_block_size"]
    out = []
    for r in range(tp):
        want = {}
        for n, (dt, shape, data) in bf16_ranks[r].items():
            want[n] = (dt, shape, data)
            m = n[:-len(".weight")] if n.endswith(".weight") else None
            if m is None or ".layers." not in m:
                continue
            p, rest = m.split(".layers.", 1)
            layer, leaf = rest.split(".", 1)
            pre = f"{p}.layers.{layer}."
            if leaf in DS_RULES[layout]:
                how, srcs = DS_RULES[layout][leaf]
                want[n] = ("F8_E4M3", shape, e4m3_of_bf16(data))
                parts = []
                for s in srcs:
                    sc = tensors[pre + s + ".weight_scale_inv"]
                    w = tensors[pre + s + ".weight"]
                    if how == "whole":
                        parts.append(sc)
                    elif how == "rows":
                        rows = w[1][0] // tp
                        parts.append(so._rows(sc, r * rows // bn, rows // bn))
                    else:
                        cols = w[1][1] // tp
                        parts.append(so._cols(sc, r * cols // bk, cols // bk))
                want[m + ".weight_scale_inv"] = _f32(so._cat0(parts))
                if layout == "sglang" and how == "whole":
                    # deepseek_v2.py: attn_mqa, attn_mha RadixAttention(quant_config=...):
                    # Fp8KVCacheMethod k_scale, v_scale, 0-dim F32, 1.0 once processed
                    for a in ("attn_mha", "attn_mqa"):
                        for x in ("k_scale", "v_scale"):
                            want[pre + f"self_attn.{a}.{x}"] = ("F32", [], qo.scalar_bytes("F32", 1.0))
        # routed experts
        for n in list(want):
            if not n.endswith("w13_weight") and not n.endswith("w2_weight"):
                continue
            dt, shape, data = want[n]
            want[n] = ("F8_E4M3", shape, e4m3_of_bf16(data))
            pre = n.split(".mlp.experts.")[0] + ".mlp.experts"
            E = config["n_routed_experts"]
            sch = dict(kind="block", block=(bn, bk), scale="weight_scale_inv", static=False)
            base = n.rsplit(".", 1)[0] + "."
            if n.endswith("w13_weight"):
                tmp = {}
                _experts(tmp, sch, tensors, base, pre, ("gate_proj", "up_proj", "down_proj"), r,
                         tp, False, E, config["moe_intermediate_size"], config["hidden_size"])
                want.update(tmp)
        out.append(want)
    return out


def deepseek_many_experts(src, out, E=256, seed=3):
    """The BF16 DeepSeek-V3 checkpoint src with E routed experts in every MoE
    layer (the ones src lacks made up, the router widened): the shape of
    DeepSeek-V3/R1 (256 routed, 1 shared) that SGLang fuses."""
    config, tensors = so.load_checkpoint(src)
    rng = np.random.default_rng(seed)
    E0 = config["n_routed_experts"]

    def bf16(shape):
        f = rng.uniform(-1, 1, size=shape).astype(np.float32)
        return ("BF16", list(shape), (f.view(np.uint32) >> 16).astype("<u2").tobytes())

    t = dict(tensors)
    for n in list(tensors):
        if n.endswith(".mlp.gate.weight"):
            t[n] = bf16((E, tensors[n][1][1]))
            b = n[:-len("weight")] + "e_score_correction_bias"
            t[b] = ("F32", [E], rng.uniform(-1, 1, size=E).astype("<f4").tobytes())
        if ".mlp.experts.0." in n:
            for e in range(E0, E):
                m = n.replace(".mlp.experts.0.", f".mlp.experts.{e}.")
                t[m] = bf16(tensors[n][1])
    config = dict(config)
    config["n_routed_experts"] = E
    qo.write_model(out, config, t)
    return out


def sglang_fused_shared(model_dir, tp, r):
    """SGLang's w13_weight / w2_weight of every MoE layer on rank r with the
    shared expert fused in as expert E (deepseek_v2.py): {name: tensor}."""
    config, tensors = so.load_checkpoint(model_dir)
    E = config["n_routed_experts"]
    out = {}
    for n in sorted(tensors):
        if not n.endswith(".mlp.experts.0.gate_proj.weight"):
            continue
        pre = n[:-len(".experts.0.gate_proj.weight")]
        if pre.startswith("model.layers.") and int(pre.split(".")[2]) >= config["num_hidden_layers"]:
            continue  # the MTP layer: dropped
        srcs = [f"{pre}.experts.{e}." for e in range(E)] + [f"{pre}.shared_experts."]
        w13, w2 = [], []
        for s in srcs:
            w13.append(so._merged([tensors[s + "gate_proj.weight"], tensors[s + "up_proj.weight"]], r, tp))
            w2.append(so._row_parallel(tensors[s + "down_proj.weight"], r, tp))
        out[pre + ".experts.w13_weight"] = ("BF16", [E + 1] + w13[0][1], b"".join(x[2] for x in w13))
        out[pre + ".experts.w2_weight"] = ("BF16", [E + 1] + w2[0][1], b"".join(x[2] for x in w2))
    return out
