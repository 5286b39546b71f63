"""tpshard: tensor-parallel resharding of safetensors checkpoints.

The functions mirror the tpshard commands and take their long options as
keywords (``--max-part-size`` is ``max_part_size=``, ``-o`` is ``output=``).
They call libtpshard, the library the ``tpshard`` program is built on,
directly (no subprocess), and return what ``tpshard <command> --json`` prints,
parsed: plain dicts and lists with the same keys, starting with ``ok`` and
``schema_version``.

    inspect(model)                     what is in a checkpoint
    plan(model, tp, ...)               how a split would place every tensor
    plan(list=True)                    the built-in plans and layouts
    split(model, tp, output, ...)      write one safetensors file per rank
    check(dir)                         a split directory against its manifest
    merge(dir, output)                 back to the full checkpoint
    verify(dir, source=model, ...)     the shards compute what the model computes

A failure raises tpshard.Error, which carries the library's stable error code
(``e.code``, an ErrorCode; ``e.name`` such as ``"TPS_E_REJECT"``) and the
message the tpshard command prints (``str(e)``). A plan that rejects the model
and a verification that fails are results, not errors: their documents say
``"ok": False``. Ctrl-C stops a running command cleanly (no file is left
under a final name) and raises KeyboardInterrupt. Warnings go to the
``logging`` logger ``"tpshard"``.

The ``tpshard`` command installed with this package is the same program
(``tpshard --version``); ``man tpshard`` and one page per command describe
it in full. Loading rank files into numpy or torch: tpshard.load_rank().
"""
from __future__ import annotations

import ctypes
import enum
import json
import logging
import os
import threading
from typing import Any, Callable, Dict, Iterable, List, Optional, Union

from . import _lib
from ._lib import lib
from ._version import __version__

__all__ = ["inspect", "plan", "split", "check", "merge", "verify", "load_rank",
           "load_rank_dtensors", "rank_files", "Error", "ErrorCode", "Progress", "PathLike",
           "__version__", "library_version", "executable", "SCHEMA_VERSION"]

PathLike = Union[str, "os.PathLike[str]"]
#: progress(done, total, tensor): bytes done of total, and the tensor being
#: copied or checked (None for the last call).
Progress = Callable[[int, int, Optional[str]], Any]

#: The "schema_version" of the documents this module returns.
SCHEMA_VERSION = 1

logger = logging.getLogger("tpshard")

#: The tpshard program shipped in this package.
executable = _lib.EXECUTABLE


def library_version() -> str:
    """The version of the libtpshard this module runs."""
    return lib.tps_version().decode()


class ErrorCode(enum.IntEnum):
    """The library's stable error numbers (tps_err in tpshard.h)."""

    IO = 1             #: open/read/write/fsync/rename failed
    NOMEM = 2          #: allocation failed or a resource bound was hit
    FORMAT = 3         #: malformed safetensors file
    JSON = 4           #: malformed JSON (config.json, index, manifest)
    INDEX = 5          #: inconsistent model.safetensors.index.json
    CONFIG = 6         #: config.json lacks or has a bad value
    PLAN = 7           #: malformed plan file
    REJECT = 8         #: the plan rejects tensor parallelism for this model
    ARG = 9            #: bad argument
    EXISTS = 10        #: output exists and force was not given
    MISMATCH = 11      #: check found data that disagrees
    UNSUPPORTED = 12   #: feature not built in (e.g. the CUDA backends)
    INTERRUPTED = 13   #: stopped
    NOSPACE = 14       #: not enough free space or file size limit
    DEVICE = 15        #: CUDA, cuBLAS or NCCL error
    SHAPE = 16         #: a tensor cannot be split as the plan asks
    PARTIAL = 17       #: ranks missing: split(ranks=...) runs have not filled the directory


