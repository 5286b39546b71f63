"""`tpshard split --layout vllm|sglang` of FP8 mixture-of-experts checkpoints
(Qwen3-MoE and Mixtral with FP8 experts and attention: block FP8, per-tensor
FP8 with static input scales, compressed-tensors block, channel and tensor)
against moe_quant_oracle.py, which shares no code with tpshard:
  - at tp 1, 2, 4, with and without --ep, every rank file holds exactly the
    oracle's tensors (names, dtypes, shapes, bytes);
  - `check` passes; `merge` gives back every tensor the rank files hold,
    byte for byte, and names the ones the layout leaves out (each expert's
    gate input scale, which the engine overwrites with the up one's);
  - `verify --source` passes, and fails once one byte of one expert's scale
    on one rank is flipped;
  - refusals (expert widths that are not whole blocks, vLLM's refined grids,
    SGLang's post-processed per-tensor and per-channel weights) exit 1, say
    why (with the tp values that work) and write no .safetensors.
Run with build/venv/bin/python; env TPSHARD, TOP, TPS_TMP.
"""
import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moe_quant_oracle as mo  # noqa: E402
import ranktest  # noqa: E402
from ranktest import report  # noqa: E402
import safetensors  # noqa: E402
from safetensors import safe_open  # noqa: E402

TPSHARD = os.environ.get("TPSHARD") or os.path.join(os.environ.get("TOP", "."), "tpshard")
TMP = os.environ.get("TPS_TMP") or "/tmp"
TMP = os.path.join(TMP, "moe-quant")
os.makedirs(TMP, exist_ok=True)


