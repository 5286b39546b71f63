"""The model families of issue 20 against their oracle (family_oracle.py):
Phi-3 (packed qkv_proj / gate_up_proj), Qwen3-MoE and Mixtral (experts, with
and without --ep), a family written by a user (--plan FILE), Mistral's DTensor
plan.

For each family x layout (dtensor, vllm, sglang) x tp (and --ep):
  - `tpshard split MODEL --tp N [--layout L] [--ep] -o OUT -q` writes
    OUT/model-rank-<r>-part-*.safetensors holding exactly the oracle's tensors
    for rank r (names, dtypes, shapes, bytes), each once, format pt, with
    config.json beside them;
  - `tpshard merge OUT` gives back the source files byte for byte;
  - on some: `tpshard check OUT` and `tpshard verify OUT --source MODEL`
    pass, and both fail once one bit of a rank's fused tensor (an expert
    stack, a packed qkv_proj) is flipped;
  - a model the layout refuses at that tp (heads the packed sections cannot
    split on, experts not divisible by the EP size, an expert intermediate
    size not divisible by tp, packed rows that disagree with the config, ...)
    makes split exit 1 naming the rule, and leaves no .safetensors file;
  - a large MoE (128 experts x 48 layers, tiny dims) splits, checks, verifies
    and merges with a bounded peak RSS (printed; time is not asserted).
The DTensor expectations follow transformers' own TP plans for these families
(Phi-3: the packed tensors Shard(0) as one block; Qwen3-MoE and Mixtral: every
expert's gate/up Shard(0) and down Shard(1)); the serving layouts follow the
engines' loaders (see family_oracle.py).  --ep is run for the serving layouts.
Until tpshard knows a family, its group prints one "not ok" line instead.
Run with build/venv/bin/python; env TPSHARD (binary), TOP (repo root), TPS_TMP
(scratch).  Prints "ok - ..." / "not ok - ..." / "skip - ..." lines.
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
TMP = tempfile.mkdtemp(prefix="pyfam.", dir=os.environ.get("TPS_TMP") or None)

try:
    import safetensors
    from safetensors import safe_open
except ImportError as e:  # pragma: no cover
    print(f"skip - family tests: {e}")
    sys.exit(0)

sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(TOP, "testdata"))
import family_oracle as fo  # noqa: E402
import ranktest  # noqa: E402
from ranktest import compare, first_diff, flip_bit, read_rank_files, report, source_files  # noqa: E402
import gen  # noqa: E402

ALL = ("dtensor", "vllm", "sglang")
SERVING = ("vllm", "sglang")

# Models: label -> (group, generator, keyword arguments).  group: the family
# group whose support is probed once (phi3, moe) or None (works today).
MODELS = {
    "phi3-kv2": ("phi3", fo.phi3_checkpoint, dict(hidden=64, heads=4, kv_heads=2, inter=96, vocab=256)),
    # Phi-4-mini style: tied, partial rotary; vocab 1000 is padded; 6 heads over kv 2
    "phi3-tied-v1000-f16-index2": ("phi3", fo.phi3_checkpoint,
                                   dict(hidden=48, heads=6, kv_heads=2, inter=96, vocab=1000, tied=True,
                                        dtype="F16", index=2)),
    "qwen3moe-e8": ("moe", fo.qwen3_moe_checkpoint,
                    dict(hidden=32, heads=4, kv_heads=2, head_dim=8, experts=8, moe_inter=16)),
    # a dense layer (mlp_only_layers): vLLM gives it a plain MLP, SGLang refuses
    "qwen3moe-dense1": ("moe", fo.qwen3_moe_checkpoint,
                        dict(hidden=32, heads=4, kv_heads=2, head_dim=8, experts=4, moe_inter=8,
                             inter=24, layers=3, mlp_only_layers=(1,))),
    "qwen3moe-f16-v1000-index3": ("moe", fo.qwen3_moe_checkpoint,
                                  dict(hidden=32, heads=8, kv_heads=4, head_dim=4, experts=8, moe_inter=8,
                                       vocab=1000, dtype="F16", index=3)),
    "mixtral-e8": ("moe", fo.mixtral_checkpoint, dict(hidden=32, heads=4, kv_heads=2, experts=8, inter=16)),
    "mixtral-e4-kv1": ("moe", fo.mixtral_checkpoint, dict(hidden=32, heads=4, kv_heads=1, experts=4, inter=8)),
    # head_dim 16 != hidden/heads 8: vLLM uses it, SGLang's Mixtral cannot
    "mixtral-hd16": ("moe", fo.mixtral_checkpoint,
                     dict(hidden=32, heads=4, kv_heads=2, experts=4, inter=8, head_dim=16)),
    "mistral-kv2-v1007": (None, lambda out, args: gen.main(["mistral", out] + args.split()),
                          dict(args="--hidden 64 --heads 8 --kv-heads 2 --head-dim 8 --inter 72 --vocab 1007")),
    "foo": (None, fo.user_checkpoint, dict(dim=32, n_heads=8, n_kv_heads=4, ffn=40, vocab=100)),
    # refusals
    "phi3-qkv-rows": ("phi3", fo.phi3_checkpoint, dict(hidden=32, heads=4, kv_heads=2, inter=32, vocab=128,
                                                      qkv_extra_rows=8)),
    "phi3-kv3": ("phi3", fo.phi3_checkpoint, dict(hidden=48, heads=12, kv_heads=3, inter=48, vocab=128)),
    "phi3-h6": ("phi3", fo.phi3_checkpoint, dict(hidden=48, heads=6, kv_heads=6, inter=48, vocab=128)),
    "phi3-i90": ("phi3", fo.phi3_checkpoint, dict(hidden=32, heads=4, kv_heads=2, inter=90, vocab=128)),
    "qwen3moe-mi12-h8": ("moe", fo.qwen3_moe_checkpoint,
                         dict(hidden=32, heads=8, kv_heads=8, head_dim=4, experts=8, moe_inter=12,
                              vocab=128)),
    "qwen3moe-e6": ("moe", fo.qwen3_moe_checkpoint,
                    dict(hidden=32, heads=4, kv_heads=2, head_dim=8, experts=6, moe_inter=8, vocab=128)),
    "qwen3moe-e2": ("moe", fo.qwen3_moe_checkpoint,
                    dict(hidden=32, heads=4, kv_heads=2, head_dim=8, experts=2, moe_inter=8, vocab=128)),
    "mixtral-i12-h8": ("moe", fo.mixtral_checkpoint,
                       dict(hidden=32, heads=8, kv_heads=8, experts=8, inter=12, vocab=128)),
    "mixtral-e6": ("moe", fo.mixtral_checkpoint, dict(hidden=32, heads=4, kv_heads=2, experts=6, inter=8,
                                                     vocab=128)),
}

# (model label, layout, tp, ep)
SPLITS = (
    [("phi3-kv2", "dtensor", tp, False) for tp in (1, 2, 3, 4)]
    + [("phi3-kv2", "vllm", tp, False) for tp in (1, 2, 4)]
    + [("phi3-kv2", "sglang", tp, False) for tp in (2, 4)]
    + [("phi3-tied-v1000-f16-index2", lay, tp, False)
       for lay, tp in (("dtensor", 2), ("vllm", 2), ("sglang", 6))]
    + [("qwen3moe-e8", "dtensor", tp, False) for tp in (1, 2)]
    + [("qwen3moe-e8", lay, tp, ep) for lay in SERVING for tp, ep in ((1, False), (2, False), (4, False),
                                                                     (2, True), (4, True))]
    + [("qwen3moe-dense1", lay, 2, ep) for lay, ep in (("dtensor", False), ("vllm", False), ("vllm", True))]
    + [("qwen3moe-f16-v1000-index3", lay, tp, ep)
       for lay, tp, ep in (("vllm", 4, True), ("sglang", 4, False), ("dtensor", 4, False))]
    + [("qwen3moe-mi12-h8", lay, 8, True) for lay in SERVING]     # --ep: no intermediate condition
    + [("mixtral-e8", "dtensor", tp, False) for tp in (1, 2)]
    + [("mixtral-e8", lay, tp, ep) for lay in SERVING for tp, ep in ((2, False), (4, False), (4, True))]
    + [("mixtral-e8", "vllm", 2, True)]
    + [("mixtral-e4-kv1", lay, 4, ep) for lay, ep in (("vllm", True), ("sglang", False), ("sglang", True))]
    + [("mixtral-hd16", "vllm", 2, False)]
    + [("mistral-kv2-v1007", "dtensor", tp, False) for tp in (1, 2)]
)

# (label, model, layouts, tp, ep, word the error must contain)
REFUSALS = [
    ("packed rows disagree with the config", "phi3-qkv-rows", ALL, 2, False, "qkv_proj"),
    ("KV heads the packed qkv_proj cannot split on", "phi3-kv3", SERVING, 2, False, "num_key_value_heads"),
    ("tp not a multiple of the packed KV heads", "phi3-kv3", SERVING, 4, False, "num_key_value_heads"),
    ("query heads the packed qkv_proj cannot split on", "phi3-h6", SERVING, 4, False, "num_attention_heads"),
    ("packed gate_up_proj intermediate", "phi3-i90", SERVING, 4, False, "intermediate_size"),
    ("expert intermediate size", "qwen3moe-mi12-h8", ALL, 8, False, "moe_intermediate_size"),
    ("experts not divisible by the EP size", "qwen3moe-e6", SERVING, 4, True, "num_experts"),
    ("more ranks than experts", "qwen3moe-e2", SERVING, 4, False, "num_experts"),
    ("SGLang gives every Qwen3-MoE layer experts", "qwen3moe-dense1", ("sglang",), 2, False,
     "mlp_only_layers"),
    ("expert intermediate size", "mixtral-i12-h8", ALL, 8, False, "intermediate_size"),
    ("experts not divisible by the EP size", "mixtral-e6", SERVING, 4, True, "num_local_experts"),
    ("SGLang's Mixtral takes head_dim from hidden/heads", "mixtral-hd16", ("sglang",), 2, False, "head_dim"),
    ("Mistral KV heads (DTensor)", "mistral-kv2-v1007", ("dtensor",), 4, False, "num_key_value_heads"),
]

# (model, layout, tp, ep, tensor to corrupt on the last rank) put through check and verify
CHECKED = [
    ("phi3-kv2", "vllm", 4, False, "model.layers.0.self_attn.qkv_proj.weight"),
    ("phi3-kv2", "dtensor", 3, False, "model.layers.1.mlp.gate_up_proj.weight"),
    ("qwen3moe-e8", "vllm", 4, True, "model.layers.1.mlp.experts.routed_experts.w13_weight"),
    ("qwen3moe-e8", "sglang", 2, False, "model.layers.0.mlp.experts.w2_weight"),
    ("qwen3moe-e8", "dtensor", 2, False, "model.layers.0.mlp.experts.5.up_proj.weight"),
    ("mixtral-e8", "vllm", 2, False, "model.layers.0.block_sparse_moe.experts.routed_experts.w13_weight"),
    ("mixtral-e8", "sglang", 4, True, "model.layers.1.block_sparse_moe.experts.w13_weight"),
]


def tps(*args, timeout=120):
    p = subprocess.run([TPSHARD, *map(str, args)], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def tps_rss(*args, timeout=600):
    """(rc, stdout, stderr, peak RSS in KiB of this run alone). Measured by
    build/tests/peakrss: a child of this Python process would start with its
    high-water mark (ru_maxrss keeps it across exec)."""
    peak = os.path.join(TOP, "build", "tests", "peakrss")
    with tempfile.TemporaryDirectory() as td:
        out = os.path.join(td, "rss")
        p = subprocess.run([peak, out, TPSHARD, *map(str, args)], capture_output=True, text=True,
                           timeout=timeout)
        with open(out) as f:
            kib = int(f.read())
    return p.returncode, p.stdout, p.stderr, kib


def make_model(label):
    group, fn, kw = MODELS[label]
    d = os.path.join(TMP, "m-" + label)
    if not os.path.exists(os.path.join(d, "config.json")):
        fn(d, **kw)
    return d


def split_args(model, tp, layout, ep, out):
    a = ["split", model, "--tp", tp, "-o", out, "-q"]
    if layout != "dtensor":
        a += ["--layout", layout]
    if ep:
        a.append("--ep")
    return a


def case_name(label, layout, tp, ep):
    return f"{label} {layout} tp {tp}" + (" --ep" if ep else "")



# ------------------------------------------------------------------ checks

def check_rank_files(out, model, want, tp, name):
    problems = ranktest.rank_file_problems(out, model, want, tp)
    n = sum(len(w) for w in want)
    report(not problems, f"{name}: {tp} rank(s) hold exactly the oracle's {n} tensors, format pt",
           "\n".join(problems))
    return not problems


def check_merge(out, model, name):
    merged = out + "-merged"
    rc, so_, se = tps("merge", out, "-o", merged, "-q")
    if rc != 0:
        report(False, f"{name}: merge", f"rc {rc}\n{se}{so_}")
        return
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
    shutil.rmtree(merged, ignore_errors=True)


def check_split(label, layout, tp, ep, plan=None):
    name = "families: " + case_name(label, layout, tp, ep)
    model = make_model(label)
    out = os.path.join(TMP, "o-" + case_name(label, layout, tp, ep).replace(" ", "_"))
    try:
        if plan is None:
            want = fo.expected_ranks(model, layout, tp, ep)
        else:
            want = fo.expected_ranks(model, "dtensor", tp, plan=fo.USER_RULES)
    except Exception as e:  # noqa: BLE001
        report(False, f"{name}: oracle", f"{type(e).__name__}: {e}")
        return None
    args = split_args(model, tp, layout, ep, out)
    if plan is not None:
        args += ["--plan", plan]
    rc, so_, se = tps(*args)
    if rc != 0:
        report(False, f"{name}: split", f"rc {rc}\n{se}{so_}")
        return None
    check_rank_files(out, model, want, tp, name)
    check_merge(out, model, name)
    return out


def verify_kinds(out, model):
    """verify OUT --source MODEL --json: (exit status, {check: kind}, stderr)."""
    rc, so_, se = tps("verify", out, "--source", model, "--json")
    try:
        rows = json.loads(so_).get("checks") or []
    except ValueError:
        rows = []
    return rc, {c.get("check"): c.get("kind") for c in rows}, se


def check_and_corrupt(out, model, label, layout, tp, ep, tensor):
    name = "families: " + case_name(label, layout, tp, ep)
    for what, args in (("check", ["check", out]), ("verify --source", ["verify", out, "--source", model, "-q"])):
        rc, so_, se = tps(*args)
        report(rc == 0, f"{name}: {what} passes on the fresh split", f"rc {rc}\n{se}{so_}")
    if ep:
        # an expert under --ep is whole on one rank: verify says "whole", not "replicated"
        rc, by_check, se = verify_kinds(out, model)
        kinds = {}
        for check, kind in by_check.items():
            if ".experts." in check and check.endswith(".weight"):
                kinds[kind] = kinds.get(kind, 0) + 1
        report(rc == 0 and set(kinds) == {"whole"}, f"{name}: verify calls every expert tensor whole "
               f"({kinds.get('whole', 0)} of them), none replicated", f"rc {rc} kinds {kinds}\n{se}")
    r = tp - 1
    target = None
    for path in sorted(glob.glob(os.path.join(out, f"model-rank-{r}-part-*.safetensors"))):
        with safe_open(path, framework="numpy") as h:
            if tensor in h.keys():
                target = path
    if target is None:
        report(False, f"{name}: corrupt {tensor}", f"rank {r} has no {tensor}")
        return
    flip_bit(target, tensor)
    for what, args in (("check", ["check", out]), ("verify --source", ["verify", out, "--source", model, "-q"])):
        rc, so_, se = tps(*args)
        report(rc != 0, f"{name}: {what} fails after one bit of rank {r}'s {tensor.split('.', 3)[3]} flips",
               f"{what} exited {rc} on the corrupted output\n{se}{so_}")


def check_refusal(label, model_label, layout, tp, ep, word):
    name = f"families: {layout} refuses {model_label} at tp {tp}" + (" --ep" if ep else "") + f" ({label})"
    model = make_model(model_label)
    config, tensors = fo.so.load_checkpoint(model)
    ok, why = fo.accepts(config, tp, layout, ep, tensors)
    if ok or word not in why:
        report(False, f"{name}: the oracle agrees", f"accepts() -> ({ok}, {why!r})")
        return
    out = os.path.join(TMP, "r-" + case_name(model_label, layout, tp, ep).replace(" ", "_"))
    rc, so_, se = tps(*split_args(model, tp, layout, ep, out))
    problems = ranktest.refusal_problems(rc, se, out, word, f"the rule: {why}")
    # plan says the same before anything is written: a failed check naming it
    pargs = ["plan", model, "--tp", tp, "--json"] + split_args(model, tp, layout, ep, out)[7:]
    prc, pso, pse = tps(*pargs)
    try:
        checks = json.loads(pso).get("checks") or []
    except ValueError:
        checks = []
    if prc != 1 or not any(c.get("verdict") == "fail" and word in json.dumps(c) for c in checks):
        problems.append(f"plan {' '.join(map(str, pargs[2:]))}: exit {prc}, no failed check naming {word}: "
                        f"{checks}\n{pse.strip()}")
    report(not problems, f"{name}: exit 1, the error names {word}, no .safetensors written; plan's "
                         f"checks show it", "\n".join(problems + (["stderr: " + se.strip()] if se.strip() else [])))


def check_partial_kinds():
    """A --ranks directory: verify refuses it while ranks are missing (one
    error naming them, exit 3, as check); once the runs have joined, a tensor
    on every rank is 'replicated' and an --ep expert is 'whole'."""
    model = make_model("qwen3moe-e8")
    for ep in (False, True):
        out = os.path.join(TMP, "o-partial" + ("-ep" if ep else ""))
        rc, so_, se = tps(*split_args(model, 4, "vllm", ep, out), "--ranks", "0-1")
        rcp, sop, sep = tps("verify", out, "--source", model)
        report(rc == 0 and rcp == 3 and "partial: ranks 2,3 are not written" in sep and not sop,
               f"families: verify of a --ranks 0-1 directory (vllm tp 4{' --ep' if ep else ''}): one "
               f"error naming ranks 2,3, exit 3", f"split rc {rc} {se}; verify rc {rcp}\n{sep}{sop}")
        rc1, so_, se1 = tps(*split_args(model, 4, "vllm", ep, out), "--ranks", "2-3")
        rc2, so2, se2 = tps("verify", out, "--source", model, "--json")
        try:
            rows = json.loads(so2).get("checks") or []
        except ValueError:
            rows = []
        norm = {c.get("kind") for c in rows if c.get("check") == "model.norm.weight"}
        expert = {c.get("kind") for c in rows
                  if c.get("check") == "model.layers.0.mlp.experts.0.up_proj.weight"}
        want_expert = "whole" if ep else "reconstruct"
        report(rc1 == 0 and rc2 == 0 and "replicated" in norm and want_expert in expert,
               f"families: verify of --ranks 0-1 and 2-3 joined (vllm tp 4{' --ep' if ep else ''}): the "
               f"final norm is replicated, an expert {want_expert}",
               f"split rc {rc1} {se1}; verify rc {rc2}: norm {norm!r}, expert {expert!r}\n{se2}")
        shutil.rmtree(out, ignore_errors=True)


# ------------------------------------------------------------------ the user's family

def test_user_plan():
    model = make_model("foo")
    plan = os.path.join(TMP, "foo.yaml")
    with open(plan, "w") as f:
        f.write(fo.USER_PLAN)
    out = os.path.join(TMP, "o-foo-noplan")
    rc, so_, se = tps("split", model, "--tp", 2, "-o", out, "-q")
    left = glob.glob(os.path.join(out, "*.safetensors"))
    report(rc != 0 and "--plan" in se and not left,
           "families: FooForCausalLM without --plan: no built-in plan, the error points to --plan, "
           "nothing written", f"rc {rc}\n{se}{so_}")
    for tp in (1, 2, 4):
        o = check_split("foo", "dtensor", tp, False, plan=plan)
        if o and tp == 4:
            check_and_corrupt(o, model, "foo", "dtensor", tp, False, "foo.blocks.1.attn.wq.weight")
    # the plan's own check: n_heads 8 at tp 3
    config, _ = fo.so.load_checkpoint(model)
    ok, why = fo.user_accepts(config, 3)
    out = os.path.join(TMP, "r-foo-tp3")
    rc, so_, se = tps("split", model, "--tp", 3, "--plan", plan, "-o", out, "-q")
    left = glob.glob(os.path.join(out, "*.safetensors"))
    report(not ok and rc == 1 and "n_heads" in se and not left,
           "families: the user plan's check refuses n_heads 8 at tp 3 (exit 1, names n_heads, nothing "
           "written)", f"oracle ({ok}, {why!r}); rc {rc}\n{se}{so_}")


# ------------------------------------------------------------------ packed tensors in reports

def test_packed_reports():
    """A packed tensor in a serving layout puts several row ranges on a rank:
    plan --json says all of the rank's rows, and verify --tensors selecting
    only packed tensors checks them (not 'matches no tensor')."""
    model = make_model("phi3-kv2")
    want = fo.expected_ranks(model, "vllm", 4)
    name = "model.layers.0.self_attn.qkv_proj.weight"
    rows = want[0][name][1][0]
    rc, out, err = tps("plan", model, "--tp", "4", "--layout", "vllm", "--json")
    doc = json.loads(out) if rc == 0 else {}
    ent = next((t for t in doc.get("tensors", []) if t.get("name") == name), {})
    shapes = [ls[0] for ls in ent.get("local_shapes", [])]
    report(rc == 0 and shapes == [rows] * 4,
           f"families: plan --json gives each rank all {rows} rows of the packed {name} (vllm tp 4)",
           f"rc {rc}; local_shapes rows {shapes}\n{err}")
    out_dir = os.path.join(TMP, "o-packed-reports")
    rc, so_, se = tps("split", model, "--tp", "4", "--layout", "vllm", "-o", out_dir, "-q")
    rc2, so2, se2 = tps("verify", out_dir, "--source", model, "--tensors", "*qkv_proj*", "--json")
    doc = json.loads(so2) if so2.strip().startswith("{") else {}
    kinds = sorted({c.get("kind") for c in doc.get("checks", [])})
    report(rc == 0 and rc2 == 0 and doc.get("ok") is True and "colwise" in kinds,
           "families: verify --tensors '*qkv_proj*' checks the packed tensors alone (reconstruct, colwise)",
           f"split rc {rc} {se}; verify rc {rc2}; kinds {kinds}\n{se2}{so2[:400]}")


# ------------------------------------------------------------------ a large MoE

def test_large_moe(ep_ok):
    """128 experts x 48 layers of tiny tensors (~18.6k tensors): split, check,
    verify and merge must not grow with tensors x ranks beyond reason."""
    model = os.path.join(TMP, "m-large-moe")
    fo.qwen3_moe_checkpoint(model, hidden=8, heads=8, kv_heads=8, head_dim=4, experts=128, moe_inter=8,
                            vocab=64, layers=48, top_k=8)
    ntensors = 48 * (128 * 3 + 9) + 3
    runs = [("vllm", 8, ep_ok), ("dtensor", 8, False)]
    for layout, tp, ep in runs:
        name = f"families: large MoE (128 experts x 48 layers, {ntensors} tensors) {layout} tp {tp}" + \
            (" --ep" if ep else "")
        out = os.path.join(TMP, f"o-large-{layout}")
        rss, problems = {}, []
        # two threads, as the bar is set (each thread holds two copy buffers)
        rc, so_, se, rss["split"] = tps_rss(*split_args(model, tp, layout, ep, out), "--threads", 2)
        if rc != 0:
            report(False, f"{name}: split", f"rc {rc}\n{se}{so_}")
            continue
        want = fo.expected_ranks(model, layout, tp, ep)
        ranks, problems = read_rank_files(out, tp)
        for r in sorted(ranks):
            problems += compare(want[r], ranks[r], f"rank {r}")[:5]
        del want, ranks
        for what, args in (("check", ["check", out, "-q"]),
                           ("verify", ["verify", out, "--source", model, "-q"]),
                           ("merge", ["merge", out, "-o", out + "-merged", "-q"])):
            rc, so_, se, rss[what] = tps_rss(*args)
            if rc != 0:
                problems.append(f"{what} exited {rc}: {(se or so_).strip()[:300]}")
        if not problems:
            with open(os.path.join(model, "model.safetensors"), "rb") as f, \
                    open(os.path.join(out + "-merged", "model.safetensors"), "rb") as g:
                if f.read() != g.read():
                    problems.append("merge did not give back model.safetensors byte for byte")
        # split's bar is any split's (64 MiB); check, verify and merge hold
        # every rank file's header at once, verify the layout too (151k rank
        # tensors: 48-76 MiB measured), 128 MiB
        big = {k: v for k, v in rss.items() if v > (64 if k == "split" else 128) * 1024}
        # a sanitized build's redzones and quarantine inflate RSS: the bar is
        # for the real build (make test SANITIZE=... says so in TPS_SANITIZE)
        if big and not os.environ.get("TPS_SANITIZE"):
            problems.append(f"peak RSS above the bar (split 64 MiB, others 128 MiB): {big} KiB")
        shown = ", ".join(f"{k} {v / 1024:.0f} MiB" for k, v in rss.items())
        report(not problems, f"{name}: oracle's tensors, check, verify --source, merge pass; peak RSS "
                             f"{shown}" + (" (sanitized build: no RSS bar)"
                                           if os.environ.get("TPS_SANITIZE") else ""),
               "\n".join(problems))
        shutil.rmtree(out + "-merged", ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)


# ------------------------------------------------------------------ probes

def probe(group, kind):
    """None when tpshard splits a tiny model of the group in that kind of layout
    (dtensor, or the serving layouts), else (layout, why not)."""
    model, what = ((make_model("phi3-kv2"), "Phi3ForCausalLM") if group == "phi3"
                   else (make_model("qwen3moe-e8"), "Qwen3MoeForCausalLM"))
    for layout in (("dtensor",) if kind == "dtensor" else SERVING):
        args = ["split", model, "--tp", 2, "--dry-run", "-q"]
        if layout != "dtensor":
            args += ["--layout", layout]
        rc, so_, se = tps(*args)
        if rc != 0:
            line = (se or so_).replace(TMP + os.sep, "").strip().splitlines()[:1]
            return layout, f"split --tp 2 of a tiny {what} exits {rc}: {line[0] if line else ''}"
    return None


def main():
    if not os.access(TPSHARD, os.X_OK):
        print(f"skip - families: no tpshard binary at {TPSHARD}")
        return 0
    rc, out, err = tps("split", "-h")
    ep_ok = "--ep" in out + err
    known = {}  # (group, "dtensor" | "serving") -> bool
    for group, what in (("phi3", "phi3"), ("moe", "qwen3_moe/mixtral")):
        whys = {}  # message -> layouts
        for kind in ("dtensor", "serving"):
            try:
                why = probe(group, kind)
            except Exception as e:  # noqa: BLE001
                why = (kind, f"{type(e).__name__}: {e}")
            known[(group, kind)] = not why
            if why:
                whys.setdefault(why[1], []).append(why[0])
        if whys:
            text = "; ".join(f"{', '.join(lays)}: {msg}" for msg, lays in whys.items())
            report(False, f"families: tpshard does not know {what} yet ({text})")
    if not ep_ok:
        report(False, "families: tpshard split has no --ep yet ('tpshard split -h' does not mention it); "
                      "the expert-parallel splits are not run")
    def runs(label, layout, ep):
        group = MODELS[label][0]
        kind = "dtensor" if layout == "dtensor" else "serving"
        return (not group or known[(group, kind)]) and (ep_ok or not ep)

    for label, layout, tp, ep in SPLITS:
        if not runs(label, layout, ep):
            continue
        try:
            o = check_split(label, layout, tp, ep)
            for c in CHECKED:
                if o and c[:4] == (label, layout, tp, ep):
                    check_and_corrupt(o, make_model(label), label, layout, tp, ep, c[4])
        except Exception as e:  # noqa: BLE001
            import traceback
            report(False, f"families: {case_name(label, layout, tp, ep)} raised {type(e).__name__}",
                   traceback.format_exc())
    for label, model, layouts, tp, ep, word in REFUSALS:
        for layout in layouts:
            if not runs(model, layout, ep):
                continue
            try:
                check_refusal(label, model, layout, tp, ep, word)
            except Exception as e:  # noqa: BLE001
                import traceback
                report(False, f"families: refusal {label} ({layout}) raised {type(e).__name__}",
                       traceback.format_exc())
    if known[("moe", "serving")] and ep_ok:
        try:
            check_partial_kinds()
        except Exception as e:  # noqa: BLE001
            import traceback
            report(False, f"families: partial kinds raised {type(e).__name__}", traceback.format_exc())
    if known[("phi3", "serving")]:
        try:
            test_packed_reports()
        except Exception as e:  # noqa: BLE001
            import traceback
            report(False, f"families: packed reports raised {type(e).__name__}", traceback.format_exc())
    try:
        test_user_plan()
    except Exception as e:  # noqa: BLE001
        import traceback
        report(False, f"families: user plan raised {type(e).__name__}", traceback.format_exc())
    if known[("moe", "serving")] and known[("moe", "dtensor")]:
        try:
            test_large_moe(ep_ok)
        except Exception as e:  # noqa: BLE001
            import traceback
            report(False, f"families: large MoE raised {type(e).__name__}", traceback.format_exc())
    if not os.environ.get("KEEP_TMP"):
        shutil.rmtree(TMP, ignore_errors=True)
    return 1 if ranktest.fails() else 0


if __name__ == "__main__":
    sys.exit(main())
