"""Helpers the Python tests of tpshard's rank files share (test_serving_layouts,
test_quant, test_families): TAP-style reporting, reading every rank file with
the reference safetensors reader, and comparing them with an oracle's tensors.
No tpshard code: the oracles and these helpers must stay independent of it."""
import glob
import json
import os
import re
import sys

import safetensors
from safetensors import safe_open

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tap import fails, report  # noqa: E402,F401  (the tests import them from here too)

RANK_FILE = re.compile(r"^model-rank-(\d+)-part-(\d+)\.safetensors$")


def source_files(model):
    """The safetensors files of a model directory (an index's parts, or one)."""
    idx = os.path.join(model, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            return sorted(set(json.load(f)["weight_map"].values()))
    return ["model.safetensors"]


def read_rank_files(out, tp, where=None):
    """-> ({rank: {name: (dtype, shape, bytes)}}, problems). where, a dict,
    gets (rank, name) -> path."""
    problems, ranks = [], {}
    for path in sorted(glob.glob(os.path.join(out, "*.safetensors"))):
        base = os.path.basename(path)
        m = RANK_FILE.match(base)
        if not m:
            problems.append(f"{base}: not a model-rank-<r>-part-<p>.safetensors name")
            continue
        r = int(m.group(1))
        if r >= tp:
            problems.append(f"{base}: rank {r} at tp {tp}")
            continue
        try:
            with safe_open(path, framework="numpy") as h:
                meta = h.metadata() or {}
            with open(path, "rb") as f:
                items = safetensors.deserialize(f.read())
        except Exception as e:  # noqa: BLE001
            problems.append(f"{base}: the reference reader rejects it: {e}")
            continue
        if meta.get("format") != "pt":
            problems.append(f"{base}: __metadata__ format is {meta.get('format')!r}, not 'pt'")
        mine = ranks.setdefault(r, {})
        for n, i in items:
            if n in mine:  # the engines' loaders raise KeyError on the second copy
                problems.append(f"{base}: {n} is also in another part of rank {r}")
            mine[n] = (i["dtype"], list(i["shape"]), bytes(i["data"]))
            if where is not None:
                where[(r, n)] = path
    for r in range(tp):
        if r not in ranks:
            problems.append(f"rank {r} has no file (the engine refuses to load)")
    return ranks, problems


def compare(want, got, label, engine=False):
    """Differences between the oracle's tensors and a rank's, as lines. With
    engine, missing and extra keys are said as an engine's loader says them."""
    out = []
    for n in sorted(set(want) - set(got)):
        out.append(f"{label}: missing {n} (the engine says 'Missing keys')" if engine
                   else f"{label}: missing {n} {want[n][0]}{want[n][1]}")
    for n in sorted(set(got) - set(want)):
        out.append(f"{label}: {n} is not in the engine's state (KeyError)" if engine
                   else f"{label}: {n} {got[n][0]}{got[n][1]} should not be there")
    for n in sorted(set(want) & set(got)):
        (wd, ws, wb), (gd, gs, gb) = want[n], got[n]
        if (wd, ws) != (gd, gs):
            out.append(f"{label}: {n}: {gd}{gs}, expected {wd}{ws}")
        elif wb != gb:
            i = next((k for k in range(min(len(wb), len(gb))) if wb[k] != gb[k]), 0)
            out.append(f"{label}: {n}: bytes differ from byte {i}")
    return out


def flip_bit(path, tensor):
    """Flips one bit in the middle of tensor's bytes in a safetensors file."""
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    n = int.from_bytes(raw[:8], "little")
    hdr = json.loads(raw[8:8 + n])
    b, e = hdr[tensor]["data_offsets"]
    raw[8 + n + (b + e) // 2] ^= 0x10
    with open(path, "wb") as f:
        f.write(raw)


def first_diff(a, b):
    n = min(len(a), len(b))
    i = next((k for k in range(n) if a[k] != b[k]), n)
    return f"lengths {len(a)} vs {len(b)}, first difference at byte {i}"


def rank_file_problems(out, model, want, tp, engine=False):
    """What is wrong with a split's rank files against the oracle's tensors
    want ([{name: (dtype, shape, bytes)}] per rank), and its config.json
    (beside them, the source's own): a list of lines."""
    ranks, problems = read_rank_files(out, tp)
    for r in sorted(ranks):
        problems += compare(want[r], ranks[r], f"rank {r}", engine=engine)
    cfg = os.path.join(out, "config.json")
    if not os.path.exists(cfg):
        problems.append("no config.json beside the rank files" +
                        (" (the engine builds the model from it)" if engine else ""))
    else:
        with open(cfg) as f, open(os.path.join(model, "config.json")) as g:
            if json.load(f) != json.load(g):
                problems.append("config.json differs from the source's")
    return problems


def refusal_problems(rc, stderr, out, word, rule):
    """A refused split: exit 1, the error naming word, no .safetensors under
    out. rule: why the oracle refuses, said when the error lacks word."""
    problems = []
    if rc != 1:
        problems.append(f"exit status {rc}, not 1")
    if word not in stderr:
        problems.append(f"the error does not name {word} ({rule})")
    left = glob.glob(os.path.join(out, "**", "*.safetensors"), recursive=True)
    if left:
        problems.append(f"left {[os.path.relpath(x, out) for x in left]}")
    return problems