class Error(Exception):
    """A tpshard command failed.

    Attributes:
        code: the library's error number, an ErrorCode (a plain int for a
            number this module does not know yet).
        name: the code's name in tpshard.h, e.g. "TPS_E_REJECT".
        message: what ``tpshard`` prints after "tpshard: error: " (also str(e)).
        document: the error document ``--json`` prints,
            {"ok": False, "schema_version": 1, "error": message}.
    """

    def __init__(self, code: int, message: str):
        super().__init__(message)
        try:
            self.code: Union[ErrorCode, int] = ErrorCode(code)
            self.name = "TPS_E_" + self.code.name
        except ValueError:
            self.code = int(code)
            self.name = f"TPS_E_{int(code)}"
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return f"tpshard.Error({self.name}, {self.message!r})"

    @property
    def document(self) -> Dict[str, Any]:
        out = ctypes.c_void_p()
        if lib.tps_error_json(None, self.message.encode("utf-8", "surrogateescape"),
                              ctypes.byref(out)):
            raise MemoryError("tpshard: out of memory")
        return json.loads(_lib.take_string(out))


def _arg_error(message: str) -> Error:
    return Error(ErrorCode.ARG, message)


def _path(p: PathLike, what: str) -> bytes:
    try:
        return os.fsencode(p)
    except TypeError:
        raise TypeError(f"{what} must be a path (str or os.PathLike), not "
                        f"{type(p).__name__}") from None


def _count(v: Any, what: str, lo: int, hi: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{what} must be an int, not {type(v).__name__}")
    if not lo <= v <= hi:
        raise _arg_error(f"{what}={v} is not a whole number from {lo} to {hi}")
    return v


_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}


class _Call:
    """One library context for one command: its log goes to logging, its
    progress to the caller's callable, and Ctrl-C interrupts it."""

    def __init__(self, threads: Optional[int] = None, progress: Optional[Progress] = None):
        if progress is not None and not callable(progress):
            raise TypeError("progress must be callable: progress(done, total, tensor)")
        self.ctx = lib.tps_ctx_new()
        if not self.ctx:
            raise MemoryError("tpshard: out of memory")
        self._frees: List[Callable[[], None]] = []
        self._raised: Optional[BaseException] = None
        # ctypes callbacks must outlive every call that may make them.
        self._log = _lib.LOG_FN(self._on_log)
        lib.tps_ctx_set_log(self.ctx, self._log, None)
        self._progress_fn = progress
        if progress is not None:
            self._progress = _lib.PROGRESS_FN(self._on_progress)
            lib.tps_ctx_set_progress(self.ctx, self._progress, None)
        if threads is not None:
            lib.tps_ctx_set_threads(self.ctx, threads)

    def __enter__(self) -> "_Call":
        return self

    def __exit__(self, *exc: Any) -> None:
        for free in reversed(self._frees):
            free()
        lib.tps_ctx_free(self.ctx)

    # -- callbacks (from the library's threads) --

    def _on_log(self, user: Any, level: int, msg: bytes) -> None:
        try:
            logger.log(_LEVELS.get(level, logging.INFO), "%s", msg.decode("utf-8", "replace"))
        except Exception:  # a broken handler must not take the library down
            pass

    def _on_progress(self, user: Any, done: int, total: int, what: Optional[bytes]) -> None:
        if self._raised is not None:
            return
        try:
            self._progress_fn(done, total, what.decode("utf-8", "replace") if what else None)
        except BaseException as e:  # stop the work; raised once it has stopped
            self._raised = e
            lib.tps_ctx_interrupt(self.ctx)

    # -- calls --

    def run(self, fn: Callable[..., int], *args: Any) -> None:
        """fn(ctx, *args) in a worker thread, so that the main thread stays
        free to take Ctrl-C: then the library is asked to stop, and once it
        has (temporaries removed), KeyboardInterrupt is raised."""
        box: Dict[str, Any] = {}
        done = threading.Event()

        def work() -> None:
            try:
                box["rc"] = fn(self.ctx, *args)
            except BaseException as e:  # pragma: no cover - ctypes argument errors
                box["exc"] = e
            finally:
                done.set()

        worker = threading.Thread(target=work, name="tpshard", daemon=True)
        worker.start()
        interrupted = False
        # Polled: a signal taken by another thread is acted on by this one
        # only when it runs Python again.
        while not done.is_set():
            try:
                done.wait(0.1)
            except KeyboardInterrupt:
                interrupted = True
                lib.tps_ctx_interrupt(self.ctx)
        worker.join()
        if interrupted:
            raise KeyboardInterrupt
        if self._raised is not None:
            raise self._raised
        if "exc" in box:
            raise box["exc"]
        self.check(box["rc"])

    def check(self, rc: int) -> None:
        if rc == 0:
            return
        msg = (lib.tps_ctx_errmsg(self.ctx) or b"").decode("utf-8", "replace")
        if rc == ErrorCode.INTERRUPTED:
            msg = "interrupted; no partial file was left under a final name"
        raise Error(rc, msg or lib.tps_strerror(rc).decode())

    def handle(self, fn: Callable[..., int], *args: Any, free: Callable[[Any], None]) -> Any:
        """An opaque handle made by fn(ctx, *args, &h), freed when the call ends."""
        h = ctypes.c_void_p()
        try:
            self.run(fn, *args, ctypes.byref(h))
        finally:  # made, even if Ctrl-C came just after: freed with the rest
            if h.value:
                self._frees.append(lambda: free(h))
        return h

    def doc(self, fn: Callable[..., int], *args: Any) -> Dict[str, Any]:
        """The JSON document fn(ctx, *args, &out) makes, parsed."""
        out = ctypes.c_void_p()
        self.check(fn(self.ctx, *args, ctypes.byref(out)))
        return json.loads(_lib.take_string(out))

    def layout(self, model: PathLike, tp: int, plan: Optional[PathLike], family: Optional[str],
               layout: Optional[PathLike], untie: bool, ep: bool = False, pp: int = 1,
               pp_layers: Any = None) -> Any:
        """Opens model, picks the plan (plan, family or detected) and the
        layout, unties when asked, and lays out every rank: split's and
        plan's common part. pp_layers: a ctypes int array of pp counts."""
        if plan is not None and family is not None:
            raise _arg_error("plan and family conflict; give one")
        ck = self.handle(lib.tps_ckpt_open, _path(model, "model"), free=lib.tps_ckpt_free)
        if plan is not None:
            pl = self.handle(lib.tps_plan_load, _path(plan, "plan"), free=lib.tps_plan_free)
        elif family is not None:
            pl = self.handle(lib.tps_plan_builtin, str(family).encode(), free=lib.tps_plan_free)
        else:
            pl = self.handle(lib.tps_plan_detect, ck, free=lib.tps_plan_free)
        spec = self.handle(lib.tps_layout_spec_open,
                           None if layout is None else _path(layout, "layout"),
                           free=lib.tps_layout_spec_free)
        if untie:
            if spec.value:
                name = lib.tps_layout_spec_name(spec).decode()
                raise _arg_error(f"untie is for the dtensor layout; layout {name} writes tied "
                                 "checkpoints as its engine loads them")
            self.run(lib.tps_ckpt_untie, ck, pl)
        if pp > 1 and not lib.tps_layout_spec_has_pipeline(spec):
            name = lib.tps_layout_spec_name(spec).decode()
            raise _arg_error(f"pp is for layouts with pipeline stages (layout=\"vllm\"); layout "
                             f"{name} has none")
        return self.handle(lib.tps_layout_new_pp, ck, pl, spec, tp, 1 if ep else 0, pp, pp_layers,
                           free=lib.tps_layout_free), ck


