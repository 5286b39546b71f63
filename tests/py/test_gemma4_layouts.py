"""`tpshard split --layout vllm` of Gemma 4 text models (Gemma4ForCausalLM)
against gemma4_oracle.py, which shares no code with tpshard and encodes what
vLLM 0.33's models/gemma4.py holds on each rank:
  - the E series (per-layer inputs, KV-shared layers with a double-wide MLP,
    k_eq_v full-attention layers with their own head size and one global KV
    head, a per-layer vocabulary of its own size), the same with the
    KV-shared layers' K/V shipped (left out, and named by merge), the
    transformers 5 per_layer_config form, and the 31B style (no per-layer
    inputs, none shared, untied): at tp 1, 2 and 4 every rank file holds
    exactly the oracle's tensors;
  - check and verify --source pass, merge gives back the source less what
    the layout leaves out; a flipped byte fails verify, naming the tensor;
  - refusals name the field (the layer's own where per_layer_config says)
    and the tp values that work; bad inputs (sizes that disagree with
    per_layer_config, a per-layer table of the wrong width, a v_proj where
    vLLM loads k_proj, experts) exit 1 naming the tensor or field and write
    no .safetensors.
Run with build/venv/bin/python; env TPSHARD, TOP, TPS_TMP.
"""
import glob
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemma4_oracle as g4  # noqa: E402
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engines"))
import models as engine_models  # noqa: E402  (its FP8 maker: numpy only)
import ranktest  # noqa: E402
from ranktest import report  # noqa: E402
from serving_oracle import Rejected, load_checkpoint  # noqa: E402

TPSHARD = os.environ.get("TPSHARD") or os.path.join(os.environ.get("TOP", "."), "tpshard")
TMP = os.path.join(os.environ.get("TPS_TMP") or "/tmp", "gemma4-layouts")
shutil.rmtree(TMP, ignore_errors=True)
os.makedirs(TMP)


