"""`tpshard split --layout vllm` of packed integer checkpoints (GPTQ 4- and
8-bit, grouped and channelwise; AWQ) against packed_oracle.py, which shares no
code with tpshard:
  - every rank file holds exactly the oracle's tensors (fused qkv_proj and
    gate_up_proj along their output columns, KV heads replicated at tp 4,
    channelwise scales and zeros whole on row-parallel ranks, g_idx left out);
  - `check` passes, and fails once one byte of a fused (strided) qweight is
    flipped; `merge` gives back every tensor but g_idx, byte for byte, and
    names those; `verify --source` passes;
  - refusals (cuts inside a packed word or a group, AWQ's channelwise
    row-parallel layers, asymmetric GPTQ, desc_act with groups, 3 bits,
    scales not in the model's dtype, --layout dtensor and sglang) exit 1, say
    why and write no .safetensors;
  - bad input (a qzeros of the wrong shape, missing scales) exits 1 naming the
    tensor.
Run with build/venv/bin/python; env TPSHARD, TOP, TPS_TMP.
"""
import glob
import json
import os

import numpy as np
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import packed_oracle as po  # noqa: E402
import ranktest  # noqa: E402
from ranktest import report  # noqa: E402

TPSHARD = os.environ.get("TPSHARD") or os.path.join(os.environ.get("TOP", "."), "tpshard")
TMP = os.path.join(os.environ.get("TPS_TMP") or "/tmp", "packed")
shutil.rmtree(TMP, ignore_errors=True)
os.makedirs(TMP, exist_ok=True)