def _pipeline(pp: Optional[int], pp_layers: Union[str, Iterable[int], None]) -> Any:
    """(pp, the partition as a ctypes array or None): pp_layers as given, or
    VLLM_PP_LAYER_PARTITION when set (honoured as vLLM honours it); both and
    different: an error."""
    given = None if pp_layers is None else (
        pp_layers if isinstance(pp_layers, str) else ",".join(str(int(x)) for x in pp_layers))
    if pp is None:
        pp = given.count(",") + 1 if given else 1
    pp = _count(pp, "pp", 1, 4096)
    env = os.environ.get("VLLM_PP_LAYER_PARTITION") if pp > 1 else None
    parts = []
    for what, text in (("pp_layers", given), ("VLLM_PP_LAYER_PARTITION", env)):
        if text is None:
            parts.append(None)
            continue
        arr, why = (ctypes.c_int * pp)(), ctypes.create_string_buffer(160)
        if lib.tps_pp_parse_layers(text.encode(), pp, arr, why, 160) != 0:
            raise _arg_error(f"{what} {text!r}: {why.value.decode()}")
        parts.append(arr)
    if parts[0] is not None and parts[1] is not None and list(parts[0]) != list(parts[1]):
        raise _arg_error(f"pp_layers {given} and VLLM_PP_LAYER_PARTITION={env} disagree: vLLM "
                         "partitions the layers as the variable says; give one, or the same")
    return pp, parts[1] if parts[1] is not None else parts[0]


