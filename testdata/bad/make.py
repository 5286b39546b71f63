#!/usr/bin/env python3
"""Writes the malformed inputs of testdata/bad/ and its EXPECT list.

    python3 testdata/bad/make.py [OUTDIR]      (default: this script's folder)

Every case is a file `<case>.safetensors` or a folder `dir_<case>/` (a model
directory: config.json + index + parts).  EXPECT lists `<case> <word>`: what
`tpshard inspect <case>` must say in its error (case-insensitive), with exit
status 1.  The outputs are committed; rerun this after changing it.
Standard library only.
"""
import json
import os
import shutil
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import gen  # noqa: E402  (testdata/gen.py: the reference-layout writer)

CASES = []  # (name, word, why)


def raw_file(out, name, body):
    with open(os.path.join(out, name), "wb") as f:
        f.write(body)


def st_bytes(header, data=b"", n=None, pad=True):
    """8-byte length + header (str or bytes, space-padded to 8) + data."""
    h = header.encode("utf-8") if isinstance(header, str) else header
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h) if n is None else n) + h + data


def case(name, word, why):
    CASES.append((name, word, why))


def t(dtype="F32", shape=(2, 2), offs=(0, 16)):
    """One tensor entry as compact JSON text."""
    return ('{"dtype":"%s","shape":%s,"data_offsets":[%s,%s]}'
            % (dtype, json.dumps(list(shape), separators=(",", ":")), offs[0], offs[1]))


W16 = bytes(range(16))


