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
  - the vLLM layout of MXFP4 checkpoints at tp 1, 2, 4 (default triton and
    cpu; emulation, triton_unfused; marlin and flashinfer_cutlass where the
    hidden size is already their multiple; an index of parts): every rank file
    exactly gptoss_oracle.vllm_ranks (uneven cdiv(I/32, tp)*32 cuts, zero
    tails, w2_bias on rank 0), the manifest naming the backend; check, merge
    byte for byte, verify --source; flipped bytes (real, scale, zero tail)
    caught by check and verify; a manifest naming another backend fails
    verify; --ranks runs of two backends do not join; the layout file given as
    a file writes the same, and its new stack fields are checked;
  - the vLLM layout of BF16 checkpoints at tp 1, 2, 4 (and an index of parts, and
    experts of 8 MiB, whose transposed matrices split tasks and reads cut): each
    expert's rank slice transposed as vllm_ranks says; check, merge, verify;
    flipped bytes caught; a manifest without its transpose marks fails check;
  - refusals, exit 1 and nothing written: backends that pad the hidden size
    (naming those that keep it), BF16 experts under --ep, biases
    of the wrong shape or dtype or missing, a stray tensor under the experts,
    --ep, vLLM's head, KV head and intermediate divisibility rules; SGLang
    refuses gpt-oss saying why;
  - --moe-backend: every vLLM backend name with the round-up the oracle's
    table gives (plan's quantization line), an unknown name a usage error
    (exit 2), a note where the option is ignored.
Run with build/venv/bin/python; env TPSHARD, TOP, TPS_TMP.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gptoss_oracle as go  # noqa: E402
import jsonlog  # noqa: E402
import ranktest  # noqa: E402
from ranktest import report  # noqa: E402
import safetensors  # noqa: E402

TPSHARD = os.environ.get("TPSHARD") or os.path.join(os.environ.get("TOP", "."), "tpshard")
TMP = os.path.join(os.environ.get("TPS_TMP") or "/tmp", "gpt-oss")
shutil.rmtree(TMP, ignore_errors=True)
os.makedirs(TMP)


def tps(*args):
    p = subprocess.run([TPSHARD, *map(str, args)], capture_output=True, text=True, timeout=300)
    jsonlog.save(args, p)
    return p.returncode, p.stdout, p.stderr


def source_tensors(model):
    out = {}
    for f in ranktest.source_files(model):
        with open(os.path.join(model, f), "rb") as h:
            for n, i in safetensors.deserialize(h.read()):
                out[n] = (i["dtype"], list(i["shape"]), bytes(i["data"]))
    return out


def merged(out, model, src):
    """merge of split output `out`: its exit status, stderr, the tensors that differ from
    `src` (model's tensors) and whether every source file came back byte for byte."""
    m = out + "-merged"
    rc, so, se = tps("merge", out, "-o", m)
    got = source_tensors(m) if rc == 0 else {}
    diff = ranktest.compare(src, got, "merged")
    same_files = rc == 0 and all(
        open(os.path.join(m, f), "rb").read() == open(os.path.join(model, f), "rb").read()
        for f in ranktest.source_files(model))
    return rc, se, diff, same_files


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
        rc, se, diff, same_files = merged(out, model, src)
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

# ------------------------------------------------------------------ the vLLM layout

# vLLM holds num_key_value_heads / tp KV heads a rank: 4 KV heads for tp 4. intermediate_size
# 160 is 5 MX blocks: the cdiv(5, tp) * 32 cut is uneven (tp 2: 96 + 64 rows; tp 4: 64, 64,
# 32 and none), and every backend's round-up leaves zero tails.
VMODELS = {
    "mxfp4-v": go.checkpoint(os.path.join(TMP, "mxfp4-v"), "mxfp4", heads=8, kv_heads=4,
                             inter=160, seed=11),
    "mxfp4-v-parts3": go.checkpoint(os.path.join(TMP, "mxfp4-v-parts3"), "mxfp4", heads=8,
                                    kv_heads=4, inter=160, seed=12, parts=3),
    # hidden 256: Marlin's and TRT-LLM's x256, CUTLASS's x128 leave it as is
    "mxfp4-h256": go.checkpoint(os.path.join(TMP, "mxfp4-h256"), "mxfp4", hidden=256, heads=8,
                                kv_heads=4, inter=96, seed=13),
    # BF16 experts, which vLLM holds transposed per expert
    "bf16-v": go.checkpoint(os.path.join(TMP, "bf16-v"), "bf16", heads=8, kv_heads=4,
                            inter=160, seed=14),
    "bf16-v-parts3": go.checkpoint(os.path.join(TMP, "bf16-v-parts3"), "bf16", heads=8,
                                   kv_heads=4, inter=160, seed=15, parts=3),
    # an expert's gate_up_proj of 512 x 8192 BF16 (8 MiB): at tp 1 a split task moves part
    # of one transposed matrix (4 MiB), and check's and merge's reads take parts of one too
    "bf16-big": go.checkpoint(os.path.join(TMP, "bf16-big"), "bf16", hidden=512, heads=8,
                              kv_heads=4, inter=4096, experts=2, layers=1, vocab=64, seed=16),
}
VCASES = [("mxfp4-v", b, tp) for b in ("triton", "cpu") for tp in (1, 2, 4)]
VCASES += [("mxfp4-v-parts3", "triton", 2), ("mxfp4-v", "emulation", 2),
           ("mxfp4-v", "triton_unfused", 4), ("mxfp4-h256", "marlin", 2),
           ("mxfp4-h256", "flashinfer_cutlass", 4)]
VCASES += [("bf16-v", "triton", tp) for tp in (1, 2, 4)]
VCASES += [("bf16-v-parts3", "triton", 2), ("bf16-big", "triton", 1), ("bf16-big", "triton", 4)]


def vsplit(name, backend, tp, *extra):
    out = os.path.join(TMP, f"v-{name}-{backend}-tp{tp}")
    args = ["split", VMODELS[name], "--tp", tp, "--layout", "vllm", "-o", out, "-q"]
    if backend != "triton":  # triton: the default, given by leaving the option out
        args += ["--moe-backend", backend]
    return out, tps(*args, *extra)


for name, backend, tp in VCASES:
    model = VMODELS[name]
    src = source_tensors(model)
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    label = f"{name} --layout vllm --moe-backend {backend} tp {tp}"
    out, (rc, so, se) = vsplit(name, backend, tp)
    if rc:
        report(False, f"{label}: split", se)
        continue
    want = go.vllm_ranks(cfg, src, tp, backend)
    probs = ranktest.rank_file_problems(out, model, want, tp, engine=True)
    report(not probs, f"{label}: every rank file is vLLM 0.33's state (gptoss_oracle.vllm_ranks)",
           "\n".join(probs))
    mx = "mxfp4" in name
    with open(os.path.join(out, "tpshard.json")) as f:
        mb = json.load(f)["layout"].get("moe_backend")
    report(mb == (backend if mx else None),
           f"{label}: the manifest records the MoE backend" if mx else
           f"{label}: the manifest records no MoE backend (BF16 experts)", f"moe_backend {mb}")
    rc, so, se = tps("check", out)
    report(rc == 0, f"{label}: check passes", se)
    rc, se, diff, same_files = merged(out, model, src)
    report(rc == 0 and not diff and same_files,
           f"{label}: merge gives the source back byte for byte (zero tails and the rank-0 "
           "w2_bias are layout, not data)",
           se + "\n".join(diff) + ("" if same_files else "\nthe merged files differ"))
    if tp > 1:
        rc, so, se = tps("verify", out, "--source", model)
        report(rc == 0 and "verify: PASS" in so, f"{label}: verify --source passes",
               so[-800:] + se)
        if mx:
            report(re.search(r"^dequant +4 passed, 0 failed", so, re.M) is not None,
                   f"{label}: verify dequantizes every layer's gate_up and down experts on both "
                   "sides", so[-800:])

# Pipeline stages (--pp 2 at tp 2): GptOssModel builds its embedding and norm, and
# GptOssForCausalLM its head, on every stage; each stage holds its layer (vLLM's partition of
# two layers: one each), as vllm_ranks says for it.
out = os.path.join(TMP, "v-pp2")
rc, so, se = tps("split", VMODELS["mxfp4-v"], "--tp", 2, "--pp", 2, "--layout", "vllm", "-o", out,
                 "-q")
with open(os.path.join(VMODELS["mxfp4-v"], "config.json")) as f:
    want = go.vllm_ranks(json.load(f), source_tensors(VMODELS["mxfp4-v"]), 2)
probs = [] if rc == 0 else ["split: " + se]
for st in range(2 if rc == 0 else 0):
    for r in range(2):
        got = {}
        for path in glob.glob(os.path.join(out, f"model-pp-{st}-tp-{r}-part-*.safetensors")):
            with open(path, "rb") as f:
                for n, i in safetensors.deserialize(f.read()):
                    got[n] = (i["dtype"], list(i["shape"]), bytes(i["data"]))
        mine = {k: v for k, v in want[r].items()
                if not k.startswith("model.layers.") or k.split(".")[2] == str(st)}
        probs += ranktest.compare(mine, got, f"stage {st} rank {r}")
report(not probs, "--layout vllm --tp 2 --pp 2: every stage holds its layer and the embedding, "
       "norm and head (vllm_ranks per stage)", "\n".join(probs))
# verify with stages: each stage's ranks hold their layer's experts and o_proj (its bias on the
# stage's tp rank 0, worker 2 for stage 1), MXFP4 and BF16 alike
for name in ("mxfp4-v", "bf16-v"):
    o = os.path.join(TMP, f"v-pp2-verify-{name}")
    rc, so, se = tps("split", VMODELS[name], "--tp", 2, "--pp", 2, "--layout", "vllm", "-o", o,
                     "-q")
    if rc == 0:
        rc, so, se = tps("verify", o, "--source", VMODELS[name])
    report(rc == 0 and "verify: PASS" in so and
           (name != "mxfp4-v" or re.search(r"^dequant +4 passed, 0 failed", so, re.M)),
           f"{name} --layout vllm --tp 2 --pp 2: verify --source passes (the experts and the "
           "row-parallel biases of stage 1 on workers 2 and 3)", so[-1200:] + se)

# Flipped bytes in the cpu backend's tp 4 output: a real byte of an expert (rank 1's
# w13_weight), a scale, and a byte of a zero tail (rank 2's w13_weight ends in one) and of
# rank 1's zero w2_bias: check and verify fail, naming the tensor.
out = os.path.join(TMP, "v-mxfp4-v-cpu-tp4")
X = "model.layers.1.mlp.experts."
FLIPS = [(1, X + "routed_experts.w13_weight", X + "gate_up_proj_blocks", "mid", "gate_up"),
         (1, X + "routed_experts.w2_weight_scale", X + "down_proj_scales", "first", "down"),
         (2, X + "routed_experts.w13_weight", "zero padding", "last", "gate_up"),
         (1, X + "routed_experts.w2_bias", "zero padding", "mid", "down")]
def flipped_copy(out, k, r, victim, where):
    """A copy of split output `out` with one byte of rank r's tensor `victim` flipped
    (its first, middle or last byte)."""
    bad = f"{out}-flip{k}"
    shutil.rmtree(bad, ignore_errors=True)
    shutil.copytree(out, bad)
    path = glob.glob(os.path.join(bad, f"model-rank-{r}-part-*.safetensors"))[0]
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    n = int.from_bytes(raw[:8], "little")
    b, e = json.loads(raw[8:8 + n])[victim]["data_offsets"]
    raw[8 + n + {"mid": (b + e) // 2, "first": b, "last": e - 1}[where]] ^= 0x10
    with open(path, "wb") as f:
        f.write(raw)
    return bad


for k, (r, victim, named, where, proj) in enumerate(FLIPS):
    bad = flipped_copy(out, k, r, victim, where)
    rc, so, se = tps("check", bad)
    report(rc == 1 and victim in so + se and named in so + se,
           f"vllm tp 4: a flipped byte in rank {r}'s {victim.split('.')[-1]} ({where}): check "
           f"fails naming {named}", so + se)
    rc, so, se = tps("verify", bad, "--source", VMODELS["mxfp4-v"], "-v")
    deq = re.search(rf"^{re.escape(X + proj)}_proj_blocks +dequant .* FAIL$", so + se, re.M)
    report(rc == 1 and "verify: FAIL" in so and deq is not None,
           f"vllm tp 4: the same flipped byte: verify fails, its {proj} experts' products too",
           (so + se)[-1500:])

# The MoE backend decides the experts' shapes: a manifest whose moe_backend says another one
# (cpu's x32 round-up is 96 at tp 2, triton's x64 128) no longer verifies.
out = os.path.join(TMP, "v-mxfp4-v-cpu-tp2")
bad = out + "-other-backend"
shutil.rmtree(bad, ignore_errors=True)
shutil.copytree(out, bad)
with open(os.path.join(bad, "tpshard.json")) as f:
    man = json.load(f)
man["layout"]["moe_backend"] = "triton"
with open(os.path.join(bad, "tpshard.json"), "w") as f:
    json.dump(man, f)
rc, so, se = tps("verify", bad, "--source", VMODELS["mxfp4-v"])
report(rc == 1 and "verify: FAIL" in so and "routed_experts.w13_weight" in so,
       "vllm: a manifest naming another MoE backend than the split's: verify fails naming the "
       "experts", (so + se)[-1500:])
man["layout"]["moe_backend"] = "tensorrt"
with open(os.path.join(bad, "tpshard.json"), "w") as f:
    json.dump(man, f)
rc, so, se = tps("check", bad)
report(rc == 1 and "moe_backend" in se, "vllm: a manifest naming an unknown MoE backend: check "
       "fails naming layout.moe_backend", se)

# A --ranks run joins a split of the same MoE backend only.
out = os.path.join(TMP, "v-ranks")
rc1, _, se1 = tps("split", VMODELS["mxfp4-v"], "--tp", 2, "--layout", "vllm", "--moe-backend",
                  "cpu", "--ranks", "0", "-o", out, "-q")
rc2, _, se2 = tps("split", VMODELS["mxfp4-v"], "--tp", 2, "--layout", "vllm", "--ranks", "1",
                  "-o", out, "-q")
left = sorted(os.path.basename(x) for x in glob.glob(os.path.join(out, "*.safetensors")))
report(rc1 == 0 and rc2 == 1 and left == ["model-rank-0-part-0.safetensors"],
       "vllm --ranks: a run of another --moe-backend does not join the directory's split",
       f"rc {rc1}, {rc2}; left {left}\n{se1}{se2}")
rc3, _, se3 = tps("split", VMODELS["mxfp4-v"], "--tp", 2, "--layout", "vllm", "--moe-backend",
                  "cpu", "--ranks", "1", "-o", out, "-q")
rc, so, se = tps("check", out)
report(rc3 == 0 and rc == 0, "vllm --ranks: a run of the same --moe-backend joins, and check "
       "passes", se3 + se)

# Backends that pad the hidden size (2880 of the published models, 64 here) are refused,
# naming the backend, the sizes and the backends that keep it; nothing written.
for b in ("marlin", "flashinfer_trtllm", "flashinfer_cutlass", "cutlass", "deep_gemm",
          "deepgemm"):
    ha = go.ROUND_UP[b][0]
    out = os.path.join(TMP, f"v-pad-{b}")
    rc, so, se = tps("split", MODELS["mxfp4"], "--tp", 2, "--layout", "vllm", "--moe-backend", b,
                     "-o", out)
    probs = ranktest.refusal_problems(rc, se, out, f"--moe-backend {b}", "hidden size padded")
    for w in (f"hidden_size 64 up to {ha}", "triton, triton_unfused, cpu, emulation"):
        if w not in se:
            probs.append(f"the reason does not say '{w}'")
    report(not probs, f"--layout vllm --moe-backend {b}: refused (it pads hidden_size 64 to {ha}), "
           "naming the backends that work, nothing written", "\n".join(probs) + "\n" + se)

# BF16 experts, transposed per expert in the rank files: a flipped byte in rank 1's
# w13_weight, w2_weight (the last byte: the last expert's last stored row) and w13_bias:
# check and verify fail naming the rank tensor and the source tensor it holds.
out = os.path.join(TMP, "v-bf16-v-triton-tp2")
X = "model.layers.0.mlp.experts."
for k, (victim, named, where) in enumerate([
        (X + "routed_experts.w13_weight", X + "gate_up_proj", "mid"),
        (X + "routed_experts.w2_weight", X + "down_proj", "last"),
        (X + "routed_experts.w13_bias", X + "gate_up_proj_bias", "first")]):
    bad = flipped_copy(out, k, 1, victim, where)
    rc, so, se = tps("check", bad)
    report(rc == 1 and victim in so + se and named in so + se,
           f"vllm bf16 tp 2: a flipped byte in rank 1's {victim.split('.')[-1]} ({where}): check "
           f"fails naming it and {named.split('.')[-1]}", so + se)
    rc, so, se = tps("verify", bad, "--source", VMODELS["bf16-v"])
    report(rc == 1 and "verify: FAIL" in so, f"vllm bf16 tp 2: the same flipped byte: verify fails",
           (so + se)[-1500:])

# The manifest says which pieces are transposed: without it the rank files read as they lie,
# and check no longer matches them.
bad = out + "-untransposed"
shutil.rmtree(bad, ignore_errors=True)
shutil.copytree(out, bad)
with open(os.path.join(bad, "tpshard.json")) as f:
    man = f.read()
ntr = man.count('"transpose": true')
with open(os.path.join(bad, "tpshard.json"), "w") as f:
    f.write(man.replace(', "transpose": true', ""))
rc, so, se = tps("check", bad)
report(ntr == 8 and rc == 1 and "CRC32" in so + se,
       "vllm bf16 tp 2: the manifest marks the 8 transposed pieces (2 layers x 2 stacks x 2 "
       "ranks); without the marks check fails", f"{ntr} marks\n" + so + se)
with open(os.path.join(bad, "tpshard.json"), "w") as f:
    f.write(man.replace('"transpose": true', '"transpose": 1', 1))
rc, so, se = tps("check", bad)
report(rc == 1 and "transpose" in so + se, "a manifest whose transpose is not true: check fails "
       "naming it", so + se)

# plan says which pieces are transposed: text and --json (the schema's optional field).
rc, so, se = tps("plan", VMODELS["bf16-v"], "--tp", 2, "--layout", "vllm", "--json")
tr, other = set(), 0
try:
    for rt in json.loads(so)["rank_tensors"]:
        for pc in rt["pieces"]:
            if pc.get("transposed"):
                tr.add(rt["name"].split(".")[-1])
            elif "transposed" in pc:
                other += 1
except (ValueError, KeyError) as e:
    tr = {f"unreadable: {e}"}
report(rc == 0 and tr == {"w13_weight", "w2_weight"} and not other,
       "plan --json: the w13_weight and w2_weight pieces, only they, say transposed",
       f"{tr} {other}\n" + se)
rc, so, se = tps("plan", VMODELS["bf16-v"], "--tp", 2, "--layout", "vllm")
line = next((l for l in so.splitlines() if "routed_experts.w13_weight " in l), "")
report(rc == 0 and "gate_up_proj[:][:][0:160) transposed per matrix" in line,
       "plan: rank 0's w13_weight is gate_up_proj[:][:][0:160) transposed per matrix", line)

# --ep is refused for BF16 experts as for MXFP4.
out = os.path.join(TMP, "bf16-vllm-ep")
rc, so, se = tps("split", VMODELS["bf16-v"], "--tp", 2, "--ep", "--layout", "vllm", "-o", out)
probs = ranktest.refusal_problems(rc, se, out, "--ep", "BF16 experts --ep")
report(not probs, "bf16 --layout vllm --ep: refused, nothing written", "\n".join(probs))

# SGLang 0.5.23 keeps refusing gpt-oss, saying why.
for quant in ("bf16", "mxfp4"):
    out = os.path.join(TMP, f"{quant}-sglang")
    rc, so, se = tps("split", MODELS[quant], "--tp", 2, "--layout", "sglang", "-o", out)
    probs = ranktest.refusal_problems(rc, se, out, "gpt-oss", "SGLang 0.5.23 gpt-oss refused")
    if "SGLang 0.5.23" not in se:
        probs.append("the reason does not name SGLang 0.5.23")
    if "triton_kernel" not in se:
        probs.append("the reason does not say the MoE runner backend decides the BF16 shapes")
    report(not probs, f"{quant} --layout sglang: refused saying why, nothing written",
           "\n".join(probs) + "\n" + se)


def vvariant(name, edit_tensors=None, **dims):
    d = os.path.join(TMP, "vbad-" + name)
    cfg = go.config_of("mxfp4", heads=8, kv_heads=4, inter=160, **dims)
    t = go.tensors_of(cfg, "mxfp4", seed=7)
    if edit_tensors:
        edit_tensors(t)
    go.gen.write_checkpoint(d, t, 0)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(cfg, f)
    return d


def add(name, value):
    return lambda t: t.update({name: value})


def widen(name):
    """BF16 -> F32, exactly (the same values)."""
    def f(t):
        _, shape, data = t[name]
        out = bytearray()
        for k in range(0, len(data), 2):
            out += b"\0\0" + data[k:k + 2]
        t[name] = ("F32", shape, bytes(out))
    return f


E0 = "model.layers.0.mlp.experts."
VBAD = [
    # (case, tensors edit, split args, words the error must hold)
    ("a w2 bias of the wrong shape",
     add(E0 + "down_proj_bias", ("BF16", [4, 32], bytes(256))), [],
     [E0 + "down_proj_bias", "[4, 64]", "[4, 32]"]),
    ("a w13 bias missing", drop(E0 + "gate_up_proj_bias"), [], [E0 + "gate_up_proj_bias"]),
    ("an expert bias in F32", widen(E0 + "down_proj_bias"), [],
     [E0 + "down_proj_bias", "BF16", "torch_dtype"]),
    ("a tensor under the experts no stack holds",
     add(E0 + "gate_proj_bias", ("BF16", [4, 8], bytes(64))), [],
     [E0 + "gate_proj_bias", "none of its stacks holds it"]),
    ("MXFP4 blocks of a projection gpt-oss has not",
     add(E0 + "gate_proj_blocks", ("U8", [4, 8], bytes(32))), [],
     [E0 + "gate_proj_blocks", "not one of them"]),
    ("--ep", None, ["--ep"], ["--ep", "MXFP4"]),
]
for case, et, extra, words in VBAD:
    model = vvariant(case.replace(" ", "-"), et)
    out = os.path.join(TMP, "vout-bad-" + case.replace(" ", "-"))
    rc, so, se = tps("split", model, "--tp", 2, "--layout", "vllm", "-o", out, *extra)
    probs = ranktest.refusal_problems(rc, se, out, words[0], case)
    probs += [f"the error does not say '{w}'" for w in words[1:] if w not in se]
    report(not probs, f"--layout vllm, {case}: exit 1 naming {', '.join(words)}, nothing written",
           "\n".join(probs) + "\n" + se)

# The layout is data: the built-in vllm.yaml given as a file writes the same rank files; the
# experts entry's new stack fields are checked where the file says them.
own = os.path.join(TMP, "my-vllm.yaml")
shutil.copy(os.path.join(os.environ.get("TOP", "."), "plans", "layouts", "vllm.yaml"), own)
out = os.path.join(TMP, "v-own-layout")
rc, so, se = tps("split", VMODELS["mxfp4-v"], "--tp", 4, "--layout", own, "-o", out, "-q")
with open(os.path.join(VMODELS["mxfp4-v"], "config.json")) as f:
    want = go.vllm_ranks(json.load(f), source_tensors(VMODELS["mxfp4-v"]), 4)
probs = ["split: " + se] if rc else ranktest.rank_file_problems(out, VMODELS["mxfp4-v"], want, 4)
report(not probs, "--layout FILE (vllm.yaml copied): the same rank files as the built-in layout",
       "\n".join(probs))
STACK_BAD = [
    ("{name: w2_weight, parts: [down_proj], split: columns, interleaved: true}",
     "an interleaved stack is split by rows"),
    ("{name: w13_weight, parts: [gate_up_proj], split: rows, bias: {part: b, as: w13_bias, "
     "ranks: first}}", "'ranks: first' is for the bias of a stack split by columns"),
    ("{name: w2_weight, parts: [down_proj], split: columns, bias: {part: b, ranks: first}}",
     "a stack's 'bias' needs 'part' and 'as'"),
    ("{name: w2_weight, parts: [down_proj], split: columns, bias: {part: b, as: c, ranks: some}}",
     "a bias's 'ranks' is all or first"),
    ("{name: w2_weight, parts: [down_proj], split: columns, scale: a.b}", "must be one module name"),
]
for k, (stack, why) in enumerate(STACK_BAD + [
        ("{name: w2_weight, parts: [down_proj], split: columns, transposed: true}",
         "a stack's 'transposed' is for a stacked experts entry's one-part stack")]):
    stacked = "    stacked: true\n" if k < len(STACK_BAD) else ""
    path = os.path.join(TMP, f"bad-stack{k}.yaml")
    with open(path, "w") as f:
        f.write("name: t\ntarget: x\nexperts:\n  - match: model.layers.*.mlp.experts\n"
                f"    count: num_local_experts\n{stacked}    stacks:\n      - {stack}\n")
    rc, so, se = tps("plan", MODELS["mxfp4"], "--tp", 2, "--layout", path)
    line = f"bad-stack{k}.yaml:{8 if stacked else 7}"
    report(rc == 1 and why in se and line in se,
           f"a layout file's stack, {why}: an error naming the file and line", f"rc {rc}\n{se}")

# vLLM's own divisibility rules come before anything else, so the error names the field at fault.
odd = go.checkpoint(os.path.join(TMP, "heads6"), "mxfp4", heads=6, kv_heads=6, inter=64)
for model, tp, field, why in ((odd, 4, "num_attention_heads", "sinks"),
                              (odd, 3, "intermediate_size", "MLPBlock"),
                              (MODELS["mxfp4"], 4, "num_key_value_heads", "replicates none")):
    out = os.path.join(TMP, f"div-vllm-tp{tp}-{field}")
    rc, so, se = tps("split", model, "--tp", tp, "--layout", "vllm", "-o", out)
    probs = ranktest.refusal_problems(rc, se, out, field, f"{field} % tp (vLLM's {why})")
    if why not in se:
        probs.append(f"the reason does not say {why}")
    report(not probs, f"--layout vllm tp {tp}, {field} not divisible: refused naming it ({why})",
           "\n".join(probs) + "\n" + se)
rc, so, se = tps("plan", VMODELS["mxfp4-v"], "--tp", 2, "--layout", "vllm")
line = next((x for x in so.splitlines() if x.startswith("tp values that work")), "")
report(rc == 0 and line.endswith(": 1, 2, 4"),
       "plan --layout vllm: the tp values that work are those of heads, KV heads and "
       "intermediate_size together (1, 2, 4)", line or so[-600:] + se)
rc, so, se = tps("plan", VMODELS["mxfp4-v"], "--tp", 2, "--layout", "vllm", "--moe-backend",
                 "marlin")
line = next((x for x in so.splitlines() if x.startswith("tp values that work")), "")
report(rc == 1 and line.endswith(": none") and "--moe-backend marlin rounds" in so,
       "plan --layout vllm --moe-backend marlin: no tp works, and it says why", so[-900:] + se)

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
