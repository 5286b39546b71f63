"""`tpshard split --layout vllm|sglang` against the serving-layout oracle
(serving_oracle.py, checked against the engines' own output by
test_serving_oracle.py).

For LLaMA, Mistral, Qwen2, Qwen3 and Gemma3 text checkpoints made by
testdata/gen.py, at several tp (tp 1, tp > KV heads, vocabularies that are not
multiples of 64, tied and untied, biases, an indexed source, F16/F32):
  - the union of OUT/model-rank-<r>-part-*.safetensors, read by the
    reference safetensors library, holds exactly the oracle's tensors for
    rank r (names, dtypes, shapes, bytes), each once, for r in 0..tp-1, and
    every file's __metadata__ has format: pt; config.json sits beside them;
  - `tpshard merge OUT` gives back the source files byte for byte;
  - `tpshard check OUT` passes, and fails once one bit of a rank's fused
    qkv_proj is flipped;
  - a model the engine refuses at that tp (heads, KV heads, intermediate
    size, vLLM's padded vocabulary not divisible) makes split exit 1 with an
    error naming the config field, and leaves no .safetensors file.
Run with build/venv/bin/python; env TPSHARD (binary), TOP (repo root),
TPS_TMP (scratch).  Prints "ok - ..." / "not ok - ..." / "skip - ..." lines.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.environ.get("TOP") or os.path.dirname(os.path.dirname(HERE))
TPSHARD = os.environ.get("TPSHARD") or os.path.join(TOP, "tpshard")
TMP = tempfile.mkdtemp(prefix="pyserve.", dir=os.environ.get("TPS_TMP") or None)

try:
    import safetensors
    from safetensors import safe_open
except ImportError as e:  # pragma: no cover
    print(f"skip - serving layout tests: {e}")
    sys.exit(0)

sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(TOP, "testdata"))
import gen  # noqa: E402
import serving_oracle as so  # noqa: E402
import ranktest  # noqa: E402
from ranktest import first_diff, flip_bit, report, source_files  # noqa: E402
import jsonlog  # noqa: E402

BOTH = ("vllm", "sglang")

# (label, gen.py family and options, tp values, layouts)
SPLITS = [
    ("llama-v250-kv2", "llama --hidden 64 --heads 8 --kv-heads 2 --head-dim 8 --inter 96 --vocab 250",
     [1, 2, 4, 8], BOTH),
    ("llama-tied-bias-f16-v1007", "llama --hidden 32 --heads 4 --kv-heads 2 --inter 64 --vocab 1007"
     " --tied --attention-bias --dtype F16", [2, 4], BOTH),
    # SGLang's LlamaMLP has no biases (it would drop them): vLLM only
    ("llama-mlp-bias", "llama --hidden 32 --heads 4 --kv-heads 4 --inter 64 --vocab 100 --mlp-bias",
     [2, 4], ("vllm",)),
    ("mistral-hd16-v1007-index2", "mistral --hidden 64 --heads 8 --kv-heads 2 --head-dim 16 --inter 64"
     " --vocab 1007 --index 2", [1, 4, 8], BOTH),
    ("qwen2-f16-v250", "qwen2 --hidden 64 --heads 4 --kv-heads 2 --inter 96 --vocab 250 --dtype F16",
     [1, 2, 4], BOTH),
    ("qwen2-tied-v1007", "qwen2 --hidden 32 --heads 4 --kv-heads 2 --inter 64 --vocab 1007 --tied"
     " --layers 3", [2], BOTH),
    ("qwen3-tied-v250", "qwen3 --hidden 64 --heads 4 --kv-heads 2 --head-dim 32 --inter 96 --vocab 250"
     " --tied", [1, 2, 4], BOTH),
    ("qwen3-f32", "qwen3 --hidden 32 --heads 4 --kv-heads 2 --head-dim 16 --inter 64 --vocab 130"
     " --dtype F32", [2], BOTH),
    ("gemma3-tied-kv1-v262", "gemma3 --gemma3-naming causal --hidden 64 --heads 4 --kv-heads 1"
     " --head-dim 32 --inter 96 --vocab 262", [1, 2, 4], BOTH),
    ("gemma3-untied", "gemma3 --gemma3-naming causal --untied --hidden 32 --heads 4 --kv-heads 2"
     " --head-dim 16 --inter 64 --vocab 200", [2], BOTH),
    # Qwen3 with attention_bias: SGLang's o_proj has the bias too, vLLM's has none
    ("qwen3-attn-bias", "qwen3 --hidden 32 --heads 4 --kv-heads 2 --head-dim 16 --inter 64 --vocab 130"
     " --attention-bias", [2], ("sglang",)),
    # 250 rows padded to 256 do not divide by 3: SGLang pads by 64*3 (384
    # rows), vLLM refuses (REFUSALS below)
    ("llama-tp3-v250", "llama --hidden 48 --heads 6 --kv-heads 3 --head-dim 8 --inter 96 --vocab 250",
     [3], ("sglang",)),
]

# (label, model: a SPLITS label or gen.py options, tp, layouts, the config field the error names)
REFUSALS = [
    ("heads", "llama --hidden 48 --heads 6 --kv-heads 1 --head-dim 8 --inter 96 --vocab 256",
     4, BOTH, "num_attention_heads"),
    ("kv-below-tp", "llama --hidden 48 --heads 12 --kv-heads 3 --head-dim 4 --inter 96 --vocab 256",
     4, BOTH, "num_key_value_heads"),
    ("kv-above-tp", "qwen3 --hidden 48 --heads 12 --kv-heads 6 --head-dim 4 --inter 96 --vocab 256",
     4, BOTH, "num_key_value_heads"),
    ("intermediate", "mistral --hidden 32 --heads 4 --kv-heads 2 --inter 90 --vocab 256",
     4, BOTH, "intermediate_size"),
    ("vocab", "llama-tp3-v250", 3, ("vllm",), "vocab_size"),
]

# (label, gen.py options, config.json fields removed, layouts, the field the error names):
# biases in the checkpoint that its config.json does not enable, which the engine's model
# has no parameter for
BIAS_REFUSALS = [
    ("llama-qkv-bias", "llama --hidden 32 --heads 4 --kv-heads 2 --inter 64 --vocab 100"
     " --attention-bias", ["attention_bias"], BOTH, "attention_bias"),
    ("qwen3-qkv-bias", "qwen3 --hidden 32 --heads 4 --kv-heads 2 --head-dim 16 --inter 64"
     " --vocab 130 --attention-bias", ["attention_bias"], BOTH, "attention_bias"),
    ("llama-mlp-bias", "llama --hidden 32 --heads 4 --kv-heads 4 --inter 64 --vocab 100"
     " --mlp-bias", ["mlp_bias"], ("vllm",), "mlp_bias"),
]

# (SPLITS label, tp, layout) whose output is also put through check and a flipped bit
CHECKED = [("llama-v250-kv2", 8, "vllm"), ("gemma3-tied-kv1-v262", 2, "sglang"),
           ("qwen2-f16-v250", 4, "sglang")]


def tps(*args):
    p = subprocess.run([TPSHARD, *map(str, args)], capture_output=True, text=True, timeout=120)
    jsonlog.save(args, p)
    return p.returncode, p.stdout, p.stderr


def make_model(label, args):
    args = args.split()
    d = os.path.join(TMP, "m-" + label)
    if not os.path.exists(d):
        gen.main([args[0], d] + args[1:])
    return d



# ------------------------------------------------------------------ splits

def check_split(label, model, tp, layout):
    name = f"serving {layout} {label} tp {tp}"
    out = os.path.join(TMP, f"o-{label}-{layout}-tp{tp}")
    try:
        want = so.expected_ranks(model, layout, tp)
    except Exception as e:  # noqa: BLE001
        report(False, f"{name}: oracle", f"{type(e).__name__}: {e}")
        return None
    rc, so_, se = tps("split", model, "--tp", tp, "--layout", layout, "-o", out, "-q")
    if rc != 0:
        report(False, f"{name}: split", f"rc {rc}\n{se}{so_}")
        return None
    problems = ranktest.rank_file_problems(out, model, want, tp, engine=True)
    n = sum(len(w) for w in want)
    report(not problems, f"{name}: {tp} rank(s) hold exactly the oracle's {n} tensors, format pt",
           "\n".join(problems))
    # merge gives the source back
    merged = out + "-merged"
    rc, so_, se = tps("merge", out, "-o", merged, "-q")
    if rc != 0:
        report(False, f"{name}: merge", f"rc {rc}\n{se}{so_}")
        return out
    bad = []
    for fn in source_files(model):
        a, b = os.path.join(model, fn), os.path.join(merged, fn)
        if not os.path.exists(b):
            bad.append(f"{fn}: not written (merge wrote {sorted(os.listdir(merged))})")
            continue
        with open(a, "rb") as f, open(b, "rb") as g:
            x, y = f.read(), g.read()
        if x != y:
            bad.append(f"{fn}: {first_diff(x, y)}")
    report(not bad, f"{name}: merge gives back the source files byte for byte", "\n".join(bad))
    return out



def check_and_corrupt(out, label, tp, layout):
    name = f"serving {layout} {label} tp {tp}"
    rc, so_, se = tps("check", out)
    if rc != 0:
        report(False, f"{name}: check passes on the fresh split", f"rc {rc}\n{se}{so_}")
        return
    r = 1 if tp > 1 else 0
    target = None
    for path in sorted(glob.glob(os.path.join(out, f"model-rank-{r}-part-*.safetensors"))):
        with safe_open(path, framework="numpy") as h:
            if "model.layers.0.self_attn.qkv_proj.weight" in h.keys():
                target = path
    if target is None:
        report(False, f"{name}: check", f"no qkv_proj in rank {r}'s files")
        return
    flip_bit(target, "model.layers.0.self_attn.qkv_proj.weight")
    rc, so_, se = tps("check", out)
    report(rc != 0, f"{name}: check passes, and fails after one bit of rank {r}'s qkv_proj flips",
           f"check exited {rc} on the corrupted output\n{se}{so_}")


# ------------------------------------------------------------------ refusals

def check_refusal(label, model, tp, layout, field):
    name = f"serving {layout} refuses {label} at tp {tp}"
    config, _ = so.load_checkpoint(model)
    ok, why = so.accepts(config, tp, layout)
    if ok or not why.startswith(field):
        report(False, f"{name}: the oracle agrees", f"accepts() -> ({ok}, {why!r})")
        return
    out = os.path.join(TMP, f"r-{label}-{layout}-tp{tp}")
    rc, so_, se = tps("split", model, "--tp", tp, "--layout", layout, "-o", out, "-q")
    problems = ranktest.refusal_problems(rc, se, out, field, f"the engine's rule: {why}")
    report(not problems, f"{name}: exit 1, the error names {field}, no .safetensors written",
           "\n".join(problems + (["stderr: " + se.strip()] if se.strip() else [])))


def check_bias_refusal(label, model, layout, field):
    name = f"serving {layout} refuses {label} without {field}"
    config, tensors = so.load_checkpoint(model)
    try:
        so.expected_ranks_from(config, tensors, layout, 2)
        report(False, f"{name}: the oracle agrees", "the oracle places every tensor")
        return
    except so.Unsupported as e:
        if ".bias" not in str(e):
            report(False, f"{name}: the oracle agrees", str(e))
            return
    out = os.path.join(TMP, f"rb-{label}-{layout}")
    rc, so_, se = tps("split", model, "--tp", 2, "--layout", layout, "-o", out, "-q")
    problems = [] if rc == 1 else [f"exit {rc}"]
    if ".bias'" not in se or f"set {field}: true" not in se or f"layout {layout}" not in se:
        problems.append(f"the error does not name the bias, layout {layout} and {field}: {se.strip()}")
    if glob.glob(os.path.join(out, "*.safetensors")):
        problems.append("rank files written")
    report(not problems, f"{name}: the oracle finds no place for the bias; split exits 1 naming "
           f"it and {field}, writes nothing", "\n".join(problems))


def main():
    if not os.access(TPSHARD, os.X_OK):
        print(f"skip - serving layouts: no tpshard binary at {TPSHARD}")
        return 0
    rc, out, err = tps("split", "-h")
    if "--layout" not in out + err:
        report(False, "serving layouts: tpshard has no --layout "
                      "('tpshard split -h' does not mention it)")
        return 1
    models = {}
    for label, args, tps_, layouts in SPLITS:
        try:
            models[label] = make_model(label, args)
        except Exception as e:  # noqa: BLE001
            report(False, f"serving: gen.py {label}", f"{type(e).__name__}: {e}")
            continue
        for tp in tps_:
            for layout in layouts:
                try:
                    o = check_split(label, models[label], tp, layout)
                    if o and (label, tp, layout) in CHECKED:
                        check_and_corrupt(o, label, tp, layout)
                except Exception as e:  # noqa: BLE001
                    import traceback
                    report(False, f"serving {layout} {label} tp {tp} raised {type(e).__name__}",
                           traceback.format_exc())
    for label, model, tp, layouts, field in REFUSALS:
        try:
            m = models[model] if model in models else make_model("refuse-" + label, model)
            for layout in layouts:
                check_refusal(label, m, tp, layout, field)
        except Exception as e:  # noqa: BLE001
            import traceback
            report(False, f"serving refusal {label} raised {type(e).__name__}", traceback.format_exc())
    for label, args, fields, layouts, field in BIAS_REFUSALS:
        try:
            m = make_model("bias-" + label, args)
            cfg = os.path.join(m, "config.json")
            c = json.load(open(cfg))
            for f in fields:
                c.pop(f, None)
            json.dump(c, open(cfg, "w"), indent=2)
            for layout in layouts:
                check_bias_refusal(label, m, layout, field)
        except Exception as e:  # noqa: BLE001
            import traceback
            report(False, f"serving bias refusal {label} raised {type(e).__name__}",
                   traceback.format_exc())
    if not os.environ.get("KEEP_TMP"):
        shutil.rmtree(TMP, ignore_errors=True)
    return 1 if ranktest.fails() else 0


if __name__ == "__main__":
    sys.exit(main())
