"""tpshard against the reference safetensors library (PyPI `safetensors`, Rust
core) and numpy, as independent oracles.  Run with build/venv/bin/python;
env TPSHARD (the binary), TOP (repo root), TPS_TMP (scratch).

(a) writer identity: a file written by safetensors.numpy.save_file, split
    --tp N and merged back, is byte-identical (tp 1..9), also for an indexed
    checkpoint whose parts were written by save_file.
(b) every rank file of a split (the conformance models, gen.py models) loads
    with the reference reader, and every tensor equals the numpy slice of
    the source along the placement the manifest (tpshard.json) records, with
    torch.chunk extents and the manifest's CRC32.
Prints "ok - ..." / "not ok - ..." / "skip - ..." lines.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zlib

TOP = os.environ.get("TOP") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
TPSHARD = os.environ.get("TPSHARD") or os.path.join(TOP, "tpshard")
TMP = tempfile.mkdtemp(prefix="pyref.", dir=os.environ.get("TPS_TMP") or None)

try:
    import numpy as np
    import safetensors
    from safetensors import safe_open
    from safetensors.numpy import save_file
except ImportError as e:  # pragma: no cover
    print(f"skip - reference tests: {e}")
    sys.exit(0)

sys.path.insert(0, os.path.join(TOP, "testdata"))
import gen  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jsonlog  # noqa: E402
from tap import fails, report  # noqa: E402

# safetensors dtype -> numpy dtype of the same width used to compare bytes
NP_VIEW = {"BOOL": np.uint8, "U8": np.uint8, "I8": np.int8, "F8_E5M2": np.uint8,
           "F8_E4M3": np.uint8, "F8_E8M0": np.uint8, "F8_E4M3FNUZ": np.uint8,
           "F8_E5M2FNUZ": np.uint8, "I16": np.int16, "U16": np.uint16, "F16": np.uint16,
           "BF16": np.uint16, "I32": np.int32, "U32": np.uint32, "F32": np.uint32,
           "C64": np.uint64, "F64": np.uint64, "I64": np.int64, "U64": np.uint64}


def tps(*args):
    p = subprocess.run([TPSHARD, *map(str, args)], capture_output=True, text=True, timeout=300)
    jsonlog.save(args, p)
    return p.returncode, p.stdout, p.stderr


def chunk(n, tp, r):
    """torch.chunk / DTensor Shard extent of rank r: (start, length)."""
    c = -(-n // tp) if n else 0
    s = min(r * c, n)
    return s, min((r + 1) * c, n) - s


# ------------------------------------------------------------------ (a) writer identity

def every_dtype_tensors(rng):
    """Tensors of every dtype numpy and safetensors.numpy both handle, with
    llama names so that some are sharded (dims not divisible by most tp), odd
    byte lengths that break alignment, a zero-size and a rank-0 tensor."""
    def arr(dt, shape):
        dt = np.dtype(dt)
        if dt == np.bool_:
            return rng.integers(0, 2, size=shape).astype(np.bool_)
        if dt.kind == "f":
            return (rng.random(size=shape) * 2 - 1).astype(dt)
        if dt.kind == "c":
            return (rng.random(size=shape) + 1j * rng.random(size=shape)).astype(dt)
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, size=shape, dtype=dt, endpoint=True)

    t = {
        "model.embed_tokens.weight": arr(np.float16, (11, 6)),      # vocab-sharded
        "lm_head.weight": arr(np.float32, (11, 6)),                 # colwise
        "model.layers.0.self_attn.q_proj.weight": arr(np.int8, (7, 6)),
        "model.layers.0.self_attn.k_proj.weight": arr(np.uint8, (5, 6)),
        "model.layers.0.self_attn.v_proj.weight": arr(np.bool_, (5, 6)),
        "model.layers.0.self_attn.o_proj.weight": arr(np.complex64, (6, 7)),   # rowwise
        "model.layers.0.mlp.gate_proj.weight": arr(np.int16, (9, 6)),
        "model.layers.0.mlp.up_proj.weight": arr(np.uint16, (9, 6)),
        "model.layers.0.mlp.down_proj.weight": arr(np.float64, (6, 9)),        # rowwise
        "model.layers.1.self_attn.q_proj.weight": arr(np.int32, (7, 6)),
        "model.layers.1.self_attn.k_proj.weight": arr(np.uint32, (5, 6)),
        "model.layers.1.self_attn.v_proj.weight": arr(np.int64, (5, 6)),
        "model.layers.1.self_attn.o_proj.weight": arr(np.uint64, (6, 7)),
        "model.layers.1.mlp.gate_proj.weight": arr(np.float32, (0, 6)),        # zero-size
        "model.layers.1.mlp.up_proj.weight": arr(np.float32, (9, 6)),
        "model.layers.1.mlp.down_proj.weight": arr(np.float16, (6, 9)),
        "model.layers.0.input_layernorm.weight": arr(np.float32, (6,)),
        "model.norm.weight": arr(np.uint8, (3,)),                              # odd length
        "model.layers.0.layer_scalar": np.array(0.5, dtype=np.float32),        # rank 0
        "model.odd.u8": arr(np.uint8, (7,)),
        "model.zzz_unicode_\u00e9\u4e2d.weight": arr(np.int8, (2, 3)),
    }
    return t


def test_writer_identity():
    rng = np.random.default_rng(1234)
    src_dir = os.path.join(TMP, "wid-src")
    os.makedirs(src_dir)
    a = os.path.join(src_dir, "model.safetensors")
    save_file(every_dtype_tensors(rng), a, metadata={"format": "pt"})
    want = open(a, "rb").read()
    for tp in range(1, 10):
        d = os.path.join(TMP, f"wid-tp{tp}")
        m = os.path.join(TMP, f"wid-merged{tp}")
        rc, out, err = tps("split", a, "--tp", tp, "--family", "llama", "-o", d)
        if rc != 0:
            report(False, f"writer identity tp {tp}: split", f"rc {rc}\n{err}")
            continue
        rc, out, err = tps("merge", d, "-o", m)
        if rc != 0:
            report(False, f"writer identity tp {tp}: merge", f"rc {rc}\n{err}")
            continue
        got_path = os.path.join(m, "model.safetensors")
        if not os.path.exists(got_path):
            report(False, f"writer identity tp {tp}", f"merge wrote {sorted(os.listdir(m))}")
            continue
        got = open(got_path, "rb").read()
        report(got == want, f"writer identity tp {tp}: merge(split(save_file)) == save_file bytes",
               first_diff(want, got))


def first_diff(a, b):
    if a == b:
        return ""
    n = min(len(a), len(b))
    i = next((k for k in range(n) if a[k] != b[k]), n)
    return (f"lengths {len(a)} vs {len(b)}, first difference at byte {i}\n"
            f"want {a[max(0, i - 40):i + 40]!r}\ngot  {b[max(0, i - 40):i + 40]!r}")


def test_indexed_identity():
    """An indexed checkpoint whose parts come from save_file: merge gives the
    parts back byte for byte."""
    rng = np.random.default_rng(99)
    t = every_dtype_tensors(rng)
    names = sorted(t)
    src = os.path.join(TMP, "idx-src")
    os.makedirs(src)
    parts = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    wm = {}
    for k, p in enumerate(parts):
        mine = {n: t[n] for i, n in enumerate(names) if i % 2 == k}
        save_file(mine, os.path.join(src, p), metadata={"format": "pt"})
        wm.update({n: p for n in mine})
    total = sum(t[n].nbytes for n in names)
    with open(os.path.join(src, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wm}, f, indent=2, sort_keys=True)
    d, m = os.path.join(TMP, "idx-tp4"), os.path.join(TMP, "idx-merged")
    rc, out, err = tps("split", src, "--tp", 4, "--family", "llama", "-o", d)
    if rc != 0:
        report(False, "indexed identity: split", f"rc {rc}\n{err}")
        return
    rc, out, err = tps("merge", d, "-o", m)
    if rc != 0:
        report(False, "indexed identity: merge", f"rc {rc}\n{err}")
        return
    bad = []
    for p in parts:
        gp = os.path.join(m, p)
        if not os.path.exists(gp):
            bad.append(f"{p} missing (merge wrote {sorted(os.listdir(m))})")
        elif open(gp, "rb").read() != open(os.path.join(src, p), "rb").read():
            bad.append(f"{p}: " + first_diff(open(os.path.join(src, p), "rb").read(),
                                            open(gp, "rb").read()))
    report(not bad, "indexed identity tp 4: merged parts == save_file parts", "\n".join(bad))


NP_NAME = {np.bool_: "BOOL", np.uint8: "U8", np.int8: "I8", np.int16: "I16", np.uint16: "U16",
           np.float16: "F16", np.int32: "I32", np.uint32: "U32", np.float32: "F32",
           np.complex64: "C64", np.float64: "F64", np.int64: "I64", np.uint64: "U64"}


def test_gen_layout():
    """testdata/gen.py (what the other tests build their inputs with) writes
    exactly what save_file writes."""
    t = every_dtype_tensors(np.random.default_rng(7))
    a, b = os.path.join(TMP, "gen-ref.safetensors"), os.path.join(TMP, "gen-ours.safetensors")
    save_file(t, a, metadata={"format": "pt"})
    gen.write_safetensors(b, {k: (NP_NAME[v.dtype.type], list(v.shape), v.tobytes())
                              for k, v in t.items()}, {"format": "pt"})
    want, got = open(a, "rb").read(), open(b, "rb").read()
    report(want == got, "gen.py writes the save_file layout byte for byte", first_diff(want, got))


# ------------------------------------------------------------------ (b) rank files vs source

def load_source(model):
    """{name: (dtype, shape, bytes)} of a model dir or file, read by the reference library."""
    files = [model] if os.path.isfile(model) else sorted(glob.glob(os.path.join(model, "*.safetensors")))
    out = {}
    for f in files:
        for name, info in safetensors.deserialize(open(f, "rb").read()):
            out[name] = (info["dtype"], list(info["shape"]), bytes(info["data"]))
    return out


def as_np(dtype, shape, data):
    v = NP_VIEW[dtype]
    a = np.frombuffer(data, dtype=v) if data else np.zeros(0, dtype=v)
    return a.reshape(shape)


def expected_dim(name, gemma4_e=False):
    """DESIGN §5's placement of a tensor by its name (llama/qwen/gemma
    families), independent of the plan files: 0, 1 or -1 (replicated)."""
    if "vision" in name or "multi_modal" in name or "audio" in name:
        return -1
    parts = name.split(".")
    leaf = parts[-2] if parts[-1] in ("weight", "bias") else parts[-1]
    if leaf in ("embed_tokens", "embed_tokens_per_layer"):
        return 0
    if leaf == "lm_head":
        return -1 if gemma4_e else 0
    if leaf in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
        return 0
    if leaf in ("o_proj", "down_proj"):
        return 1 if parts[-1] == "weight" else -1
    return -1


def check_split(label, model, tp, extra_args=(), placements=True):
    out = os.path.join(TMP, "split-" + label.replace("/", "_"))
    shutil.rmtree(out, ignore_errors=True)
    rc, so, se = tps("split", model, "--tp", tp, "-o", out, *extra_args)
    if rc != 0:
        report(False, f"reference {label}: split --tp {tp}", f"rc {rc}\n{se}")
        return
    src = load_source(model)
    problems = []
    # every rank file loads with the reference reader
    rank_files = sorted(glob.glob(os.path.join(out, "model-rank-*-part-*.safetensors")))
    loaded = {}
    for f in rank_files:
        base = os.path.basename(f)
        try:
            with safe_open(f, framework="numpy") as h:
                meta = h.metadata() or {}
                for k in h.keys():
                    sl = h.get_slice(k)
                    sl.get_shape()
                    sl.get_dtype()
            items = safetensors.deserialize(open(f, "rb").read())
        except Exception as e:  # noqa: BLE001
            problems.append(f"{base}: the reference reader rejects it: {e}")
            continue
        for key in ("format", "tp_rank", "tp_size"):
            if key not in meta:
                problems.append(f"{base}: __metadata__ lacks {key}")
        if meta.get("format") != "pt":
            problems.append(f"{base}: __metadata__ format is {meta.get('format')!r}, not 'pt'")
        if meta.get("tp_size") != str(tp):
            problems.append(f"{base}: tp_size {meta.get('tp_size')!r} != {tp}")
        loaded[base] = {n: (i["dtype"], list(i["shape"]), bytes(i["data"])) for n, i in items}
    # the manifest says where every tensor went
    mpath = os.path.join(out, "tpshard.json")
    if not os.path.exists(mpath):
        report(False, f"reference {label}: tpshard.json", "no manifest in the output")
        return
    man = json.load(open(mpath))
    tensors = man.get("tensors")
    if not isinstance(tensors, list):
        report(False, f"reference {label}: manifest", "no 'tensors' list in tpshard.json")
        return
    seen = set()
    g4e = any("embed_tokens_per_layer" in str(x.get("name")) for x in tensors)
    for e in tensors:
        name = e.get("name")
        seen.add(name)
        if name not in src:
            problems.append(f"manifest names {name}, not in the source")
            continue
        sdt, sshape, sdata = src[name]
        if e.get("dtype") != sdt or list(e.get("shape", [])) != sshape:
            problems.append(f"{name}: manifest says {e.get('dtype')}{e.get('shape')}, "
                            f"source is {sdt}{sshape}")
        dim = e.get("dim", -1)
        if placements and tp > 1:
            want_dim = expected_dim(name, g4e)
            if dim != want_dim:
                problems.append(f"{name}: placed on dim {dim}, DESIGN §5 says {want_dim}")
        full = as_np(sdt, sshape, sdata)
        ranks = e.get("ranks", [])
        if sorted(x.get("rank") for x in ranks) != list(range(tp)):
            problems.append(f"{name}: manifest ranks {[x.get('rank') for x in ranks]}")
        for x in ranks:
            r, fname = x.get("rank"), x.get("file")
            if fname not in loaded or name not in loaded[fname]:
                problems.append(f"{name}: rank {r}: not in {fname}")
                continue
            ldt, lshape, ldata = loaded[fname][name]
            if dim is None or dim < 0:
                want_shape, want = sshape, full
                off = 0
            else:
                s, n = chunk(sshape[dim], tp, r)
                want_shape = list(sshape)
                want_shape[dim] = n
                want = full[(slice(None),) * dim + (slice(s, s + n),)]
                off = s
                if x.get("offset") != s:
                    problems.append(f"{name}: rank {r}: manifest offset {x.get('offset')}, "
                                    f"torch.chunk says {s}")
            if ldt != sdt or lshape != want_shape:
                problems.append(f"{name}: rank {r}: {ldt}{lshape}, expected {sdt}{want_shape}")
                continue
            if list(x.get("shape", lshape)) != lshape:
                problems.append(f"{name}: rank {r}: manifest shape {x.get('shape')} != file {lshape}")
            got = as_np(ldt, lshape, ldata)
            if not np.array_equal(got, want):
                problems.append(f"{name}: rank {r}: bytes differ from the source slice at {off}")
            if "crc32" in x and x["crc32"] != zlib.crc32(ldata):
                problems.append(f"{name}: rank {r}: crc32 {x['crc32']} != {zlib.crc32(ldata)}")
    missing = sorted(set(src) - seen)
    if missing:
        problems.append(f"tensors missing from the manifest: {missing[:3]}")
    # nothing in the rank files that the manifest does not account for
    for fname, tt in loaded.items():
        r = int(fname.split("-")[2])
        for n in tt:
            if not any(e.get("name") == n and any(x.get("rank") == r and x.get("file") == fname
                                                  for x in e.get("ranks", []))
                       for e in tensors):
                problems.append(f"{fname}: {n} is not in the manifest for rank {r}")
    report(not problems, f"reference {label}: {len(rank_files)} rank files load and match the "
           f"source slices (tp {tp})", "\n".join(problems[:15]))


def test_conformance_models():
    for case_dir in sorted(glob.glob(os.path.join(TOP, "testdata", "conformance", "*", ""))):
        cj = os.path.join(case_dir, "case.json")
        if not os.path.exists(cj):
            continue
        case = json.load(open(cj))
        # the serving layouts have their own oracle (test_serving_layouts.py)
        if case.get("expect") != "split" or case.get("layout"):
            continue
        check_split("conformance/" + os.path.basename(case_dir.rstrip("/")),
                    os.path.join(case_dir, "model"), case["tp"])


def test_gen_models():
    cases = [
        ("gen/llama-all-dtypes", ["--all-dtypes"], 3, ["--family", "llama"]),
        ("gen/qwen2-index3", ["qwen2", "--index", "3", "--dtype", "F16"], 2, []),
        ("gen/qwen3-tied-f32", ["qwen3", "--tied", "--dtype", "F32", "--vocab", "250"], 2, []),
        ("gen/gemma3-new-tp1", ["gemma3", "--gemma3-naming", "new"], 1, []),
        ("gen/gemma3-untied", ["gemma3", "--untied"], 2, []),
        ("gen/gemma4-e", ["gemma4", "--vocab", "250"], 2, []),
        ("gen/gemma4-dense", ["gemma4", "--gemma4-variant", "dense", "--kv-heads", "4",
                              "--index", "2"], 2, []),
    ]
    for label, args, tp, extra in cases:
        d = os.path.join(TMP, "m-" + label.replace("/", "_"))
        if args[0] == "--all-dtypes":
            gen.main(["--all-dtypes", d, "--no-config"])
        else:
            gen.main([args[0], d] + args[1:])
        check_split(label, d, tp, extra)


def main():
    test_gen_layout()
    if not os.access(TPSHARD, os.X_OK):
        print(f"skip - reference tests: no tpshard binary at {TPSHARD}")
        return 1 if fails() else 0
    for t in (test_writer_identity, test_indexed_identity, test_conformance_models, test_gen_models):
        try:
            t()
        except Exception as e:  # noqa: BLE001
            import traceback
            report(False, f"{t.__name__} raised {type(e).__name__}", traceback.format_exc())
    if not os.environ.get("KEEP_TMP"):
        shutil.rmtree(TMP, ignore_errors=True)
    return 1 if fails() else 0


if __name__ == "__main__":
    sys.exit(main())
