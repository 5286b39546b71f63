"""The tpshard wheel, installed into a fresh venv (tests/wheel/install.sh),
against the tpshard program of this tree. Run with that venv's python -I;
env TPSHARD (the tree's binary), TOP (repo root), TPS_TMP (scratch).

(a) the package: imports without numpy or torch, carries its version, its
    program (the `tpshard` command is that program) and man pages, bundles
    the shared libraries that are not on every Linux, and its ctypes structs
    and error codes match lib/tpshard.h (a C program compiled against it).
(b) every function on the bundled checkpoints (testdata/conformance) returns
    the document `tpshard <command> --json` prints, and writes the same files.
(c) failures raise tpshard.Error with the CLI's message and stable code; a
    progress callable sees every byte; Ctrl-C (and an exception raised by the
    callable) stops a split with nothing left under a final name.
(d) load_rank(framework="numpy") equals the reference safetensors loader
    (run with build/venv's python, which has numpy and safetensors).
Prints "ok - ..." / "not ok - ..." / "skip - ..." lines.
"""
import ctypes
import glob
import json
import os
import pydoc
import re
import shutil
import subprocess
import sys
import tempfile

import tpshard
from tpshard import _lib

TOP = os.environ["TOP"]
TPSHARD = os.environ.get("TPSHARD") or os.path.join(TOP, "tpshard")
TMP = tempfile.mkdtemp(prefix="wheel.", dir=os.environ.get("TPS_TMP") or None)
CONF = os.path.join(TOP, "testdata", "conformance")
VENV = sys.prefix
# the harness only (-I leaves the source tree off the path)
sys.path.insert(0, os.path.join(TOP, "tests", "py"))
from tap import fails, report  # noqa: E402


def test(name):
    """Decorator: runs the function now; an exception is a failure."""
    def run(fn):
        try:
            why = fn()
            report(not why, name, why or "")
        except Exception as e:  # noqa: BLE001
            report(False, name, f"{type(e).__name__}: {e}")
        return fn
    return run


def cli(*args, ok_codes=(0,)):
    p = subprocess.run([TPSHARD, *map(str, args)], capture_output=True, text=True, timeout=300)
    if p.returncode not in ok_codes:
        raise RuntimeError(f"tpshard {' '.join(map(str, args))}: exit {p.returncode}: {p.stderr}")
    return json.loads(p.stdout), p