def tps(*args):
    p = subprocess.run([TPSHARD, *map(str, args)], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


MODELS = {
    "gptq-g128": ("gptq", {}),
    "gptq-ch": ("gptq", {"group": -1, "desc_act": True}),
    "gptq-8bit": ("gptq", {"bits": 8}),
    "gptq-g32-qwen2": ("gptq", {"group": 32, "family": "qwen2"}),
    "awq-g128": ("awq", {}),
    "awq-g64-mistral": ("awq", {"group": 64, "family": "mistral"}),
    "awq-ch": ("awq", {"group": -1}),
    # head_dim 4: a KV head is 4 output features, half a 4-bit word of qzeros
    "gptq-hd4": ("gptq", {"hd": 4, "heads": 8, "H": 64, "I": 256, "group": 32}),
    # intermediate 384 at group 128: tp 2 gives each rank 192 input features of down_proj
    "gptq-i384": ("gptq", {"I": 384}),
    "gptq-asym": ("gptq", {"sym": False}),
    "gptq-descact": ("gptq", {"desc_act": True}),
    "gptq-3bit": ("gptq", {"bits": 3, "I": 384, "H": 96, "hd": 24}),
    "gptq-bf16-scales": ("gptq", {"scale_dtype": "BF16"}),
    # compressed-tensors pack-quantized (WNA16)
    "ct-g128": ("ct", {"H": 256, "I": 512, "hd": 64}),
    "ct-asym-g32": ("ct", {"sym": False, "group": 32}),
    "ct-ch": ("ct", {"group": -1}),
    "ct-8bit-qwen2": ("ct", {"bits": 8, "group": 64, "family": "qwen2"}),
    # zero points of 4-bit codes: a KV head of 4 rows is half a word of them
    "ct-asym-hd4": ("ct", {"sym": False, "hd": 4, "heads": 8, "H": 64, "I": 256, "group": 32}),
    # NVFP4, ModelOpt and compressed-tensors
    "nvfp4": ("nvfp4", {}),
    "nvfp4-mistral": ("nvfp4", {"family": "mistral", "I": 384}),
    # intermediate 224: tp 4 gives down_proj 56 input features, not whole 16-blocks
    "nvfp4-i224": ("nvfp4", {"I": 224}),
    "ct-nvfp4": ("ct-nvfp4", {}),
}
_BUILT = {}


def model(name, **extra):
    key = name + repr(sorted(extra.items()))
    if key not in _BUILT:
        method, kw = MODELS[name]
        _BUILT[key] = po.build(os.path.join(TMP, "m-" + name + ("-" + "-".join(extra) if extra else "")),
                               method, **kw, **extra)
    return _BUILT[key]


def sources(m):
    out = {}
    for f in glob.glob(os.path.join(m, "*.safetensors")):
        out.update(po._st_read(f))
    return out


def run_case(name, tp, full=False):
    m = model(name)
    label = f"packed vllm {name} tp {tp}"
    out = os.path.join(TMP, f"o-{name}-{tp}")
    args = ["split", m, "--tp", tp, "-o", out, "-q", "--layout", "vllm"]
    try:
        want = po.expected_ranks(m, tp)
    except po.Refused as e:
        rc, _, se = tps(*args)
        problems = ranktest.refusal_problems(rc, se, out, e.words[0], e.reason)
        for w in e.words[1:]:
            if w not in se:
                problems.append(f"the error does not say '{w}'")
        report(not problems, f"{label}: refused ({e.reason})", "\n".join(problems) + "\n" + se)
        return
    rc, so, se = tps(*args)
    if rc:
        report(False, f"{label}: split", f"rc {rc}\n{se}{so}")
        return
    problems = [x for x in ranktest.rank_file_problems(out, m, want, tp)
                if not x.startswith("config.json differs")]
    with open(os.path.join(out, "config.json")) as f:
        if json.load(f) != po.expected_config(m):
            problems.append("config.json is not the source's with the quantized modules named")
    report(not problems, f"{label}: every rank file holds exactly the oracle's "
           f"{sum(len(w) for w in want)} tensors", "\n".join(problems[:20]))
    if not full:
        return
    rc, so, se = tps("check", out)
    report(rc == 0, f"{label}: check passes", f"rc {rc}\n{se}{so}")
    rc, so, se = tps("verify", out, "--source", m)
    report(rc == 0, f"{label}: verify --source passes", f"rc {rc}\n{se}{so[-1500:]}")
    merged = out + "-merged"
    rc, so, se = tps("merge", out, "-o", merged)
    src, got = sources(m), sources(merged) if rc == 0 else {}
    drop = set(po.dropped(m))
    bad = [f"{n} missing" for n in sorted(set(src) - set(got) - drop)]
    bad += [f"{n} differs" for n in sorted(set(src) & set(got)) if src[n] != got[n]]
    bad += [f"{n} should be left out" for n in sorted(drop & set(got))]
    bad += [f"merge does not name {n}" for n in sorted(drop) if n not in se + so][:3]
    with open(os.path.join(merged, "config.json"), "rb") as f, open(os.path.join(m, "config.json"), "rb") as g:
        if f.read() != g.read():
            bad.append("merge's config.json is not the source's, byte for byte")
    report(rc == 0 and not bad, f"{label}: merge gives back every tensor but the {len(drop)} "
           f"left out (g_idx, fused parts' weight_shape), byte for byte, and names those", f"rc {rc}\n" + "\n".join(bad[:10]) + se[-500:])
    # one bit of a fused, strided qweight, and of a row-parallel one
    w, sc = {"gptq": ("qweight", "scales"), "awq": ("qweight", "scales"),
             "ct": ("weight_packed", "weight_scale"), "nvfp4": ("weight", "weight_scale"),
             "ct-nvfp4": ("weight_packed", "weight_scale")}[MODELS[name][0]]
    for victim in (f"model.layers.1.self_attn.qkv_proj.{w}", f"model.layers.0.mlp.down_proj.{sc}"):
        tampered = out + "-t-" + victim.split(".")[-2]
        shutil.copytree(out, tampered)
        path = sorted(glob.glob(os.path.join(tampered, f"model-rank-{tp - 1}-part-*.safetensors")))[0]
        ranktest.flip_bit(path, victim)
        rc, so, se = tps("check", tampered)
        report(rc == 1 and os.path.basename(path) in se + so,
               f"{label}: check fails with one flipped bit of {victim} on rank {tp - 1}, naming "
               "its file", f"rc {rc}\n{se}{so}")
        rc, so, se = tps("verify", tampered, "--source", m, "--json")
        try:
            failed = [(c.get("check"), c.get("kind")) for c in json.loads(so).get("checks", [])
                      if not c.get("ok")]
        except ValueError:
            failed = []
        deq = [c for c, k in failed if k == "dequant"]
        report(rc == 1 and bool(deq), f"{label}: verify --source fails with it, its dequantized "
               f"products too ({deq[0] if deq else 'none'})", f"rc {rc}; failed {failed[:6]}\n{se}")


MOE = {
    "moe-ct-g32": ("ct", {}),
    "moe-ct-asym-ch": ("ct", {"sym": False, "group": -1}),
    "moe-gptq-g32": ("gptq", {}),
    "moe-nvfp4": ("nvfp4", {}),
    "moe-awq-g32": ("awq", {}),
    # experts of 224 rows: 56 a rank at tp 4, not whole 16-groups (NVFP4) or 32-groups (GPTQ)
    "moe-nvfp4-i224": ("nvfp4", {"I": 224}),
    "moe-gptq-i224": ("gptq", {"I": 224}),
    "moe-ct-asym-i224": ("ct", {"I": 224, "sym": False}),
    # experts of 96 rows, groups of 32: tp 2 gives down_proj 48 input features
    "moe-ct-i96": ("ct", {"I": 96, "E": 8}),
}


def moe_pad_case(name, tp):
    """--pad-intermediate on experts whose rank width is not whole groups
    (vLLM #49949: Nemotron's 1856 experts at tp 8 cut a 16-group)."""
    method, kw = MOE[name]
    m = os.path.join(TMP, "m-" + name)
    if not os.path.exists(os.path.join(m, "config.json")):
        po.build_moe(m, method, **kw)
    label = f"packed vllm {name} tp {tp} --pad-intermediate"
    out = os.path.join(TMP, f"o-{name}-{tp}-pad")
    rc, _, se = tps("split", m, "--tp", tp, "-o", out + "-plain", "-q", "--layout", "vllm")
    rc2, so2, _ = tps("plan", m, "--tp", tp, "--layout", "vllm")
    report(rc == 1 and "experts' MLP" in so2, f"{label}: refused without it, plan suggests it",
           f"rc {rc}\n{se[-300:]}\n{so2[-500:]}")
    rc, so, se = tps("split", m, "--tp", tp, "-o", out, "-q", "--layout", "vllm", "--pad-intermediate")
    if rc:
        report(False, f"{label}: split", se)
        return
    want = po.expected_moe_ranks(m, tp, pad=True)
    problems = [x for x in ranktest.rank_file_problems(out, m, want, tp)
                if not x.startswith("config.json differs")]
    with open(os.path.join(out, "config.json")) as f:
        if json.load(f) != po.moe_expected_config(m, tp, pad=True):
            problems.append("config.json is not the source's with the padded moe_intermediate_size")
    report(not problems, f"{label}: every rank file holds exactly the oracle's padded experts",
           "\n".join(problems[:20]))
    rc, so, se = tps("check", out)
    report(rc == 0, f"{label}: check passes", se)
    rc, so, se = tps("verify", out, "--source", m)
    report(rc == 0, f"{label}: verify --source passes", se + so[-600:])
    rc, so, se = tps("merge", out, "-o", out + "-merged")
    src, got = sources(m), sources(out + "-merged") if rc == 0 else {}
    drop = set(po.moe_dropped(m))
    bad = [n for n in src if n not in drop and src[n] != got.get(n)]
    report(rc == 0 and not bad, f"{label}: merge gives back the unpadded source", f"{bad[:4]}{se[-300:]}")


def moe_case(name, tp, ep=False, full=False):
    method, kw = MOE[name]
    m = os.path.join(TMP, "m-" + name)
    if not os.path.exists(os.path.join(m, "config.json")):
        po.build_moe(m, method, **kw)
    label = f"packed vllm {name} tp {tp}{' --ep' if ep else ''}"
    out = os.path.join(TMP, f"o-{name}-{tp}{'-ep' if ep else ''}")
    args = ["split", m, "--tp", tp, "-o", out, "-q", "--layout", "vllm"] + (["--ep"] if ep else [])
    try:
        want = po.expected_moe_ranks(m, tp, ep)
    except po.Refused as e:
        rc, _, se = tps(*args)
        problems = ranktest.refusal_problems(rc, se, out, e.words[0], e.reason)
        report(not problems, f"{label}: refused ({e.reason})", "\n".join(problems) + "\n" + se)
        return
    rc, so, se = tps(*args)
    if rc:
        report(False, f"{label}: split", f"rc {rc}\n{se}{so}")
        return
    problems = [x for x in ranktest.rank_file_problems(out, m, want, tp)
                if not x.startswith("config.json differs")]
    with open(os.path.join(out, "config.json")) as f:
        if json.load(f) != po.moe_expected_config(m):
            problems.append("config.json is not the source's with the quantized modules named")
    report(not problems, f"{label}: every rank file holds exactly the oracle's "
           f"{sum(len(w) for w in want)} tensors", "\n".join(problems[:20]))
    if not full:
        return
    rc, so, se = tps("check", out)
    report(rc == 0, f"{label}: check passes", f"rc {rc}\n{se}{so}")
    rc, so, se = tps("verify", out, "--source", m)
    report(rc == 0, f"{label}: verify --source passes", f"rc {rc}\n{se}{so[-1500:]}")
    merged = out + "-merged"
    rc, so, se = tps("merge", out, "-o", merged)
    src, got = sources(m), sources(merged) if rc == 0 else {}
    drop = set(po.moe_dropped(m))
    bad = [f"{n} missing" for n in sorted(set(src) - set(got) - drop)]
    bad += [f"{n} differs" for n in sorted(set(src) & set(got)) if src[n] != got[n]]
    bad += [f"merge does not name {n}" for n in sorted(drop) if n not in se + so][:3]
    report(rc == 0 and not bad, f"{label}: merge gives back every tensor but the {len(drop)} "
           f"left out, byte for byte, and names those", "\n".join(bad[:10]) + se[-300:])


PAD = {
    "pad-gptq-i224": ("gptq", {"I": 224, "group": 32}),
    # Qwen2-72B's shape scaled down: 231 groups of intermediate features
    "pad-gptq-qwen72b": ("gptq", {"I": 231 * 32, "group": 32, "layers": 1, "family": "qwen2",
                                  "heads": 8, "kv": 8, "hd": 32, "H": 256}),
    "pad-ct-i224": ("ct", {"I": 224, "group": 32}),
    "pad-awq-i224": ("awq", {"I": 224, "group": 32}),
}


def mlp_out(x, gate, up, down):
    g = x @ gate.T
    return ((g / (1 + np.exp(-g))) * (x @ up.T)) @ down.T


def pad_case(name, tp):
    """--pad-intermediate: the oracle's padded rank files, the padded size in
    config.json, check/verify/merge, and (GPTQ) the padded MLP's outputs,
    dequantized by the oracle on every rank and summed, equal the unpadded
    model's."""
    method, kw = PAD[name]
    m = os.path.join(TMP, "m-" + name)
    if not os.path.exists(os.path.join(m, "config.json")):
        po.build(m, method, **kw)
    label = f"packed vllm {name} tp {tp} --pad-intermediate"
    out = os.path.join(TMP, f"o-{name}-{tp}")
    rc, so, se = tps("split", m, "--tp", tp, "-o", out + "-plain", "-q", "--layout", "vllm")
    refused = rc == 1 and ("groups" in se or "packed words" in se)
    rc2, so2, _ = tps("plan", m, "--tp", tp, "--layout", "vllm")
    report(refused and "--pad-intermediate" in so2, f"{label}: without it the split is refused "
           "and plan suggests the padding", f"rc {rc}\n{se[-400:]}\n{so2[-600:]}")
    rc, so, se = tps("split", m, "--tp", tp, "-o", out, "-q", "--layout", "vllm", "--pad-intermediate")
    if rc:
        report(False, f"{label}: split", f"rc {rc}\n{se}")
        return
    want = po.expected_ranks(m, tp, pad=True)
    problems = [x for x in ranktest.rank_file_problems(out, m, want, tp)
                if not x.startswith("config.json differs")]
    with open(os.path.join(m, "config.json")) as f:
        cfg = json.load(f)
    want_cfg = po.expected_config(m)
    parts = po._parts(po._method(cfg["quantization_config"]), 8, kw.get("group", 128))
    want_cfg["intermediate_size"] = po.padded_size(cfg["intermediate_size"], tp, parts)
    with open(os.path.join(out, "config.json")) as f:
        got_cfg = json.load(f)
    if got_cfg != want_cfg:
        problems.append(f"config.json: intermediate_size {got_cfg.get('intermediate_size')}, "
                        f"expected {want_cfg['intermediate_size']}")
    report(not problems, f"{label}: every rank file holds exactly the oracle's padded tensors "
           f"(intermediate_size {cfg['intermediate_size']} -> {want_cfg['intermediate_size']})",
           "\n".join(problems[:20]))
    rc, so, se = tps("check", out)
    report(rc == 0, f"{label}: check passes (the padding is the constants the manifest says)",
           f"rc {rc}\n{se}{so}")
    rc, so, se = tps("verify", out, "--source", m)
    report(rc == 0, f"{label}: verify --source passes", f"rc {rc}\n{se}{so[-1200:]}")
    merged = out + "-merged"
    rc, so, se = tps("merge", out, "-o", merged)
    src, got = sources(m), sources(merged) if rc == 0 else {}
    bad = [n for n in src if n not in po.dropped(m) and src[n] != got.get(n)]
    with open(os.path.join(merged, "config.json"), "rb") as f, open(os.path.join(m, "config.json"), "rb") as g:
        if f.read() != g.read():
            bad.append("config.json")
    report(rc == 0 and not bad, f"{label}: merge gives back the unpadded source and its config",
           f"rc {rc} {bad[:5]}\n{se[-300:]}")
    if method != "gptq":
        return
    ranks, _ = ranktest.read_rank_files(out, tp)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, cfg["hidden_size"]))
    worst = 0.0
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}.mlp."
        full = mlp_out(x, *(po.gptq_dequant(src[p + f"{mod}.qweight"], src[p + f"{mod}.scales"],
                                            group=kw["group"]) for mod in ("gate_proj", "up_proj", "down_proj")))
        y = np.zeros_like(full)
        for r in range(tp):
            gu = po.gptq_dequant(ranks[r][p + "gate_up_proj.qweight"], ranks[r][p + "gate_up_proj.scales"],
                                 group=kw["group"])
            h = gu.shape[0] // 2
            dn = po.gptq_dequant(ranks[r][p + "down_proj.qweight"], ranks[r][p + "down_proj.scales"],
                                 group=kw["group"])
            y += mlp_out(x, gu[:h], gu[h:], dn)
        worst = max(worst, float(np.max(np.abs(y - full)) / (np.max(np.abs(full)) or 1)))
    report(worst < 1e-9, f"{label}: the padded MLP's outputs, summed over the {tp} ranks, equal "
           f"the unpadded model's (max relative difference {worst:.1e})")


