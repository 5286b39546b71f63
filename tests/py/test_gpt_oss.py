"""gpt-oss (GptOssForCausalLM), BF16 and MXFP4 experts, against gptoss_oracle.py,
which shares no code with tpshard:
  - the DTensor layout at tp 1, 2, 3, 4 (one file and an index of parts): every
    rank file holds exactly the oracle's tensors (transformers 5.24's plan:
    embed_tokens and lm_head by vocabulary rows, the rest whole);
  - `check` passes; `merge` gives the source back byte for byte (every tensor,
    and the file); `verify --source` passes, and `check` and `verify` fail
    once one byte of an MXFP4 expert on one rank is flipped;
  - MXFP4 blocks and scales that disagree with config.json, a missing scale,
    blocks of another dtype, quant_method mxfp4 on another family, a hidden
    size off the MXFP4 block: exit 1 naming the tensor or the field, nothing
    written;
  - the serving layouts refuse gpt-oss saying why, writing nothing, vLLM's
    head and intermediate divisibility rules first;
  - --moe-backend: every vLLM backend name with the round-up the oracle's
    table gives (plan's quantization line), an unknown name a usage error
    (exit 2), a note where the option is ignored.
Run with build/venv/bin/python; env TPSHARD, TOP, TPS_TMP.
"""
import glob
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gptoss_oracle as go  # noqa: E402
import ranktest  # noqa: E402
from ranktest import report  # noqa: E402
import safetensors  # noqa: E402

TPSHARD = os.environ.get("TPSHARD") or os.path.join(os.environ.get("TOP", "."), "tpshard")
TMP = os.path.join(os.environ.get("TPS_TMP") or "/tmp", "gpt-oss")
shutil.rmtree(TMP, ignore_errors=True)
os.makedirs(TMP)


