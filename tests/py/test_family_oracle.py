"""The family oracle (family_oracle.py) on its own, with numbers worked out by
hand from the engines' and transformers' code: which rows of a packed Phi-3
qkv_proj / gate_up_proj each rank gets, which experts and which rows of each
expert a rank's fused w13_weight / w2_weight hold (tensor and expert
parallel), the key names each engine's state has, the DTensor placements of
transformers' plans, and accepts().  Every entry of the models here is a label
saying where it comes from, so a misplaced row shows.

Needs no tpshard binary.  Run with build/venv/bin/python; env TOP (repo root).
Prints "ok - ..." / "not ok - ..." lines.
"""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

sys.path.insert(0, HERE)
import family_oracle as fo  # noqa: E402
from tap import fails, report  # noqa: E402


def lab(rows, cols, f):
    """I16 [rows, cols] (or [rows] when cols is None) with entry f(row, col)."""
    if cols is None:
        vals = [f(i, 0) for i in range(rows)]
        return ("I16", [rows], struct.pack(f"<{rows}h", *vals))
    vals = [f(i, j) for i in range(rows) for j in range(cols)]
    return ("I16", [rows, cols], struct.pack(f"<{len(vals)}h", *vals))


def vals(t):
    dt, shape, data = t
    return list(struct.unpack(f"<{len(data) // 2}h", data))


def col0(t):
    """First entry of every row (of every expert, for a 3-dim tensor), flattened."""
    v = vals(t)
    return v[::t[1][-1]] if t[1][-1] else []


def row0(t, e=0):
    """Row 0 of expert e of a 3-dim tensor."""
    E, R, C = t[1]
    v = vals(t)
    return v[e * R * C:e * R * C + C]


def common(H, V, L, tied=False):
    ts = {"model.embed_tokens.weight": lab(V, H, lambda i, j: i),
          "model.norm.weight": lab(H, None, lambda i, j: 0)}
    if not tied:
        ts["lm_head.weight"] = lab(V, H, lambda i, j: 100 + i)
    for i in range(L):
        p = f"model.layers.{i}."
        ts[p + "input_layernorm.weight"] = lab(H, None, lambda i, j: 1)
        ts[p + "post_attention_layernorm.weight"] = lab(H, None, lambda i, j: 2)
    return ts


# ------------------------------------------------------------------ Phi-3

def phi3_model(A=4, K=2, D=2, I=8, V=64, tied=False):
    H = A * D
    cfg = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": H,
           "num_attention_heads": A, "num_key_value_heads": K, "intermediate_size": I,
           "vocab_size": V, "num_hidden_layers": 1, "tie_word_embeddings": tied}
    ts = common(H, V, 1, tied)
    # packed rows labelled by their index: q 0..A*D-1, then k, then v; gate 0..I-1, up I..2I-1
    ts["model.layers.0.self_attn.qkv_proj.weight"] = lab((A + 2 * K) * D, H, lambda i, j: i)
    ts["model.layers.0.self_attn.o_proj.weight"] = lab(H, A * D, lambda i, j: j)
    ts["model.layers.0.mlp.gate_up_proj.weight"] = lab(2 * I, H, lambda i, j: i)
    ts["model.layers.0.mlp.down_proj.weight"] = lab(H, I, lambda i, j: j)
    return cfg, ts