def inspect(model: PathLike) -> Dict[str, Any]:
    """What is in a checkpoint (``tpshard inspect MODEL --json``).

    Lists every tensor (name, dtype, shape, bytes, file), totals by dtype,
    the config.json fields that matter for tensor parallelism, the
    quantization, and the model family tpshard detects. Only headers are
    read, and every header is validated against the safetensors format.

    Args:
        model: a directory holding config.json and model.safetensors (or
            model.safetensors.index.json with its parts), one .safetensors
            file, or a directory tpshard split wrote.

    Returns:
        The document: ok, schema_version, model, kind, files, family, config
        (null without config.json), quantization, tensor_count, total_bytes,
        dtypes ({dtype: {tensors, bytes}}) and tensors ([{name, dtype, shape,
        bytes, file}]).

    Raises:
        tpshard.Error: unreadable or malformed input (the code says which).
    """
    with _Call() as c:
        ck = c.handle(lib.tps_ckpt_open, _path(model, "model"), free=lib.tps_ckpt_free)
        return c.doc(lib.tps_inspect_json, ck)


def plan(model: Optional[PathLike] = None, tp: Optional[int] = None, *,
         plan: Optional[PathLike] = None, family: Optional[str] = None,
         layout: Optional[PathLike] = None, untie: bool = False, ep: bool = False,
         pp: Optional[int] = None, pp_layers: Union[str, Iterable[int], None] = None,
         list: bool = False) -> Dict[str, Any]:
    """How a split would place every tensor, and whether it is allowed
    (``tpshard plan MODEL --tp N --json``). Writes nothing.

    One entry per tensor with its style, its placement and its local shape on
    every rank; the bytes per rank and the replication overhead; the
    attention geometry layer by layer; and every check of the plan against
    config.json with its verdict.

    Args:
        model: the checkpoint, in any form inspect() takes.
        tp: tensor-parallel size, 1 to 4096.
        plan: a YAML plan file (see tpshard-plan(5)) instead of a built-in one.
        family: a built-in plan by name (plan(list=True) shows them) instead
            of the one detected from config.json. Cannot go with plan.
        layout: "dtensor" (the default: the plan's DTensor shards), "vllm",
            "sglang" (the rank files of those engines' sharded_state
            loaders), or a layout file (a path with a "/" or ending in .yaml).
            A serving layout adds rank_tensors: every rank file's tensors and
            where each of their bytes comes from.
        untie: plan the split of a tied checkpoint as split(untie=True)
            writes it.
        ep: plan the split as split(ep=True) writes it.
        pp, pp_layers: plan the pipeline stages as split(pp=, pp_layers=)
            writes them: each tensor's stages, each worker's bytes.
        list: return the built-in plans and layouts instead
            (``tpshard plan --list --json``); model and tp are then ignored.

    Returns:
        The document: ok (False when a check rejects the split), model, plan,
        layout, target, tp, pp, stages ([{stage, layers, ranks}]), ep, quantization, rejected (why, or None), untie,
        layers, checks ([{check, verdict, detail}]), tensors ([{name, dtype,
        style, placement, rule, shape, stages, local_shapes}]), rank_bytes (every rank:
        tp x pp of them),
        source_bytes and replication_overhead.

    Raises:
        tpshard.Error: unreadable input, an unknown family, a malformed plan
            or layout file, an untie that does not apply (code ARG).
    """
    if list:
        with _Call() as c:
            return c.doc(lib.tps_plan_list_json)
    if model is None or tp is None:
        raise _arg_error("plan: give model and tp (or list=True)")
    tp = _count(tp, "tp", 1, 4096)
    pp, parts = _pipeline(pp, pp_layers)
    with _Call() as c:
        L, _ = c.layout(model, tp, plan, family, layout, untie, ep, pp, parts)
        return c.doc(lib.tps_plan_json, L)