def big_gptq():
    """A GPTQ LLaMA of 40 MB (bench/gen_llama.c, BF16 scales) at tp 8: runs of
    1 KiB in fused qweights long enough for the writer's mapped path; the rank
    files are the oracle's, check and verify pass."""
    gen = os.path.join(os.environ.get("TOP", "."), "build", "gen_llama")
    if not os.path.exists(gen):
        report(False, "packed vllm gen_llama --gptq tp 8", f"{gen} is not built (make tests-bin)")
        return
    m = os.path.join(TMP, "m-big-gptq")
    subprocess.run([gen, m, "--size", "64M", "--gptq", "--intermediate", "6144", "--vocab",
                    "4096", "-q"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = os.path.join(TMP, "o-big-gptq")
    rc, so, se = tps("split", m, "--tp", 8, "-o", out, "-q", "--layout", "vllm")
    if rc:
        report(False, "packed vllm gen_llama --gptq tp 8: split", f"rc {rc}\n{se}")
        return
    want = po.expected_ranks(m, 8)
    problems = [x for x in ranktest.rank_file_problems(out, m, want, 8)
                if not x.startswith("config.json differs")]
    report(not problems, "packed vllm gen_llama --gptq (40 MB) tp 8: every rank file holds "
           "exactly the oracle's tensors (the mapped writes of strided pieces)", "\n".join(problems[:10]))
    rc, so, se = tps("check", out)
    report(rc == 0, "packed vllm gen_llama --gptq tp 8: check passes", f"rc {rc}\n{se}")


def bf16_pad():
    """--pad-intermediate on an unquantized LLaMA (intermediate 100, tp 8): the
    rank files equal those of a plain split of the same model zero-padded to
    104 by hand (gate/up rows, down_proj columns), byte for byte; check,
    verify --source and merge (the unpadded source back)."""
    rng = np.random.default_rng(9)
    H, I, V, layers = 64, 100, 256, 2

    def f16(*shape):
        return po._t(rng.standard_normal(shape).astype(np.float16), "F16")

    t = {"model.embed_tokens.weight": f16(V, H), "lm_head.weight": f16(V, H), "model.norm.weight": f16(H)}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = f16(H)
        t[p + "post_attention_layernorm.weight"] = f16(H)
        for n, sh in (("self_attn.q_proj", (64, H)), ("self_attn.k_proj", (64, H)),
                      ("self_attn.v_proj", (64, H)), ("self_attn.o_proj", (H, 64)),
                      ("mlp.gate_proj", (I, H)), ("mlp.up_proj", (I, H)), ("mlp.down_proj", (H, I))):
            t[p + n + ".weight"] = f16(*sh)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": I, "num_attention_heads": 8, "num_key_value_heads": 8,
           "head_dim": 8, "num_hidden_layers": layers, "vocab_size": V, "torch_dtype": "float16",
           "tie_word_embeddings": False, "rms_norm_eps": 1e-6}
    m, mp = os.path.join(TMP, "m-bf16-i100"), os.path.join(TMP, "m-bf16-i104")
    for d, tensors, c in ((m, t, cfg), (mp, None, dict(cfg, intermediate_size=104))):
        os.makedirs(d, exist_ok=True)
        if tensors is None:
            tensors = {}
            for n, (dt, sh, b) in t.items():
                a = np.frombuffer(b, np.float16).reshape(sh)
                if ".mlp.gate_proj" in n or ".mlp.up_proj" in n:
                    a = np.concatenate([a, np.zeros((104 - I, H), np.float16)])
                if ".mlp.down_proj" in n:
                    a = np.concatenate([a, np.zeros((H, 104 - I), np.float16)], axis=1)
                tensors[n] = po._t(a, dt)
        po._st_write(os.path.join(d, "model.safetensors"), tensors)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f)
    out, ref = os.path.join(TMP, "o-bf16-pad"), os.path.join(TMP, "o-bf16-padded-plain")
    rc0, _, se0 = tps("split", m, "--tp", 8, "-o", out + "-x", "-q", "--layout", "vllm")
    rc, _, se = tps("split", m, "--tp", 8, "-o", out, "-q", "--layout", "vllm", "--pad-intermediate")
    rc2, _, se2 = tps("split", mp, "--tp", 8, "-o", ref, "-q", "--layout", "vllm")
    if rc or rc2:
        report(False, "packed: --pad-intermediate of a BF16 LLaMA at tp 8", f"{se}{se2}")
        return
    a, pa = ranktest.read_rank_files(out, 8)
    b, pb = ranktest.read_rank_files(ref, 8)
    problems = pa + pb
    for r in range(8):
        problems += ranktest.compare(b.get(r, {}), a.get(r, {}), f"rank {r}")
    with open(os.path.join(out, "config.json")) as f:
        if json.load(f).get("intermediate_size") != 104:
            problems.append("config.json's intermediate_size is not 104")
    report(rc0 == 1 and not problems, "packed: --pad-intermediate of a BF16 LLaMA (intermediate "
           "100, refused plain at tp 8) writes the rank files of the model zero-padded to 104",
           "\n".join(problems[:10]) + se0[-200:])
    rc, so, se = tps("check", out)
    report(rc == 0, "packed: BF16 --pad-intermediate: check passes", se)
    rc, so, se = tps("verify", out, "--source", m)
    report(rc == 0, "packed: BF16 --pad-intermediate: verify --source passes", se + so[-800:])
    rc, so, se = tps("merge", out, "-o", out + "-merged")
    src, got = sources(m), sources(out + "-merged") if rc == 0 else {}
    report(rc == 0 and src == got, "packed: BF16 --pad-intermediate: merge gives back the "
           "unpadded source", se[-300:])


