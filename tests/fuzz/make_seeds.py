#!/usr/bin/env python3
"""Writes the seed corpora of testdata/fuzz/{header,index,config,plan}/.

    python3 tests/fuzz/make_seeds.py          (from anywhere; stdlib only)

Seeds are small on purpose: the bad inputs of testdata/bad (file cases under
64 KiB, the index and config of the dir_* cases), tiny valid files from
testdata/gen.py, the conformance indexes and configs, and plans/*.yaml.
The manifest seeds come from the fuzz target itself (a genuine tpshard.json
of its own split):  TPS_FUZZ_DUMP=testdata/fuzz/manifest/genuine.json
build/tests/replay_fuzz_manifest.  Files named crash-*, leak-*, timeout-*,
oom-* are fuzzer finds; this script leaves them alone.
"""
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(TOP, "testdata"))
import gen  # noqa: E402

FZ = os.path.join(TOP, "testdata", "fuzz")
KEEP = ("crash-", "leak-", "timeout-", "oom-", "slow-unit-")


def reset(target):
    d = os.path.join(FZ, target)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        if not f.startswith(KEEP):
            os.remove(os.path.join(d, f))
    return d


def put(d, name, data):
    with open(os.path.join(d, name), "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode())


def st(header, data=b""):
    h = header.encode() if isinstance(header, str) else header
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + data


def header_seeds():
    d = reset("header")
    for f in sorted(glob.glob(os.path.join(TOP, "testdata", "bad", "*.safetensors"))):
        if os.path.getsize(f) <= 65536:
            shutil.copy(f, os.path.join(d, "bad-" + os.path.basename(f)))
    deep = 1000
    put(d, "deep-1000", st('{"__metadata__":{"a":' + "[" * deep + "]" * deep + "}}"))
    put(d, "deep-64", st('{"__metadata__":{"a":' + "[" * 61 + "]" * 61 + "}}"))
    # valid edge cases
    put(d, "ok-empty", st("{}"))
    put(d, "ok-meta-only", st('{"__metadata__":{"format":"pt"}}'))
    put(d, "ok-zero-size", st('{"z":{"dtype":"F32","shape":[0,4],"data_offsets":[0,0]}}'))
    put(d, "ok-rank0", st('{"s":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}', b"\1\0\0\0"))
    put(d, "ok-whitespace", st(b'\t\n {"w":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}\r\n',
                               b"abc"))
    put(d, "ok-f4", st('{"f":{"dtype":"F4","shape":[2,4],"data_offsets":[0,4]}}', b"\x12\x34\x56\x78"))
    put(d, "ok-f6", st('{"f":{"dtype":"F6_E3M2","shape":[4],"data_offsets":[0,3]}}', b"\1\2\3"))
    put(d, "ok-unsorted", st('{"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},'
                             '"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}', b"wxyz"))
    put(d, "ok-escapes", st('{"__metadata__":{"k\\"q":"v\\\\\\n\\u00e9\\ud83d\\ude00"},'
                            '"n\\u00e9/x":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"!"))
    put(d, "ok-unaligned", st('{"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},'
                              '"b":{"dtype":"F32","shape":[1],"data_offsets":[3,7]}}', bytes(7)))
    # tiny real checkpoints in the reference layout
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in [("llama", ["llama"]), ("qwen2", ["qwen2"]), ("alldt", ["--all-dtypes"]),
                           ("gemma4e", ["gemma4", "--layers", "2", "--kv-shared", "1"])]:
            out = os.path.join(tmp, name)
            gen.main(args[:1] + [out] + args[1:] + ["--hidden", "8", "--heads", "2",
                                                    "--kv-heads", "2", "--vocab", "6",
                                                    "--inter", "4", "--layers", "1"]
                     if name != "gemma4e" else args[:1] + [out] + args[1:] +
                     ["--hidden", "8", "--heads", "2", "--kv-heads", "2", "--vocab", "6",
                      "--inter", "4"])
            shutil.copy(os.path.join(out, "model.safetensors"), os.path.join(d, "gen-" + name))


def index_seeds():
    d = reset("index")
    P1, P2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    good = {"metadata": {"total_size": 152},
            "weight_map": {"model.embed_tokens.weight": P1, "model.norm.weight": P2,
                           "model.extra": P2}}
    put(d, "ok-matching", json.dumps(good, indent=2, sort_keys=True) + "\n")
    put(d, "ok-compact", json.dumps(good, separators=(",", ":")))
    g2 = dict(good, metadata={"total_size": 1, "total_parameters": 7, "format": "pt"})
    put(d, "ok-total-size-wrong", json.dumps(g2))
    put(d, "missing-from-map", json.dumps({"metadata": {}, "weight_map": {
        "model.embed_tokens.weight": P1, "model.norm.weight": P2}}))
    for f in sorted(glob.glob(os.path.join(TOP, "testdata", "bad", "dir_*",
                                           "model.safetensors.index.json"))):
        shutil.copy(f, os.path.join(d, "bad-" + os.path.basename(os.path.dirname(f))))
    for f in sorted(glob.glob(os.path.join(TOP, "testdata", "conformance", "*", "model",
                                           "model.safetensors.index.json"))):
        shutil.copy(f, os.path.join(d, "conf-" + f.split(os.sep)[-3]))
    put(d, "empty", b"")
    put(d, "null", "null")
    put(d, "deep", '{"weight_map":' + "[" * 200 + "]" * 200 + "}")


def config_seeds():
    d = reset("config")
    seen = set()
    for f in sorted(glob.glob(os.path.join(TOP, "testdata", "conformance", "*", "model",
                                           "config.json"))):
        data = open(f, "rb").read()
        if data not in seen:
            seen.add(data)
            put(d, "conf-" + f.split(os.sep)[-3], data)
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in [("llama", ["llama"]), ("llama-tied", ["llama", "--tied"]),
                           ("qwen2", ["qwen2"]), ("qwen3", ["qwen3"]),
                           ("gemma3-hub", ["gemma3"]),
                           ("gemma3-causal", ["gemma3", "--gemma3-naming", "causal", "--untied"]),
                           ("gemma4-e", ["gemma4"]),
                           ("gemma4-dense", ["gemma4", "--gemma4-variant", "dense", "--kv-heads", "4"]),
                           ("gemma4-moe", ["gemma4", "--gemma4-variant", "moe", "--kv-heads", "4"])]:
            out = os.path.join(tmp, name)
            gen.main(args[:1] + [out] + args[1:] + ["--vocab", "8", "--hidden", "8", "--heads", "2",
                                                    "--inter", "4", "--layers", "2",
                                                    "--kv-heads", "2"])
            put(d, "gen-" + name, open(os.path.join(out, "config.json"), "rb").read())
    put(d, "tiny-llama-match", json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8,
        "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 4,
        "intermediate_size": 12, "vocab_size": 10, "num_hidden_layers": 1,
        "tie_word_embeddings": False}))
    put(d, "text-config-null", '{"model_type":"gemma3","text_config":null,"num_key_value_heads":2}')
    put(d, "heads-weird", '{"architectures":["LlamaForCausalLM"],"num_attention_heads":-2,'
                          '"num_key_value_heads":1e300,"tie_word_embeddings":"yes"}')
    put(d, "heads-zero", '{"architectures":["LlamaForCausalLM"],"num_attention_heads":0,'
                         '"num_key_value_heads":0}')
    put(d, "arch-not-list", '{"architectures":"LlamaForCausalLM","model_type":7}')
    # per-layer values: as transformers 5 writes them, and broken ones
    put(d, "per-layer", '{"architectures":["LlamaForCausalLM"],"num_hidden_layers":1,'
                        '"num_attention_heads":2,"num_key_value_heads":2,"head_dim":4,'
                        '"per_layer_config":{"0":{"num_key_value_heads":1,"head_dim":8}}}')
    put(d, "per-layer-padded", '{"architectures":["LlamaForCausalLM"],"num_hidden_layers":12,'
                               '"num_key_value_heads":2,"per_layer_config":{"05":{},"11":'
                               '{"num_key_value_heads":"x"}}}')
    put(d, "per-layer-bad", '{"architectures":["LlamaForCausalLM"],"num_hidden_layers":1e9,'
                            '"per_layer_config":{"99999999999":[],"00":1}}')
    put(d, "older-gemma4", '{"architectures":["LlamaForCausalLM"],"layer_types":["full_attention",'
                           'null,7],"num_global_key_value_heads":"2","global_head_dim":-1,'
                           '"attention_k_eq_v":[0]}')
    put(d, "bad-not-json", '{"model_type": llama}\n')
    put(d, "empty", b"")


def plan_seeds():
    d = reset("plan")
    for f in sorted(glob.glob(os.path.join(TOP, "plans", "*.yaml"))):
        shutil.copy(f, os.path.join(d, "plan-" + os.path.basename(f)))
    put(d, "minimal", "name: x\nrules:\n  - match: '*'\n    style: replicate\n")
    put(d, "alias", "name: &n x\ndescription: *n\nrules: []\n")
    put(d, "flow", "{name: x, rules: [{match: [a.*, 'model.layers.[0-9].mlp.*'], style: colwise}]}\n")
    put(d, "checks", "name: c\nrules: []\nchecks:\n  - divisible: num_key_value_heads\n"
                     "    optional: true\n  - reject_if: {field: tie_word_embeddings, equals: true}\n"
                     "    reason: tied\n")
    put(d, "heads-untie", "name: h\nrules:\n  - match: model.layers.*.self_attn.k_proj\n"
                          "    style: colwise\n    heads: num_key_value_heads\nuntie:\n"
                          "  - {embedding: model.embed_tokens, head: lm_head}\n")
    put(d, "bad-tab", "name: x\n\trules: []\n")
    put(d, "bad-style", "name: x\nrules:\n  - match: lm_head\n    style: diagonal\n")
    put(d, "bad-multi-doc", "name: a\n---\nname: b\n")
    put(d, "empty", b"")
    put(d, "deep", "name: x\nrules: " + "[" * 100 + "]" * 100 + "\n")


def manifest_seeds():
    """Variants of genuine.json (kept; made by the fuzz target, see above)."""
    d = os.path.join(FZ, "manifest")
    os.makedirs(d, exist_ok=True)
    g = os.path.join(d, "genuine.json")
    if not os.path.exists(g):
        print("manifest: no genuine.json yet (see the docstring)")
        return
    for f in os.listdir(d):
        if f.startswith("var-"):
            os.remove(os.path.join(d, f))
    base = json.load(open(g))

    def var(name, fn):
        m = json.loads(json.dumps(base))
        fn(m)
        put(d, "var-" + name, json.dumps(m, separators=(",", ":")))

    t0 = lambda m: m["tensors"][0]  # noqa: E731
    var("compact", lambda m: None)
    var("tp0", lambda m: m.update(tp=0))
    var("tp-huge", lambda m: m.update(tp=1 << 40))
    var("tp-3", lambda m: m.update(tp=3))
    var("version-99", lambda m: m.update(version=99))
    var("no-tensors", lambda m: m.pop("tensors"))
    var("tensors-empty", lambda m: m.update(tensors=[]))
    var("files-traversal", lambda m: m["files"][0].update(name="../../etc/passwd"))
    var("rank-file-slash", lambda m: t0(m)["ranks"][0].update(file="/etc/passwd"))
    var("rank-missing", lambda m: t0(m)["ranks"].pop())
    var("rank-dup", lambda m: t0(m)["ranks"].append(t0(m)["ranks"][0]))
    var("rank-negative", lambda m: t0(m)["ranks"][0].update(rank=-1))
    var("crc-wrong", lambda m: t0(m)["ranks"][0].update(crc32=1))
    var("offset-past", lambda m: t0(m)["ranks"][1].update(offset=1 << 60))
    var("shape-wrong", lambda m: t0(m)["ranks"][0].update(shape=[6, 8]))
    var("shape-overflow", lambda m: t0(m).update(shape=[1 << 52, 1 << 52]))
    var("dim-5", lambda m: t0(m).update(dim=5))
    var("dtype-bad", lambda m: t0(m).update(dtype="F12"))
    var("placement-garbage", lambda m: t0(m).update(placement="Shard(-7)", dim=-7))
    var("dup-tensor", lambda m: m["tensors"].append(t0(m)))
    var("nbytes-wrong", lambda m: t0(m)["ranks"][0].update(nbytes=1 << 62))

    def untie(m, head="lm_head.weight", emb="model.embed_tokens.weight", record=True):
        for t in m["tensors"]:
            if t["name"] == head:
                t["derived_from"] = emb
        if record:
            m["untie"] = {"head": head, "embedding": emb, "config": "{}"}
    var("untie", untie)
    var("untie-no-record", lambda m: untie(m, record=False))
    var("untie-other", lambda m: untie(m, emb="model.norm.weight"))
    var("untie-bad", lambda m: m.update(untie={"head": 7}))


def main():
    header_seeds()
    index_seeds()
    config_seeds()
    plan_seeds()
    manifest_seeds()
    for t in ("header", "index", "config", "plan", "manifest"):
        print(t, len(os.listdir(os.path.join(FZ, t))), "seeds")


if __name__ == "__main__":
    main()
