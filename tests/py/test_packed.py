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
        rc, so, se = tps("verify", tampered, "--source", m)
        report(rc == 1, f"{label}: verify --source fails with it", f"rc {rc}\n{se}{so[-800:]}")


MOE = {
    "moe-ct-g32": ("ct", {}),
    "moe-ct-asym-ch": ("ct", {"sym": False, "group": -1}),
    "moe-gptq-g32": ("gptq", {}),
    "moe-nvfp4": ("nvfp4", {}),
    # experts of 96 rows, groups of 32: tp 2 gives down_proj 48 input features
    "moe-ct-i96": ("ct", {"I": 96, "E": 8}),
}


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
                       ("moe-gptq-g32", (2, 4)), ("moe-nvfp4", (2, 4)), ("moe-ct-i96", (1, 2))):
        for tp in tps_:
            moe_case(name, tp, full=(name, tp) in {("moe-ct-g32", 2), ("moe-gptq-g32", 4),
                                                   ("moe-nvfp4", 2), ("moe-ct-asym-ch", 4)})
    moe_case("moe-ct-g32", 2, ep=True)
    moe_case("moe-ct-i96", 4, ep=True)
    m = os.path.join(TMP, "m-moe-nvfp4")
    out = os.path.join(TMP, "o-moe-nvfp4-ep")
    rc, _, se = tps("split", m, "--tp", 2, "--ep", "-o", out, "--layout", "vllm")
    problems = ranktest.refusal_problems(rc, se, out, "use_global_sf", "NVFP4 experts under --ep")
    report(not problems, "packed vllm moe-nvfp4 tp 2 --ep: refused (the input scales' expert "
           "count depends on the GPU backend)", "\n".join(problems) + "\n" + se)
    layout_refusals()
    bad_inputs()
    sys.exit(1 if ranktest.fails() else 0)


if __name__ == "__main__":
    main()
