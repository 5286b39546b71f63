"""`tpshard split --tp T --pp P --layout vllm` against pp_oracle.py: each
worker's file holds exactly what vLLM 0.33 builds on that worker.

The TP-only state dict of each rank comes from the oracles that do not read
tpshard (serving_oracle.py for the dense families, family_oracle.py for the
mixtures of experts, --ep included, moe_quant_oracle.py for FP8 ones); pp_oracle.py then gives each stage what
vLLM's model code builds there (get_pp_indices, first/last or every stage).
For each case:
  - the files are exactly model-pp-{s}-tp-{r}-part-*.safetensors for s < P,
    r < T (no model-rank-* file), read by the reference safetensors library,
    each holding exactly the oracle's tensors of worker (s, r) (names,
    dtypes, shapes, bytes), with __metadata__ pp_rank, pp_size, tp_rank;
  - an explicit --pp-layers and VLLM_PP_LAYER_PARTITION give the oracle's
    stages for that partition.
Run with build/venv/bin/python; env TPSHARD (binary), TOP (repo root),
TPS_TMP (scratch).  Prints "ok - ..." / "not ok - ..." / "skip - ..." lines.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.environ.get("TOP") or os.path.dirname(os.path.dirname(HERE))
TPSHARD = os.environ.get("TPSHARD") or os.path.join(TOP, "tpshard")
TMP = tempfile.mkdtemp(prefix="pypp.", dir=os.environ.get("TPS_TMP") or None)

try:
    import safetensors
    from safetensors import safe_open
except ImportError as e:  # pragma: no cover
    print(f"skip - pipeline layout tests: {e}")
    sys.exit(0)

sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(TOP, "testdata"))
import gen  # noqa: E402
import serving_oracle as so  # noqa: E402
import family_oracle as fo  # noqa: E402
import pp_oracle as ppo  # noqa: E402
import moe_quant_oracle as mqo  # noqa: E402
import ranktest  # noqa: E402
from ranktest import report  # noqa: E402
import jsonlog  # noqa: E402

PP_FILE = re.compile(r"^model-pp-(\d+)-tp-(\d+)-part-(\d+)\.safetensors$")

# label -> how to make it; "dense" models come from testdata/gen.py
MODELS = {
    "llama-5l": ("dense", "llama --layers 5 --hidden 32 --heads 4 --kv-heads 2 --inter 64 --vocab 100"),
    "qwen3-tied-4l": ("dense", "qwen3 --layers 4 --hidden 32 --heads 4 --kv-heads 2 --inter 64"
                               " --vocab 1007 --tied"),
    "llama-tied-7l": ("dense", "llama --layers 7 --hidden 32 --heads 4 --kv-heads 4 --inter 64"
                               " --vocab 250 --tied"),
    # vocabulary 100 at tp 8: padded to 128, the last rank's real rows empty
    "llama-tied-v100": ("dense", "llama --layers 2 --hidden 64 --heads 8 --kv-heads 8 --inter 64"
                                 " --vocab 100 --tied"),
    "qwen3moe-v100": ("moe", lambda out: fo.qwen3_moe_checkpoint(out, heads=8, kv_heads=8,
                                                                 vocab=100, experts=8, layers=2)),
    "qwen3moe-3l": ("moe", lambda out: fo.qwen3_moe_checkpoint(out, layers=3)),
    "qwen3moe-tied-4l": ("moe", lambda out: fo.qwen3_moe_checkpoint(out, layers=4, tied=True)),
    "mixtral-4l": ("moe", lambda out: fo.mixtral_checkpoint(out, layers=4)),
    # FP8 experts (block and per-tensor scales) and attention
    "qwen3moe-fp8block-3l": ("fp8", lambda out: mqo.build(out, "qwen3_moe", "fp8-block", layers=3)),
    "mixtral-cttensor-3l": ("fp8", lambda out: mqo.build(out, "mixtral", "ct-tensor", layers=3)),
}

# (model, tp, pp, extra split arguments, ep, env partition, oracle partition)
CASES = [
    ("llama-5l", 2, 2, [], False, None, None),
    ("llama-5l", 1, 3, [], False, None, None),
    ("llama-5l", 2, 2, ["--pp-layers", "1,4"], False, None, [1, 4]),
    ("llama-5l", 1, 2, [], False, "4,1", [4, 1]),
    ("qwen3-tied-4l", 2, 2, [], False, None, None),
    ("qwen3-tied-4l", 1, 3, [], False, None, None),
    ("llama-tied-7l", 2, 3, [], False, None, None),
    ("llama-tied-v100", 8, 2, [], False, None, None),
    ("qwen3moe-v100", 8, 2, ["--ep"], True, None, None),
    ("qwen3moe-3l", 2, 2, [], False, None, None),
    ("qwen3moe-3l", 1, 3, [], False, None, None),
    ("qwen3moe-tied-4l", 2, 2, [], False, None, None),
    ("mixtral-4l", 2, 2, ["--ep"], True, None, None),
    ("mixtral-4l", 2, 4, [], False, None, None),
    ("qwen3moe-fp8block-3l", 2, 2, [], False, None, None),
    ("qwen3moe-fp8block-3l", 2, 3, ["--ep"], True, None, None),
    ("mixtral-cttensor-3l", 1, 3, [], False, None, None),
]


def tps(*args, env=None):
    e = dict(os.environ)
    e.pop("VLLM_PP_LAYER_PARTITION", None)
    if env:
        e.update(env)
    p = subprocess.run([TPSHARD, *map(str, args)], capture_output=True, text=True, timeout=120,
                       env=e)
    jsonlog.save(args, p)
    return p.returncode, p.stdout, p.stderr


def make_model(label):
    kind, how = MODELS[label]
    d = os.path.join(TMP, "m-" + label)
    if not os.path.exists(d):
        if kind == "dense":
            args = how.split()
            gen.main([args[0], d] + args[1:])
        else:
            how(d)
    return d


def read_workers(out, tp, pp):
    """-> ({(stage, rank): {name: (dtype, shape, bytes)}}, problems)."""
    workers, problems = {}, []
    for path in sorted(glob.glob(os.path.join(out, "*.safetensors"))):
        base = os.path.basename(path)
        m = PP_FILE.match(base)
        if not m:
            problems.append(f"{base}: not a model-pp-<s>-tp-<r>-part-<p>.safetensors name")
            continue
        s, r = int(m.group(1)), int(m.group(2))
        if s >= pp or r >= tp:
            problems.append(f"{base}: worker ({s}, {r}) at tp {tp} x pp {pp}")
            continue
        with safe_open(path, framework="numpy") as h:
            meta = h.metadata() or {}
        with open(path, "rb") as f:
            items = safetensors.deserialize(f.read())
        want_meta = {"format": "pt", "pp_rank": str(s), "pp_size": str(pp), "tp_rank": str(r),
                     "tp_size": str(tp)}
        for k, v in want_meta.items():
            if meta.get(k) != v:
                problems.append(f"{base}: __metadata__ {k} is {meta.get(k)!r}, not {v!r}")
        mine = workers.setdefault((s, r), {})
        for n, i in items:
            if n in mine:
                problems.append(f"{base}: {n} is also in another part of worker ({s}, {r})")
            mine[n] = (i["dtype"], list(i["shape"]), bytes(i["data"]))
    for s in range(pp):
        for r in range(tp):
            if (s, r) not in workers:
                problems.append(f"worker ({s}, {r}) has no file (vLLM refuses to load)")
    return workers, problems


def check_case(label, tp, pp, extra, ep, env, layers):
    name = f"pp vllm {label} tp {tp} x pp {pp}" + (" " + " ".join(extra) if extra else "") + \
        (f" VLLM_PP_LAYER_PARTITION={env}" if env else "")
    model = make_model(label)
    out = os.path.join(TMP, "o-" + re.sub(r"[^A-Za-z0-9]+", "-", name))
    import json
    with open(os.path.join(model, "config.json")) as f:
        config = json.load(f)
    kind = MODELS[label][0]
    base = (so.expected_ranks(model, "vllm", tp) if kind == "dense"
            else fo.expected_ranks(model, "vllm", tp, ep=ep) if kind == "moe"
            else mqo.expected_ranks(model, "vllm", tp, ep=ep))
    want = ppo.split_stages(base, config, tp, pp, layers)
    rc, so_, se = tps("split", model, "--tp", tp, "--pp", pp, "--layout", "vllm", "-o", out, "-q",
                      *extra, env={"VLLM_PP_LAYER_PARTITION": env} if env else None)
    if rc != 0:
        report(False, f"{name}: split", f"rc {rc}\n{se}{so_}")
        return
    got, problems = read_workers(out, tp, pp)
    for key in sorted(got):
        problems += ranktest.compare(want[key], got[key], f"worker {key}", engine=True)
    n = sum(len(w) for w in want.values())
    rule = ppo.stage_rule(config)
    report(not problems, f"{name}: {tp * pp} workers hold exactly the oracle's {n} tensors "
                         f"(stages {layers or ppo.partition(config['num_hidden_layers'], pp)}, "
                         f"{rule.replace('_', '/')} stage rule)", "\n".join(problems))


def main():
    if not os.access(TPSHARD, os.X_OK):
        print(f"skip - pipeline layouts: no tpshard binary at {TPSHARD}")
        return 0
    rc, out, err = tps("split", "-h")
    if "--pp" not in out + err:
        report(False, "pipeline layouts: tpshard split has no --pp ('tpshard split -h' does not "
                      "mention it)")
        return 1
    # the oracle's own partition against the values vLLM's get_pp_indices gives
    for (L, P), parts in {(5, 2): [3, 2], (7, 3): [2, 3, 2], (4, 3): [1, 2, 1],
                          (61, 4): [15, 15, 16, 15], (8, 4): [2, 2, 2, 2]}.items():
        report(ppo.partition(L, P) == parts, f"pp oracle: {L} layers over {P} stages are {parts}",
               f"got {ppo.partition(L, P)}")
    for case in CASES:
        try:
            check_case(*case)
        except Exception as e:  # noqa: BLE001
            import traceback
            report(False, f"pp vllm {case[0]} tp {case[1]} x pp {case[2]} raised "
                          f"{type(e).__name__}", traceback.format_exc())
    if not os.environ.get("KEEP_TMP"):
        shutil.rmtree(TMP, ignore_errors=True)
    return 1 if ranktest.fails() else 0


if __name__ == "__main__":
    sys.exit(main())