def tps(*args):
    p = subprocess.run([TPSHARD, *map(str, args)], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


MODELS = {
    "e": {},
    "e-shipkv": {"ship_shared_kv": True, "k_eq_v": False, "vocab_pl": 250, "seed": 1},
    "e-plc": {"per_layer_config": True, "seed": 3},
    "mm-e": {"multimodal": True, "seed": 6},
    "dense": {"heads": 8, "kv_heads": 4, "global_kv_heads": 2, "ple": 0, "kv_shared": 0,
              "double_wide": False, "tied": False, "vocab": 320, "seed": 2},
    # the 26B-A4B style: a router and 4 experts beside every layer's dense MLP
    "moe": {"heads": 8, "kv_heads": 4, "global_kv_heads": 2, "ple": 0, "kv_shared": 0,
            "double_wide": False, "vocab": 256, "experts": 4, "moe_inter": 32, "seed": 7},
    "mm-moe": {"multimodal": True, "ple": 0, "kv_shared": 0, "double_wide": False,
               "experts": 4, "moe_inter": 32, "seed": 8},
}


# FP8 E series (block [128, 128], compressed-tensors per channel with BF16 scales): the
# engine oracle's models, every linear weight but the embeddings' in E4M3
FP8 = {"e-fp8-block": "gemma4-e-fp8-block", "e-ct-fp8-channel": "gemma4-e-ct-fp8-channel",
       # the MoE's experts one 2-D tensor each (BF16, block FP8), and fused 3-D in block FP8
       # (experts.gate_up_proj_scale_inv [E, 2I/128, H/128])
       "moe-pe": "gemma4-moe-pe", "moe-pe-fp8-block": "gemma4-moe-pe-fp8-block",
       "moe-fp8-block": "gemma4-moe-fp8-block"}


def model(name, **over):
    d = os.path.join(TMP, "m-" + name)
    if not os.path.exists(d):
        if name in FP8:
            engine_models.MODELS[FP8[name]](d)
        else:
            g4.make_checkpoint(d, **dict(MODELS.get(name, {}), **over))
    return d


def sources(m):
    return {n: v for n, v in load_checkpoint(m)[1].items()}


def split_case(name, tp, full):
    m = model(name)
    label = f"gemma4 vllm {name} tp {tp}"
    out = os.path.join(TMP, f"o-{name}-{tp}")
    try:
        want = g4.expected_ranks(m, tp)
    except Rejected as e:
        rc, so, se = tps("split", m, "--tp", tp, "--layout", "vllm", "-o", out, "-q")
        problems = ranktest.refusal_problems(rc, se, out, "tp values that work", str(e))
        report(not problems, f"{label}: refused ({e})", "\n".join(problems) + "\n" + se)
        return
    rc, so, se = tps("split", m, "--tp", tp, "--layout", "vllm", "-o", out, "-q")
    if rc:
        report(False, f"{label}: split", f"rc {rc}\n{se}{so}")
        return
    problems = ranktest.rank_file_problems(out, m, want, tp)
    report(not problems, f"{label}: every rank file holds exactly the oracle's "
           f"{sum(len(w) for w in want)} tensors", "\n".join(problems[:20]))
    if not full:
        return
    rc, so, se = tps("check", out)
    report(rc == 0, f"{label}: check passes", f"rc {rc}\n{se}{so}")
    rc, so, se = tps("verify", out, "--source", m)
    report(rc == 0, f"{label}: verify --source passes", f"rc {rc}\n{se}{so}")
    merged = out + "-merged"
    rc, so, se = tps("merge", out, "-o", merged)
    if rc:
        report(False, f"{label}: merge", f"rc {rc}\n{se}{so}")
        return
    with open(os.path.join(m, "config.json")) as f:
        drop = set(g4.dropped(json.load(f), sources(m)))
    src, got = sources(m), sources(merged)
    bad = [f"{n} missing" for n in sorted(set(src) - set(got) - drop)]
    bad += [f"{n} should be left out" for n in sorted(drop & set(got))]
    bad += [f"{n} differs" for n in sorted(set(src) & set(got)) if src[n] != got[n]]
    bad += [f"{n} is not in the source" for n in sorted(set(got) - set(src))]
    bad += [f"merge does not name {n}" for n in sorted(drop) if n not in se + so]
    report(not bad, f"{label}: merge gives back the source" +
           (f" less the {len(drop)} tensors vLLM skips, naming them" if drop else ""),
           "\n".join(bad[:10]))
    # one byte of the last rank's fused qkv of a k_eq_v layer (K in the V rows)
    victim = ("language_model.model." if MODELS.get(name, {}).get("multimodal") else "model.") \
        + "layers.1.self_attn.qkv_proj.weight"
    tampered = out + "-tampered"
    shutil.copytree(out, tampered)
    path = os.path.join(tampered, f"model-rank-{tp - 1}-part-0.safetensors")
    if not os.path.exists(path):
        report(False, f"{label}: the last rank's file", f"no {path}")
        return
    flip_last_byte(path, victim)
    rc, so, se = tps("verify", tampered, "--source", m)
    report(rc == 1 and victim in so + se, f"{label}: verify --source fails with the last byte "
           f"of {victim} (its V rows, a copy of K) flipped, naming it",
           f"rc {rc}\n{se}{so}"[-1500:])
    rc, so, se = tps("check", tampered)
    report(rc == 1, f"{label}: check fails with it", f"rc {rc}\n{se}{so}")


def flip_last_byte(path, tensor):
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    n = int.from_bytes(raw[:8], "little")
    b, e = json.loads(raw[8:8 + n])[tensor]["data_offsets"]
    raw[8 + n + e - 1] ^= 0x10
    with open(path, "wb") as f:
        f.write(raw)


def pp_partition(layers, pp):
    """vLLM 0.33's get_pp_indices: layers // pp a stage, the remainder one
    each to stages pp - 2, pp - 3, ... (never the last)."""
    n = [layers // pp] * pp
    for k in range(layers % pp):
        n[pp - 2 - k] += 1
    return n


def pp_case(name, tp, pp):
    """Every stage builds the embeddings, the per-layer input tables, the
    final norm and the head (Gemma4Model and Gemma4ForCausalLM build them
    unconditionally), and its own layers."""
    m = model(name)
    label = f"gemma4 vllm {name} tp {tp} pp {pp}"
    out = os.path.join(TMP, f"o-{name}-{tp}-pp{pp}")
    with open(os.path.join(m, "config.json")) as f:
        L = json.load(f)["num_hidden_layers"]
    counts = pp_partition(L, pp)
    starts = [sum(counts[:k]) for k in range(pp)]
    want = g4.expected_ranks(m, tp)
    rc, so, se = tps("split", m, "--tp", tp, "--pp", pp, "--layout", "vllm", "-o", out, "-q")
    if rc:
        report(False, f"{label}: split", f"rc {rc}\n{se}{so}")
        return
    problems = []
    for st in range(pp):
        for r in range(tp):
            exp = {}
            for n, v in want[r].items():
                parts = n.split(".")
                layer = int(parts[2]) if parts[1] == "layers" else None
                if layer is None or starts[st] <= layer < starts[st] + counts[st]:
                    exp[n] = v
            got = {}
            for path in sorted(glob.glob(os.path.join(out, f"model-pp-{st}-tp-{r}-part-*"))):
                got.update(load_file_raw(path))
            problems += ranktest.compare(exp, got, f"stage {st} rank {r}")
    report(not problems, f"{label}: every stage's rank files hold exactly its layers "
           f"({counts}) and every stage the embeddings, norm and head", "\n".join(problems[:20]))
    rc, so, se = tps("verify", out, "--source", m)
    report(rc == 0, f"{label}: verify --source passes", f"rc {rc}\n{se}{so}")


def load_file_raw(path):
    import safetensors
    with open(path, "rb") as f:
        return {n: (i["dtype"], list(i["shape"]), bytes(i["data"]))
                for n, i in safetensors.deserialize(f.read())}


def refused(label, m, tp, words, extra=()):
    out = os.path.join(TMP, "r-" + label.replace(" ", "-").replace("/", "-"))
    rc, so, se = tps("split", m, "--tp", tp, "--layout", "vllm", "-o", out, *extra)
    problems = ranktest.refusal_problems(rc, se, out, words[0], label)
    problems += [f"the error does not say '{w}'" for w in words[1:] if w not in se]
    report(not problems, f"gemma4 vllm: {label}: exit 1 naming {words[0]}, nothing written",
           "\n".join(problems) + "\n" + se)


def edit_config(name, fn, **over):
    """A copy of a model with config.json edited by fn (in place)."""
    d = os.path.join(TMP, "m-" + name)
    if not os.path.exists(d):
        g4.make_checkpoint(d, **dict(MODELS[over.pop("base", "e")], **over))
        with open(os.path.join(d, "config.json")) as f:
            c = json.load(f)
        fn(c)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f)
    return d


def main():
    for name in list(MODELS) + list(FP8):
        for tp in (1, 2, 4):
            split_case(name, tp, full=tp == 2)
    # a flipped bit of the fused FP8 experts' block scales on the last rank (rows that
    # come from the up half, an expert apart)
    out = os.path.join(TMP, "o-moe-fp8-block-2")
    victim = "model.layers.1.experts.routed_experts.w13_weight_scale_inv"
    tampered = out + "-scale"
    if os.path.isdir(out):
        shutil.copytree(out, tampered)
        path = os.path.join(tampered, "model-rank-1-part-0.safetensors")
        ranktest.flip_bit(path, victim)
        rc, so, se = tps("check", tampered)
        rc2, so2, se2 = tps("verify", tampered, "--source", model("moe-fp8-block"))
        src_name = "model.layers.1.experts.gate_up_proj_scale_inv"
        report(rc == 1 and rc2 == 1 and src_name in so2 + se2,
               f"gemma4 vllm moe-fp8-block tp 2: check and verify fail with one flipped bit of "
               f"{victim} on rank 1, verify naming its source {src_name}",
               f"rc {rc} {rc2}\n{se}{so}{se2}{so2[-800:]}")
    else:
        report(False, "gemma4 vllm moe-fp8-block tp 2: its split is there to tamper with")
    pp_case("dense", 1, 3)
    pp_case("dense", 2, 2)
    # the E series' KV-shared layers 2 and 3 read layers 0 and 1's caches: vLLM refuses
    # a target on another stage
    refused("pp 2 parting KV-shared layers from their targets", model("e"), 2,
            ["layer 2", "num_kv_shared_layers", "layer 0", "stage"], ["--pp", 2])
    # the oracle itself refuses what vLLM asserts
    try:
        g4.expected_ranks(model("e"), 8)
        report(False, "gemma4 oracle: tp 8 of 4 heads is refused")
    except Rejected:
        report(True, "gemma4 oracle: tp 8 of 4 heads is refused")
    refused("tp 8 of 4 attention heads", model("e"), 8,
            ["num_attention_heads = 4", "tp values that work: 1, 2, 4"])
    # 3 KV heads on sliding layers: tp 2 neither divides them nor is a multiple
    m = model("kv3", kv_heads=3, head_dim=16)
    refused("tp 2 of 3 KV heads", m, 2,
            ["num_key_value_heads = 3", "tp values that work: 1, 3"])
    # the full layers' own 3 KV heads (per_layer_config): the layer is named
    m = model("plc-kv3", per_layer_config=True, kv_heads=2, global_kv_heads=3)
    refused("tp 2 of a layer's 3 KV heads", m, 2,
            ["num_key_value_heads (layer 1, from per_layer_config) = 3",
             "tp values that work: 1, 3"])
    # bad inputs
    m = edit_config("bad-plc", lambda c: c["per_layer_config"]["1"].update(head_dim=16),
                    base="e-plc")
    refused("per_layer_config's head_dim disagrees with q_proj", m, 2,
            ["model.layers.1.self_attn.", "layer 1", "per_layer_config", "head_dim 16"])
    m = edit_config("bad-ple", lambda c: c.update(hidden_size_per_layer_input=4))
    refused("embed_tokens_per_layer wider than num_hidden_layers x hidden_size_per_layer_input",
            m, 2, ["model.embed_tokens_per_layer.weight", "hidden_size_per_layer_input"])
    m = edit_config("bad-vpl", lambda c: c.update(vocab_size_per_layer_input=256))
    refused("embed_tokens_per_layer rows not vocab_size_per_layer_input", m, 2,
            ["model.embed_tokens_per_layer.weight", "vocab_size_per_layer_input"])
    # a k_eq_v full-attention layer with a v_proj: vLLM has no place for it
    m = edit_config("kv-with-v", lambda c: c.update(attention_k_eq_v=True,
                                                     num_global_key_value_heads=2,
                                                     global_head_dim=32),
                    base="e", k_eq_v=False, global_kv_heads=2, seed=4)
    refused("v_proj on a k_eq_v layer", m, 2,
            ["model.layers.1.self_attn.v_proj.weight", "k_proj"])
    # experts that disagree with config.json
    m = edit_config("moe-count", lambda c: c.update(num_experts=8), base="moe")
    refused("num_experts disagreeing with the experts' tensors", m, 2,
            ["model.layers.0.experts.gate_up_proj", "num_experts"])
    m = edit_config("moe-inter", lambda c: c.update(moe_intermediate_size=48), base="moe")
    refused("moe_intermediate_size disagreeing with the experts' tensors", m, 2,
            ["model.layers.0.experts.", "moe_intermediate_size"])
    refused("moe_intermediate_size 32 at tp 64", model("moe"), 64, ["moe_intermediate_size"])
    # fused FP8 experts without their block scales, and with scales off their block grid
    import quant_oracle
    for label, edit, words in (
            ("fused FP8 experts without their block scales",
             lambda t: t.pop("model.layers.0.experts.down_proj_scale_inv"),
             ["model.layers.0.experts.down_proj", "no block scales"]),
            ("fused FP8 experts' block scales off their grid",
             lambda t: t.update({"model.layers.0.experts.down_proj_scale_inv": (
                 "F32", [4, 2, 3], bytes(4 * 2 * 3 * 4))}),
             ["model.layers.0.experts.down_proj_scale_inv", "[4, 2, 2] for blocks of 128 x 128"])):
        d = os.path.join(TMP, "m-" + label.replace(" ", "-").replace("'", ""))
        if not os.path.exists(d):
            cfg, t = load_checkpoint(model("moe-fp8-block"))
            edit(t)
            quant_oracle.write_model(d, cfg, t)
        refused(label, d, 2, words)
    m = edit_config("mm-audio", lambda c: c.update(audio_config={"model_type": "gemma4_audio"}),
                    base="mm-e")
    refused("a multimodal checkpoint with an audio tower", m, 2, ["audio_config", "audio tower"])

    # SGLang 0.5.23 cannot build a Gemma 4 whose layers differ (every real one)
    out = os.path.join(TMP, "r-sglang")
    rc, so, se = tps("split", model("e"), "--tp", 2, "--layout", "sglang", "-o", out)
    problems = ranktest.refusal_problems(rc, se, out, "SGLang 0.5.23 cannot build Gemma 4",
                                         "sglang")
    report(not problems, "gemma4 sglang: refused, saying why, nothing written",
           "\n".join(problems) + "\n" + se)
    return 1 if ranktest_fails() else 0


def ranktest_fails():
    import tap
    return tap.fails()


if __name__ == "__main__":
    sys.exit(main())