def tps(*args):
    p = subprocess.run([TPSHARD, *map(str, args)], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def source_tensors(model):
    out = {}
    for f in ranktest.source_files(model):
        with open(os.path.join(model, f), "rb") as h:
            for n, i in safetensors.deserialize(h.read()):
                out[n] = (i["dtype"], list(i["shape"]), bytes(i["data"]))
    return out


def no_safetensors(d):
    return not glob.glob(os.path.join(d, "**", "*.safetensors"), recursive=True)


# ------------------------------------------------------------------ the DTensor layout

MODELS = {}
for quant in ("bf16", "mxfp4"):
    for parts in (0, 3):
        name = f"{quant}" + (f"-parts{parts}" if parts else "")
        MODELS[name] = go.checkpoint(os.path.join(TMP, name), quant, parts=parts,
                                     seed=len(MODELS))

for name, model in MODELS.items():
    src = source_tensors(model)
    for tp in (1, 2, 3, 4):
        out = os.path.join(TMP, f"{name}-tp{tp}")
        rc, so, se = tps("split", model, "--tp", tp, "-o", out, "-q")
        if rc:
            report(False, f"{name} tp {tp}: split", se)
            continue
        want = go.dtensor_ranks(src, tp)
        report(not ranktest.rank_file_problems(out, model, want, tp),
               f"{name} tp {tp}: rank files are transformers' plan (vocabulary split, "
               "attention, sinks, router, experts whole)",
               "\n".join(ranktest.rank_file_problems(out, model, want, tp)))
        rc, so, se = tps("check", out)
        report(rc == 0, f"{name} tp {tp}: check passes", se)
        m = out + "-merged"
        rc, so, se = tps("merge", out, "-o", m)
        got = source_tensors(m) if rc == 0 else {}
        diff = ranktest.compare(src, got, "merged")
        same_files = rc == 0 and all(
            open(os.path.join(m, f), "rb").read() == open(os.path.join(model, f), "rb").read()
            for f in ranktest.source_files(model))
        report(rc == 0 and not diff and same_files,
               f"{name} tp {tp}: merge gives the source back byte for byte",
               se + "\n".join(diff) + ("" if same_files else "\nthe merged files differ"))
        if tp in (2, 4):
            rc, so, se = tps("verify", out, "--source", model)
            report(rc == 0 and "verify: PASS" in so, f"{name} tp {tp}: verify --source passes",
                   so[-800:] + se)

# A flipped byte in rank 1's MXFP4 experts: check and verify fail, naming the tensor.
out = os.path.join(TMP, "mxfp4-tp2")
bad = out + "-flipped"
shutil.copytree(out, bad)
victim = "model.layers.1.mlp.experts.down_proj_blocks"
ranktest.flip_bit(glob.glob(os.path.join(bad, "model-rank-1-part-*.safetensors"))[0], victim)
rc, so, se = tps("check", bad)
report(rc == 1 and victim in so + se, "a flipped MXFP4 byte on rank 1: check fails naming it",
       so + se)
rc, so, se = tps("verify", bad, "--source", MODELS["mxfp4"])
report(rc == 1 and victim in so + se, "a flipped MXFP4 byte on rank 1: verify fails naming it",
       (so + se)[-1500:])

# ------------------------------------------------------------------ bad MXFP4 checkpoints


def variant(name, edit_config=None, edit_tensors=None):
    d = os.path.join(TMP, "bad-" + name)
    cfg = go.config_of("mxfp4")
    t = go.tensors_of(cfg, "mxfp4", seed=5)
    if edit_tensors:
        edit_tensors(t)
    if edit_config:
        edit_config(cfg)
    go.gen.write_checkpoint(d, t, 0)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d


def drop(name):
    return lambda t: t.pop(name)


def retype(name, dtype):
    def f(t):
        _, shape, data = t[name]
        t[name] = (dtype, shape, data)
    return f


BAD = [
    # (case, config edit, tensors edit, words the error must hold)
    ("intermediate_size disagrees with the blocks",
     lambda c: c.update(intermediate_size=96), None,
     ["mlp.experts.down_proj_blocks", "intermediate_size / 32"]),
    ("num_local_experts disagrees with the blocks",
     lambda c: c.update(num_local_experts=8), None, ["_blocks", "num_local_experts"]),
    ("a scales tensor missing", None, drop("model.layers.1.mlp.experts.down_proj_scales"),
     ["model.layers.1.mlp.experts.down_proj_blocks", "down_proj_scales"]),
    ("a blocks tensor missing", None, drop("model.layers.0.mlp.experts.gate_up_proj_blocks"),
     ["model.layers.0.mlp.experts.gate_up_proj_scales"]),
    ("blocks of another dtype", None,
     retype("model.layers.0.mlp.experts.down_proj_blocks", "I8"),
     ["model.layers.0.mlp.experts.down_proj_blocks", "U8"]),
    ("quant_method mxfp4 on another family",
     lambda c: c.update(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"]), None,
     ["mxfp4", "gpt_oss"]),
    ("hidden_size off the MXFP4 block", lambda c: c.update(hidden_size=48), None,
     ["hidden_size", "32"]),
    ("intermediate_size missing", lambda c: c.pop("intermediate_size"), None,
     ["intermediate_size"]),
]
for case, ec, et, words in BAD:
    model = variant(case.replace(" ", "-"), ec, et)
    out = os.path.join(TMP, "out-bad-" + case.replace(" ", "-"))
    rc, so, se = tps("split", model, "--tp", 2, "-o", out, "--family", "gpt_oss")
    missing = [w for w in words if w not in se]
    report(rc == 1 and not missing and (not os.path.exists(out) or no_safetensors(out)),
           f"bad MXFP4 checkpoint ({case}): exit 1 naming {', '.join(words)}, nothing written",
           f"rc {rc}; missing {missing}\n{se}")

# ------------------------------------------------------------------ the serving layouts

for quant in ("bf16", "mxfp4"):
    for layout, word in (("vllm", "vLLM 0.33"), ("sglang", "SGLang 0.5.23")):
        out = os.path.join(TMP, f"{quant}-{layout}")
        rc, so, se = tps("split", MODELS[quant], "--tp", 2, "--layout", layout, "-o", out)
        probs = ranktest.refusal_problems(rc, se, out, "gpt-oss", f"{word} gpt-oss refused")
        if word not in se:
            probs.append(f"the reason does not name {word}")
        report(not probs, f"{quant} --layout {layout}: refused saying why, nothing written",
               "\n".join(probs) + "\n" + se)

# vLLM's own divisibility rules come before the refusal, so the error names the field at fault.
odd = go.checkpoint(os.path.join(TMP, "heads6"), "mxfp4", heads=6, kv_heads=6, inter=64)
for tp, field, why in ((4, "num_attention_heads", "sinks"), (3, "intermediate_size", "MLPBlock")):
    out = os.path.join(TMP, f"heads6-vllm-tp{tp}")
    rc, so, se = tps("split", odd, "--tp", tp, "--layout", "vllm", "-o", out)
    probs = ranktest.refusal_problems(rc, se, out, field, f"{field} % tp (vLLM's {why})")
    if why not in se:
        probs.append(f"the reason does not say {why}")
    report(not probs, f"--layout vllm tp {tp}, {field} not divisible: refused naming it ({why})",
           "\n".join(probs) + "\n" + se)

# ------------------------------------------------------------------ --moe-backend

for b, (ha, ia) in sorted(go.ROUND_UP.items()):
    rc, so, se = tps("plan", MODELS["mxfp4"], "--tp", 2, "--moe-backend", b)
    line = next((x for x in so.splitlines() if "vLLM MoE backend" in x), "")
    hid = "hidden size as is" if ha == 1 else f"hidden size rounded up to a multiple of {ha}"
    ok = (rc == 0 and f" {b}" in line and hid in line and
          f"intermediate size rounded up to a multiple of {ia}" in line)
    report(ok, f"plan --moe-backend {b}: hidden x{ha}, intermediate x{ia} per rank",
           line or so[-600:] + se)
rc, so, se = tps("plan", MODELS["mxfp4"], "--tp", 2)
line = next((x for x in so.splitlines() if "vLLM MoE backend" in x), "")
report(rc == 0 and "triton (the default" in line and "Hopper" in line,
       "plan without --moe-backend: triton, said to be vLLM 0.33's Hopper choice", line or so)
for cmd in (["split", MODELS["mxfp4"], "--tp", 2, "-o", os.path.join(TMP, "mb-x")],
            ["plan", MODELS["mxfp4"], "--tp", 2]):
    rc, so, se = tps(*cmd, "--moe-backend", "tensorrt")
    report(rc == 2 and "tensorrt" in se and "triton" in se and "usage:" in se and
           not os.path.exists(os.path.join(TMP, "mb-x")),
           f"{cmd[0]} --moe-backend tensorrt: usage error (exit 2) listing the names",
           f"rc {rc}\n{se}")
out = os.path.join(TMP, "mb-bf16")
rc, so, se = tps("split", MODELS["bf16"], "--tp", 2, "--moe-backend", "marlin", "-o", out)
report(rc == 0 and "note:" in se and "ignored" in se and "MXFP4" in se,
       "--moe-backend on a BF16 checkpoint: ignored with a note, split as without it", se)
want = go.dtensor_ranks(source_tensors(MODELS["bf16"]), 2)
report(not ranktest.rank_file_problems(out, MODELS["bf16"], want, 2),
       "--moe-backend on a BF16 checkpoint: the rank files are the oracle's",
       "\n".join(ranktest.rank_file_problems(out, MODELS["bf16"], want, 2)))
rc, so, se = tps("split", MODELS["mxfp4"], "--tp", 2, "--moe-backend", "cpu", "-o",
                 os.path.join(TMP, "mb-mx"))
report(rc == 0 and "note:" in se and "dtensor" in se,
       "--moe-backend with the dtensor layout: ignored with a note", se)
rc, so, se = tps("inspect", MODELS["mxfp4"])
report(rc == 0 and "quantization: mxfp4: 4 MXFP4 expert projections" in so,
       "inspect: mxfp4, one line per blocks tensor counted (2 layers x 2)", so[-800:] + se)

sys.exit(1 if ranktest.fails() else 0)