def _ranks_mask(ranks: Union[str, Iterable[int]], tp: int) -> Any:
    text = ranks if isinstance(ranks, str) else ",".join(
        str(_count(r, "ranks", 0, tp - 1)) for r in ranks)
    mask = (ctypes.c_ubyte * tp)()
    if not text or lib.tps_parse_ranks(text.encode(), tp, mask) != 0:
        raise _arg_error(f"ranks={ranks!r} is not a list of ranks below {tp} (e.g. \"0,3-5\")")
    return mask


def _size(v: Union[int, str]) -> int:
    if isinstance(v, str):
        out = ctypes.c_uint64()
        if lib.tps_parse_size(v.encode(), ctypes.byref(out)) != 0 or out.value == 0:
            raise _arg_error(f"max_part_size={v!r} is not a size (e.g. \"512M\", \"5G\")")
        return out.value
    return _count(v, "max_part_size", 1, 2**64 - 1)


def split(model: PathLike, tp: int, output: Optional[PathLike] = None, *,
          plan: Optional[PathLike] = None, family: Optional[str] = None,
          layout: Optional[PathLike] = None, ranks: Union[str, Iterable[int], None] = None,
          untie: bool = False, ep: bool = False, pp: Optional[int] = None,
          pp_layers: Union[str, Iterable[int], None] = None, threads: Optional[int] = None,
          max_part_size: Union[int, str, None] = None, no_mmap: bool = False,
          copy: bool = False, force: bool = False, dry_run: bool = False,
          progress: Optional[Progress] = None) -> Dict[str, Any]:
    """Write one safetensors file per tensor-parallel rank
    (``tpshard split MODEL --tp N -o DIR --json``).

    Reads a full Hugging Face checkpoint, resolves the placement of every
    tensor with a tensor-parallel plan, and writes, for every rank r in
    0..tp-1, the local tensors that PyTorch DTensor gives rank r under that
    placement (or, with layout="vllm"|"sglang", the parameters that engine's
    sharded_state loader reads), then the manifest tpshard.json, and copies
    config.json and the tokenizer files. Placement follows torch.chunk: 250
    rows over 4 ranks give 63, 63, 63, 61.

    The whole split is computed and validated before the first byte is
    written: when the plan or the layout rejects the model, nothing is
    written and tpshard.Error (code REJECT) says why. Tensors are streamed;
    every file is written under a temporary name, synced and renamed, the
    manifest last, so a file under a final name is always complete, also
    after Ctrl-C (KeyboardInterrupt) or an exception raised by progress.

    Args:
        model: the checkpoint: a directory (config.json + model.safetensors
            or an index with its parts), one .safetensors file, or a
            directory tpshard split wrote (resharded through its manifest).
        tp: tensor-parallel size, 1 to 4096.
        output: the output directory, created when missing. Default:
            NAME-tpN beside the input (NAME: the model directory's name or
            the file's stem).
        plan: a YAML plan file (see tpshard-plan(5)).
        family: a built-in plan by name; default: detected from config.json.
        layout: "dtensor" (default), "vllm", "sglang", or a layout file.
        ranks: write only these ranks: "0,3-5" or an iterable of ints. Runs
            of the same split may share one directory.
        untie: a tied checkpoint: write lm_head from the embedding and set
            tie_word_embeddings false in the copied config.json.
        ep: mixture-of-experts checkpoints in a serving layout: expert
            parallelism, each expert whole on one rank (rank r holds experts
            [r E/tp, (r+1) E/tp)); attention stays tensor parallel.
        pp: layout="vllm": pipeline stages of tp ranks each, files
            model-pp-{stage}-tp-{rank}-part-{p}.safetensors, each layer on the
            stage vLLM's get_pp_indices gives it (VLLM_PP_LAYER_PARTITION
            honoured when set). ranks then counts workers, stage x tp + rank.
        pp_layers: each stage's layers, "15,15,16,15" or a list of ints
            (implies pp).
        threads: worker threads; default: all cores.
        max_part_size: split each rank into parts of at most this much tensor
            data: bytes (int) or a size such as "5G", "512M".
        no_mmap: read the source with pread instead of mapping it (by
            default it is mapped except on NFS, FUSE, Lustre, CIFS/SMB).
        copy: copy every byte through the library (split --copy): no blocks
            shared with the source (XFS, btrfs), no copy_file_range.
        force: replace an existing tpshard output in output.
        dry_run: write nothing; return what plan() returns.
        progress: called as progress(done, total, tensor) with the bytes
            copied so far, the total, and the tensor being copied (None on
            the last call). It runs on the library's threads, one call at a
            time; an exception it raises stops the split and is raised.

    Returns:
        The document: ok, schema_version, model, output, plan, layout, target,
        tp, pp, stages, ep, ranks_written, files_written, bytes_written,
        bytes_shared, bytes_copied, copy (reflink, copy_file_range or write)
        and rank_bytes (the tensor bytes of each rank; 0 for ranks not
        written).

    Raises:
        tpshard.Error: malformed input, a rejected split (REJECT), an output
            that exists without force (EXISTS), I/O errors, no space.
        KeyboardInterrupt: Ctrl-C; the temporary files are removed first.
    """
    tp = _count(tp, "tp", 1, 4096)
    pp, parts = _pipeline(pp, pp_layers)
    mask = None if ranks is None else _ranks_mask(ranks, tp * pp)
    part = 0 if max_part_size is None else _size(max_part_size)
    if threads is not None:
        threads = _count(threads, "threads", 1, 1024)
    with _Call(threads=threads, progress=progress) as c:
        L, ck = c.layout(model, tp, plan, family, layout, untie, ep, pp, parts)
        if dry_run:
            return c.doc(lib.tps_plan_json, L)
        if output is None:
            out = ctypes.c_void_p()
            c.check(lib.tps_split_default_dir_pp(c.ctx, ck, tp, pp, ctypes.byref(out)))
            out_dir = os.fsencode(_lib.take_string(out))
        else:
            out_dir = _path(output, "output")
        opts = _lib.SplitOpts(tp=tp, ranks=mask, max_part_size=part, force=int(bool(force)),
                              out_dir=out_dir, map_source=int(not no_mmap),
                              plain_copy=int(bool(copy)))
        res = _lib.SplitResult()
        c.run(lib.tps_split, ck, L, ctypes.byref(opts), ctypes.byref(res))
        return c.doc(lib.tps_split_json, L, ctypes.byref(opts), ctypes.byref(res))


