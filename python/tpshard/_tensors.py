"""One rank's tensors of a split directory as numpy arrays or torch tensors.

numpy and torch are optional: each is imported only when asked for
(``pip install tpshard[numpy]`` or ``tpshard[torch]``). The rank files are
read through a copy-on-write mapping, so loading costs no copy until a
tensor is written to.
"""
from __future__ import annotations

import json
import mmap
import os
import re
import struct
from typing import Any, Dict, List, Optional, Tuple

__all__ = ["rank_files", "load_rank", "load_rank_dtensors"]

_MAX_HEADER = 100_000_000

# numpy has no bfloat16 or float8: those come as their bits, same width.
_NUMPY = {"BOOL": "bool", "U8": "u1", "I8": "i1", "I16": "<i2", "U16": "<u2", "I32": "<i4",
          "U32": "<u4", "I64": "<i8", "U64": "<u8", "F16": "<f2", "BF16": "<u2", "F32": "<f4",
          "F64": "<f8", "C64": "<c8", "F8_E5M2": "u1", "F8_E4M3": "u1", "F8_E8M0": "u1",
          "F8_E4M3FNUZ": "u1", "F8_E5M2FNUZ": "u1"}
_TORCH = {"BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16",
          "I32": "int32", "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16",
          "BF16": "bfloat16", "F32": "float32", "F64": "float64", "C64": "complex64",
          "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn", "F8_E8M0": "float8_e8m0fnu",
          "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz"}


def rank_files(dir: "os.PathLike[str] | str", rank: int) -> List[str]:
    """The paths of rank `rank`'s files in a split directory, in part order
    (model-rank-{rank}-part-{p}.safetensors; with pipeline stages, rank =
    stage x tp + tp rank, model-pp-{stage}-tp-{tp rank}-part-{p}.safetensors)."""
    d = os.fspath(dir)
    pat = re.compile(rf"model-rank-{int(rank)}-part-(\d+)\.safetensors\Z")
    try:
        with open(os.path.join(d, "tpshard.json")) as f:
            m = json.load(f)
        tp, pp = int(m.get("tp", 1)), int(m.get("pp", 1))
    except (OSError, ValueError, AttributeError):
        tp, pp = 1, 1
    if pp > 1:
        pat = re.compile(rf"model-pp-{int(rank) // tp}-tp-{int(rank) % tp}-part-(\d+)"
                         r"\.safetensors\Z")
    parts = []
    for name in os.listdir(d):
        m = pat.match(name)
        if m:
            parts.append((int(m.group(1)), os.path.join(d, name)))
    if not parts:
        raise FileNotFoundError(f"{d}: no files of rank {rank} "
                                f"(model-rank-{rank}-part-*.safetensors)")
    return [p for _, p in sorted(parts)]


def _header(path: str, mm: Any) -> Tuple[int, Dict[str, Any], Dict[str, str]]:
    if len(mm) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack_from("<Q", mm, 0)
    if n > _MAX_HEADER or 8 + n > len(mm):
        raise ValueError(f"{path}: header length {n} is past the end of the file")
    hdr = json.loads(bytes(mm[8:8 + n]).decode("utf-8"))
    meta = hdr.pop("__metadata__", None) or {}
    return 8 + n, hdr, meta


def _tensors(path: str, make: Any) -> Tuple[Dict[str, Any], Dict[str, str]]:
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    start, hdr, meta = _header(path, mm)
    out = {}
    for name, info in hdr.items():
        b, e = info["data_offsets"]
        if not 0 <= b <= e or start + e > len(mm):
            raise ValueError(f"{path}: tensor '{name}': data_offsets {b}, {e} outside the file")
        out[name] = make(mm, info["dtype"], info["shape"], start + b, e - b, name)
    return out, meta


