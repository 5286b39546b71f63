"""`make test-engines`: tpshard's serving layouts against vLLM 0.33.0 and
SGLang 0.5.23 themselves (README.md beside this file).

For each case of CASES (engine, model, tp, pp):
  1. make the tiny Hugging Face checkpoint (models.py);
  2. the engine, in its own venv, loads it its normal way for every rank of a
     faked group and saves what its ShardedStateLoader.save_model writes:
     build/engines/expected/<case>/ (with the input model in model/);
  3. tpshard split MODEL --tp T [--pp P] --layout ENGINE writes
     build/engines/tpshard/<case>/;
  4. per rank, the union of that rank's files on both sides must hold the same
     tensors: names, dtypes, shapes, bytes;
  5. the engine loads tpshard's files with its ShardedStateLoader into a fresh
     model for every rank (no missing, no unexpected keys).
A rank passes when 4 and 5 hold; both sides refusing the same model also
passes; tpshard refusing what the engine serves fails ("refused: ...").
Then one self-test: a flipped byte in a tpshard rank file must be caught.

Runs with the project's test venv (build/venv: numpy, safetensors); the
engines with build/engines-venv/{vllm,sglang}.  Ends "N passed, M failed".

    run.py [--only SUBSTRING ...] [--list]
"""
import argparse
import glob
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(os.path.dirname(HERE))
BUILD = os.path.join(TOP, "build", "engines")
VENV = os.path.join(TOP, "build", "engines-venv")
TPSHARD = os.environ.get("TPSHARD") or os.path.join(TOP, "tpshard")
sys.path.insert(0, HERE)
import models  # noqa: E402