def fp8_pad(kind, I, Ip, tp):
    """--pad-intermediate on an FP8 LLaMA (kind: block 16 x 16, ct-channel,
    tensor): the rank files equal those of a plain split of the same model
    padded by hand, byte for byte: gate/up rows and down_proj columns of zero
    bytes, their block (or channel) scales 1.0 (per-tensor scales as they
    are); check, verify --source and merge (the unpadded source back)."""
    rng = np.random.default_rng(11)
    H, V, layers, b = 64, 256, 2, 16
    A = 64 if tp < 8 else 128  # attention rows: whole 16-blocks a rank

    def f16(*shape):
        return rng.standard_normal(shape).astype(np.float16)

    def e4m3(*shape):
        # random E4M3 codes, never NaN (0x7f, 0xff)
        return (rng.integers(0, 0x7e, shape, dtype=np.uint8) | (rng.integers(0, 2, shape, dtype=np.uint8) << 7))

    def scales(o, i):
        if kind == "block":
            return rng.uniform(0.001, 0.01, (-(-o // b), -(-i // b))).astype(np.float32)
        if kind == "ct-channel":
            return rng.uniform(0.001, 0.01, (o, 1)).astype(np.float16)
        return np.asarray(rng.uniform(0.001, 0.01), np.float32)

    sname = "weight_scale_inv" if kind == "block" else "weight_scale"
    sdt = {"block": "F32", "ct-channel": "F16", "tensor": "F32"}[kind]
    w = {"model.embed_tokens.weight": ("F16", f16(V, H)), "lm_head.weight": ("F16", f16(V, H)),
         "model.norm.weight": ("F16", f16(H))}
    for i in range(layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = ("F16", f16(H))
        w[p + "post_attention_layernorm.weight"] = ("F16", f16(H))
        for n, (o, k) in (("self_attn.q_proj", (A, H)), ("self_attn.k_proj", (A, H)),
                          ("self_attn.v_proj", (A, H)), ("self_attn.o_proj", (H, A)),
                          ("mlp.gate_proj", (I, H)), ("mlp.up_proj", (I, H)),
                          ("mlp.down_proj", (H, I))):
            w[p + n + ".weight"] = ("F8_E4M3", e4m3(o, k))
            w[p + n + "." + sname] = (sdt, scales(o, k))
    if kind == "block":
        qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [b, b]}
    elif kind == "tensor":
        qc = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    else:
        qc = {"quant_method": "compressed-tensors", "format": "float-quantized",
              "quantization_status": "compressed", "ignore": ["lm_head"],
              "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                  "num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel",
                  "dynamic": False}, "input_activations": {
                  "num_bits": 8, "type": "float", "symmetric": True, "strategy": "token",
                  "dynamic": True}}}}
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": I, "num_attention_heads": A // 8, "num_key_value_heads": A // 8,
           "head_dim": 8, "num_hidden_layers": layers, "vocab_size": V, "torch_dtype": "float16",
           "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "quantization_config": qc}

    def padded(n, a):
        if ".mlp.gate_proj." in n or ".mlp.up_proj." in n:
            if n.endswith(".weight"):
                return np.concatenate([a, np.zeros((Ip - I, H), a.dtype)])
            if kind == "block":
                return np.concatenate([a, np.ones((Ip // b - a.shape[0], a.shape[1]), a.dtype)])
            if kind == "ct-channel":
                return np.concatenate([a, np.ones((Ip - I, 1), a.dtype)])
        if ".mlp.down_proj." in n:
            if n.endswith(".weight"):
                return np.concatenate([a, np.zeros((H, Ip - I), a.dtype)], axis=1)
            if kind == "block":
                return np.concatenate([a, np.ones((a.shape[0], Ip // b - a.shape[1]), a.dtype)],
                                      axis=1)
        return a

    tag = f"fp8-{kind}-i{I}"
    m, mp = os.path.join(TMP, "m-" + tag), os.path.join(TMP, f"m-{tag}-padded")
    for d, pad, c in ((m, False, cfg), (mp, True, dict(cfg, intermediate_size=Ip))):
        os.makedirs(d, exist_ok=True)
        po._st_write(os.path.join(d, "model.safetensors"),
                     {n: po._t(padded(n, a) if pad else a, dt) for n, (dt, a) in w.items()})
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(c, f)
    label = f"packed: --pad-intermediate of an FP8 ({kind}) LLaMA, intermediate {I} at tp {tp}"
    out, ref = os.path.join(TMP, f"o-{tag}-pad"), os.path.join(TMP, f"o-{tag}-padded-plain")
    rc0, _, se0 = tps("split", m, "--tp", tp, "-o", out + "-x", "-q", "--layout", "vllm")
    rc, _, se = tps("split", m, "--tp", tp, "-o", out, "-q", "--layout", "vllm", "--pad-intermediate")
    rc2, _, se2 = tps("split", mp, "--tp", tp, "-o", ref, "-q", "--layout", "vllm")
    if rc or rc2:
        report(False, label, f"{se}{se2}")
        return
    a, pa = ranktest.read_rank_files(out, tp)
    bb, pb = ranktest.read_rank_files(ref, tp)
    problems = pa + pb
    for r in range(tp):
        problems += ranktest.compare(bb.get(r, {}), a.get(r, {}), f"rank {r}")
    with open(os.path.join(out, "config.json")) as f:
        if json.load(f).get("intermediate_size") != Ip:
            problems.append(f"config.json's intermediate_size is not {Ip}")
    refused_plain = rc0 == 1 if kind != "tensor" else rc0 in (0, 1)
    report(refused_plain and not problems, f"{label}: rank files equal a plain split of the model "
           f"padded to {Ip} by hand (zero weights, scales 1.0)",
           "\n".join(problems[:10]) + se0[-200:])
    rc, so, se = tps("check", out)
    report(rc == 0, f"{label}: check passes", se)
    rc, so, se = tps("verify", out, "--source", m)
    report(rc == 0, f"{label}: verify --source passes", se + so[-800:])
    rc, so, se = tps("merge", out, "-o", out + "-merged")
    src, got = sources(m), sources(out + "-merged") if rc == 0 else {}
    report(rc == 0 and src == got, f"{label}: merge gives back the unpadded source", se[-300:])
    if kind != "block":
        return
    # plan --json's working_tp: tp is among them with the option, not without
    wt = []
    for extra in ((), ("--pad-intermediate",)):
        rc, so, se = tps("plan", m, "--tp", tp, "--layout", "vllm", "--json", *extra)
        try:
            wt.append(json.loads(so).get("working_tp") or [])
        except ValueError:
            wt.append([])
    report(tp not in wt[0] and tp in wt[1] and set(wt[0]) <= set(wt[1]),
           f"{label}: plan --json lists tp {tp} among the tp values that work with "
           f"--pad-intermediate only", f"without {wt[0]}, with {wt[1]}")
    # the last rank's block scales are the padding's: one bit of them flipped
    for victim in ("model.layers.0.mlp.gate_up_proj.weight_scale_inv",
                   "model.layers.1.mlp.down_proj.weight_scale_inv"):
        tampered = out + "-t-" + victim.split(".")[-2]
        shutil.copytree(out, tampered)
        path = sorted(glob.glob(os.path.join(tampered, f"model-rank-{tp - 1}-part-*.safetensors")))[0]
        ranktest.flip_bit(path, victim)
        rc, so, se = tps("check", tampered)
        rc2, so2, se2 = tps("verify", tampered, "--source", m)
        report(rc == 1 and rc2 == 1 and os.path.basename(path) in se + so,
               f"{label}: check and verify fail with one flipped bit of the padding's scales "
               f"({victim}) on rank {tp - 1}", f"rc {rc} {rc2}\n{se}{so[-500:]}{se2}")


def moe_pad(quant, I, Ip, tp, block=(16, 16)):
    """--pad-intermediate on Qwen3-MoE experts, BF16 or FP8 (block, channel,
    tensor), whose moe_intermediate_size I does not split at tp: the rank
    files equal a plain split of the model padded to Ip by hand (expert
    gate/up rows and down columns zero, their block or channel scales 1.0),
    byte for byte; check, verify --source, merge (the unpadded source)."""
    import family_oracle as fo
    import moe_quant_oracle as mqo
    import serving_oracle as so
    import quant_oracle as qo
    tag = f"moe-{quant}-i{I}-tp{tp}"
    m = os.path.join(TMP, "m-" + tag)
    H, bn, bk = 64, block[0], block[1]
    if quant == "bf16":
        fo.qwen3_moe_checkpoint(m, hidden=H, heads=8, kv_heads=8, head_dim=8, experts=4,
                                moe_inter=I, vocab=128, layers=2)
    else:
        mqo.build(m, "qwen3_moe", quant, H=H, A=8, K=8, D=8, E=4, I=I, block=block)
    config, tensors = so.load_checkpoint(m)
    kind = quant.split("-", 1)[-1]

    def arr(dt, shape, data):
        return np.frombuffer(data, {"BF16": np.uint16, "F32": np.float32, "F8_E4M3": np.uint8}[dt]
                             ).reshape(shape)

    one = {"F32": np.float32(1.0).view(np.float32), "BF16": np.uint16(0x3F80)}
    padded = {}
    for n, (dt, shape, data) in tensors.items():
        a = arr(dt, shape, data)
        if ".mlp.experts." in n:
            rows = ".gate_proj." in n or ".up_proj." in n
            scale = not n.endswith(".weight")
            if not scale:
                z = np.zeros((Ip - I, H) if rows else (H, Ip - I), a.dtype)
                a = np.concatenate([a, z], axis=0 if rows else 1)
            elif kind == "block":
                if rows:
                    a = np.concatenate([a, np.full((Ip // bn - a.shape[0], a.shape[1]), one[dt], a.dtype)])
                else:
                    a = np.concatenate([a, np.full((a.shape[0], Ip // bk - a.shape[1]), one[dt], a.dtype)], axis=1)
            elif kind == "channel" and rows and a.ndim == 2:
                a = np.concatenate([a, np.full((Ip - I, 1), one[dt], a.dtype)])
        padded[n] = (dt, list(a.shape), a.tobytes())
    mp = m + "-padded"
    qo.write_model(mp, dict(config, moe_intermediate_size=Ip), padded)
    label = f"packed: --pad-intermediate of Qwen3-MoE experts ({quant}), moe_intermediate_size {I} at tp {tp}"
    out, ref = os.path.join(TMP, f"o-{tag}-pad"), os.path.join(TMP, f"o-{tag}-padded-plain")
    rc0, _, se0 = tps("split", m, "--tp", tp, "-o", out + "-x", "-q", "--layout", "vllm")
    rc, _, se = tps("split", m, "--tp", tp, "-o", out, "-q", "--layout", "vllm", "--pad-intermediate")
    rc2, _, se2 = tps("split", mp, "--tp", tp, "-o", ref, "-q", "--layout", "vllm")
    if rc or rc2:
        report(False, label, f"{se}{se2}")
        return
    a, pa = ranktest.read_rank_files(out, tp)
    bb, pb = ranktest.read_rank_files(ref, tp)
    problems = pa + pb
    for r in range(tp):
        problems += ranktest.compare(bb.get(r, {}), a.get(r, {}), f"rank {r}")
    with open(os.path.join(out, "config.json")) as f:
        if json.load(f).get("moe_intermediate_size") != Ip:
            problems.append(f"config.json's moe_intermediate_size is not {Ip}")
    report(rc0 == 1 and not problems, f"{label}: refused plain; rank files equal a plain split "
           f"of the model padded to {Ip} by hand", "\n".join(problems[:10]) + se0[-300:])
    rc, so_, se = tps("check", out)
    report(rc == 0, f"{label}: check passes", se)
    rc, so_, se = tps("verify", out, "--source", m)
    report(rc == 0, f"{label}: verify --source passes", se + so_[-800:])
    rc, so_, se = tps("merge", out, "-o", out + "-merged")
    src, got = sources(m), sources(out + "-merged") if rc == 0 else {}
    report(rc == 0 and src == got, f"{label}: merge gives back the unpadded source", se[-300:])


def working_tps():
    """plan --json's working_tp: every tp the oracle accepts, no other."""
    for name in ("gptq-g128", "gptq-i384", "ct-asym-hd4", "nvfp4-i224", "awq-ch", "ct-g128",
                 "gptq-g32-qwen2", "nvfp4"):
        m = model(name)
        with open(os.path.join(m, "config.json")) as f:
            heads = json.load(f)["num_attention_heads"]
        want = []
        for tp in range(1, 65):
            if heads % tp:
                continue
            try:
                po.expected_ranks(m, tp)
                want.append(tp)
            except po.Refused:
                pass
        rc, so, se = tps("plan", m, "--tp", 1, "--layout", "vllm", "--json")
        try:
            got = json.loads(so).get("working_tp")
        except ValueError:
            got = None
        report(got == want, f"packed: plan --json of {name} lists the tp values every rule "
               f"allows: {want}", f"got {got}\n{se}")


def layout_refusals():
    m = model("gptq-g128")
    for layout, word in (("dtensor", "no DTensor consumer loads packed weights"),
                         ("sglang", "gptq_marlin_repack")):
        out = os.path.join(TMP, "o-refuse-" + layout)
        rc, _, se = tps("split", m, "--tp", 2, "-o", out, "--layout", layout)
        problems = ranktest.refusal_problems(rc, se, out, word, f"layout {layout}")
        report(not problems, f"packed: --layout {layout} refuses GPTQ, saying why",
               "\n".join(problems) + "\n" + se)
    m = model("gptq-g32-qwen2")
    rc, so, se = tps("plan", m, "--tp", 2, "--layout", "vllm")
    report(rc == 0 and "pass    quantization served" in so and "4-bit codes packed" in so and
           "g_idx" in so, "packed: plan --layout vllm shows the method served and g_idx left out",
           f"rc {rc}\n{so[-1500:]}{se}")


def bad_inputs():
    for bad, word, method, kw in (
            ("qzeros-shape", "model.layers.1.self_attn.o_proj.qzeros", "gptq", {}),
            ("no-scales", "model.layers.0.mlp.up_proj.scales", "gptq", {}),
            ("zp-shape", "model.layers.1.self_attn.o_proj.weight_zero_point", "ct", {"sym": False})):
        m = po.build(os.path.join(TMP, "m-bad-" + bad), method, bad=bad, **kw)
        out = os.path.join(TMP, "o-bad-" + bad)
        rc, _, se = tps("split", m, "--tp", 2, "-o", out, "--layout", "vllm")
        problems = ranktest.refusal_problems(rc, se, out, word, bad)
        report(not problems, f"packed bad input ({bad}): exit 1 naming {word}, nothing written",
               "\n".join(problems) + "\n" + se)


def main():
    for name, tps_ in (("gptq-g128", (1, 2, 4)), ("gptq-ch", (2, 4)), ("gptq-8bit", (2,)),
                       ("gptq-g32-qwen2", (2, 4)), ("awq-g128", (1, 2, 4)),
                       ("awq-g64-mistral", (2,)), ("awq-ch", (1, 2)), ("gptq-hd4", (1, 2)),
                       ("gptq-i384", (1, 2)), ("gptq-asym", (2,)), ("gptq-descact", (2,)),
                       ("gptq-3bit", (2,)), ("gptq-bf16-scales", (2,)),
                       ("ct-g128", (1, 2, 4)), ("ct-asym-g32", (2, 4)), ("ct-ch", (2, 4)),
                       ("ct-8bit-qwen2", (2,)), ("ct-asym-hd4", (1, 2)),
                       ("nvfp4", (1, 2, 4)), ("nvfp4-mistral", (2, 4)), ("nvfp4-i224", (2, 4)),
                       ("ct-nvfp4", (2, 4))):
        for tp in tps_:
            run_case(name, tp, full=(name, tp) in {("gptq-g128", 4), ("gptq-ch", 2),
                                                   ("awq-g128", 2), ("gptq-g32-qwen2", 2),
                                                   ("ct-asym-g32", 4), ("ct-ch", 2), ("nvfp4", 2),
                                                   ("ct-nvfp4", 4)})
    for name, tps_ in (("moe-ct-g32", (1, 2, 4)), ("moe-ct-asym-ch", (2, 4)),
                       ("moe-gptq-g32", (2, 4)), ("moe-nvfp4", (2, 4)), ("moe-ct-i96", (1, 2)),
                       ("moe-awq-g32", (2, 4))):
        for tp in tps_:
            moe_case(name, tp, full=(name, tp) in {("moe-ct-g32", 2), ("moe-gptq-g32", 4),
                                                   ("moe-nvfp4", 2), ("moe-ct-asym-ch", 4),
                                                   ("moe-awq-g32", 4)})
    for name in ("moe-nvfp4-i224", "moe-gptq-i224", "moe-ct-asym-i224"):
        moe_pad_case(name, 4)
    moe_case("moe-ct-g32", 2, ep=True)
    moe_case("moe-ct-i96", 4, ep=True)
    m = os.path.join(TMP, "m-moe-nvfp4")
    out = os.path.join(TMP, "o-moe-nvfp4-ep")
    rc, _, se = tps("split", m, "--tp", 2, "--ep", "-o", out, "--layout", "vllm")
    problems = ranktest.refusal_problems(rc, se, out, "use_global_sf", "NVFP4 experts under --ep")
    report(not problems, "packed vllm moe-nvfp4 tp 2 --ep: refused (the input scales' expert "
           "count depends on the GPU backend)", "\n".join(problems) + "\n" + se)
    for name, tp in (("pad-gptq-i224", 2), ("pad-gptq-i224", 4), ("pad-gptq-qwen72b", 8),
                     ("pad-ct-i224", 2), ("pad-awq-i224", 4)):
        pad_case(name, tp)
    big_gptq()
    bf16_pad()
    fp8_pad("block", 96, 128, 4)
    fp8_pad("block", 160, 256, 8)
    fp8_pad("ct-channel", 100, 104, 8)
    fp8_pad("tensor", 100, 104, 8)
    moe_pad("bf16", 102, 104, 4)
    moe_pad("fp8-block", 96, 128, 4)
    moe_pad("fp8-tensor", 102, 104, 4)
    moe_pad("ct-channel", 102, 104, 4)
    moe_pad("ct-block", 96, 128, 4)
    working_tps()
    layout_refusals()
    bad_inputs()
    sys.exit(1 if ranktest.fails() else 0)


if __name__ == "__main__":
    main()