def diff(a, b, path="$"):
    """The first difference between two documents, or ''."""
    if type(a) is not type(b):
        return f"{path}: {a!r} != {b!r}"
    if isinstance(a, dict):
        if list(a) != list(b):
            return f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            d = diff(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return ""
    if isinstance(a, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            d = diff(x, y, f"{path}[{i}]")
            if d:
                return d
        return ""
    return "" if a == b else f"{path}: {a!r} != {b!r}"


def cases():
    for d in sorted(glob.glob(os.path.join(CONF, "*", "case.json"))):
        c = json.load(open(d))
        c["name"] = os.path.basename(os.path.dirname(d))
        c["model"] = os.path.join(os.path.dirname(d), "model")
        yield c


def files_of(d):
    return sorted(f for f in os.listdir(d) if not f.startswith("."))


def same_tree(a, b):
    fa, fb = files_of(a), files_of(b)
    if fa != fb:
        return f"{a}: {fa} != {b}: {fb}"
    for f in fa:
        with open(os.path.join(a, f), "rb") as x, open(os.path.join(b, f), "rb") as y:
            if x.read() != y.read():
                return f"{f} differs"
    return ""


def tensors_of(raw):
    n = int.from_bytes(raw[:8], "little")
    h = json.loads(raw[8:8 + n])
    h.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in h.items()}


def same_weights(a, b, split=None):
    """The safetensors files and config.json of a and b are the same bytes; where the
    split's manifest lists tensors its layout drops (DeepSeek's MTP layer), a holds b's
    tensors less exactly those, byte for byte."""
    gone = set()
    if split:
        gone = {e["name"] for e in json.load(open(os.path.join(split, "tpshard.json"))).get("dropped") or []}
    names = [f for f in files_of(b) if f.endswith(".safetensors") or f == "config.json"]
    for f in names:
        with open(os.path.join(a, f), "rb") as x, open(os.path.join(b, f), "rb") as y:
            ra, rb = x.read(), y.read()
            if gone and f.endswith(".safetensors"):
                want = {k: v for k, v in tensors_of(rb).items() if k not in gone}
                if tensors_of(ra) != want:
                    return f"{f} differs from the source's less the dropped tensors"
            elif ra != rb:
                return f"{f} differs from the source's"
    return "" if names else f"{b}: no weights"


def untimed(doc):
    """A verify document without its timings."""
    doc = json.loads(json.dumps(doc))
    for k in ("seconds", "gb_per_s", "setup_seconds"):
        doc["summary"].pop(k, None)
    return doc


# ------------------------------------------------------------------ (a) the package

@test("import tpshard: from the venv, without numpy or torch")
def _():
    if not tpshard.__file__.startswith(VENV):
        return f"imported from {tpshard.__file__}, not from {VENV}"
    heavy = [m for m in ("numpy", "torch") if m in sys.modules]
    return f"imported {heavy}" if heavy else ""


@test("version and schema version: the package's, the library's and the header's agree")
def _():
    from importlib.metadata import version
    header = re.search(r'TPS_VERSION_STRING "([^"]+)"',
                       open(os.path.join(TOP, "lib", "tpshard.h")).read()).group(1)
    got = {version("tpshard"), tpshard.__version__, tpshard.library_version(), header}
    schema = re.search(r"TPS_JSON_SCHEMA_VERSION (\d+)",
                       open(os.path.join(TOP, "lib", "tpshard.h")).read()).group(1)
    if int(schema) != tpshard.SCHEMA_VERSION:
        return f"SCHEMA_VERSION {tpshard.SCHEMA_VERSION}, the header's {schema}"
    return "" if len(got) == 1 else f"versions differ: {got}"


def version_lines(exe):
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout
    return out.splitlines()


@test("the `tpshard` command on the venv's PATH runs the packaged program")
def _():
    cmd = os.path.join(VENV, "bin", "tpshard")
    packaged = version_lines(tpshard.executable)
    if version_lines(cmd) != packaged:
        return f"{cmd} --version: {version_lines(cmd)} != {packaged}"
    mod = subprocess.run([sys.executable, "-m", "tpshard", "--version"], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    if mod != packaged:
        return f"python -m tpshard --version: {mod}"
    # exit status and stderr pass through
    p = subprocess.run([cmd, "split"], capture_output=True, text=True)
    if p.returncode != 2 or "usage: tpshard split" not in p.stderr:
        return f"tpshard split without arguments: exit {p.returncode}, {p.stderr!r}"
    return ""


@test("the packaged program is this tree's: same version, features and built-in plans")
def _():
    keep = ("tpshard ", "features:", "built-in plans:")
    a = [x for x in version_lines(tpshard.executable) if x.startswith(keep)]
    b = [x for x in version_lines(TPSHARD) if x.startswith(keep)]
    return "" if a == b and len(a) == 3 else f"{a} != {b}"


@test("man pages installed under the venv's share/man")
def _():
    want = [os.path.basename(p) for p in glob.glob(os.path.join(TOP, "man", "*.[15]"))]
    missing = [m for m in want if not os.path.isfile(
        os.path.join(VENV, "share", "man", "man" + m[-1], m))]
    return f"missing {missing}" if missing or not want else ""


ALLOWED = re.compile(r"^(linux-vdso|ld-linux|libc|libm|libz|libpthread|libdl|librt|libgcc_s)\b")


@test("the program and the library find their non-standard libraries in the wheel")
def _():
    libs = os.path.join(os.path.dirname(os.path.dirname(tpshard.__file__)), "tpshard.libs")
    bundled = sorted(os.listdir(libs)) if os.path.isdir(libs) else []
    for want in ("libcjson", "libyaml", "libgomp"):
        if not any(b.startswith(want) for b in bundled):
            return f"{want} is not bundled: {bundled}"
    for elf in (tpshard.executable, _lib.LIBRARY):
        out = subprocess.run(["ldd", elf], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            name = line.split()[0]
            if "not found" in line:
                return f"{elf}: {line.strip()}"
            where = line.split("=>")[1].split("(")[0].strip() if "=>" in line else ""
            bundled_here = where and os.path.dirname(os.path.realpath(where)) == \
                os.path.realpath(libs)
            if not ALLOWED.match(os.path.basename(name)) and not bundled_here:
                return f"{elf}: {line.strip()} is neither bundled nor on every Linux"
    return ""


@test("ctypes structs match lib/tpshard.h (sizes and offsets, from a C program)")
def _():
    lines = ['#include <stddef.h>', '#include <stdio.h>', '#include "tpshard.h"',
             "int main(void) {"]
    want = []
    for cname, cls in _lib.STRUCTS.items():
        lines.append(f'printf("{cname} %zu\\n", sizeof({cname}));')
        want.append(f"{cname} {ctypes.sizeof(cls)}")
        for f, _t in cls._fields_:
            lines.append(f'printf("{cname}.{f} %zu %zu\\n", offsetof({cname}, {f}), '
                         f"sizeof((({cname} *)0)->{f}));")
            want.append(f"{cname}.{f} {getattr(cls, f).offset} {getattr(cls, f).size}")
    lines.append("return 0; }")
    src, exe = os.path.join(TMP, "abi.c"), os.path.join(TMP, "abi")
    open(src, "w").write("\n".join(lines) + "\n")
    subprocess.run(["cc", "-I", os.path.join(TOP, "lib"), src, "-o", exe], check=True,
                   capture_output=True)
    got = subprocess.run([exe], capture_output=True, text=True, check=True).stdout.split("\n")
    bad = [f"C: {g} / ctypes: {w}" for g, w in zip(got, want) if g != w]
    return "\n".join(bad)


@test("tpshard.ErrorCode is tps_err of lib/tpshard.h")
def _():
    h = open(os.path.join(TOP, "lib", "tpshard.h")).read()
    header = {m.group(1): int(m.group(2)) for m in re.finditer(r"TPS_E_(\w+) = (\d+)", h)}
    py = {e.name: int(e) for e in tpshard.ErrorCode}
    return "" if header == py else f"header {header} != {py}"


@test("help(tpshard.split) reads like the man page: every option, returns, raises")
def _():
    text = pydoc.render_doc(tpshard.split, renderer=pydoc.plaintext)
    words = ["model", "tp", "output", "plan", "family", "layout", "ranks", "untie", "threads",
             "max_part_size", "no_mmap", "force", "dry_run", "progress", "Returns", "Raises",
             "KeyboardInterrupt", "torch.chunk"]
    missing = [w for w in words if w not in text]
    for fn in (tpshard.inspect, tpshard.plan, tpshard.check, tpshard.merge, tpshard.verify):
        doc = fn.__doc__ or ""
        if "Returns:" not in doc or "Raises:" not in doc or "--json" not in doc:
            missing.append(fn.__name__ + " docstring")
    return f"missing {missing}" if missing else ""


# ------------------------------------------------------------------ (b) the commands

@test("inspect() == inspect --json, every bundled checkpoint")
def _():
    for c in cases():
        d = diff(tpshard.inspect(c["model"]), cli("inspect", c["model"], "--json")[0])
        if d:
            return f"{c['name']}: {d}"
    return ""


@test("plan(list=True) == plan --list --json")
def _():
    return diff(tpshard.plan(list=True), cli("plan", "--list", "--json")[0])


@test("plan() == plan --json, every bundled checkpoint and layout, rejections included")
def _():
    n = 0
    for c in cases():
        for layout in ("dtensor", "vllm", "sglang"):
            want, _ = cli("plan", c["model"], "--tp", c["tp"], "--layout", layout, "--json",
                          ok_codes=(0, 1))
            got = tpshard.plan(c["model"], tp=c["tp"], layout=layout)
            d = diff(got, want)
            if d:
                return f"{c['name']} --layout {layout}: {d}"
            n += not got["ok"]
    return "" if n else "no rejected plan among the cases"


@test("plan(untie=True, family=...) == plan --untie --family --json")
def _():
    m = os.path.join(CONF, "gemma3-tp2-tied-reject", "model")
    want, _ = cli("plan", m, "--tp", 2, "--untie", "--family", "gemma3", "--json")
    return diff(tpshard.plan(m, 2, untie=True, family="gemma3"), want)


def splittable():
    return [c for c in cases() if c["expect"] == "split"]


@test("split() == split --json and writes the same files, every accepted checkpoint")
def _():
    for c in splittable():
        kw = {"layout": c["layout"]} if c.get("layout") else {}
        a, b = os.path.join(TMP, "py-" + c["name"]), os.path.join(TMP, "cli-" + c["name"])
        got = tpshard.split(c["model"], c["tp"], a, **kw)
        want, _ = cli("split", c["model"], "--tp", c["tp"], "-o", b, "--json",
                      *(["--layout", c["layout"]] if kw else []))
        want["output"] = a
        d = diff(got, want) or same_tree(a, b)
        if d:
            return f"{c['name']}: {d}"
    return ""


@test("split(dry_run=True) == split --dry-run --json")
def _():
    m = os.path.join(CONF, "llama-tp4-uneven-vocab", "model")
    want, _ = cli("split", m, "--tp", 4, "--dry-run", "--json")
    return diff(tpshard.split(m, 4, dry_run=True), want)


@test("split(ranks=, max_part_size=, force=, threads=, no_mmap=) == the same options")
def _():
    m = os.path.join(CONF, "llama-tp4-uneven-vocab", "model")
    a, b = os.path.join(TMP, "opt-py"), os.path.join(TMP, "opt-cli")
    tpshard.split(m, 4, a)
    cli("split", m, "--tp", 4, "-o", b, "--json")
    got = tpshard.split(m, 4, a, ranks=[0, 2, 3], max_part_size="8K", force=True, threads=2,
                        no_mmap=True)
    want, _ = cli("split", m, "--tp", 4, "-o", b, "--ranks", "0,2-3", "--max-part-size", "8K",
                  "--force", "--threads", 2, "--no-mmap", "--json")
    want["output"] = a
    if got["files_written"] < 4:
        return f"max_part_size made {got['files_written']} files"
    d = diff(got, want) or same_tree(a, b)
    if d:
        return d
    got = tpshard.split(m, 4, a, ranks="1", max_part_size=8192, force=True)
    return "" if got["ranks_written"] == 1 else f"ranks='1': {got}"


@test("split(pp=, layout='vllm') == split --pp --layout vllm, and rank_files() finds a worker's")
def _():
    m = os.path.join(CONF, "llama-tp4-uneven-vocab", "model")
    a, b = os.path.join(TMP, "pp-py"), os.path.join(TMP, "pp-cli")
    got = tpshard.split(m, 2, a, layout="vllm", pp=2)
    want, _ = cli("split", m, "--tp", 2, "--pp", 2, "--layout", "vllm", "-o", b, "--json")
    want["output"] = a
    d = diff(got, want) or same_tree(a, b)
    if d:
        return d
    names = [os.path.basename(p) for p in tpshard.rank_files(a, 3)]
    if names != ["model-pp-1-tp-1-part-0.safetensors"]:
        return f"rank_files(a, 3) = {names}"
    doc = tpshard.plan(m, 2, layout="vllm", pp_layers=[1, 1])
    return "" if doc["pp"] == 2 and len(doc["rank_bytes"]) == 4 else f"plan(pp_layers=): {doc}"


@test("load_rank() without numpy or torch: says pip install tpshard[numpy] / tpshard[torch]")
def _():
    d = os.path.join(TMP, "noframework")
    tpshard.split(os.path.join(CONF, "llama-tp3", "model"), 3, d)
    calls = [("numpy", lambda: tpshard.load_rank(d, 0)),
             ("numpy", lambda: tpshard.load_rank(d, 1, framework="numpy")),
             ("torch", lambda: tpshard.load_rank(d, 0, framework="torch")),
             ("torch", lambda: tpshard.load_rank_dtensors(d, None))]
    for extra, call in calls:
        try:
            call()
            return f"no error without {extra}"
        except ModuleNotFoundError as e:
            if f"pip install tpshard[{extra}]" not in str(e) or e.name != extra:
                return f"{type(e).__name__}: {e}"
    return ""


@test("split() without output writes <name>-tp<N> beside the model, as the CLI does")
def _():
    src = os.path.join(TMP, "beside", "llama")
    shutil.copytree(os.path.join(CONF, "llama-tp3", "model"), src)
    got = tpshard.split(src + "/", 3)
    want = os.path.join(TMP, "beside", "llama-tp3")
    if got["output"] != want or not os.path.isfile(os.path.join(want, "tpshard.json")):
        return f"output {got['output']}, wanted {want}"
    single = tpshard.split(os.path.join(src, "model.safetensors"), 3)
    return "" if single["output"] == os.path.join(src, "model-tp3") else single["output"]


@test("check(), verify(), merge() == check, verify, merge --json, every accepted checkpoint")
def _():
    for c in splittable():
        d = os.path.join(TMP, "py-" + c["name"])
        cd = diff(tpshard.check(d), cli("check", d, "--json")[0])
        want, _ = cli("verify", d, "--source", c["model"], "--json")
        vd = diff(untimed(tpshard.verify(d, source=c["model"])), untimed(want))
        want, _ = cli("verify", d, "--json", "--seed", 7, "--batch", 2, "--tensors", "*proj*",
                      "--threads", 1)
        vd = vd or diff(untimed(tpshard.verify(d, seed=7, batch=2, tensors="*proj*", threads=1)),
                        untimed(want))
        want, _ = cli("verify", d, "--source", c["model"], "--json", "--tensors-per-pass", 1)
        vd = vd or diff(untimed(tpshard.verify(d, source=c["model"], tensors_per_pass=1)),
                        untimed(want))
        out = os.path.join(TMP, "merged-" + c["name"])
        cout = os.path.join(TMP, "cmerged-" + c["name"])
        got = tpshard.merge(d, out)
        want, _ = cli("merge", d, "-o", cout, "--json")
        want["output"] = out
        md = diff(got, want) or same_tree(out, cout) or same_weights(out, c["model"], d)
        if cd or vd or md:
            return f"{c['name']}: {cd or vd or md}"
    return ""


@test("verify() of a corrupted split is a result with ok False, as verify --json")
def _():
    d = os.path.join(TMP, "flip")
    shutil.copytree(os.path.join(TMP, "py-llama-tp3"), d)
    f = os.path.join(d, "model-rank-1-part-0.safetensors")
    b = bytearray(open(f, "rb").read())
    b[-3] ^= 0x40
    open(f, "wb").write(b)
    src = os.path.join(CONF, "llama-tp3", "model")
    got = tpshard.verify(d, source=src)
    want, _ = cli("verify", d, "--source", src, "--json", ok_codes=(1,))
    if got["ok"] is not False:
        return "ok is not False"
    return diff(untimed(got), untimed(want))


# ------------------------------------------------------------------ (c) errors, progress, Ctrl-C

def error_of(fn, *a, **kw):
    try:
        fn(*a, **kw)
    except tpshard.Error as e:
        return e
    raise AssertionError(f"{fn.__name__} raised nothing")


@test("a rejected split raises tpshard.Error: REJECT, the CLI's message and error document")
def _():
    m = os.path.join(CONF, "llama-tp8-gqa-reject", "model")
    out = os.path.join(TMP, "rejected")
    e = error_of(tpshard.split, m, 8, out)
    want, p = cli("split", m, "--tp", 8, "-o", out, "--json", ok_codes=(1,))
    if e.code != tpshard.ErrorCode.REJECT or int(e.code) != 8 or e.name != "TPS_E_REJECT":
        return f"code {e.code!r}, name {e.name}"
    if f"tpshard: error: {e}\n" != p.stderr or e.document != want:
        return f"{str(e)!r} / {e.document} vs the CLI's {p.stderr!r} / {want}"
    return "nothing may be written" if os.path.exists(out) else ""


@test("errors carry their codes: missing model (IO), existing output (EXISTS), unknown family "
      "(ARG), corrupt shard (MISMATCH)")
def _():
    got = [error_of(tpshard.inspect, os.path.join(TMP, "nothing")).code,
           error_of(tpshard.split, os.path.join(CONF, "llama-tp3", "model"), 3,
                    os.path.join(TMP, "py-llama-tp3")).code,
           error_of(tpshard.plan, os.path.join(CONF, "llama-tp3", "model"), 3,
                    family="nope").code,
           error_of(tpshard.check, os.path.join(TMP, "flip")).code]
    E = tpshard.ErrorCode
    want = [E.IO, E.EXISTS, E.ARG, E.MISMATCH]
    if got != want:
        return f"{got} != {want}"
    e = error_of(tpshard.check, os.path.join(TMP, "flip"))
    p = subprocess.run([TPSHARD, "check", os.path.join(TMP, "flip")], capture_output=True,
                       text=True)
    return "" if p.stderr == f"tpshard: error: {e}\n" else f"{e} vs {p.stderr}"


@test("bad arguments raise tpshard.Error ARG (or TypeError), before anything runs")
def _():
    m = os.path.join(CONF, "llama-tp3", "model")
    calls = [lambda: tpshard.split(m, 0), lambda: tpshard.split(m, 3, ranks="7"),
             lambda: tpshard.split(m, 3, ranks=[5]), lambda: tpshard.split(m, 3, max_part_size="x"),
             lambda: tpshard.split(m, 3, plan="p.yaml", family="llama"),
             lambda: tpshard.verify(m, backend="tpu"), lambda: tpshard.verify(m, batch=0),
             lambda: tpshard.verify(m, tensors_per_pass=0),
             lambda: tpshard.split(os.path.join(CONF, "qwen3-tp2-tied", "model"), 2, untie=True,
                                   layout="vllm"),
             lambda: tpshard.plan(m)]
    for i, call in enumerate(calls):
        try:
            call()
            return f"call {i} raised nothing"
        except tpshard.Error as e:
            if e.code != tpshard.ErrorCode.ARG:
                return f"call {i}: {e!r}"
    try:
        tpshard.split(m, "3")
        return "tp='3' accepted"
    except TypeError:
        return ""


@test("progress(done, total, tensor): every byte, in order, ending at total with None")
def _():
    calls = []
    m = os.path.join(CONF, "llama-tp4-uneven-vocab", "model")
    tpshard.split(m, 4, os.path.join(TMP, "progress"),
                  progress=lambda d, t, w: calls.append((d, t, w)))
    if len(calls) < 3:
        return f"{len(calls)} calls"
    dones = [d for d, _, _ in calls]
    total = calls[-1][1]
    if dones != sorted(dones) or calls[-1] != (total, total, None) or total <= 0:
        return f"calls {calls[:3]} ... {calls[-3:]}"
    if not all(isinstance(w, str) for _, _, w in calls[:-1]) or {t for _, t, _ in calls} != {total}:
        return "tensor names and totals"
    vcalls = []
    tpshard.verify(os.path.join(TMP, "progress"), source=m, threads=1,
                   progress=lambda d, t, w: vcalls.append((d, t)))
    return "" if vcalls and vcalls[-1][0] <= vcalls[-1][1] else f"verify: {vcalls[-3:]}"


def nothing_final(d):
    """'' when d holds no rank file, manifest or temporary."""
    left = [f for f in (os.listdir(d) if os.path.isdir(d) else [])
            if f.startswith(("model-rank", "tpshard.json", ".")) or ".tmp" in f]
    return f"left in {d}: {left}" if left else ""


INTERRUPT = r"""
import os, signal, sys, time
import tpshard
# A shell that starts a job in the background (a CI runner's may) leaves it
# ignoring SIGINT, and Python then keeps it ignored: take it as a terminal would.
signal.signal(signal.SIGINT, signal.default_int_handler)
sent = []
def progress(done, total, tensor):
    if not sent:
        sent.append(1)
        os.kill(os.getpid(), signal.SIGINT)   # Ctrl-C, while the library works
        time.sleep(2)
try:
    tpshard.split(sys.argv[1], 4, sys.argv[2], progress=progress)
except KeyboardInterrupt:
    print("KeyboardInterrupt")
else:
    print("finished")
"""


@test("Ctrl-C during split(): KeyboardInterrupt, temporaries removed, nothing final written")
def _():
    out = os.path.join(TMP, "interrupted")
    p = subprocess.run([sys.executable, "-I", "-c", INTERRUPT,
                        os.path.join(CONF, "llama-tp4-uneven-vocab", "model"), out],
                       capture_output=True, text=True, timeout=60)
    if p.stdout.strip() != "KeyboardInterrupt":
        return f"exit {p.returncode}: {p.stdout} {p.stderr}"
    return nothing_final(out)


@test("an exception raised by progress stops split() and is raised; nothing final written")
def _():
    out = os.path.join(TMP, "raised")

    def progress(done, total, tensor):
        raise ValueError("stop here")
    try:
        tpshard.split(os.path.join(CONF, "llama-tp4-uneven-vocab", "model"), 4, out,
                      progress=progress)
        return "split finished"
    except ValueError as e:
        if str(e) != "stop here":
            return repr(e)
    return nothing_final(out)


# ------------------------------------------------------------------ (d) tensors

ORACLE = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1])
sys.path.insert(0, sys.argv[2])
import numpy as np
from safetensors.numpy import load_file
import st  # testdata/conformance/st.py: a reader of its own, for BF16
import tpshard
for d in sys.argv[3:]:
    tp = json.load(open(os.path.join(d, "tpshard.json")))["tp"]
    for r in range(tp):
        got = tpshard.load_rank(d, r, framework="numpy")
        files = tpshard.rank_files(d, r)
        assert len(files) > 1, files
        want = {}
        for f in files:
            if "bf16" in d:
                want.update({k: (s, b) for k, (_, s, b) in st.read(f)[1].items()})
            else:
                want.update({k: (list(v.shape), v.tobytes()) for k, v in load_file(f).items()})
        assert sorted(got) == sorted(want), (sorted(got), sorted(want))
        for k, (shape, b) in want.items():
            assert list(got[k].shape) == shape and got[k].tobytes() == b, k
print("same")
"""


@test("load_rank(framework='numpy') == the safetensors library (F16) and st.py (BF16), all parts")
def _():
    py = os.path.join(TOP, "build", "venv", "bin", "python")
    chk = subprocess.run([py, "-c", "import numpy, safetensors"], capture_output=True) \
        if os.path.exists(py) else None
    if not chk or chk.returncode:
        print("skip - load_rank against safetensors: build/venv has no numpy and safetensors")
        return ""
    f16 = os.path.join(TMP, "f16")
    subprocess.run([sys.executable, os.path.join(TOP, "testdata", "gen.py"), "qwen2", f16,
                    "--dtype", "F16"], check=True, capture_output=True)
    dirs = [os.path.join(TMP, "parts-f16"), os.path.join(TMP, "parts-bf16")]
    tpshard.split(f16, 2, dirs[0], max_part_size="16K")
    tpshard.split(os.path.join(CONF, "llama-tp4-uneven-vocab", "model"), 4, dirs[1],
                  max_part_size="16K")
    site = os.path.dirname(os.path.dirname(tpshard.__file__))
    p = subprocess.run([py, "-c", ORACLE, site, CONF, *dirs], capture_output=True, text=True)
    return "" if p.stdout.strip() == "same" else p.stderr[-2000:]


if not os.environ.get("KEEP_TMP"):
    shutil.rmtree(TMP, ignore_errors=True)
sys.exit(1 if fails() else 0)