# ------------------------------------------------------------------ the cases
# (engine, model (models.MODELS), format shown, tp, pp).  One line a case.
V, S = "vllm", "sglang"
CASES = [
    # dense, vLLM
    (V, "llama", "bf16", 2, 1), (V, "llama", "bf16", 4, 1),
    (V, "qwen2", "bf16", 2, 1), (V, "qwen2", "bf16", 4, 1),
    (V, "qwen3-tied", "bf16", 2, 1), (V, "qwen3-tied", "bf16", 4, 1),
    (V, "mistral", "bf16", 2, 1), (V, "mistral", "bf16", 4, 1),
    (V, "phi3", "bf16", 2, 1), (V, "phi3", "bf16", 4, 1),
    (V, "gemma3-tied", "bf16", 2, 1), (V, "gemma3-tied", "bf16", 4, 1),
    # MoE, vLLM
    (V, "qwen3_moe", "bf16", 2, 1), (V, "qwen3_moe", "bf16", 4, 1),
    (V, "mixtral", "bf16", 2, 1), (V, "mixtral", "bf16", 4, 1),
    (V, "deepseek_v3", "bf16", 2, 1), (V, "deepseek_v3", "bf16", 4, 1),
    (V, "deepseek_v2-lite", "bf16", 2, 1), (V, "deepseek_v2-lite", "bf16", 4, 1),
    # FP8 dense, vLLM
    (V, "llama-fp8-block", "fp8-block", 2, 1), (V, "llama-fp8-block", "fp8-block", 4, 1),
    (V, "qwen3-fp8-block-bf16scale", "fp8-block", 2, 1),
    (V, "qwen3-fp8-block-bf16scale", "fp8-block", 4, 1),
    (V, "qwen3-ct-fp8-channel", "ct-fp8-channel", 2, 1),
    (V, "qwen3-ct-fp8-channel", "ct-fp8-channel", 4, 1),
    # FP8 experts, vLLM
    (V, "qwen3_moe-fp8-block-i256", "fp8-block", 2, 1),   # I/tp = 128
    (V, "qwen3_moe-fp8-block-i256", "fp8-block", 4, 1),   # I/tp = 64
    (V, "qwen3_moe-fp8-block-i384", "fp8-block", 2, 1),   # I/tp = 192
    (V, "qwen3_moe-fp8-block-i384", "fp8-block", 4, 1),   # I/tp = 96
    (V, "mixtral-fp8-tensor", "fp8-tensor", 2, 1), (V, "mixtral-fp8-tensor", "fp8-tensor", 4, 1),
    (V, "qwen3_moe-ct-fp8-channel", "ct-fp8-channel", 2, 1),
    (V, "qwen3_moe-ct-fp8-channel", "ct-fp8-channel", 4, 1),
    (V, "deepseek_v3-fp8-block", "fp8-block", 2, 1),
    # packed integer methods, vLLM (tp 4: KV heads replicated)
    (V, "llama-gptq-g128", "gptq", 2, 1), (V, "llama-gptq-g128", "gptq", 4, 1),
    (V, "llama-gptq-ch", "gptq", 2, 1), (V, "llama-gptq-ch", "gptq", 4, 1),
    # (8-bit GPTQ: vLLM's CPU build has no 8-bit WNA16 kernel to build the layer with;
    # tests/py/test_packed.py covers its layout)
    (V, "qwen2-gptq-g32", "gptq", 2, 1), (V, "qwen2-gptq-g32", "gptq", 4, 1),
    (V, "llama-awq-g128", "awq", 2, 1), (V, "llama-awq-g128", "awq", 4, 1),
    (V, "llama-ct-w4a16", "ct-w4a16", 2, 1), (V, "llama-ct-w4a16", "ct-w4a16", 8, 1),
    (V, "qwen2-ct-w4a16-asym", "ct-w4a16", 2, 1),
    (V, "llama-nvfp4", "nvfp4", 2, 1), (V, "llama-nvfp4", "nvfp4", 4, 1),
    (V, "llama-ct-nvfp4", "ct-nvfp4", 2, 1),
    (V, "qwen3_moe-ct-w4a16", "ct-w4a16", 2, 1), (V, "qwen3_moe-ct-w4a16", "ct-w4a16", 4, 1),
    (V, "qwen3_moe-gptq", "gptq", 2, 1), (V, "qwen3_moe-awq", "awq", 2, 1),
    (V, "gemma4-moe", "bf16", 2, 1), (V, "gemma4-moe", "bf16", 4, 1),
    # SGLang
    (S, "llama", "bf16", 2, 1), (S, "llama", "bf16", 4, 1),
    (S, "qwen2", "bf16", 2, 1), (S, "qwen3-tied", "bf16", 2, 1), (S, "mistral", "bf16", 2, 1),
    (S, "phi3", "bf16", 2, 1), (S, "gemma3-tied", "bf16", 2, 1),
    (S, "qwen3_moe", "bf16", 2, 1), (S, "mixtral", "bf16", 2, 1), (S, "deepseek_v3-yarn", "bf16", 2, 1),
    (S, "deepseek_v2-lite", "bf16", 2, 1),
    (S, "llama-fp8-block", "fp8-block", 2, 1), (S, "qwen3-ct-fp8-channel", "ct-fp8-channel", 2, 1),
    (S, "qwen3_moe-fp8-block-i256", "fp8-block", 2, 1),
    (S, "qwen3_moe-fp8-block-i384", "fp8-block", 2, 1),
    (S, "mixtral-fp8-tensor", "fp8-tensor", 2, 1),
    (S, "qwen3_moe-ct-fp8-channel", "ct-fp8-channel", 2, 1),
    (S, "deepseek_v3-fp8-block", "fp8-block", 2, 1),
    # Gemma 4, vLLM
    (V, "gemma4-e", "bf16", 2, 1), (V, "gemma4-e", "bf16", 4, 1),
    (V, "gemma4-e-shipkv", "bf16", 2, 1), (V, "gemma4-e-plc", "bf16", 2, 1),
    (V, "gemma4-dense", "bf16", 2, 1), (V, "gemma4-dense", "bf16", 4, 1),
    (V, "gemma4-mm-e", "bf16", 2, 1), (V, "gemma4-mm-e", "bf16", 4, 1),
    (V, "gemma4-e-fp8-block", "fp8-block", 2, 1),
    (V, "gemma4-e-ct-fp8-channel", "ct-fp8-channel", 2, 1),
    # Gemma 4 MoE experts per expert (BF16, block FP8) and fused 3-D in block FP8
    (V, "gemma4-moe-pe", "bf16", 2, 1), (V, "gemma4-moe-pe", "bf16", 4, 1),
    (V, "gemma4-moe-pe-fp8-block", "fp8-block", 2, 1),
    (V, "gemma4-moe-fp8-block", "fp8-block", 2, 1),
    # pipeline parallel, vLLM
    (V, "llama-5", "bf16", 2, 2), (V, "llama-5", "bf16", 1, 3),
    (V, "llama-tied", "bf16", 2, 2), (V, "llama-tied", "bf16", 1, 3),
    (V, "qwen3_moe", "bf16", 2, 2), (V, "qwen3_moe", "bf16", 1, 3),
    # Gemma 4 31B style (every stage builds the embedding, norm and head); the E series at
    # pp 2 parts KV-shared layers from the layers whose cache they read, which vLLM refuses
    # on the later stage only (its first stage builds), and tpshard refuses whole
    (V, "gemma4-dense", "bf16", 2, 2), (V, "gemma4-dense", "bf16", 1, 3),
    # gpt-oss: vLLM's layout writes the MXFP4 experts (split --moe-backend cpu, what vLLM's CPU
    # platform runs) and the BF16 ones (each expert's rank slice transposed); tpshard refuses
    # SGLang's (its BF16 row fails as "refused": plans/layouts/sglang.yaml says why). The
    # oracle rows check gptoss_oracle.vllm_ranks, what test_gpt_oss.py relies on, against vLLM
    # itself
    (V, "gpt_oss", "bf16", 1, 1), (V, "gpt_oss", "bf16", 2, 1), (V, "gpt_oss", "bf16", 4, 1),
    (V, "gpt_oss-mxfp4", "mxfp4", 1, 1), (V, "gpt_oss-mxfp4", "mxfp4", 2, 1),
    (V, "gpt_oss-mxfp4", "mxfp4", 4, 1), (V, "gpt_oss-mxfp4", "mxfp4", 2, 2),
    (S, "gpt_oss", "bf16", 2, 1), (S, "gpt_oss-mxfp4", "mxfp4", 2, 1),
]