def check(dir: PathLike) -> Dict[str, Any]:
    """Verify a split directory against its manifest, without the source
    (``tpshard check DIR --json``).

    Every rank file parses, every tensor has the manifest's dtype, shape and
    CRC32, shards cover each tensor exactly once, replicas agree. Ranks that
    were not written (split(ranks=...)) are reported, not failed.

    Args:
        dir: a directory tpshard split wrote.

    Returns:
        The document: ok, schema_version, dir, tp, ranks_present,
        missing_ranks ("1,2,5" or ""), complete (False for a directory that
        split(ranks=...) runs have not finished: the command exits 3 then),
        files_checked, tensors_checked, bytes_checked and headers_checked
        (rank files whose header has the manifest's CRC32: fewer than
        files_checked only for a manifest older than header CRCs).

    Raises:
        tpshard.Error: a file that disagrees with the manifest (MISMATCH),
            a missing or malformed manifest or rank file.
    """
    with _Call() as c:
        r = _lib.CheckResult()
        d = _path(dir, "dir")
        c.run(lib.tps_check_dir, d, ctypes.byref(r))
        return c.doc(lib.tps_check_json, d, ctypes.byref(r))


def merge(dir: PathLike, output: PathLike, *, force: bool = False,
          copy: bool = False) -> Dict[str, Any]:
    """Reassemble the full checkpoint from a split directory
    (``tpshard merge DIR -o OUT --json``).

    Every tensor is gathered along its placement, replicated tensors are
    taken once after checking the ranks agree, and the original file names
    and grouping come back (model.safetensors, or the parts and their index),
    with config and tokenizer files: merge(split(x)) == x byte for byte.

    Args:
        dir: a directory tpshard split wrote, with every rank present.
        output: the output directory.
        force: replace existing files in output.
        copy: copy every byte through the library (merge --copy), instead
            of sharing blocks with the rank files or copy_file_range.

    Returns:
        The document: ok, schema_version, dir, output and files_written.

    Raises:
        tpshard.Error: missing ranks, disagreeing replicas, an existing
            output without force (EXISTS), I/O errors.
        KeyboardInterrupt: Ctrl-C; nothing incomplete is left.
    """
    with _Call() as c:
        d = _path(dir, "dir")
        opts = _lib.MergeOpts(out_dir=_path(output, "output"), force=int(bool(force)),
                              plain_copy=int(bool(copy)))
        files = ctypes.c_int()
        c.run(lib.tps_merge, d, ctypes.byref(opts), ctypes.byref(files))
        return c.doc(lib.tps_merge_json, d, ctypes.byref(opts), files.value)