def test_phi3():
    cfg, ts = phi3_model()  # A 4, K 2, D 2: q rows 0-7, k 8-11, v 12-15; gate 0-7, up 8-15
    q = "model.layers.0.self_attn.qkv_proj.weight"
    g = "model.layers.0.mlp.gate_up_proj.weight"
    for layout in ("vllm", "sglang"):
        r = fo.expected_ranks_from(cfg, ts, layout, 2)
        got = col0(r[1][q]), col0(r[1][g])
        report(got == ([4, 5, 6, 7, 10, 11, 14, 15], [4, 5, 6, 7, 12, 13, 14, 15]),
               f"phi3 {layout} tp 2 rank 1: qkv_proj = q heads 2,3 + k head 1 + v head 1; "
               "gate_up = gate rows 4-7 + up rows 4-7", got)
        # tp 4 > kv 2: rank 3 has q head 3 and KV head 3 // 2 = 1
        r = fo.expected_ranks_from(cfg, ts, layout, 4)
        got = col0(r[3][q]), col0(r[3][g]), col0(r[0][q])
        report(got == ([6, 7, 10, 11, 14, 15], [6, 7, 14, 15], [0, 1, 8, 9, 12, 13]),
               f"phi3 {layout} tp 4: KV heads replicated, rank 3 = q 6,7 k 10,11 v 14,15", got)
        want_keys = {"model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.self_attn.o_proj.weight",
                     "model.layers.0.mlp.gate_up_proj.weight", "model.layers.0.mlp.down_proj.weight",
                     "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight",
                     "model.norm.weight", "model.embed_tokens.weight", "lm_head.weight"}
        if layout == "vllm":
            want_keys |= {f"model.layers.0.self_attn.attn.{b}" for b in
                          ("_k_scale", "_v_scale", "_q_scale", "_prob_scale")}
        report(set(r[0]) == want_keys, f"phi3 {layout}: the engine's key set (LlamaForCausalLM's)",
               sorted(set(r[0]) ^ want_keys))
    # DTensor (transformers colwise_gather_output): the packed tensor as one block
    r = fo.expected_ranks_from(cfg, ts, "dtensor", 3)
    got = [col0(r[k][q]) for k in range(3)], col0(r[2][g]), r[1]["model.embed_tokens.weight"][1]
    report(got == ([[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11], [12, 13, 14, 15]],
                   [12, 13, 14, 15], [64, 8]),
           "phi3 dtensor tp 3: qkv_proj torch.chunk of the packed rows (6,6,4), gate_up likewise, "
           "embedding replicated", got)
    r = fo.expected_ranks_from(cfg, ts, "dtensor", 2)
    down = r[1]["model.layers.0.mlp.down_proj.weight"]
    got = r[1]["model.layers.0.self_attn.o_proj.weight"][1], vals(down)[:down[1][1]], r[1]["lm_head.weight"][1]
    report(got == ([8, 4], [4, 5, 6, 7], [32, 8]),
           "phi3 dtensor tp 2: o_proj/down_proj Shard(1), lm_head Shard(0)", got)
    # NeMo AutoModel's _parallelize_phi3 (the alternative PHI3_DTENSOR = "nemo")
    nemo = [fo.placement(n, fo.PHI3_RULES_NEMO) for n in
            ("model.embed_tokens.weight", q, "model.layers.0.self_attn.o_proj.weight", g, "lm_head.weight")]
    report(nemo == [("shard", 0), ("shard", 1), ("shard", 0), ("shard", 0), ("shard", 0)],
           "phi3 NeMo plan: embedding Shard(0), qkv_proj Rowwise Shard(1), o_proj Colwise Shard(0), "
           "gate_up Shard(0), lm_head Shard(0)", nemo)
    # packed rows that disagree with the config
    bad = dict(ts)
    bad[q] = lab(18, 8, lambda i, j: i)
    for layout in fo.LAYOUTS:
        ok, why = fo.accepts(cfg, 2, layout, tensors=bad)
        report(not ok and "qkv_proj" in why, f"phi3 {layout}: qkv_proj of 18 rows (config: 16) is refused",
               why)
    # tied (Phi-4-mini): lm_head.weight is the vocab-parallel embedding, no embed_tokens key
    cfg, ts = phi3_model(tied=True, V=100)
    r = fo.expected_ranks_from(cfg, ts, "vllm", 2)
    got = "model.embed_tokens.weight" in r[0], r[1]["lm_head.weight"][1], col0(r[1]["lm_head.weight"])[-30:-27]
    report(got == (False, [64, 8], [98, 99, 0]), "phi3 tied vllm tp 2: lm_head.weight only, 128 padded rows, "
           "rank 1 = rows 64-99 then zeros", got)


# ------------------------------------------------------------------ MoE

