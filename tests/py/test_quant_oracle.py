"""The quantized-checkpoint oracle (quant_oracle.py) on its own, against
what was seen running vLLM 0.33's loader on tiny block-FP8 and
compressed-tensors models (the facts of issue 18) and numbers worked out by
hand from the engines' code:
  - the checkpoint writer lays files out as safetensors' save_file does, and
    the reference reader reads every generated model back;
  - F8_E4M3, F8_E8M0 and BF16 decode to the right values;
  - vLLM qkv_proj.weight_scale_inv per rank, in 128-row blocks of each
    source: tp 2 rank 0 = q[0..1], k[0], v[0], rank 1 = q[2..3], k[1],
    v[1]; tp 4 with 2 KV heads rank r = q[r], k[r/2], v[r/2];
    gate_up_proj = [gate blocks; up blocks]; o/down split by block columns;
  - per-tensor scales one F32 slot per logical part (qkv [3], gate_up [2],
    o/down [1]), input_scale alike; per-channel scales follow the weight
    rows (KV replication included), row-parallel ones whole; every scale F32
    in vLLM's state (BF16 and E8M0 converted), the DTensor layout keeps the
    checkpoint's dtypes;
  - the extra attention entries: vLLM fp8 attn.q/k/v/prob_scale 0-dim in the
    model's dtype = -1.0; vLLM compressed-tensors attn.k/v/q_scale F32 [1] =
    1.0 and k/v/q_zero_point [1] = 0 in the model's dtype; SGLang fp8
    attn.k_scale/v_scale F32 [] = 1.0 (LLaMA, not Qwen3); SGLang
    compressed-tensors none;
  - every expected rank dequantizes (weight times the scale the oracle put
    beside it) to exactly the matching rows/columns of the dequantized
    source: no scale paired with the wrong rows;
  - refusals: misaligned blocks name the tensor and the block, unsupported
    quant_methods are named, bad input names the tensor.

Needs no tpshard binary.  Run with build/venv/bin/python; env TOP (repo root),
TPS_TMP (scratch).  Prints "ok - ..." / "not ok - ..." / "skip - ..." lines.
"""
import json
import os
import shutil
import struct
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

try:
    import numpy as np
    import safetensors
    from safetensors.numpy import save_file
except ImportError as e:  # pragma: no cover
    print(f"skip - quantized oracle tests: {e}")
    sys.exit(0)

sys.path.insert(0, HERE)
import quant_oracle as qo  # noqa: E402
import serving_oracle as so  # noqa: E402
from tap import fails, report  # noqa: E402

TMP = tempfile.mkdtemp(prefix="pyqo.", dir=os.environ.get("TPS_TMP") or None)
MODELS = {}


def model(preset):
    if preset not in MODELS:
        MODELS[preset] = qo.make_model(os.path.join(TMP, preset), preset)
    return MODELS[preset]


def src(preset):
    return qo.load(model(preset))[1]


def f32(t):
    return qo.to_f32(t[0], t[2]).reshape(t[1])


def rows_of(t, start, count):
    return f32(t)[start:start + count]


# ------------------------------------------------------------------ files and numbers

def test_writer():
    rng = np.random.default_rng(7)
    arrs = {"b.f32": rng.standard_normal((3, 5)).astype(np.float32),
            "a.f16": rng.standard_normal((7,)).astype(np.float16),
            "c.u8": rng.integers(0, 255, (5, 3)).astype(np.uint8),
            "d.i32": rng.integers(-9, 9, (2, 2)).astype(np.int32),
            "e.scalar": np.array(2.5, dtype=np.float32)}
    ref = os.path.join(TMP, "ref.safetensors")
    save_file(arrs, ref, metadata={"format": "pt"})
    dt = {np.float32: "F32", np.float16: "F16", np.uint8: "U8", np.int32: "I32"}
    mine = qo.safetensors_bytes({k: (dt[v.dtype.type], list(v.shape), v.tobytes())
                                 for k, v in arrs.items()}, {"format": "pt"})
    with open(ref, "rb") as f:
        theirs = f.read()
    report(mine == theirs, "writer: byte-identical to safetensors.numpy.save_file",
           f"{len(mine)} vs {len(theirs)} bytes")
    bad = []
    for p in qo.PRESETS:
        config, tensors = qo.load(model(p))
        with open(os.path.join(model(p), "model.safetensors"), "rb") as f:
            items = safetensors.deserialize(f.read())
        got = {n: (i["dtype"], list(i["shape"]), bytes(i["data"])) for n, i in items}
        if got != tensors:
            bad.append(f"{p}: the reference reader reads something else")
        try:
            qo.check_input(config, tensors)
        except qo.Refused as e:
            bad.append(f"{p}: {e}")
    report(not bad, f"generators: {len(qo.PRESETS)} models readable by the reference library, "
           "consistent scales", "\n".join(bad))