# Models with an oracle of the engine's rank state (tests/py): engine -> model ->
# (config, tensors, tp) -> [{name: (dtype, shape, bytes)}] per rank.  vLLM's CPU platform picks
# the cpu MXFP4 backend (oracle/mxfp4.py _get_priority_backends), whose round-up is x32.
sys.path.insert(0, os.path.join(TOP, "tests", "py"))
import gptoss_oracle  # noqa: E402
ORACLES = {V: {"gpt_oss": lambda c, t, tp: gptoss_oracle.vllm_ranks(c, t, tp),
               "gpt_oss-mxfp4": lambda c, t, tp: gptoss_oracle.vllm_ranks(c, t, tp, "cpu")}}


# tpshard split options a case needs to describe the engine's run: vLLM's CPU platform runs
# MXFP4 experts on its cpu backend (round-up x32), which tpshard must be told.
SPLIT_ARGS = {(V, "gpt_oss-mxfp4"): ["--moe-backend", "cpu"]}


def case_name(engine, model, tp, pp):
    return f"{engine}-{model}-tp{tp}" + (f"-pp{pp}" if pp > 1 else "")


def family_of(model):
    return re.split(r"-(?:fp8|ct|yarn|mxfp4)", model)[0]


# What an engine raises when it refuses a model at that tp (its divide()
# asserts, validate_fp8_block_shape...): both sides refusing then passes.  Any
# other engine error (a missing kernel, a NameError) fails the case.
REFUSAL_ERRORS = ("ValueError", "AssertionError")


# ------------------------------------------------------------------ safetensors, read here