def single_files(out):
    def f(name, word, why, body):
        raw_file(out, name + ".safetensors", body)
        case(name + ".safetensors", word, why)

    good = st_bytes('{"__metadata__":{"format":"pt"},"w":%s}' % t(), W16)

    f("empty", "small", "empty file", b"")
    f("short7", "small", "7 bytes: less than the 8-byte length prefix", b"\x10\x00\x00\x00\x00\x00\x00")
    f("header_truncated", "header", "header cut in the middle (N says 56, 30 bytes follow)",
      good[:38])
    f("header_past_eof", "header", "N = 1,000,000 in a 40-byte file",
      st_bytes('{"w":%s}' % t(), W16, n=1000000))
    f("header_huge", "header", "N = 100,000,001 (over the 100,000,000 limit)",
      st_bytes("{}", n=100000001))
    f("header_u64max", "header", "N = 2^64-1: N + 8 overflows",
      st_bytes("{}", n=(1 << 64) - 1))
    f("header_len0", "json", "N = 0: no header at all", st_bytes(b"", pad=False) + W16)
    f("not_json", "json", "header is not JSON", st_bytes("hello, world!"))
    f("json_unterminated", "json", "header JSON ends early", st_bytes('{"w":{"dtype":"F32"'))
    f("json_array", "object", "header is a JSON array", st_bytes("[1,2,3]"))
    f("json_string", "object", "header is a JSON string", st_bytes('"tensors"'))
    f("json_number", "object", "header is a JSON number", st_bytes("42"))
    f("json_trailing_garbage", "json", "a second value after the header object",
      st_bytes('{"w":%s}{}' % t(), W16))
    f("header_nul_padding", "json", "header padded with NUL bytes (only JSON whitespace may pad)",
      st_bytes(b'{"w":' + t().encode() + b"}\0\0\0\0", W16))
    f("raw_nul_in_name", "name", "a raw NUL byte inside a tensor name (JSON forbids raw controls)",
      st_bytes(b'{"w\0x":' + t().encode() + b"}", W16))
    f("bad_utf8", "utf-8", "invalid UTF-8 (0xff 0xfe) in a metadata value",
      st_bytes(b'{"__metadata__":{"format":"p\xff\xfe"},"w":' + t().encode() + b"}", W16))
    f("bad_utf8_name", "utf-8", "overlong UTF-8 encoding (0xc0 0xaf) in a tensor name",
      st_bytes(b'{"w\xc0\xaf":' + t().encode() + b"}", W16))
    f("dtype_unknown", "dtype", "dtype F12 does not exist", st_bytes('{"w":%s}' % t("F12"), W16))
    f("dtype_lowercase", "dtype", "dtype names are case-sensitive: f32",
      st_bytes('{"w":%s}' % t("f32"), W16))
    f("dtype_not_string", "dtype", "dtype is a number",
      st_bytes('{"w":{"dtype":7,"shape":[2,2],"data_offsets":[0,16]}}', W16))
    f("dtype_missing", "dtype", "no dtype",
      st_bytes('{"w":{"shape":[2,2],"data_offsets":[0,16]}}', W16))
    f("shape_negative", "shape", "shape [-2,-2] (product 4 would fit)",
      st_bytes('{"w":%s}' % t(shape=(-2, -2)), W16))
    f("shape_fractional", "shape", "shape [2.5,1.6]",
      st_bytes('{"w":{"dtype":"F32","shape":[2.5,1.6],"data_offsets":[0,16]}}', W16))
    f("shape_string", "shape", 'shape ["2",2]',
      st_bytes('{"w":{"dtype":"F32","shape":["2",2],"data_offsets":[0,16]}}', W16))
    f("shape_not_array", "shape", "shape is a number",
      st_bytes('{"w":{"dtype":"F32","shape":4,"data_offsets":[0,16]}}', W16))
    f("shape_missing", "shape", "no shape",
      st_bytes('{"w":{"dtype":"F32","data_offsets":[0,16]}}', W16))
    f("shape_huge_dim", "shape", "a dim of 1e30 (past 2^64)",
      st_bytes('{"w":{"dtype":"F32","shape":[1000000000000000000000000000000],'
               '"data_offsets":[0,16]}}', W16))
    f("shape_too_many_dims", "dim", "17 dims of 1 (tpshard's bound is 16)",
      st_bytes('{"w":%s}' % t("U8", [1] * 17, (0, 1)), b"\x01"))
    f("shape_product_overflow", "overflow", "shape [2^32,2^32,2]: the element count overflows",
      st_bytes('{"w":%s}' % t("U8", (1 << 32, 1 << 32, 2), (0, 16)), W16))
    f("size_overflow", "overflow", "U64 [2^31,2^31]: 2^62 elements fit, 2^65 bytes overflow",
      st_bytes('{"w":%s}' % t("U64", (1 << 31, 1 << 31), (0, 16)), W16))
    f("offsets_overlap", "offset", "a [0,16], b [8,24]",
      st_bytes('{"a":%s,"b":%s}' % (t(), t(offs=(8, 24))), W16 + W16[:8]))
    f("offsets_gap", "offset", "a [0,16], b [20,36]: 4 bytes belong to no tensor",
      st_bytes('{"a":%s,"b":%s}' % (t(), t(offs=(20, 36))), W16 + b"\0" * 4 + W16))
    f("offsets_not_zero", "offset", "the only tensor starts at 4",
      st_bytes('{"w":%s}' % t(offs=(4, 20)), b"\0" * 4 + W16))
    f("offsets_reversed", "offset", "data_offsets [16,0]",
      st_bytes('{"w":%s}' % t("U8", (0,), (16, 0)), W16))
    f("offsets_same", "offset", "ten tensors all at [0,16] (the safetensors json attack)",
      st_bytes("{" + ",".join('"t%d":%s' % (i, t()) for i in range(10)) + "}", W16))
    f("offsets_missing", "data_offsets", "no data_offsets",
      st_bytes('{"w":{"dtype":"F32","shape":[2,2]}}', W16))
    f("offsets_len3", "data_offsets", "data_offsets [0,8,16]",
      st_bytes('{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,8,16]}}', W16))
    f("offsets_len1", "data_offsets", "data_offsets [16]",
      st_bytes('{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[16]}}', W16))
    f("offsets_negative", "offset", "data_offsets [-16,0]",
      st_bytes('{"w":{"dtype":"F32","shape":[2,2],"data_offsets":[-16,0]}}', W16))
    f("offsets_string", "data_offsets", 'data_offsets ["0","16"]',
      st_bytes('{"w":{"dtype":"F32","shape":[2,2],"data_offsets":["0","16"]}}', W16))
    f("trailing_bytes", "trailing", "4 bytes after the last tensor", good + b"\0\0\0\0")
    f("trailing_bytes_no_tensors", "trailing", "no tensors but 16 data bytes",
      st_bytes('{"__metadata__":{"format":"pt"}}', W16))
    f("data_short", "truncated", "header says 16 data bytes, 8 present", good[:-8])
    f("data_short_two", "truncated", "second tensor runs past EOF",
      st_bytes('{"a":%s,"b":%s}' % (t(), t(offs=(16, 32))), W16 + W16[:4]))
    f("nbytes_mismatch", "size", "F32 [2,2] needs 16 bytes, offsets give 12",
      st_bytes('{"w":%s}' % t(offs=(0, 12)), W16[:12]))
    f("nbytes_mismatch_zero", "size", "F32 [0] needs 0 bytes, offsets give 4",
      st_bytes('{"w":%s}' % t(shape=(0,), offs=(0, 4)), W16[:4]))
    f("duplicate_name", "duplicate", "two tensors named w",
      st_bytes('{"w":%s,"w":%s}' % (t(), t(offs=(16, 32))), W16 + W16))
    f("duplicate_metadata_key", "duplicate", "__metadata__ has key format twice",
      st_bytes('{"__metadata__":{"format":"pt","format":"np"},"w":%s}' % t(), W16))
    f("metadata_twice", "duplicate", "__metadata__ appears twice",
      st_bytes('{"__metadata__":{"format":"pt"},"__metadata__":{"a":"b"},"w":%s}' % t(), W16))
    f("metadata_nonstring", "metadata", "__metadata__ value is a number",
      st_bytes('{"__metadata__":{"format":"pt","step":1},"w":%s}' % t(), W16))
    f("metadata_null", "metadata", "__metadata__ value is null",
      st_bytes('{"__metadata__":{"format":null},"w":%s}' % t(), W16))
    f("metadata_not_object", "metadata", "__metadata__ is a string",
      st_bytes('{"__metadata__":"pt","w":%s}' % t(), W16))
    # The reserved key used as a tensor: it has an object value, so a reader
    # that treats it as metadata sees non-string values (dtype is a string,
    # shape/data_offsets are arrays); either way it must name __metadata__.
    f("metadata_as_tensor", "__metadata__", "a tensor named __metadata__",
      st_bytes('{"__metadata__":%s}' % t(), W16))
    f("tensor_not_object", "lonely_tensor", "tensor entry lonely_tensor is a string",
      st_bytes('{"lonely_tensor":"F32"}'))
    f("name_nul", "name", r'tensor name "w\u0000x" (C strings would truncate it to "w")',
      st_bytes('{"w\\u0000x":%s}' % t(), W16))
    f("name_nul_collide", "name", r'"w\u0000a" and "w\u0000b" both read as "w" in C',
      st_bytes('{"w\\u0000a":%s,"w\\u0000b":%s}' % (t(), t(offs=(16, 32))), W16 + W16))
    f("f4_odd", "F4", "F4 [3]: 12 bits is not a whole number of bytes",
      st_bytes('{"w":%s}' % t("F4", (3,), (0, 2)), b"\0\0"))
    f("f6_misaligned", "F6_E2M3", "F6_E2M3 [3]: 18 bits",
      st_bytes('{"w":%s}' % t("F6_E2M3", (3,), (0, 3)), b"\0\0\0"))
    deep = 100000
    f("deep_metadata", "string", "100,000 nested arrays in a metadata value",
      st_bytes('{"__metadata__":{"a":' + "[" * deep + "]" * deep + '},"w":%s}' % t(), W16))
    f("deep_shape", "shape", "100,000 nested arrays as a shape",
      st_bytes('{"w":{"dtype":"F32","shape":' + "[" * deep + "]" * deep +
               ',"data_offsets":[0,16]}}', W16))
    f("deep_unclosed", "json", "100,000 '[' never closed",
      st_bytes('{"w":' + "[" * deep + "}", W16))