def test_decoding():
    e4 = qo.to_f32("F8_E4M3", bytes([0x38, 0x7E, 0x01, 0x80, 0xB8, 0x08]))
    want = [1.0, 448.0, 2.0 ** -9, -0.0, -1.0, 2.0 ** -6]
    report(list(e4) == want and np.isnan(qo.to_f32("F8_E4M3", b"\x7f"))[0],
           "E4M3: 0x38 = 1, 0x7E = 448, 0x01 = 2^-9, 0x08 = 2^-6, 0x7F NaN", list(e4))
    e5 = qo.to_f32("F8_E5M2", bytes([0x3C, 0x7B, 0x01]))
    report(list(e5) == [1.0, 57344.0, 2.0 ** -16], "E5M2: 0x3C = 1, 0x7B = 57344, 0x01 = 2^-16",
           list(e5))
    e8 = qo.to_f32("F8_E8M0", bytes([127, 120, 130]))
    report(list(e8) == [1.0, 2.0 ** -7, 8.0], "E8M0: 2^(e-127)", list(e8))
    bf = qo.to_f32("BF16", struct.pack("<HH", 0x3F80, 0xBFC0))
    report(list(bf) == [1.0, -1.5], "BF16: 0x3F80 = 1, 0xBFC0 = -1.5", list(bf))
    report(qo.scalar_bytes("BF16", -1.0) == b"\x80\xbf" and qo.scalar_bytes("F16", 0.0) == b"\0\0",
           "model-dtype constants: BF16 -1.0 = 80 BF, F16 0 = 00 00")


# ------------------------------------------------------------------ vLLM's observed layout

def block_rows(t, first, count):
    """count 128-row blocks of a scale from block row first (values)."""
    return f32(t)[first:first + count]


