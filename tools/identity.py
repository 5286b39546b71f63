#!/usr/bin/env python3
"""Shows that a change to tpshard left its output unchanged: runs two builds
of tpshard over the same set of cases and compares what they write, byte for
byte.

    build/venv/bin/python tools/identity.py OLD_TPSHARD NEW_TPSHARD [SCRATCH]

The cases: every split case of testdata/conformance (with its layout), the
family models of tests/py/test_families.py with their splits, the quantized
presets of tests/py/test_quant.py with theirs, the tiny families of
testdata/gen.py in every layout at tp 1, 2, 3, 4 and 8, and a few options
(--max-part-size, --untie, --ranks, a split of a split). For each, both
builds run the same command into their own directory; then
  - an accepted split: the same file names, and every file (rank files,
    tpshard.json, config.json, ...) equal byte for byte (cmp);
  - a refused one: the same exit status and the same message;
  - `plan --json` of every model and layout: the same document.
Prints one line per difference and a closing summary with the counts of
files compared; exits 1 when anything differs. Scratch defaults to a
temporary directory, removed at the end.
"""
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(TOP, "tests", "py"))
sys.path.insert(0, os.path.join(TOP, "testdata"))


def run(binary, args):
    p = subprocess.run([binary, *map(str, args)], capture_output=True, text=True, timeout=600)
    # the binary's own path never shows in a message; a scratch path may
    return p.returncode, p.stdout, p.stderr


class Compare:
    def __init__(self, old, new, scratch):
        self.old, self.new, self.scratch = old, new, scratch
        self.cases = self.files = self.refusals = self.plans = 0
        self.diffs = []
        self.n = 0

    def differ(self, what):
        self.diffs.append(what)
        print("DIFF", what, flush=True)

    def split(self, label, model, args):
        """split MODEL ARGS -o OUT with both builds; compare."""
        self.n += 1
        outs = [os.path.join(self.scratch, f"o{self.n}-{w}") for w in ("old", "new")]
        res = []
        for b, o in zip((self.old, self.new), outs):
            shutil.rmtree(o, ignore_errors=True)
            rc, out, err = run(b, ["split", model, *args, "-o", o, "-q"])
            res.append((rc, err.replace(o, "OUT")))
        self.cases += 1
        if res[0] != res[1]:
            self.differ(f"{label}: exit/message {res[0]} vs {res[1]}")
            return
        if res[0][0] != 0:
            self.refusals += 1
            return
        self.compare_dirs(label, *outs)
        for o in outs:
            shutil.rmtree(o, ignore_errors=True)

    def compare_dirs(self, label, a, b):
        fa, fb = sorted(os.listdir(a)), sorted(os.listdir(b))
        if fa != fb:
            self.differ(f"{label}: files {fa} vs {fb}")
            return
        for f in fa:
            self.files += 1
            if not filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False):
                self.differ(f"{label}: {f} differs")

    def plan(self, label, model, args):
        docs = []
        for b in (self.old, self.new):
            rc, out, err = run(b, ["plan", model, *args, "--json"])
            docs.append((rc, out, err))
        self.plans += 1
        if docs[0] != docs[1]:
            self.differ(f"{label}: plan --json differs")


def conformance_cases(c):
    base = os.path.join(TOP, "testdata", "conformance")
    for name in sorted(os.listdir(base)):
        case = os.path.join(base, name, "case.json")
        if not os.path.isfile(case):
            continue
        with open(case) as f:
            cj = json.load(f)
        args = ["--tp", cj["tp"]]
        if cj.get("family"):
            args += ["--family", cj["family"]]
        if cj.get("layout"):
            args += ["--layout", cj["layout"]]
        c.split("conformance " + name, os.path.join(base, name, "model"), args)