def model_dir(out, name, word, why, parts, index, config=True, extra=None):
    """A model directory: parts {fname: tensors}, index (dict, str or None)."""
    d = os.path.join(out, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    for fname, tensors in parts.items():
        p = os.path.join(d, fname)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        if isinstance(tensors, bytes):
            with open(p, "wb") as f:
                f.write(tensors)
        else:
            gen.write_safetensors(p, tensors, {"format": "pt"})
    if index is not None:
        with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
            f.write(index if isinstance(index, str) else json.dumps(index, indent=2) + "\n")
    if config:
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4,
               "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 2,
               "intermediate_size": 8, "vocab_size": 8, "num_hidden_layers": 1,
               "tie_word_embeddings": True}
        with open(os.path.join(d, "config.json"), "w") as f:
            f.write(config if isinstance(config, str) else json.dumps(cfg, indent=2) + "\n")
    for rel, body in (extra or {}).items():
        with open(os.path.join(d, rel), "wb") as f:
            f.write(body)
    case(name, word, why)


def dirs(out):
    P1, P2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    emb = ("F32", [8, 4], bytes(128))
    norm = ("F32", [4], bytes(16))
    A = {"model.embed_tokens.weight": emb}
    B = {"model.norm.weight": norm}
    good_map = {"model.embed_tokens.weight": P1, "model.norm.weight": P2}

    def idx(wm, total=144):
        return {"metadata": {"total_size": total}, "weight_map": wm}

    # the target exists and holds model.norm.weight: only the name check can stop it
    trav = "../dir_tensor_two_parts/" + P2
    model_dir(out, "dir_index_traversal", "../dir_tensor_two_parts",
              "weight_map names ../dir_tensor_two_parts/<part> (outside the model dir)",
              {P1: A}, idx({"model.embed_tokens.weight": P1, "model.norm.weight": trav}))
    model_dir(out, "dir_index_absolute", "/etc/passwd", "weight_map names an absolute path",
              {P1: A}, idx({"model.embed_tokens.weight": P1, "model.norm.weight": "/etc/passwd"}))
    model_dir(out, "dir_index_slash", "sub/" + P2,
              "weight_map names sub/<part> (a '/' inside the file name; the file exists)",
              {P1: A, "sub/" + P2: B},
              idx({"model.embed_tokens.weight": P1, "model.norm.weight": "sub/" + P2}))
    model_dir(out, "dir_index_dotdot_name", "..", "weight_map names '..' itself",
              {P1: A}, idx({"model.embed_tokens.weight": P1, "model.norm.weight": ".."}))
    model_dir(out, "dir_missing_part", P2, "the index names a part that does not exist",
              {P1: A}, idx(good_map))
    model_dir(out, "dir_tensor_wrong_part", "model.norm.weight",
              "the index puts model.norm.weight in part 1; it is in part 2",
              {P1: A, P2: B},
              idx({"model.embed_tokens.weight": P1, "model.norm.weight": P1}))
    model_dir(out, "dir_tensor_two_parts", "model.norm.weight",
              "model.norm.weight is in both parts",
              {P1: dict(A, **B), P2: B}, idx(good_map))
    model_dir(out, "dir_tensor_unmapped", "lm_head.weight",
              "part 2 holds lm_head.weight too, which the index does not map",
              {P1: A, P2: dict(B, **{"lm_head.weight": emb})}, idx(good_map, 272))
    model_dir(out, "dir_mapped_not_held", "lm_head.weight",
              "the index maps lm_head.weight to part 2, which does not hold it",
              {P1: A, P2: B}, idx(dict(good_map, **{"lm_head.weight": P2})))
    model_dir(out, "dir_index_not_json", "json", "the index is not JSON",
              {P1: A, P2: B}, '{"metadata": {"total_size": 144}, "weight_map": {')
    model_dir(out, "dir_weight_map_not_object", "weight_map", "weight_map is an array",
              {P1: A, P2: B}, {"metadata": {"total_size": 144}, "weight_map": [P1, P2]})
    model_dir(out, "dir_weight_map_missing", "weight_map", "no weight_map",
              {P1: A, P2: B}, {"metadata": {"total_size": 144}})
    model_dir(out, "dir_weight_map_value_not_string", "model.norm.weight",
              "a weight_map value is a number",
              {P1: A, P2: B}, idx({"model.embed_tokens.weight": P1, "model.norm.weight": 2}))
    model_dir(out, "dir_index_duplicate_key", "duplicate",
              "weight_map lists model.norm.weight twice",
              {P1: A, P2: B},
              '{"metadata": {"total_size": 144}, "weight_map": {'
              '"model.embed_tokens.weight": "%s", "model.norm.weight": "%s", '
              '"model.norm.weight": "%s"}}\n' % (P1, P2, P1))
    model_dir(out, "dir_bad_part", P2, "a part file is truncated",
              {P1: A, P2: st_bytes('{"model.norm.weight":%s}' % t("F32", (4,), (0, 16)), bytes(8))},
              idx(good_map))
    model_dir(out, "dir_config_not_json", "config.json", "config.json is not JSON",
              {"model.safetensors": dict(A, **B)}, None, config='{"model_type": llama}\n')
    model_dir(out, "dir_config_array", "config.json", "config.json is a JSON array",
              {"model.safetensors": dict(A, **B)}, None, config="[1, 2]\n")
    model_dir(out, "dir_part_is_directory", P2, "the part the index names is a directory",
              {P1: A, P2 + "/inner.safetensors": B}, idx(good_map))
    model_dir(out, "dir_no_weights", "safetensors", "config.json but no weights",
              {}, None)


def main():
    out = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else HERE
    os.makedirs(out, exist_ok=True)
    for e in os.listdir(out):  # start clean: only our own outputs
        p = os.path.join(out, e)
        if e.endswith(".safetensors") or (e.startswith("dir_") and os.path.isdir(p)):
            shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    single_files(out)
    dirs(out)
    names = [c[0] for c in CASES]
    assert len(names) == len(set(names)), "duplicate case name"
    with open(os.path.join(out, "EXPECT"), "w") as f:
        f.write("# <case> <word the error must contain, case-insensitive>   (made by make.py)\n")
        for name, word, why in CASES:
            f.write(f"{name} {word}\n")
    with open(os.path.join(out, "CASES.md"), "w") as f:
        f.write("# testdata/bad: what each case is (made by make.py)\n\n")
        for name, word, why in CASES:
            f.write(f"- `{name}` ({word}): {why}\n")
    print(f"{len(CASES)} cases in {out}")


if __name__ == "__main__":
    main()
