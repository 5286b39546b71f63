#!/usr/bin/env python3
"""bench/gen_gpt_oss.py OUT [--size SIZE | --layers N] [--experts E] [--hidden H]
[--inter I] [--vocab V] [--heads A] [--kv-heads K] [--head-dim D] [--bf16]

A synthetic gpt-oss checkpoint (GptOssForCausalLM) for the benchmarks:
config.json and one model.safetensors in the reference layout (tensors sorted
by dtype then name, header padded to 8), written streaming, so any size fits
in a few MiB of memory. MXFP4 experts by default (U8 blocks [E, rows, cols/32,
16], U8 E8M0 scales [E, rows, cols/32], BF16 biases), --bf16 for BF16 experts.
With --size, the layer count is the one that brings the file closest to SIZE
(K/M/G suffixes). Bytes are a cheap deterministic pattern, not random: the
benchmarks time copies, not compressibility. Python standard library only.
Prints the file's byte count on stdout.
"""
import argparse
import json
import os
import struct
import sys


def size_of(s):
    m = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    s = s.strip().upper()
    return int(float(s[:-1]) * m[s[-1]]) if s[-1] in m else int(s)


def tensors(a, layers):
    H, I, E, A, K, D, V = a.hidden, a.inter, a.experts, a.heads, a.kv_heads, a.head_dim, a.vocab
    t = [("model.embed_tokens.weight", "BF16", [V, H]), ("model.norm.weight", "BF16", [H]),
         ("lm_head.weight", "BF16", [V, H])]
    for n in range(layers):
        p = f"model.layers.{n}."
        t += [(p + "input_layernorm.weight", "BF16", [H]),
              (p + "post_attention_layernorm.weight", "BF16", [H])]
        for m, rows in (("q_proj", A * D), ("k_proj", K * D), ("v_proj", K * D)):
            t += [(p + f"self_attn.{m}.weight", "BF16", [rows, H]),
                  (p + f"self_attn.{m}.bias", "BF16", [rows])]
        t += [(p + "self_attn.o_proj.weight", "BF16", [H, A * D]),
              (p + "self_attn.o_proj.bias", "BF16", [H]), (p + "self_attn.sinks", "BF16", [A]),
              (p + "mlp.router.weight", "BF16", [E, H]), (p + "mlp.router.bias", "BF16", [E]),
              (p + "mlp.experts.gate_up_proj_bias", "BF16", [E, 2 * I]),
              (p + "mlp.experts.down_proj_bias", "BF16", [E, H])]
        x = p + "mlp.experts."
        if a.bf16:
            t += [(x + "gate_up_proj", "BF16", [E, H, 2 * I]), (x + "down_proj", "BF16", [E, I, H])]
        else:
            t += [(x + "gate_up_proj_blocks", "U8", [E, 2 * I, H // 32, 16]),
                  (x + "gate_up_proj_scales", "U8", [E, 2 * I, H // 32]),
                  (x + "down_proj_blocks", "U8", [E, H, I // 32, 16]),
                  (x + "down_proj_scales", "U8", [E, H, I // 32])]
    return t


def nbytes(dt, shape):
    n = 2 if dt == "BF16" else 1
    for d in shape:
        n *= d
    return n


def header(ts):
    # reference order: larger dtypes first (BF16 before U8), then by name
    ts = sorted(ts, key=lambda x: (x[1] != "BF16", x[0]))
    h, off = {}, 0
    for name, dt, shape in ts:
        n = nbytes(dt, shape)
        h[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    js = json.dumps({"__metadata__": {"format": "pt"}, **h}, separators=(",", ":")).encode()
    js += b" " * (-len(js) % 8)
    return ts, js, off


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--size")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--experts", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--inter", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--bf16", action="store_true")
    a = ap.parse_args()
    if a.hidden % 32 or a.inter % 32:
        sys.exit("gen_gpt_oss: --hidden and --inter must be multiples of 32 (the MXFP4 block)")
    layers = a.layers
    if not layers:
        want = size_of(a.size or "1G")
        one = header(tensors(a, 1))[2] - header(tensors(a, 0))[2]
        layers = max(1, round((want - header(tensors(a, 0))[2]) / one))
    ts, js, total = header(tensors(a, layers))
    os.makedirs(a.out, exist_ok=True)
    pattern = bytes((i * 131 + 7) & 0x7F for i in range(1 << 20))  # no NaN E8M0 (255)
    with open(os.path.join(a.out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(js)) + js)
        left = total
        while left:
            n = min(left, len(pattern))
            f.write(pattern[:n])
            left -= n
    cfg = {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
           "hidden_size": a.hidden, "intermediate_size": a.inter,
           "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads,
           "head_dim": a.head_dim, "num_local_experts": a.experts, "num_experts_per_tok": 4,
           "num_hidden_layers": layers, "vocab_size": a.vocab, "sliding_window": 128,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16", "attention_bias": True}
    if not a.bf16:
        cfg["quantization_config"] = {"quant_method": "mxfp4"}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    sys.stderr.write(f"gen_gpt_oss: {layers} layers, {a.experts} experts, hidden {a.hidden}, "
                     f"intermediate {a.inter}, {'BF16' if a.bf16 else 'MXFP4'} experts\n")
    print(8 + len(js) + total)


if __name__ == "__main__":
    main()