def moe_model(fam, A=4, K=2, D=2, E=4, I=8, V=64, L=1):
    H = A * D
    ts = common(H, V, L)
    cfg = {"hidden_size": H, "num_attention_heads": A, "num_key_value_heads": K, "vocab_size": V,
           "num_hidden_layers": L, "tie_word_embeddings": False}
    if fam == "qwen3_moe":
        cfg.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", head_dim=D,
                   num_experts=E, moe_intermediate_size=I, intermediate_size=3 * I,
                   decoder_sparse_step=1, mlp_only_layers=[])
        moe, w1, w3, w2, gate = "mlp", "gate_proj", "up_proj", "down_proj", "mlp.gate"
    else:
        cfg.update(architectures=["MixtralForCausalLM"], model_type="mixtral", num_local_experts=E,
                   intermediate_size=I)
        moe, w1, w3, w2, gate = "block_sparse_moe", "w1", "w3", "w2", "block_sparse_moe.gate"
    for i in range(L):
        p = f"model.layers.{i}."
        for x, rows in (("q", A * D), ("k", K * D), ("v", K * D)):
            ts[p + f"self_attn.{x}_proj.weight"] = lab(rows, H, lambda i, j: i)
        ts[p + "self_attn.o_proj.weight"] = lab(H, A * D, lambda i, j: j)
        if fam == "qwen3_moe":
            ts[p + "self_attn.q_norm.weight"] = lab(D, None, lambda i, j: 3)
            ts[p + "self_attn.k_norm.weight"] = lab(D, None, lambda i, j: 4)
        ts[p + gate + ".weight"] = lab(E, H, lambda i, j: 50 + i)
        for e in range(E):
            # gate rows 1000+100e+row, up rows 2000+100e+row, down columns 3000+100e+col
            ts[p + f"{moe}.experts.{e}.{w1}.weight"] = lab(I, H, lambda i, j, e=e: 1000 + 100 * e + i)
            ts[p + f"{moe}.experts.{e}.{w3}.weight"] = lab(I, H, lambda i, j, e=e: 2000 + 100 * e + i)
            ts[p + f"{moe}.experts.{e}.{w2}.weight"] = lab(H, I, lambda i, j, e=e: 3000 + 100 * e + j)
    return cfg, ts


NAMES = {  # (family, layout): (w13, w2, router) per layer 0
    ("qwen3_moe", "vllm"): ("mlp.experts.routed_experts.w13_weight", "mlp.experts.routed_experts.w2_weight",
                            "mlp.experts.gate.weight"),
    ("qwen3_moe", "sglang"): ("mlp.experts.w13_weight", "mlp.experts.w2_weight", "mlp.gate.weight"),
    ("mixtral", "vllm"): ("block_sparse_moe.experts.routed_experts.w13_weight",
                          "block_sparse_moe.experts.routed_experts.w2_weight", "block_sparse_moe.gate.weight"),
    ("mixtral", "sglang"): ("block_sparse_moe.experts.w13_weight", "block_sparse_moe.experts.w2_weight",
                            "block_sparse_moe.gate.weight"),
}


def test_moe():
    for fam in fo.MOE:
        cfg, ts = moe_model(fam)  # E 4, I 8, H 8
        for layout in ("vllm", "sglang"):
            n13, n2, ng = ("model.layers.0." + x for x in NAMES[(fam, layout)])
            r = fo.expected_ranks_from(cfg, ts, layout, 2)
            w13, w2 = r[1][n13], r[1][n2]
            got = w13[1], w2[1], col0(w13)[8:16], row0(w2, 3), r[1][ng][1]
            report(got == ([4, 8, 8], [4, 8, 4], [1104, 1105, 1106, 1107, 2104, 2105, 2106, 2107],
                           [3304, 3305, 3306, 3307], [4, 8]),
                   f"{fam} {layout} tp 2 rank 1: w13 [E, 2I/tp, H] = per expert [gate rows 4-7; up rows 4-7], "
                   f"w2 [E, H, I/tp] = down columns 4-7, router {NAMES[(fam, layout)][2]} [E, H] whole", got)
            # --ep over 2 ranks: rank 1 holds experts 2 and 3 whole
            r = fo.expected_ranks_from(cfg, ts, layout, 2, ep=True)
            w13, w2 = r[1][n13], r[1][n2]
            got = w13[1], w2[1], col0(w13)[:1] + col0(w13)[15:17] + col0(w13)[-1:], row0(w2, 1)
            report(got == ([2, 16, 8], [2, 8, 8], [1200, 2207, 1300, 2307],
                           [3300, 3301, 3302, 3303, 3304, 3305, 3306, 3307]),
                   f"{fam} {layout} tp 2 --ep rank 1: experts 2,3 whole, w13 [2, 2I, H] = [gate; up]", got)
            # attention under --ep stays tensor parallel (KV replicated at tp 4 > kv 2)
            r = fo.expected_ranks_from(cfg, ts, layout, 4, ep=True)
            got = col0(r[3]["model.layers.0.self_attn.qkv_proj.weight"]), r[3][n13][1]
            report(got == ([6, 7, 2, 3, 2, 3], [1, 16, 8]),
                   f"{fam} {layout} tp 4 --ep rank 3: qkv_proj = q head 3 + KV head 1, one expert", got)
            keys = {k for k in r[0] if "gate" in k}
            want = {"model.layers.0." + NAMES[(fam, layout)][2]}
            report(keys == want, f"{fam} {layout}: the router's only key is {NAMES[(fam, layout)][2]}",
                   sorted(keys))
        # DTensor: transformers' packed_colwise/rowwise under the per-expert names
        r = fo.expected_ranks_from(cfg, ts, "dtensor", 2)
        moe, w1, w3, w2 = ("mlp", "gate_proj", "up_proj", "down_proj") if fam == "qwen3_moe" else \
            ("block_sparse_moe", "w1", "w3", "w2")
        p = f"model.layers.0.{moe}.experts.2."
        router = "model.layers.0." + ("mlp.gate.weight" if fam == "qwen3_moe" else "block_sparse_moe.gate.weight")
        got = (col0(r[1][p + w1 + ".weight"]), col0(r[1][p + w3 + ".weight"]),
               vals(r[1][p + w2 + ".weight"])[:4], r[1][router][1], r[0]["model.embed_tokens.weight"][1])
        report(got == ([1204, 1205, 1206, 1207], [2204, 2205, 2206, 2207], [3204, 3205, 3206, 3207], [4, 8],
                       [64, 8]),
               f"{fam} dtensor tp 2 rank 1: every expert's {w1}/{w3} Shard(0), {w2} Shard(1); router and "
               "embedding replicated", got)