def verify(dir: PathLike, *, source: Optional[PathLike] = None, backend: str = "cpu",
           tensors: Optional[str] = None, seed: int = 0, batch: int = 4,
           nccl_id_file: Optional[PathLike] = None, threads: Optional[int] = None,
           tensors_per_pass: Optional[int] = None,
           progress: Optional[Progress] = None) -> Dict[str, Any]:
    """Prove that a split directory reproduces its source
    (``tpshard verify DIR --source MODEL --json``).

    Reconstruction: every tensor gathered from the ranks' shards equals the
    source byte for byte, and replicated tensors are identical on every rank
    (without source: every shard's CRC32 is checked against the manifest).
    Numerics (with source): seeded random tokens go through each sharded
    Linear (colwise: per-rank X W_r^T + b_r, all-gather; rowwise: per-rank
    X_r W_r^T, all-reduce, bias once), each vocabulary-sharded embedding
    (exact), and per layer the MLP and attention blocks, in f32, compared
    with the unsharded products with a tolerance of 2 gamma(n) sum|x w|.

    Args:
        dir: a directory tpshard split wrote.
        source: the checkpoint it was split from.
        backend: "cpu" (ranks as threads), "cuda" (every rank's GEMM with
            cuBLAS on one GPU) or "nccl" (one rank per GPU); the GPU backends
            need a build with CUDA, which this wheel is not.
        tensors: only tensors whose name matches this fnmatch pattern; a
            block is checked when all its tensors match.
        seed: seed of the random inputs.
        batch: tokens per check, 1 to 256.
        nccl_id_file: backend "nccl" with one process per rank: where rank 0
            writes the NCCL unique id.
        threads: worker threads; default: all cores.
        tensors_per_pass: check about this many tensors at a time, in name
            order, cut between layers (default 2048): memory for that many
            tensors' checks; the checks are the same.
        progress: progress(done, total, tensor), as for split().

    Returns:
        The document: ok (the verdict: False when a check fails), dir,
        source, backend, checks ([{check, kind, max_abs_err, tolerance,
        wrong, total, ok, note}]) and summary (passed, failed, bytes,
        seconds, gb_per_s, setup_seconds, seed, batch, kinds, note).

    Raises:
        tpshard.Error: unreadable input, a backend not built in
            (UNSUPPORTED), a GPU error (DEVICE).
        KeyboardInterrupt: Ctrl-C.
    """
    if backend not in _lib.BACKENDS:
        raise _arg_error(f"backend={backend!r}: use 'cpu', 'cuda' or 'nccl'")
    if nccl_id_file is not None and backend != "nccl":
        raise _arg_error("nccl_id_file goes with backend='nccl'")
    seed = _count(seed, "seed", 0, 2**63 - 1)
    batch = _count(batch, "batch", 1, 256)
    if threads is not None:
        threads = _count(threads, "threads", 1, 4096)
    per_pass = 0 if tensors_per_pass is None else _count(tensors_per_pass, "tensors_per_pass", 1,
                                                         2**30)
    with _Call(threads=threads, progress=progress) as c:
        opts = _lib.VerifyOpts(
            dir=_path(dir, "dir"), source=None if source is None else _path(source, "source"),
            backend=_lib.BACKENDS[backend],
            tensors_glob=None if tensors is None else str(tensors).encode(),
            seed=seed, batch=batch,
            nccl_id_file=None if nccl_id_file is None else _path(nccl_id_file, "nccl_id_file"),
            tensors_per_pass=per_pass)
        report = c.handle(lib.tps_verify, ctypes.byref(opts), free=lib.tps_verify_report_free)
        return c.doc(lib.tps_verify_json, ctypes.byref(opts), report)


# numpy and torch are imported by these only when they are called
from ._tensors import load_rank, load_rank_dtensors, rank_files  # noqa: E402
