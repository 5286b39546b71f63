"""The serving-layout oracle (serving_oracle.py) against ground truth made by
the engines themselves: the vllm-* and sglang-* conformance cases, written
by vLLM 0.33's and SGLang 0.5.23's own loaders (ShardedStateLoader.save_model
after a normal Hugging Face load on a CPU).  The oracle must reproduce every
expected/rank-<r>.safetensors exactly: names, dtypes, shapes, bytes.  Then
the oracle's rules on their own (vocab padding, KV-head replication,
accepts()), with numbers worked out by hand from the engines' code.

Needs no tpshard binary.  Run with build/venv/bin/python; env TOP (repo root).
Prints "ok - ..." / "not ok - ..." / "skip - ..." lines.
"""
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.environ.get("TOP") or os.path.dirname(os.path.dirname(HERE))

try:
    import safetensors
except ImportError as e:  # pragma: no cover
    print(f"skip - serving oracle tests: {e}")
    sys.exit(0)

sys.path.insert(0, HERE)
import serving_oracle as so  # noqa: E402
from tap import fails, report  # noqa: E402

# The engine-made cases this oracle must reproduce.
ENGINE_CASES = ["vllm-llama-tp8-kv-replicated-vocab250", "vllm-qwen3-tied-tp2",
                "sglang-gemma3-tied-tp2"]


def read_ref(path):
    """{name: (dtype, shape, bytes)} read by the reference safetensors library."""
    with open(path, "rb") as f:
        items = safetensors.deserialize(f.read())
    return {n: (i["dtype"], list(i["shape"]), bytes(i["data"])) for n, i in items}


def diff_state(want, got, label):
    """Lines describing how two {name: (dtype, shape, bytes)} differ."""
    out = []
    for n in sorted(set(want) - set(got)):
        out.append(f"{label}: missing {n}")
    for n in sorted(set(got) - set(want)):
        out.append(f"{label}: unexpected {n}")
    for n in sorted(set(want) & set(got)):
        wd, ws, wb = want[n]
        gd, gs, gb = got[n]
        if (wd, ws) != (gd, gs):
            out.append(f"{label}: {n}: {gd}{gs}, expected {wd}{ws}")
        elif wb != gb:
            i = next((k for k in range(min(len(wb), len(gb))) if wb[k] != gb[k]), 0)
            out.append(f"{label}: {n}: bytes differ from byte {i}")
    return out


# ------------------------------------------------------------------ engine-made cases

def test_engine_cases():
    root = os.path.join(TOP, "testdata", "conformance")
    for case in ENGINE_CASES:
        d = os.path.join(root, case)
        if not os.path.isdir(d):
            print(f"skip - oracle vs {case}: no testdata/conformance/{case} in this checkout")
            continue
        with open(os.path.join(d, "case.json")) as f:
            cj = json.load(f)
        tp, layout = cj["tp"], cj["layout"]
        try:
            exp = so.expected_ranks(os.path.join(d, "model"), layout, tp)
        except Exception as e:  # noqa: BLE001
            report(False, f"oracle vs {case}", f"{type(e).__name__}: {e}")
            continue
        problems = []
        files = sorted(x for x in os.listdir(os.path.join(d, "expected")) if x.endswith(".safetensors"))
        if files != [f"rank-{r}.safetensors" for r in range(tp)]:
            problems.append(f"expected/ holds {files}, not rank-0..{tp - 1}")
        n = 0
        for r in range(tp):
            p = os.path.join(d, "expected", f"rank-{r}.safetensors")
            if not os.path.exists(p):
                continue
            got = read_ref(p)
            n += len(got)
            problems += diff_state(got, exp[r], f"rank {r}")
        report(not problems, f"oracle reproduces {case} ({layout} tp {tp}, {n} tensors) byte for byte",
               "\n".join(problems))


# ------------------------------------------------------------------ rules by hand

def test_vocab_rules():
    # serving.md's example: V = 32001 at tp 2 -> 16032 rows per rank, rank 1
    # holds 15969 real rows then 63 zero rows.
    got = [so.vocab_rows(32001, 2, r, "vllm") for r in range(2)]
    report(got == [(0, 16032, 16032), (16032, 15969, 16032)],
           "vocab 32001 tp 2: 16032 rows per rank, rank 1 = 15969 real + 63 zero", got)
    # V = 250: padded to 256 at any power-of-two tp; tp 8 -> 32 per rank,
    # rank 7 holds 224..249 (26 rows) and 6 zero rows; tp 1 pads too.
    got = so.vocab_rows(250, 8, 7, "vllm"), so.vocab_rows(250, 1, 0, "vllm")
    report(got == ((224, 26, 32), (0, 250, 256)),
           "vocab 250: tp 8 rank 7 = 26 real + 6 zero; tp 1 = 256 rows", got)
    # A rank past the real vocabulary holds only zero rows.
    got = so.vocab_rows(100, 4, 3, "vllm")
    report(got == (96, 4, 32), "vocab 100 tp 4: rank 3 = 4 real + 28 zero", got)
    # SGLang multiplies the padding by tp when ceil(V/64)*64 is not a multiple
    # of tp: V 250 at tp 3 -> padding 192 -> 384 rows, 128 per rank; vLLM refuses.
    got = so.padded_vocab(250, 3, "sglang"), so.padded_vocab(250, 3, "vllm")
    report(got == (384, 256), "vocab 250 tp 3: SGLang pads to 384 (64*tp), vLLM to 256", got)
    got = [so.vocab_rows(1007, 8, r, "sglang") for r in (0, 7)]
    report(got == [(0, 128, 128), (896, 111, 128)],
           "vocab 1007 tp 8: 1024 rows, rank 7 = 111 real + 17 zero", got)