def read_st(path):
    """{name: (dtype, shape, bytes)} of one safetensors file (own reader: shares
    nothing with tpshard)."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    hdr.pop("__metadata__", None)
    base = 8 + n
    return {k: (v["dtype"], list(v["shape"]), raw[base + v["data_offsets"][0]:
                                                  base + v["data_offsets"][1]])
            for k, v in hdr.items()}


def rank_files(d, tp_rank, pp_rank, pp):
    pat = (f"model-pp-{pp_rank}-tp-{tp_rank}-part-*.safetensors" if pp > 1
           else f"model-rank-{tp_rank}-part-*.safetensors")
    return sorted(glob.glob(os.path.join(d, pat)))


def rank_state(d, tp_rank, pp_rank, pp):
    out, dup = {}, []
    for f in rank_files(d, tp_rank, pp_rank, pp):
        for k, v in read_st(f).items():
            if k in out:
                dup.append(k)
            out[k] = v
    return out, dup


def compare(exp, got):
    """'' when equal, else what differs first (and how many)."""
    problems = []
    for k in sorted(set(exp) - set(got)):
        problems.append(f"missing {k}")
    for k in sorted(set(got) - set(exp)):
        problems.append(f"unexpected {k}")
    for k in sorted(set(exp) & set(got)):
        (de, se, be), (dg, sg, bg) = exp[k], got[k]
        if de != dg:
            problems.append(f"{k}: dtype {dg}, engine {de}")
        elif se != sg:
            problems.append(f"{k}: shape {sg}, engine {se}")
        elif be != bg:
            i = next(j for j in range(len(be)) if be[j] != bg[j])
            problems.append(f"{k}: bytes differ from byte {i}")
    if not problems:
        return ""
    return problems[0] + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else "")


# ------------------------------------------------------------------ running the sides

PATCHES_SEEN = set()  # (engine, where, why) the sides report (patches.py)

def engine(engine_name, args, log):
    py = os.path.join(VENV, engine_name, "bin", "python")
    script = os.path.join(HERE, f"{engine_name}_side.py")
    with open(log, "a") as lf:
        lf.write(f"\n$ {engine_name}_side.py {' '.join(args)}\n")
        lf.flush()
        p = subprocess.run([py, script] + args, stdout=subprocess.PIPE, stderr=lf, text=True,
                           cwd=HERE, timeout=1800)
    res = {}
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            r = json.loads(line)
            if "patches" in r:
                PATCHES_SEEN.update(tuple(x) for x in r["patches"])
            else:
                res[(r["pp_rank"], r["tp_rank"])] = r
    return res, p.returncode


def first_line(msg):
    msg = msg.strip()
    for line in msg.splitlines():
        if line.strip():
            return line.strip()[:300]
    return msg[:300]


def run_case(c, log):
    eng, model, fmt, tp, pp = c
    name = case_name(eng, model, tp, pp)
    mdir = models.make(model, os.path.join(BUILD, "models", model))
    exp = os.path.join(BUILD, "expected", name)
    tps = os.path.join(BUILD, "tpshard", name)
    shutil.rmtree(exp, ignore_errors=True)
    shutil.rmtree(tps, ignore_errors=True)
    os.makedirs(exp)
    shutil.copytree(mdir, os.path.join(exp, "model"))
    ppargs = ["--pp", str(pp)] if pp > 1 else []
    saved, rc = engine(eng, ["save", mdir, exp, "--tp", str(tp)] + ppargs, log)
    cmd = ([TPSHARD, "split", mdir, "--tp", str(tp)] + ppargs + ["--layout", eng, "-o", tps, "-q"]
           + SPLIT_ARGS.get((eng, model), []))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    with open(log, "a") as lf:
        lf.write(f"\n$ {' '.join(cmd)}\nrc={p.returncode}\n{p.stdout}{p.stderr}")
    refused = first_line(p.stderr or p.stdout) if p.returncode != 0 else ""
    loaded = {}
    if not refused:
        loaded, _ = engine(eng, ["load", tps, "--tp", str(tp)] + ppargs, log)
    rows = []
    for pr in range(pp):
        for tr in range(tp):
            rank = f"{tr}" if pp == 1 else f"pp{pr}.tp{tr}"
            s = saved.get((pr, tr)) or {"ok": False, "error": f"no answer (exit {rc}), see log"}
            n = 0
            if not s["ok"]:
                eng_err = first_line(s["error"])
                if not eng_err.startswith(REFUSAL_ERRORS):
                    ok, result = False, f"engine cannot run here: {eng_err}"
                elif refused:
                    ok, result = True, f"both refuse: engine {eng_err}; tpshard {refused}"
                else:
                    ok, result = False, f"engine refuses ({eng_err}) but tpshard wrote files"
            elif refused:
                ok, result = False, f"refused: {refused}"
            else:
                e, _ = rank_state(exp, tr, pr, pp)
                g, dup = rank_state(tps, tr, pr, pp)
                n = len(set(e) & set(g))
                diff = compare(e, g)
                ld = loaded.get((pr, tr)) or {"ok": False, "error": "no answer, see log"}
                if dup:
                    ok, result = False, f"tensor in two parts: {dup[0]}"
                elif diff:
                    ok, result = False, f"differs: {diff}"
                elif not ld["ok"]:
                    ok, result = False, f"engine load fails: {first_line(ld['error'])}"
                else:
                    ok, result = True, "ok (bytes equal, ShardedStateLoader loads)"
            rows.append((eng, family_of(model), fmt, tp if pp == 1 else f"{tp}x{pp}pp", rank,
                         ok, result, n))
    oracle = ORACLES.get(eng, {}).get(model)
    if oracle and pp == 1:
        with open(os.path.join(mdir, "config.json")) as f:
            cfg = json.load(f)
        src = {}
        for f in sorted(glob.glob(os.path.join(mdir, "*.safetensors"))):
            src.update(read_st(f))
        want = oracle(cfg, src, tp)
        for tr in range(tp):
            s = saved.get((0, tr)) or {"ok": False, "error": "no answer"}
            if not s["ok"]:
                rows.append(("oracle", family_of(model), fmt, tp, f"{tr}", False,
                             f"engine cannot run here: {first_line(s['error'])}", 0))
                continue
            e, _ = rank_state(exp, tr, 0, 1)
            diff = compare(e, want[tr])
            rows.append(("oracle", family_of(model), fmt, tp, f"{tr}", not diff,
                         f"tests/py oracle {'differs: ' + diff if diff else 'equals the engine'}",
                         len(set(e) & set(want[tr]))))
    return rows


def self_test(rows_by_case, log):
    """Flip one byte of a tpshard rank file of a passing case: must be caught."""
    for (c, rows) in rows_by_case:
        eng, model, fmt, tp, pp = c
        if pp > 1 or tp < 2 or not all(r[5] for r in rows) or rows[0][7] == 0:
            continue
        name = case_name(eng, model, tp, pp)
        src = os.path.join(BUILD, "tpshard", name)
        dst = os.path.join(BUILD, "tpshard", name + "-flipped")
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst)
        f = rank_files(dst, 1, 0, 1)[0]
        with open(f, "r+b") as fh:
            fh.seek(-1, os.SEEK_END)
            b = fh.read(1)
            fh.seek(-1, os.SEEK_END)
            fh.write(bytes([b[0] ^ 0x01]))
        e, _ = rank_state(os.path.join(BUILD, "expected", name), 1, 0, 1)
        g, _ = rank_state(dst, 1, 0, 1)
        diff = compare(e, g)
        return [("selftest", family_of(model), fmt, tp, "1", bool(diff),
                 f"flipped last byte of {os.path.basename(f)}: "
                 + (f"caught: {diff}" if diff else "NOT caught"), len(e))]
    return [("selftest", "-", "-", "-", "-", False, "no passing case to flip a byte in", 0)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", action="append", default=[],
                    help="run the cases whose name contains this (repeatable)")
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    cases = [c for c in CASES
             if not a.only or any(s in case_name(c[0], c[1], c[3], c[4]) for s in a.only)]
    if a.list:
        for c in cases:
            print(case_name(c[0], c[1], c[3], c[4]))
        return 0
    os.makedirs(BUILD, exist_ok=True)
    log = os.path.join(BUILD, "log.txt")
    open(log, "w").close()
    fmt = "{:<8} {:<12} {:<15} {:<6} {:<9} {:<6} {:>7}  {}"
    print(fmt.format("engine", "family", "format", "tp", "rank", "result", "tensors", "detail"))
    passed = failed = 0
    rows_by_case = []
    t0 = time.time()
    for c in cases:
        try:
            rows = run_case(c, log)
        except Exception as e:  # a harness error fails the case, visibly
            rows = [(c[0], family_of(c[1]), c[2], c[3], "-", False,
                     f"harness error: {type(e).__name__}: {e}", 0)]
        rows_by_case.append((c, rows))
        for r in rows:
            print(fmt.format(r[0], r[1], r[2], str(r[3]), r[4], "PASS" if r[5] else "FAIL",
                             r[7], r[6]), flush=True)
            passed += r[5]
            failed += not r[5]
    for r in self_test(rows_by_case, log):
        print(fmt.format(r[0], r[1], r[2], str(r[3]), r[4], "PASS" if r[5] else "FAIL", r[7],
                         r[6]), flush=True)
        passed += r[5]
        failed += not r[5]
    for eng, where, why in sorted(PATCHES_SEEN):
        print(f"# patched ({eng}) {where}: {why}")
    print(f"# {len(cases)} cases in {time.time() - t0:.0f} s; engine outputs in "
          f"build/engines/expected/<case>/, tpshard's in build/engines/tpshard/<case>/, "
          f"the engines' messages in build/engines/log.txt")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