def _need(module: str, extra: str, what: str) -> Any:
    """import `module`, or say which pip install gives it."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ModuleNotFoundError(
            f"{what} needs {extra}, which is not installed: pip install tpshard[{extra}] "
            f"(or pip install {extra})", name=extra) from e


def _numpy_maker() -> Any:
    np = _need("numpy", "numpy", "tpshard.load_rank(framework='numpy')")

    def make(mm: Any, dtype: str, shape: List[int], off: int, n: int, name: str) -> Any:
        if dtype not in _NUMPY:
            raise ValueError(f"tensor '{name}': dtype {dtype} has no numpy equivalent")
        dt = np.dtype(_NUMPY[dtype])
        return np.frombuffer(mm, dtype=dt, count=n // dt.itemsize, offset=off).reshape(shape)
    return make


def _torch_maker(device: Any, what: str = "tpshard.load_rank(framework='torch')") -> Any:
    torch = _need("torch", "torch", what)

    def make(mm: Any, dtype: str, shape: List[int], off: int, n: int, name: str) -> Any:
        dt = getattr(torch, _TORCH.get(dtype, "?"), None)
        if dt is None:
            raise ValueError(f"tensor '{name}': dtype {dtype} is not in this torch")
        if n == 0:
            t = torch.empty(shape, dtype=dt)
        else:
            t = torch.frombuffer(mm, dtype=dt, count=n // dt.itemsize, offset=off).reshape(shape)
        return t if device is None else t.to(device)
    return make


def load_rank(dir: "os.PathLike[str] | str", rank: int, *, framework: str = "numpy",
              device: Optional[Any] = None) -> Dict[str, Any]:
    """Rank `rank`'s tensors of a split directory, by name, from all its parts.

    Args:
        dir: a directory tpshard split wrote.
        rank: the rank, 0 to tp - 1.
        framework: "numpy" (BF16 and the FP8 dtypes come as their raw bits,
            uint16 and uint8, as numpy has no such types) or "torch" (every
            dtype as itself); imported only now.
        device: torch only: where to put the tensors (default: CPU).

    Returns:
        {name: array or tensor} with the rank's local shapes. Which slice of
        the global tensor each holds is in the files' metadata
        ("placements"); load_rank_dtensors() turns them into DTensors.
    """
    if framework in ("numpy", "np"):
        make = _numpy_maker()
    elif framework in ("torch", "pt"):
        make = _torch_maker(device)
    else:
        raise ValueError(f"framework={framework!r}: use 'numpy' or 'torch'")
    out: Dict[str, Any] = {}
    for path in rank_files(dir, rank):
        out.update(_tensors(path, make)[0])
    return out


def load_rank_dtensors(dir: "os.PathLike[str] | str", mesh: Any, *,
                       device: Optional[Any] = None) -> Dict[str, Any]:
    """This process's rank of a DTensor-layout split, as DTensors on a 1-D
    tensor-parallel DeviceMesh (the recipe of the README's "Loading rank
    files in a serving stack"): sharded tensors get Shard(dim) with their
    global shape and stride (shards may be uneven), the others Replicate().

    Args:
        dir: a directory tpshard split wrote with the dtensor layout, at
            tp == mesh.size().
        mesh: the tensor-parallel torch.distributed DeviceMesh.
        device: where the local tensors go (e.g. f"cuda:{local_rank}").
    """
    torch = _need("torch", "torch", "tpshard.load_rank_dtensors()")
    from torch.distributed.tensor import DTensor, Replicate, Shard

    rank, tp = mesh.get_local_rank(), mesh.size()
    make = _torch_maker(device)
    state = {}
    for path in rank_files(dir, rank):
        tensors, meta = _tensors(path, make)
        if int(meta.get("tp_rank", -1)) != rank or int(meta.get("tp_size", -1)) != tp:
            raise ValueError(f"{path}: written for rank {meta.get('tp_rank')} of "
                             f"{meta.get('tp_size')}, not rank {rank} of {tp}")
        if "placements" not in meta:
            raise ValueError(f"{path}: no placements (a serving layout's files are loaded "
                             "by their engine)")
        placements = json.loads(meta["placements"])
        for name, local in tensors.items():
            p = placements.get(name)
            if p is None:
                state[name] = DTensor.from_local(local, mesh, [Replicate()], run_check=False)
                continue
            dim = int(p["placement"][len("Shard("):-1])
            shape = torch.Size(p["global_shape"])
            stride = torch.empty(shape, device="meta").stride()
            state[name] = DTensor.from_local(local, mesh, [Shard(dim)], run_check=False,
                                             shape=shape, stride=stride)
    return state