def llama_cfg(**kw):
    c = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
         "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 8,
         "intermediate_size": 96, "vocab_size": 250, "num_hidden_layers": 1,
         "tie_word_embeddings": False}
    c.update(kw)
    return c


def test_accepts():
    cases = [
        # (config overrides, tp, layout, expected ok, field the reason must name)
        ({}, 1, "vllm", True, None),
        ({}, 8, "vllm", True, None),                        # 8 % 2 kv: replicated 4 times
        ({}, 8, "sglang", True, None),
        ({"num_attention_heads": 6, "num_key_value_heads": 1, "head_dim": 8}, 4, "vllm", False,
         "num_attention_heads"),
        ({"num_attention_heads": 12, "num_key_value_heads": 3, "head_dim": 4}, 4, "vllm", False,
         "num_key_value_heads"),                            # tp > kv, tp % kv != 0
        ({"num_attention_heads": 12, "num_key_value_heads": 6, "head_dim": 4}, 4, "sglang", False,
         "num_key_value_heads"),                            # kv >= tp, kv % tp != 0
        ({"intermediate_size": 90}, 4, "vllm", False, "intermediate_size"),
        ({"num_attention_heads": 6, "num_key_value_heads": 3, "head_dim": 8}, 3, "vllm", False,
         "vocab_size"),                                     # 256 % 3
        ({"num_attention_heads": 6, "num_key_value_heads": 3, "head_dim": 8}, 3, "sglang", True, None),
    ]
    for kw, tp, layout, want, field in cases:
        ok, why = so.accepts(llama_cfg(**kw), tp, layout)
        good = ok == want and (field is None or why.startswith(field))
        report(good, f"accepts {layout} tp {tp} {kw or 'defaults'}: {'yes' if want else 'no, ' + field}",
               f"got ({ok}, {why!r})")
    # vLLM's Qwen2 takes head_dim = hidden/heads whatever config.json says
    q = llama_cfg(architectures=["Qwen2ForCausalLM"], head_dim=16)
    report(so.accepts(q, 2, "vllm")[0] is False and so.accepts(q, 2, "sglang")[0] is True,
           "accepts: Qwen2 with head_dim != hidden/heads: vLLM no, SGLang yes",
           f"{so.accepts(q, 2, 'vllm')} {so.accepts(q, 2, 'sglang')}")


def labelled_model(A, K, D, H, I, V, tied=False):
    """A one-layer llama whose I16 entries say where they come from: q/k/v
    rows hold 1000*which + row, so a rank's qkv_proj tells which heads it got."""
    def t(rows, cols, base):
        vals = [base + i for i in range(rows) for _ in range(cols)]
        return ("I16", [rows, cols], struct.pack(f"<{len(vals)}h", *vals))
    ts = {"model.embed_tokens.weight": t(V, H, 0),
          "model.norm.weight": ("I16", [H], bytes(2 * H)),
          "model.layers.0.input_layernorm.weight": ("I16", [H], bytes(2 * H)),
          "model.layers.0.post_attention_layernorm.weight": ("I16", [H], bytes(2 * H)),
          "model.layers.0.self_attn.q_proj.weight": t(A * D, H, 1000),
          "model.layers.0.self_attn.k_proj.weight": t(K * D, H, 2000),
          "model.layers.0.self_attn.v_proj.weight": t(K * D, H, 3000),
          "model.layers.0.self_attn.o_proj.weight": t(H, A * D, 0),
          "model.layers.0.mlp.gate_proj.weight": t(I, H, 4000),
          "model.layers.0.mlp.up_proj.weight": t(I, H, 5000),
          "model.layers.0.mlp.down_proj.weight": t(H, I, 0)}
    if not tied:
        ts["lm_head.weight"] = t(V, H, 0)
    cfg = llama_cfg(hidden_size=H, num_attention_heads=A, num_key_value_heads=K, head_dim=D,
                    intermediate_size=I, vocab_size=V, tie_word_embeddings=tied)
    return cfg, ts


