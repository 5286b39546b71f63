"""ctypes declarations of libtpshard's public API (lib/tpshard.h), as far as
the module uses it. The structs mirror the header field for field; the tests
compile a C program against the header and compare every size and offset."""
import ctypes
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_int, c_size_t, c_uint64,
                    c_void_p)

HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY = os.path.join(HERE, "lib", "libtpshard.so")
EXECUTABLE = os.path.join(HERE, "bin", "tpshard")

# tps_backend
BACKENDS = {"cpu": 0, "cuda": 1, "nccl": 2}


class SplitOpts(Structure):
    _fields_ = [("tp", c_int), ("ranks", POINTER(ctypes.c_ubyte)), ("max_part_size", c_uint64),
                ("force", c_int), ("out_dir", c_char_p), ("map_source", c_int),
                ("plain_copy", c_int)]


class SplitResult(Structure):
    _fields_ = [("bytes_written", c_uint64), ("bytes_read", c_uint64),
                ("files_written", c_int), ("ranks_written", c_int),
                ("bytes_shared", c_uint64), ("copy", c_char_p)]


class CheckResult(Structure):
    _fields_ = [("tp", c_int), ("ranks_present", c_int), ("files_checked", c_int),
                ("tensors_checked", c_uint64), ("bytes_checked", c_uint64),
                ("missing_ranks", c_char * 256), ("complete", c_int),
                ("headers_checked", c_int), ("pp", c_int), ("ranks", c_int)]


class MergeOpts(Structure):
    _fields_ = [("out_dir", c_char_p), ("force", c_int), ("plain_copy", c_int)]


class VerifyOpts(Structure):
    _fields_ = [("dir", c_char_p), ("source", c_char_p), ("backend", c_int),
                ("tensors_glob", c_char_p), ("seed", c_uint64), ("batch", c_int),
                ("nccl_id_file", c_char_p), ("tensors_per_pass", c_size_t)]


STRUCTS = {"tps_split_opts": SplitOpts, "tps_split_result": SplitResult,
           "tps_check_result": CheckResult, "tps_merge_opts": MergeOpts,
           "tps_verify_opts": VerifyOpts}

# void (*)(void *user, tps_log_level level, const char *msg)
LOG_FN = CFUNCTYPE(None, c_void_p, c_int, c_char_p)
# void (*)(void *user, uint64_t done, uint64_t total, const char *what)
PROGRESS_FN = CFUNCTYPE(None, c_void_p, c_uint64, c_uint64, c_char_p)

P = c_void_p      # every opaque handle
PP = POINTER(c_void_p)
OUT = POINTER(c_void_p)  # char **out: kept as a void pointer so that tps_free gets it back

# name: (restype, argtypes)
_SIGNATURES = {
    "tps_version": (c_char_p, []),
    "tps_strerror": (c_char_p, [c_int]),
    "tps_build_features": (c_char_p, []),
    "tps_backends_built": (c_char_p, []),
    "tps_free": (None, [c_void_p]),
    "tps_ctx_new": (P, []),
    "tps_ctx_free": (None, [P]),
    "tps_ctx_set_log": (None, [P, LOG_FN, c_void_p]),
    "tps_ctx_set_progress": (None, [P, PROGRESS_FN, c_void_p]),
    "tps_ctx_set_threads": (None, [P, c_int]),
    "tps_ctx_errmsg": (c_char_p, [P]),
    "tps_ctx_interrupt": (None, [P]),
    "tps_parse_size": (c_int, [c_char_p, POINTER(c_uint64)]),
    "tps_parse_ranks": (c_int, [c_char_p, c_int, POINTER(ctypes.c_ubyte)]),
    "tps_ckpt_open": (c_int, [P, c_char_p, PP]),
    "tps_ckpt_free": (None, [P]),
    "tps_ckpt_untie": (c_int, [P, P, P]),
    "tps_plan_load": (c_int, [P, c_char_p, PP]),
    "tps_plan_builtin": (c_int, [P, c_char_p, PP]),
    "tps_plan_detect": (c_int, [P, P, PP]),
    "tps_plan_free": (None, [P]),
    "tps_layout_spec_open": (c_int, [P, c_char_p, PP]),
    "tps_layout_spec_name": (c_char_p, [P]),
    "tps_layout_spec_free": (None, [P]),
    "tps_layout_new_with": (c_int, [P, P, P, P, c_int, PP]),
    "tps_layout_new_ep": (c_int, [P, P, P, P, c_int, c_int, PP]),
    "tps_layout_new_pp": (c_int, [P, P, P, P, c_int, c_int, c_int, P, PP]),
    "tps_layout_spec_has_pipeline": (c_int, [P]),
    "tps_pp_parse_layers": (c_int, [c_char_p, c_int, P, c_char_p, c_size_t]),
    "tps_split_default_dir_pp": (c_int, [P, P, c_int, c_int, OUT]),
    "tps_layout_free": (None, [P]),
    "tps_layout_rejected": (c_char_p, [P]),
    "tps_split_default_dir": (c_int, [P, P, c_int, OUT]),
    "tps_split": (c_int, [P, P, P, POINTER(SplitOpts), POINTER(SplitResult)]),
    "tps_check_dir": (c_int, [P, c_char_p, POINTER(CheckResult)]),
    "tps_merge": (c_int, [P, c_char_p, POINTER(MergeOpts), POINTER(c_int)]),
    "tps_verify": (c_int, [P, POINTER(VerifyOpts), PP]),
    "tps_verify_report_free": (None, [P]),
    "tps_error_json": (c_int, [P, c_char_p, OUT]),
    "tps_inspect_json": (c_int, [P, P, OUT]),
    "tps_plan_json": (c_int, [P, P, OUT]),
    "tps_plan_list_json": (c_int, [P, OUT]),
    "tps_split_json": (c_int, [P, P, POINTER(SplitOpts), POINTER(SplitResult), OUT]),
    "tps_check_json": (c_int, [P, c_char_p, POINTER(CheckResult), OUT]),
    "tps_merge_json": (c_int, [P, c_char_p, POINTER(MergeOpts), c_int, OUT]),
    "tps_verify_json": (c_int, [P, POINTER(VerifyOpts), P, OUT]),
}


def _load():
    try:
        lib = ctypes.CDLL(LIBRARY)
    except OSError as e:
        raise ImportError(f"tpshard: cannot load the library this package ships ({e}); "
                          "reinstall the wheel") from e
    for name, (res, args) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    return lib


lib = _load()


def take_string(p):
    """The library's malloc'd string *p as str; frees it."""
    if not p:
        return None
    try:
        return ctypes.string_at(p).decode("utf-8", "replace")
    finally:
        lib.tps_free(p)


__all__ = ["lib", "LIBRARY", "EXECUTABLE", "BACKENDS", "STRUCTS", "SplitOpts", "SplitResult",
           "CheckResult", "MergeOpts", "VerifyOpts", "LOG_FN", "PROGRESS_FN", "take_string"]