def tps(*args):
    p = subprocess.run([TPSHARD, *map(str, args)], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


# name -> (family, quant, build kwargs)
MODELS = {
    "q3-block": ("qwen3_moe", "fp8-block", {}),
    "q3-block-bf16s": ("qwen3_moe", "fp8-block", {"scale_dtype": "BF16"}),
    "mx-tensor-static": ("mixtral", "fp8-tensor", {"static": True, "H": 128}),
    "q3-tensor": ("qwen3_moe", "fp8-tensor", {}),
    "mx-ct-channel": ("mixtral", "ct-channel", {"scale_dtype": "BF16", "H": 128}),
    "q3-ct-tensor-static": ("qwen3_moe", "ct-tensor", {"static": True}),
    "mx-ct-block": ("mixtral", "ct-block", {"H": 128}),
    # experts 96 rows, blocks 32: tp 2 cuts 48 (vLLM refuses); E 8 for --ep
    "q3-block-i96": ("qwen3_moe", "fp8-block", {"I": 96, "E": 8}),
    # blocks 128 x 128, experts 384 rows, H 256: tp 4 holds 96 rows, which
    # vLLM holds on a refined 32 x 32 grid
    "q3-block-refine": ("qwen3_moe", "fp8-block",
                        {"H": 256, "I": 384, "D": 128, "block": (128, 128), "layers": 1}),
    # --ep: each expert whole, 96 rows: not whole 128-blocks even at MoE tp 1,
    # refined to 32 x 32 (g = gcd(128, 128, 96, 256))
    "q3-block-refine-ep": ("qwen3_moe", "fp8-block",
                           {"H": 256, "I": 96, "D": 128, "block": (128, 128), "layers": 1}),
    # experts of 320 rows (2.5 blocks): at tp 4 80 rows a rank, g = 16 < 32
    "q3-block-refine-partial": ("qwen3_moe", "fp8-block",
                                {"H": 256, "I": 320, "D": 128, "block": (128, 128), "layers": 1}),
}
_BUILT = {}


def model(name):
    if name not in _BUILT:
        fam, quant, kw = MODELS[name]
        _BUILT[name] = mo.build(os.path.join(TMP, "m-" + name), fam, quant, **kw)
    return _BUILT[name]


def source_tensors(m):
    out = {}
    for f in ranktest.source_files(m):
        with open(os.path.join(m, f), "rb") as h:
            for n, i in safetensors.deserialize(h.read()):
                out[n] = (i["dtype"], list(i["shape"]), bytes(i["data"]))
    return out


def run_case(name, layout, tp, ep=False, full=False):
    m = model(name)
    label = f"moe fp8 {layout} {name} tp {tp}{' --ep' if ep else ''}"
    out = os.path.join(TMP, f"o-{name}-{layout}-{tp}{'-ep' if ep else ''}")
    args = ["split", m, "--tp", tp, "-o", out, "-q", "--layout", layout] + (["--ep"] if ep else [])
    try:
        want = mo.expected_ranks(m, layout, tp, ep)
    except mo.Refused as e:
        rc, so_, se = tps(*args)
        problems = ranktest.refusal_problems(rc, se, out, e.words[0] if e.words else "", e.reason)
        for w in e.words[1:]:
            if w not in se:
                problems.append(f"the error does not say '{w}'")
        report(not problems, f"{label}: refused ({e.reason})", "\n".join(problems) + "\n" + se)
        return
    rc, so_, se = tps(*args)
    if rc != 0:
        report(False, f"{label}: split", f"rc {rc}\n{se}{so_}")
        return
    problems = ranktest.rank_file_problems(out, m, want, tp)
    n = sum(len(w) for w in want)
    report(not problems, f"{label}: every rank file holds exactly the oracle's {n} tensors",
           "\n".join(problems[:20]))
    if not full:
        return
    rc, so_, se = tps("check", out)
    report(rc == 0, f"{label}: check passes", f"rc {rc}\n{se}{so_}")
    rc, so_, se = tps("verify", out, "--source", m)
    report(rc == 0, f"{label}: verify --source passes", f"rc {rc}\n{se}{so_}")
    merged = out + "-merged"
    rc, so_, se = tps("merge", out, "-o", merged)
    if rc != 0:
        report(False, f"{label}: merge", f"rc {rc}\n{se}{so_}")
        return
    src, got = source_tensors(m), source_tensors(merged)
    drop = set(mo.dropped(m))
    bad = [f"{n} missing" for n in sorted(set(src) - set(got) - drop)]
    bad += [f"{n} should be left out" for n in sorted(drop & set(got))]
    bad += [f"{n} differs" for n in sorted(set(src) & set(got)) if src[n] != got[n]]
    bad += [f"{n} is not in the source" for n in sorted(set(got) - set(src))]
    if drop:
        named = [n for n in drop if n not in se + so_]
        if named:
            bad.append(f"merge does not name {len(named)} left-out tensor(s), e.g. {named[0]}")
    report(not bad, f"{label}: merge gives back every tensor the rank files hold"
           + (f" and names the {len(drop)} left out" if drop else ""), "\n".join(bad[:10]))
    # one byte of one expert scale on the last rank
    path = sorted(glob.glob(os.path.join(out, f"model-rank-{tp - 1}-part-*.safetensors")))[-1]
    with safe_open(path, framework="numpy") as h:
        keys = [k for k in h.keys() if "w2_weight_scale" in k or "w13_weight_scale" in k]
    for victim in (sorted(k for k in keys if "w13_" in k)[:1] + sorted(k for k in keys if "w2_" in k)[:1]):
        tamper_case(label, out, m, tp, path, victim)


def tamper_case(label, out, m, tp, path, victim):
    tampered = out + "-tampered-" + victim.rsplit(".", 1)[1]
    subprocess.run(["cp", "-r", out, tampered], check=True)
    ranktest.flip_bit(os.path.join(tampered, os.path.basename(path)), victim)
    rc, so_, se = tps("verify", tampered, "--source", m, "--json")
    try:
        failed = [c.get("check") or "" for c in json.loads(so_).get("checks", []) if not c.get("ok")]
    except ValueError:
        failed = []
    layer = victim.split(".experts.")[0] + ".experts."
    named = [c for c in failed if c.startswith(layer)] or ([victim] if victim in se else [])
    report(rc == 1 and bool(named), f"{label}: verify --source fails with one flipped byte of "
           f"{victim} on rank {tp - 1}, naming {named[0] if named else 'an expert'}",
           f"rc {rc}; failed {failed[:5]}\n{se}")
    rc, so_, se = tps("check", tampered)
    report(rc == 1 and os.path.basename(path) in se + so_, f"{label}: check fails with it, "
           f"naming the rank file", f"rc {rc}\n{se}{so_}")


def deepseek():
    """Block-FP8 DeepSeek-V3 (the engines' own BF16 rank files of the
    conformance case, mapped to FP8, with the scales beside): vLLM and
    SGLang at tp 2; check, verify, merge; a flipped byte of a kv_b_proj
    scale fails verify."""
    top = os.environ.get("TOP", ".")
    for layout in ("vllm", "sglang"):
        case = os.path.join(top, "testdata", "conformance", f"{layout}-deepseekv3-bf16-tp2")
        m = os.path.join(TMP, "m-deepseek-fp8")
        if not os.path.exists(m):
            mo.deepseek_fp8(os.path.join(case, "model"), m)
        bf16 = []
        for r in range(2):
            with open(os.path.join(case, "expected", f"rank-{r}.safetensors"), "rb") as f:
                bf16.append({n: (i["dtype"], list(i["shape"]), bytes(i["data"]))
                             for n, i in safetensors.deserialize(f.read())})
        want = mo.deepseek_expected(bf16, m, layout, 2)
        label = f"moe fp8 {layout} deepseek-v3 block FP8 tp 2"
        out = os.path.join(TMP, f"o-deepseek-{layout}")
        rc, so_, se = tps("split", m, "--tp", 2, "--layout", layout, "-o", out, "-q")
        if rc != 0:
            report(False, f"{label}: split", f"rc {rc}\n{se}")
            continue
        problems = ranktest.rank_file_problems(out, m, want, 2)
        report(not problems, f"{label}: every rank file holds exactly the engine's "
               f"{sum(len(w) for w in want)} tensors (FP8 of its BF16 files, scales beside)",
               "\n".join(problems[:20]))
        rc, so_, se = tps("check", out)
        report(rc == 0, f"{label}: check passes", se)
        rc, so_, se = tps("verify", out, "--source", m)
        report(rc == 0, f"{label}: verify --source passes", se + so_[-1500:])
        merged = out + "-merged"
        rc, so_, se = tps("merge", out, "-o", merged)
        src, got = source_tensors(m), source_tensors(merged) if rc == 0 else {}
        mtp = {n for n in src if n.startswith("model.layers.2.")}
        bad = [n for n in src if n not in mtp and src[n] != got.get(n)]
        bad += [n for n in got if n in mtp]
        report(rc == 0 and not bad and "model.layers.2.eh_proj.weight" in se,
               f"{label}: merge gives back every tensor but the {len(mtp)} of the MTP layer, "
               f"which it names", f"rc {rc}; {bad[:5]}\n{se[:300]}")
        victim = ("model.layers.1.self_attn.kv_b_proj.weight_scale_inv")
        tampered = out + "-tampered"
        subprocess.run(["cp", "-r", out, tampered], check=True)
        path = os.path.join(tampered, "model-rank-1-part-0.safetensors")
        ranktest.flip_bit(path, victim)
        rc, so_, se = tps("verify", tampered, "--source", m, "--json")
        try:
            failed = [c.get("check") or "" for c in json.loads(so_).get("checks", [])
                      if not c.get("ok")]
        except ValueError:
            failed = []
        named = [c for c in failed if "kv_b_proj" in c] or ([victim] if victim in se else [])
        report(rc == 1 and bool(named), f"{label}: verify fails with one flipped byte of rank 1's "
               f"{victim}", f"rc {rc}; {failed[:5]}\n{se}")


def deepseek_fused_shared():
    """DeepSeek-V3 with 256 routed experts and 1 shared: SGLang loads the
    shared expert as expert 256 (deepseek_v2.py shared-experts fusion), but
    not under --ep; vLLM keeps it apart."""
    top = os.environ.get("TOP", ".")
    src = os.path.join(top, "testdata", "conformance", "sglang-deepseekv3-bf16-tp2", "model")
    m = os.path.join(TMP, "m-deepseek-256")
    if not os.path.exists(m):
        mo.deepseek_many_experts(src, m)
    mfp8 = m + "-fp8"
    if not os.path.exists(mfp8):
        mo.deepseek_fp8(m, mfp8)
    label = "moe sglang deepseek-v3 256 routed + 1 shared tp 2"
    out = os.path.join(TMP, "o-ds256-sglang")
    rc, so_, se = tps("split", m, "--tp", 2, "--layout", "sglang", "-o", out, "-q")
    if rc != 0:
        report(False, f"{label}: split", se)
        return
    ranks, problems = ranktest.read_rank_files(out, 2)
    for r in range(2):
        want = mo.sglang_fused_shared(m, 2, r)
        for n, t in want.items():
            got = ranks.get(r, {}).get(n)
            if got != t:
                problems.append(f"rank {r}: {n}: {got[0] if got else None}"
                                f"{got[1] if got else ''}, expected {t[0]}{t[1]}")
        problems += [f"rank {r}: {n} should not be there (fused into the experts)"
                     for n in ranks.get(r, {}) if ".mlp.shared_experts." in n]
    report(not problems, f"{label}: the shared expert is expert 256 of w13_weight and w2_weight "
           f"on every rank, and no mlp.shared_experts is written", "\n".join(problems[:10]))
    rc, so_, se = tps("verify", out, "--source", m)
    report(rc == 0, f"{label}: verify --source passes", se + so_[-1000:])
    rc, so_, se = tps("merge", out, "-o", out + "-merged")
    src_t, got = source_tensors(m), source_tensors(out + "-merged") if rc == 0 else {}
    bad = [n for n in src_t if not n.startswith("model.layers.2.") and src_t[n] != got.get(n)]
    report(rc == 0 and not bad, f"{label}: merge gives back the shared expert and every other "
           f"tensor", f"rc {rc} {bad[:5]}\n{se[:300]}")
    out = os.path.join(TMP, "o-ds256-sglang-ep")
    rc, so_, se = tps("split", m, "--tp", 2, "--layout", "sglang", "--ep", "-o", out, "-q")
    ranks, problems = ranktest.read_rank_files(out, 2) if rc == 0 else ({}, [se])
    r0 = ranks.get(0, {})
    w13 = r0.get("model.layers.1.mlp.experts.w13_weight")
    ok = (rc == 0 and w13 is not None and w13[1][0] == 128
          and "model.layers.1.mlp.shared_experts.gate_up_proj.weight" in r0)
    report(ok, f"{label} --ep: no fusion (128 whole experts a rank, mlp.shared_experts kept)",
           f"rc {rc} {w13[1] if w13 else None}\n{problems[:3]}")
    out = os.path.join(TMP, "o-ds256-vllm")
    rc, so_, se = tps("split", m, "--tp", 2, "--layout", "vllm", "-o", out, "-q")
    ranks, problems = ranktest.read_rank_files(out, 2) if rc == 0 else ({}, [se])
    r0 = ranks.get(0, {})
    w13 = r0.get("model.layers.1.mlp.experts.routed_experts.w13_weight")
    ok = (rc == 0 and w13 is not None and w13[1][0] == 256 and
          "model.layers.1.mlp.experts._shared_experts._layer.gate_up_proj.weight" in r0)
    report(ok, "moe vllm deepseek-v3 256 + 1 shared tp 2: vLLM keeps the shared expert apart",
           f"rc {rc} {w13[1] if w13 else None}\n{problems[:3]}")
    # block FP8: the shared expert's scales are expert 256's
    out = os.path.join(TMP, "o-ds256-fp8-sglang")
    rc, so_, se = tps("split", mfp8, "--tp", 2, "--layout", "sglang", "-o", out, "-q")
    ranks, problems = ranktest.read_rank_files(out, 2) if rc == 0 else ({}, [se])
    cfg, src_t = mo.so.load_checkpoint(mfp8)
    bad = list(problems)
    for r in range(2):
        got = ranks.get(r, {}).get("model.layers.1.mlp.experts.w13_weight_scale_inv")
        if got is None:
            bad.append(f"rank {r}: no w13_weight_scale_inv")
            continue
        sh = src_t["model.layers.1.mlp.shared_experts.gate_proj.weight_scale_inv"]
        rows = sh[1][0] // 2
        want = mo._f32(mo.so._rows(sh, r * rows, rows))[2] + mo._f32(mo.so._rows(
            src_t["model.layers.1.mlp.shared_experts.up_proj.weight_scale_inv"], r * rows, rows))[2]
        per = len(got[2]) // got[1][0]
        if got[1][0] != 257 or got[2][256 * per:] != want:
            bad.append(f"rank {r}: expert 256's scales are not the shared expert's "
                       f"({got[1]})")
    report(rc == 0 and not bad, "moe sglang deepseek-v3 256 + 1 shared block FP8 tp 2: expert "
           "256's block scales are the shared expert's", "\n".join(bad[:5]))
    rc, so_, se = tps("verify", out, "--source", mfp8)
    report(rc == 0, "moe sglang deepseek-v3 256 + 1 shared block FP8 tp 2: verify --source "
           "passes", se + so_[-800:])


def to_bf16(t):
    """An F32 tensor's values truncated to BF16 (the top half of each)."""
    dt, shape, data = t
    return ("BF16", shape, b"".join(data[4 * i + 2:4 * i + 4] for i in range(len(data) // 4)))


def bad_inputs():
    """FP8 experts that do not fit: exit 1 naming the tensor, nothing written."""
    m = model("q3-block")
    config, tensors = mo.so.load_checkpoint(m)
    e0 = "model.layers.1.mlp.experts.2.up_proj"
    cases = [
        ("an expert without its scale", lambda t: t.pop(e0 + ".weight_scale_inv"), e0 + ".weight"),
        ("an expert scale not of its weight's block grid",
         lambda t: t.__setitem__(e0 + ".weight_scale_inv",
                                 ("F32", [1, 1], t[e0 + ".weight_scale_inv"][2][:4])),
         e0 + ".weight_scale_inv"),
        ("an expert past num_experts", lambda t: [
            t.__setitem__(n.replace(".experts.3.", ".experts.9."), t[n])
            for n in list(t) if ".layers.0.mlp.experts.3." in n], "experts.9"),
        ("an expert scale of another dtype than the others",
         lambda t: t.__setitem__(e0 + ".weight_scale_inv", to_bf16(t[e0 + ".weight_scale_inv"])),
         "quantized like"),
    ]
    for k, (what, edit, name) in enumerate(cases):
        t = dict(tensors)
        edit(t)
        bad = os.path.join(TMP, f"bad-{k}")
        mo.qo.write_model(bad, config, t)
        for layout in ("vllm", "sglang"):
            out = os.path.join(TMP, f"bad-{k}-{layout}")
            rc, so_, se = tps("split", bad, "--tp", 2, "--layout", layout, "-o", out, "-q")
            problems = ranktest.refusal_problems(rc, se, out, name, what)
            report(not problems, f"moe fp8 {layout} bad input: {what}: exit 1, names {name}, "
                   f"writes nothing", "\n".join(problems) + "\n" + se)


def main():
    rc, so_, se = tps("--version")
    if rc != 0:
        report(False, "tpshard runs", se)
        return 1
    for layout in ("vllm", "sglang"):
        for tp in (1, 2):
            run_case("q3-block", layout, tp, full=(tp == 2))
        run_case("q3-block", layout, 2, ep=True, full=True)
        run_case("q3-block", layout, 4, ep=True)
        run_case("q3-block-bf16s", layout, 2)
        run_case("mx-ct-block", layout, 2, full=(layout == "vllm"))
        for name in ("mx-tensor-static", "q3-tensor", "mx-ct-channel", "q3-ct-tensor-static"):
            for tp in (1, 2, 4):
                run_case(name, layout, tp, full=(tp == 2 and layout == "vllm"))
        run_case("mx-tensor-static", layout, 4, ep=True, full=(layout == "vllm"))
        run_case("q3-block-i96", layout, 2)
        run_case("q3-block-i96", layout, 1)
        run_case("q3-block-i96", layout, 4, ep=True)
        run_case("q3-block-refine", layout, 2, full=(layout == "vllm"))
        run_case("q3-block-refine", layout, 4, full=(layout == "vllm"))
        run_case("q3-block-refine-ep", layout, 2, ep=True, full=(layout == "vllm"))
        run_case("q3-block-refine-partial", layout, 4)
    deepseek()
    deepseek_fused_shared()
    bad_inputs()
    return 1 if ranktest.fails() else 0


if __name__ == "__main__":
    sys.exit(main())