def first_col(t):
    dt, shape, data = t
    vals = struct.unpack(f"<{len(data) // 2}h", data)
    return [vals[i * shape[1]] for i in range(shape[0])]


def test_kv_replication():
    A, K, D, H, I, V = 8, 2, 2, 4, 8, 70
    cfg, ts = labelled_model(A, K, D, H, I, V)
    ranks = so.expected_ranks_from(cfg, ts, "vllm", 8)
    bad = []
    for r in range(8):
        kv = r // 4  # tp / kv = 4 replicas: ranks 0-3 hold KV head 0, 4-7 head 1
        want = ([1000 + r * D + i for i in range(D)] + [2000 + kv * D + i for i in range(D)]
                + [3000 + kv * D + i for i in range(D)])
        got = first_col(ranks[r]["model.layers.0.self_attn.qkv_proj.weight"])
        if got != want:
            bad.append(f"rank {r}: qkv rows {got}, expected {want}")
        gu = first_col(ranks[r]["model.layers.0.mlp.gate_up_proj.weight"])
        if gu != [4000 + r, 5000 + r]:
            bad.append(f"rank {r}: gate_up rows {gu}")
    report(not bad, "kv 2 at tp 8: rank r holds query head r and KV head r // 4 whole;"
           " gate_up = [gate_r; up_r]", "\n".join(bad))
    ranks = so.expected_ranks_from(cfg, ts, "sglang", 2)
    got = [first_col(ranks[r]["model.layers.0.self_attn.qkv_proj.weight"]) for r in range(2)]
    want = [[1000 + i for i in range(8)] + [2000, 2001, 3000, 3001],
            [1008 + i for i in range(8)] + [2002, 2003, 3002, 3003]]
    report(got == want, "kv 2 at tp 2: rank r holds query heads 4r..4r+3 and KV head r", got)
    # vocab 70 at tp 2: 128 rows, 64 per rank; rank 1 = rows 64..69 then 58 zero rows
    lm = first_col(ranks[1]["lm_head.weight"])
    report(lm == list(range(64, 70)) + [0] * 58,
           "lm_head vocab 70 tp 2: rank 1 = rows 64..69 + 58 zero rows", lm)


def test_tied_and_buffers():
    cfg, ts = labelled_model(4, 2, 2, 4, 8, 70, tied=True)
    ranks = so.expected_ranks_from(cfg, ts, "vllm", 2)
    keys = sorted(ranks[0])
    good = "lm_head.weight" in keys and "model.embed_tokens.weight" not in keys
    report(good, "tied llama (vllm): lm_head.weight only, vocab sharded", keys)
    bufs = {k: v for k, v in ranks[1].items() if ".attn._" in k}
    want = {f"model.layers.0.self_attn.attn.{b}": ("F32", [], struct.pack("<f", 1.0))
            for b in ("_k_scale", "_v_scale", "_q_scale", "_prob_scale")}
    report(bufs == want, "vllm: four 0-dim F32 attention scale buffers = 1.0 per layer", sorted(bufs))
    sg = so.expected_ranks_from(cfg, ts, "sglang", 2)
    report(not any(".attn." in k for k in sg[0]), "sglang: no attention scale buffers", sorted(sg[0]))
    # SGLang drops mlp biases (LlamaMLP bias=False): the oracle refuses to model that
    cfg2, ts2 = labelled_model(4, 2, 2, 4, 8, 70)
    cfg2["mlp_bias"] = True
    ts2["model.layers.0.mlp.down_proj.bias"] = ("I16", [4], bytes(8))
    ts2["model.layers.0.mlp.gate_proj.bias"] = ("I16", [8], bytes(16))
    ts2["model.layers.0.mlp.up_proj.bias"] = ("I16", [8], bytes(16))
    name = "sglang llama mlp_bias: the oracle says the engine would drop the biases"
    try:
        so.expected_ranks_from(cfg2, ts2, "sglang", 2)
        report(False, name, "no error")
    except so.Unsupported as e:
        report("drop" in str(e), name, e)
    v = so.expected_ranks_from(cfg2, ts2, "vllm", 2)
    report(v[1]["model.layers.0.mlp.gate_up_proj.bias"][1] == [8]
           and v[1]["model.layers.0.mlp.down_proj.bias"][1] == [4],
           "vllm llama mlp_bias: gate_up_proj.bias [gate_r; up_r], down_proj.bias whole",
           {k: x[1] for k, x in v[1].items() if k.endswith("bias")})


def main():
    for t in (test_engine_cases, test_vocab_rules, test_accepts, test_kv_replication,
              test_tied_and_buffers):
        try:
            t()
        except Exception as e:  # noqa: BLE001
            import traceback
            report(False, f"{t.__name__} raised {type(e).__name__}", traceback.format_exc())
    return 1 if fails() else 0


if __name__ == "__main__":
    sys.exit(main())