def test_block_qkv():
    p = "fp8-block-llama"  # q 4 blocks, k/v 2 blocks (2 KV heads of 128 rows)
    s = src(p)
    L = "model.layers.0."
    q, k, v = (s[L + f"self_attn.{x}_proj.weight_scale_inv"] for x in "qkv")
    for layout in ("vllm", "sglang"):
        for tp, want in ((2, [(0, 2, 0, 0), (2, 2, 1, 1)]),
                         (4, [(r, 1, r // 2, r // 2) for r in range(4)])):
            ranks = qo.expected_ranks(model(p), layout, tp)
            bad = []
            for r, (q0, qn, k0, v0) in enumerate(want):
                got = ranks[r][L + "self_attn.qkv_proj.weight_scale_inv"]
                exp = np.concatenate([block_rows(q, q0, qn), block_rows(k, k0, 1),
                                      block_rows(v, v0, 1)])
                if (got[0] != "F32" or got[1] != list(exp.shape)
                        or not np.array_equal(f32(got), exp)):
                    bad.append(f"rank {r}: {got[0]}{got[1]}, expected F32{list(exp.shape)} "
                               f"= q[{q0}..{q0 + qn - 1}], k[{k0}], v[{v0}]")
            desc = ("rank 0 = q[0..1],k[0],v[0]; rank 1 = q[2..3],k[1],v[1]" if tp == 2
                    else "rank r = q[r], k[r/2], v[r/2] (KV replicated)")
            report(not bad, f"{layout} qkv_proj.weight_scale_inv tp {tp}: {desc}", "\n".join(bad))


def test_block_merged_and_row():
    p = "fp8-block-h320-e8m0"  # E8M0 scales; hidden 320: partial blocks
    s = src(p)
    L = "model.layers.0."
    g, u = s[L + "mlp.gate_proj.weight_scale_inv"], s[L + "mlp.up_proj.weight_scale_inv"]
    o, d = s[L + "self_attn.o_proj.weight_scale_inv"], s[L + "mlp.down_proj.weight_scale_inv"]
    report(g[1] == [4, 3] and o[1] == [3, 4] and d[1] == [3, 4],
           "h320: gate scale [4,3] (partial last column block), o/down [3,4] (partial last row)",
           f"{g[1]} {o[1]} {d[1]}")
    for layout in ("vllm", "sglang"):
        bad = []
        for tp in (1, 2, 4):
            ranks = qo.expected_ranks(model(p), layout, tp)
            nb = 4 // tp
            for r in range(tp):
                got = ranks[r][L + "mlp.gate_up_proj.weight_scale_inv"]
                exp = np.concatenate([f32(g)[r * nb:(r + 1) * nb], f32(u)[r * nb:(r + 1) * nb]])
                if got[0] != "F32" or not np.array_equal(f32(got), exp):
                    bad.append(f"tp {tp} rank {r}: gate_up scale {got[0]}{got[1]}")
                for nm, t in (("self_attn.o_proj", o), ("mlp.down_proj", d)):
                    got = ranks[r][L + nm + ".weight_scale_inv"]
                    exp = f32(t)[:, r * nb:(r + 1) * nb]
                    if got[0] != "F32" or not np.array_equal(f32(got), exp):
                        bad.append(f"tp {tp} rank {r}: {nm} scale {got[0]}{got[1]}, expected "
                                   f"F32{list(exp.shape)}")
        report(not bad, f"{layout} E8M0 block scales: gate_up = [gate blocks; up blocks], o/down "
               f"by block columns, all F32 (tp 1, 2, 4)", "\n".join(bad))
    # layer 1's down_proj is in modules_to_not_convert: BF16, no scale, in every layout
    for layout in qo.LAYOUTS:
        r0 = qo.expected_ranks(model(p), layout, 2)[0]
        w = r0.get("model.layers.1.mlp.down_proj.weight")
        good = (w is not None and w[0] == "BF16"
                and "model.layers.1.mlp.down_proj.weight_scale_inv" not in r0)
        report(good, f"{layout}: a module in modules_to_not_convert stays BF16 without a scale",
               f"{w and w[:2]}")
    # the DTensor layout keeps E8M0 and cuts block columns of o_proj
    dt = qo.expected_ranks(model(p), "dtensor", 2)
    got = dt[1][L + "self_attn.o_proj.weight_scale_inv"]
    report(got[0] == "F8_E8M0" and got[1] == [3, 2] and got[2] == so._cols(o, 2, 2)[2],
           "dtensor: o_proj.weight_scale_inv stays E8M0, rank 1 = block columns 2..3", got[:2])
    got = dt[1][L + "self_attn.q_proj.weight_scale_inv"]
    q = s[L + "self_attn.q_proj.weight_scale_inv"]
    report(got[1] == [2, 3] and got[2] == so._rows(q, 2, 2)[2],
           "dtensor: q_proj.weight_scale_inv rank 1 = block rows 2..3", got[:2])


def test_bf16_scales():
    p = "fp8-block-qwen3-i384"
    s = src(p)
    n = "model.layers.1.self_attn.o_proj.weight_scale_inv"
    v = qo.expected_ranks(model(p), "vllm", 1)[0][n]
    d = qo.expected_ranks(model(p), "dtensor", 1)[0][n]
    report(v[0] == "F32" and np.array_equal(f32(v), f32(s[n])) and d == s[n],
           "BF16 weight_scale_inv: F32 of the same values in vllm, untouched in dtensor",
           f"{v[:2]} {d[:2]}")


def test_per_tensor():
    for p in ("ct-tensor-static-llama", "ct-tensor-scalar", "fp8-tensor-autofp8"):
        s = src(p)
        L = "model.layers.1."
        sch = qo.scheme_of(qo.load(model(p))[0])
        bad = []
        for tp in (1, 2, 4):
            for r, rk in enumerate(qo.expected_ranks(model(p), "vllm", tp)):
                for into, parts in (("self_attn.qkv_proj", ("q", "k", "v")),
                                    ("mlp.gate_up_proj", ("gate", "up"))):
                    pre = into.split(".")[0] + "."
                    names = ["weight_scale"] + (["input_scale"] if sch["static_input"] else [])
                    for nm in names:
                        got = rk[L + into + "." + nm]
                        exp = np.concatenate([f32(s[L + pre + x + "_proj." + nm]).reshape(1)
                                              for x in parts])
                        if (got[0] != "F32" or got[1] != [len(parts)]
                                or not np.array_equal(f32(got), exp)):
                            bad.append(f"tp {tp} rank {r}: {into}.{nm} {got[0]}{got[1]}")
                for m in ("self_attn.o_proj", "mlp.down_proj"):
                    got = rk[L + m + ".weight_scale"]
                    if got[:2] != ("F32", [1]) or not np.array_equal(
                            f32(got), f32(s[L + m + ".weight_scale"]).reshape(1)):
                        bad.append(f"tp {tp} rank {r}: {m}.weight_scale {got[0]}{got[1]}")
        shp = s[L + "self_attn.q_proj.weight_scale"][1]
        report(not bad, f"vllm {p} (scales {shp}): qkv [3], gate_up [2], o/down [1] F32 slots"
               + (", input_scale alike" if sch["static_input"] else ""), "\n".join(bad))
        dt = qo.expected_ranks(model(p), "dtensor", 2)
        n = L + "self_attn.k_proj.weight_scale"
        good = all(dt[r][n] == s[n] for r in range(2))
        if sch["static_input"]:
            n2 = L + "mlp.down_proj.input_scale"
            good = good and all(dt[r][n2] == s[n2] for r in range(2))
        report(good, f"dtensor {p}: per-tensor and input scales whole on every rank, dtype kept")


def test_per_channel():
    p = "ct-channel-qwen3"  # D 64, 2 KV heads, BF16 [out,1] scales
    s = src(p)
    L = "model.layers.0."
    bad = []
    for tp in (1, 2, 4):
        for r, rk in enumerate(qo.expected_ranks(model(p), "vllm", tp)):
            qh = 4 // tp
            kv = r // (tp // 2) if tp >= 2 else 0
            kh = 1 if tp >= 2 else 2
            sc = {x: s[L + f"self_attn.{x}_proj.weight_scale"] for x in "qkv"}
            exp = np.concatenate([rows_of(sc["q"], r * qh * 64, qh * 64),
                                  rows_of(sc["k"], kv * 64, kh * 64),
                                  rows_of(sc["v"], kv * 64, kh * 64)])
            got = rk[L + "self_attn.qkv_proj.weight_scale"]
            if got[0] != "F32" or got[1] != list(exp.shape) or not np.array_equal(f32(got), exp):
                bad.append(f"tp {tp} rank {r}: qkv_proj.weight_scale {got[0]}{got[1]}")
            got = rk[L + "self_attn.o_proj.weight_scale"]
            if got[:2] != ("F32", [256, 1]) or not np.array_equal(
                    f32(got), f32(s[L + "self_attn.o_proj.weight_scale"])):
                bad.append(f"tp {tp} rank {r}: o_proj.weight_scale {got[0]}{got[1]} (whole, F32)")
    report(not bad, "vllm per-channel: qkv scale rows follow the weight rows (KV replicated at "
           "tp 4), o_proj's [out,1] whole, F32", "\n".join(bad))
    dt = qo.expected_ranks(model(p), "dtensor", 2)
    n, o = L + "mlp.up_proj.weight_scale", L + "mlp.down_proj.weight_scale"
    good = (dt[1][n] == so._rows(s[n], 192, 192) and dt[0][o] == s[o] and dt[1][o] == s[o])
    report(good, "dtensor per-channel: colwise scale rows chunked with the weight, rowwise whole")


def test_extras():
    L = "model.layers.1.self_attn.attn."
    v = qo.expected_ranks(model("fp8-block-llama"), "vllm", 2)[1]
    got = {k[len(L):]: x for k, x in v.items() if k.startswith(L)}
    want = {b: ("F32", [], struct.pack("<f", 1.0)) for b in ("_k_scale", "_v_scale", "_q_scale",
                                                              "_prob_scale")}
    want.update({b: ("BF16", [], b"\x80\xbf") for b in ("q_scale", "k_scale", "v_scale",
                                                        "prob_scale")})
    report(got == want, "vllm fp8: attn.q/k/v/prob_scale BF16 [] = -1.0 beside the four _scale "
           "buffers", sorted(got))
    v = qo.expected_ranks(model("ct-channel-qwen3"), "vllm", 2)[0]
    got = {k[len(L):]: x for k, x in v.items() if k.startswith(L)}
    want = {b: ("F32", [], struct.pack("<f", 1.0)) for b in ("_k_scale", "_v_scale", "_q_scale",
                                                              "_prob_scale")}
    want.update({b + "_scale": ("F32", [1], struct.pack("<f", 1.0)) for b in "kvq"})
    want.update({b + "_zero_point": ("BF16", [1], b"\0\0") for b in "kvq"})
    report(got == want, "vllm compressed-tensors: attn.k/v/q_scale F32 [1] = 1.0, "
           "k/v/q_zero_point BF16 [1] = 0, no prob_scale", sorted(got))
    sg = qo.expected_ranks(model("fp8-block-llama"), "sglang", 2)[0]
    got = {k[len(L):]: x for k, x in sg.items() if k.startswith(L)}
    want = {b: ("F32", [], struct.pack("<f", 1.0)) for b in ("k_scale", "v_scale")}
    report(got == want, "sglang fp8 LLaMA: attn.k_scale, v_scale F32 [] = 1.0 only", sorted(got))
    sg = qo.expected_ranks(model("fp8-block-qwen3-i384"), "sglang", 1)[0]
    sc = qo.expected_ranks(model("ct-block-llama"), "sglang", 2)[0]
    report(not any(".attn." in k for k in list(sg) + list(sc)),
           "sglang: no attention entries for fp8 Qwen3 (no quant_config to RadixAttention) nor "
           "compressed-tensors without kv_cache_scheme")
    dt = qo.expected_ranks(model("fp8-block-llama"), "dtensor", 2)[0]
    report(not any(".attn." in k for k in dt), "dtensor: no engine entries")


# ------------------------------------------------------------------ pairing, by dequantization

def _pairs(rank, sch):
    """(weight name, scale name) of every quantized weight of a rank."""
    for n, t in rank.items():
        if n.endswith(".weight") and t[0] in qo.FP8_DTYPES:
            yield n, n[:-len("weight")] + sch["scale"]


def test_dequant_pairing():
    for p in qo.PRESETS:
        config, s = qo.load(model(p))
        sch = qo.scheme_of(config)
        full = {}
        for n, t in s.items():
            if n.endswith(".weight") and t[0] in qo.FP8_DTYPES:
                full[n] = qo.dequantize(t, s[n[:-len("weight")] + sch["scale"]], sch["block"])
        for layout in qo.LAYOUTS:
            done, bad = [], []
            for tp in (1, 2, 4):
                try:
                    ranks = qo.expected_ranks(model(p), layout, tp)
                except qo.Refused:
                    continue
                done.append(tp)
                g = qo._geometry(config, layout) if layout != "dtensor" else None
                for r, rk in enumerate(ranks):
                    for wn, sn in _pairs(rk, sch):
                        w = rk[wn]
                        if sch["kind"] == "tensor" and layout != "dtensor" and "_proj" in wn and (
                                "qkv_proj" in wn or "gate_up_proj" in wn):
                            # one slot per part: dequantize each part with its slot
                            sc = f32(rk[sn])
                            got = []
                            rows = qo.part_rows(g, tp, r)
                            srcs = (("q_proj", "k_proj", "v_proj") if "qkv" in wn
                                    else ("gate_proj", "up_proj"))
                            at = 0
                            for i, x in enumerate(srcs):
                                n = rows[x][1]
                                got.append(f32(so._rows(w, at, n)) * sc[i])
                                at += n
                            got = np.concatenate(got)
                        else:
                            got = qo.dequantize(w, rk[sn], sch["block"])
                        exp = expected_piece(full, wn, layout, tp, r, g)
                        if got.shape != exp.shape or not np.array_equal(got, exp):
                            bad.append(f"tp {tp} rank {r}: {wn} dequantized differs from the "
                                       f"source's rows/columns")
            if done:
                report(not bad, f"{layout} {p}: every rank's weight x scale = the source's "
                       f"dequantized piece (tp {', '.join(map(str, done))})", "\n".join(bad[:10]))


def expected_piece(full, wn, layout, tp, r, g):
    """The dequantized source rows/columns a rank's weight must hold, computed
    from the head arithmetic without the oracle's slicing."""
    if layout == "dtensor":
        w = full[wn]
        m = wn.rsplit(".", 1)[0]
        style = qo.dtensor_style(m)
        if style == "replicate":
            return w
        dim = 1 if style == "rowwise" else 0
        s, n = qo.chunk(w.shape[dim], tp, r)
        return w[s:s + n] if dim == 0 else w[:, s:s + n]
    pre = wn.rsplit(".", 2)[0] + "."
    A, K, D, I = g["A"], g["K"], g["D"], g["I"]
    if wn.endswith("qkv_proj.weight"):
        qh = A // tp
        kv = [r // (tp // K)] if tp >= K else list(range(r * K // tp, (r + 1) * K // tp))
        q = full[pre + "q_proj.weight"][r * qh * D:(r + 1) * qh * D]
        k = np.concatenate([full[pre + "k_proj.weight"][h * D:(h + 1) * D] for h in kv])
        v = np.concatenate([full[pre + "v_proj.weight"][h * D:(h + 1) * D] for h in kv])
        return np.concatenate([q, k, v])
    if wn.endswith("gate_up_proj.weight"):
        n = I // tp
        return np.concatenate([full[pre + "gate_proj.weight"][r * n:(r + 1) * n],
                               full[pre + "up_proj.weight"][r * n:(r + 1) * n]])
    w = full[wn]
    n = w.shape[1] // tp
    return w[:, r * n:(r + 1) * n]


# ------------------------------------------------------------------ refusals

def test_refusals():
    cases = [
        # (preset, layout, tp, rule, a string the reason must contain, names that must be listed)
        ("fp8-block-qwen3-i384", "dtensor", 2, "block", "128",
         ["model.layers.0.mlp.gate_proj.weight"]),
        ("fp8-block-qwen3-i384", "vllm", 2, "block", "128",
         ["model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.down_proj.weight"]),
        ("fp8-block-qwen3-i384", "sglang", 2, "block", "128", ["model.layers.0.mlp.up_proj"]),
        ("fp8-block-hd80", "vllm", 1, "block", "128", ["model.layers.0.self_attn.q_proj.weight"]),
        ("fp8-block-hd80", "sglang", 1, "block", "128", ["model.layers.1.self_attn.k_proj"]),
        ("fp8-block-hd80", "dtensor", 2, "block", "128",
         ["model.layers.0.self_attn.q_proj.weight"]),
        ("ct-channel-qwen3", "sglang", 2, "layout", "transposed", ["compressed-tensors"]),
        ("ct-tensor-static-llama", "sglang", 1, "layout", "requantized", ["compressed-tensors"]),
        ("fp8-tensor-autofp8", "sglang", 2, "layout", "per-tensor", ["fp8"]),
        ("fp8-block-llama", "dtensor", 4, "engine", "num_key_value_heads", []),
    ]
    for p, layout, tp, rule, text, names in cases:
        try:
            qo.expected_ranks(model(p), layout, tp)
            report(False, f"refuses {p} {layout} tp {tp}", "accepted")
            continue
        except qo.Refused as e:
            good = e.rule == rule and text in e.reason and all(n in e.names for n in names)
            report(good, f"refuses {p} {layout} tp {tp}: {rule}, names {names or 'the field'}",
                   f"{e.rule}: {e.reason}\nnames {e.names}")
    for p, layout, tp in (("fp8-block-hd80", "dtensor", 1), ("fp8-block-h320-e8m0", "vllm", 4),
                          ("fp8-block-qwen3-i384", "sglang", 1)):
        ok, why, _ = qo.accepts(model(p), tp, layout)
        report(ok, f"accepts {p} {layout} tp {tp}", why)
    got = qo.working_tps(model("fp8-block-llama"), "vllm", 8), qo.working_tps(
        model("fp8-block-qwen3-i384"), "dtensor", 8)
    report(got == ([1, 2, 4], [1]), "tp values that work: fp8-block-llama vllm 1, 2, 4; "
           "qwen3-i384 dtensor 1", got)


def bad_model(label, edit, config_edit=None):
    config, tensors = qo.build(qo.PRESETS["ct-block-llama" if label.startswith("ct") else
                                           "fp8-block-hd80"])
    tensors = dict(tensors)
    config = json.loads(json.dumps(config))
    edit(tensors)
    if config_edit:
        config_edit(config)
    return config, tensors


def test_bad_input():
    L = "model.layers.0."
    cases = [
        ("scale shape", lambda t: t.__setitem__(L + "self_attn.k_proj.weight_scale_inv",
                                                ("F32", [2, 1], bytes(8))), None,
         L + "self_attn.k_proj.weight_scale_inv"),
        ("weight without scale", lambda t: t.pop(L + "mlp.up_proj.weight_scale_inv"), None,
         L + "mlp.up_proj.weight"),
        ("scale without weight", lambda t: t.__setitem__(L + "mlp.shared_proj.weight_scale_inv",
                                                         ("F32", [1, 1], bytes(4))), None,
         L + "mlp.shared_proj.weight_scale_inv"),
        ("ct scale shape", lambda t: t.__setitem__(L + "mlp.down_proj.weight_scale",
                                                   ("F32", [2, 1], bytes(8))), None,
         L + "mlp.down_proj.weight_scale"),
    ]
    for bs in ([128], [0, 128], ["a", 1], [128, 128, 1], [-128, 128], 128):
        cases.append((f"weight_block_size {json.dumps(bs)}", lambda t: None,
                      lambda c, bs=bs: c["quantization_config"].update(weight_block_size=bs),
                      "weight_block_size"))
    for label, edit, cedit, name in cases:
        config, tensors = bad_model(label, edit, cedit)
        try:
            qo.check_input(config, tensors)
            report(False, f"bad input ({label}) refused", "accepted")
        except qo.Refused as e:
            report(e.rule == "input" and name in e.names and name in e.reason,
                   f"bad input ({label}): refused, names {name}", f"{e.rule}: {e.reason}")
    for kind in qo.UNSUPPORTED:
        d, method = qo.unsupported_model(os.path.join(TMP, "u-" + kind.split()[0] + str(len(kind))),
                                         kind)
        try:
            qo.expected_ranks(d, "dtensor", 2)
            report(False, f"unsupported {kind}", "accepted")
        except qo.Refused as e:
            good = (e.rule == "quant_method" and method in e.reason
                    and "not supported yet" in e.reason)
            report(good, f"unsupported quantization {kind}: refused, quant_method {method} named",
                   e.reason)


def main():
    for t in (test_writer, test_decoding, test_block_qkv, test_block_merged_and_row,
              test_bf16_scales, test_per_tensor, test_per_channel, test_extras,
              test_dequant_pairing, test_refusals, test_bad_input):
        try:
            t()
        except Exception as e:  # noqa: BLE001
            import traceback
            report(False, f"{t.__name__} raised {type(e).__name__}", traceback.format_exc())
    if not os.environ.get("KEEP_TMP"):
        shutil.rmtree(TMP, ignore_errors=True)
    return 1 if fails() else 0


if __name__ == "__main__":
    sys.exit(main())