def gen_cases(c):
    import gen
    models = {
        "llama": "llama", "llama-h8": "llama --heads 8 --kv-heads 8 --hidden 64",
        "llama-tied-index": "llama --tied --index 3", "mistral": "mistral",
        "qwen2": "qwen2", "qwen2-kv2": "qwen2 --heads 8 --kv-heads 2",
        "qwen3": "qwen3", "qwen3-tied": "qwen3 --tied", "gemma3": "gemma3",
        "gemma3-untied": "gemma3 --untied", "gemma4-e": "gemma4 --gemma4-variant e",
        "gemma4-dense": "gemma4 --gemma4-variant dense", "gemma4-moe": "gemma4 --gemma4-variant moe",
        "all-dtypes": "--all-dtypes",
    }
    for label, spec in models.items():
        d = os.path.join(c.scratch, "gen-" + label)
        if not os.path.exists(d):
            words = spec.split()
            if words[0] == "--all-dtypes":
                gen.main(["--all-dtypes", d])
            else:
                gen.main([words[0], d] + words[1:])
        for layout in ("dtensor", "vllm", "sglang"):
            lay = [] if layout == "dtensor" else ["--layout", layout]
            if label == "all-dtypes":
                lay += ["--family", "llama"]
            for tp in (1, 2, 3, 4, 8):
                c.split(f"{label} {layout} tp {tp}", d, ["--tp", tp, *lay])
            c.plan(f"{label} {layout}", d, ["--tp", 2, *lay])
    d = os.path.join(c.scratch, "gen-llama")
    c.split("llama --max-part-size", d, ["--tp", 2, "--max-part-size", "20K"])
    c.split("llama --ranks 1", d, ["--tp", 2, "--ranks", "1"])
    c.split("gemma3 --untie vllm", os.path.join(c.scratch, "gen-gemma3"), ["--tp", 2, "--untie"])
    first = os.path.join(c.scratch, "resplit-src")
    shutil.rmtree(first, ignore_errors=True)
    if run(c.old, ["split", d, "--tp", 8, "-o", first, "-q"])[0] == 0:
        c.split("llama split of a tp 8 split, to tp 4", first, ["--tp", 4])


def family_cases(c):
    import test_families as tf
    for label, layout, tp, ep in tf.SPLITS:
        m = tf.make_model(label)
        args = ["--tp", tp] + ([] if layout == "dtensor" else ["--layout", layout]) + (["--ep"] if ep else [])
        c.split(tf.case_name(label, layout, tp, ep), m, args)
    for label, model_label, layouts, tp, ep, _ in tf.REFUSALS:
        m = tf.make_model(model_label)
        for layout in layouts:
            args = ["--tp", tp] + ([] if layout == "dtensor" else ["--layout", layout]) + (["--ep"] if ep else [])
            c.split(f"refusal {label} {layout}", m, args)


def quant_cases(c):
    import test_quant as tq
    for preset, layouts in tq.SPLITS + tq.OPTIONAL:
        m = tq.model(preset)
        for layout, tps in layouts.items():
            for tp in tps:
                args = ["--tp", tp] + ([] if layout == "dtensor" else ["--layout", layout])
                c.split(f"{preset} {layout} tp {tp}", m, args)
            c.plan(f"{preset} {layout}", m, ["--tp", tps[0]] + ([] if layout == "dtensor" else ["--layout", layout]))
    for preset, layout, tp in tq.REFUSALS:
        args = ["--tp", tp] + ([] if layout == "dtensor" else ["--layout", layout])
        c.split(f"refusal {preset} {layout} tp {tp}", tq.model(preset), args)


def main(argv):
    if len(argv) < 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    old, new = (os.path.abspath(a) for a in argv[:2])
    scratch = argv[2] if len(argv) > 2 else tempfile.mkdtemp(prefix="identity.")
    os.makedirs(scratch, exist_ok=True)
    os.environ.setdefault("TPS_TMP", scratch)
    os.environ["TPSHARD"] = new
    c = Compare(old, new, scratch)
    for group in (conformance_cases, gen_cases, family_cases, quant_cases):
        group(c)
    print(f"{c.cases} splits ({c.refusals} refused alike), {c.files} files compared byte for byte, "
          f"{c.plans} plan documents compared: {len(c.diffs)} differences")
    if len(argv) <= 2:
        shutil.rmtree(scratch, ignore_errors=True)
    return 1 if c.diffs else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