def test_accepts():
    q, _ = moe_model("qwen3_moe", A=8, K=8, D=1, E=8, I=12)
    m, _ = moe_model("mixtral", A=8, K=8, D=1, E=6, I=8)
    p, _ = phi3_model(A=12, K=3, D=4, I=48)
    cases = [
        # (config, tp, layout, ep, expected ok, word the reason starts with)
        (q, 8, "vllm", False, False, "moe_intermediate_size"),   # 12 % 8: vLLM would floor
        (q, 8, "sglang", False, False, "moe_intermediate_size"),  # SGLang asserts
        (q, 8, "dtensor", False, False, "moe_intermediate_size"),
        (q, 8, "vllm", True, True, None),                          # --ep: experts whole
        (q, 4, "sglang", True, True, None),
        (dict(q, num_experts=6), 4, "vllm", True, False, "num_experts"),
        (dict(q, num_experts=2, moe_intermediate_size=8), 4, "vllm", False, False, "num_experts"),
        (dict(q, mlp_only_layers=[0]), 2, "sglang", False, False, "mlp_only_layers"),
        (dict(q, mlp_only_layers=[0]), 2, "vllm", False, True, None),
        (dict(q, decoder_sparse_step=2), 2, "sglang", False, False, "decoder_sparse_step"),
        (m, 4, "sglang", True, False, "num_local_experts"),
        (m, 2, "vllm", True, True, None),
        (m, 8, "vllm", False, True, None),
        (dict(m, intermediate_size=12), 8, "sglang", False, False, "intermediate_size"),
        (dict(m, head_dim=2), 2, "sglang", False, False, "head_dim"),
        (dict(m, head_dim=2), 2, "vllm", False, True, None),
        (dict(m, num_key_value_heads=2), 4, "dtensor", False, False, "num_key_value_heads"),
        (dict(m, num_key_value_heads=2), 4, "vllm", False, True, None),  # replicated KV heads
        (p, 2, "vllm", False, False, "num_key_value_heads"),     # 3 KV heads over 2 ranks
        (p, 4, "sglang", False, False, "num_key_value_heads"),   # 4 % 3
        (p, 3, "sglang", False, True, None),
        (p, 3, "vllm", False, False, "vocab_size"),               # 64 rows % 3
        (p, 4, "dtensor", False, True, None),                    # the HF plan gathers: any tp
        (dict(p, num_attention_heads=6, num_key_value_heads=6, hidden_size=24), 4, "vllm", False, False,
         "num_attention_heads"),
        (dict(p, num_key_value_heads=4, intermediate_size=90), 4, "sglang", False, False, "intermediate_size"),
    ]
    for cfg, tp, layout, ep, want, word in cases:
        ok, why = fo.accepts(cfg, tp, layout, ep)
        good = ok == want and (word is None or why.startswith(word))
        base = {"qwen3_moe": q, "mixtral": m, "phi3": p}[fo.family_of(cfg)]
        diff = {k: v for k, v in cfg.items() if base.get(k) != v} or "defaults"
        report(good, f"accepts {fo.family_of(cfg)} {layout} tp {tp}{' --ep' if ep else ''} {diff}: "
                     f"{'yes' if want else 'no, ' + word}", f"got ({ok}, {why!r})")


def main():
    test_phi3()
    test_moe()
    test_accepts()
    return 1 if fails() else 0


if __name__ == "__main__":
    sys.exit(main())
