#!/usr/bin/env python3
"""bench/gen_deepseek.py OUT [--layers N] [--dense K] [--experts E] [--hidden H]
[--moe-inter I] [--inter D] [--heads A] [--block B] [--parts P] [--vocab V] [--bf16]

A synthetic DeepSeek-V3-shaped checkpoint (DeepseekV3ForCausalLM) for the scale
benchmarks: the real model's tensor count (61 layers, the first 3 dense, 256
routed experts and one shared expert in every MoE layer, the noaux_tc router's
F32 bias, one multi-token-prediction layer) at tiny dims, block FP8 as
DeepSeek-V3 ships it (every Linear of the decoder F8_E4M3 with an F32
weight_scale_inv [ceil(rows/B), ceil(cols/B)]; routers, norms, embeddings,
lm_head and the MTP layer's eh_proj BF16), in P parts with a
model.safetensors.index.json. About 92k source tensors, 1.5 GB at the defaults.

Written streaming (a few MiB of memory whatever the size). Bytes are a cheap
deterministic pattern, not random; E4M3 codes avoid the NaN codes 0x7F/0xFF so
verify's products stay finite. Python standard library only. Prints the number
of tensors and their bytes on stdout.
"""
import argparse
import json
import os
import struct


def tensors(a):
    H, I, D, A, V, E = a.hidden, a.moe_inter, a.inter, a.heads, a.vocab, a.experts
    q_lora, kv_lora, nope, rope, v = a.q_lora, a.kv_lora, a.nope, a.rope, a.v_head
    fp8 = not a.bf16
    layers = []  # one list of (name, dtype, shape) per part-able group

    def lin(p, rows, cols, quant=True):
        if fp8 and quant:
            B = a.block
            return [(p + ".weight", "F8_E4M3", [rows, cols]),
                    (p + ".weight_scale_inv", "F32", [-(-rows // B), -(-cols // B)])]
        return [(p + ".weight", "BF16", [rows, cols])]

    for n in range(a.layers + 1):  # the last one is the MTP layer
        p = f"model.layers.{n}."
        t = [(p + "input_layernorm.weight", "BF16", [H]),
             (p + "post_attention_layernorm.weight", "BF16", [H]),
             (p + "self_attn.q_a_layernorm.weight", "BF16", [q_lora]),
             (p + "self_attn.kv_a_layernorm.weight", "BF16", [kv_lora])]
        t += lin(p + "self_attn.q_a_proj", q_lora, H)
        t += lin(p + "self_attn.q_b_proj", A * (nope + rope), q_lora)
        t += lin(p + "self_attn.kv_a_proj_with_mqa", kv_lora + rope, H)
        t += lin(p + "self_attn.kv_b_proj", A * (nope + v), kv_lora)
        t += lin(p + "self_attn.o_proj", H, A * v)
        if n < a.dense:
            t += lin(p + "mlp.gate_proj", D, H) + lin(p + "mlp.up_proj", D, H)
            t += lin(p + "mlp.down_proj", H, D)
        else:
            t += [(p + "mlp.gate.weight", "BF16", [E, H]),
                  (p + "mlp.gate.e_score_correction_bias", "F32", [E])]
            for e in range(E):
                q = p + f"mlp.experts.{e}."
                t += lin(q + "gate_proj", I, H) + lin(q + "up_proj", I, H)
                t += lin(q + "down_proj", H, I)
            q = p + "mlp.shared_experts."
            t += lin(q + "gate_proj", I, H) + lin(q + "up_proj", I, H) + lin(q + "down_proj", H, I)
        if n == a.layers:
            t += [(p + "enorm.weight", "BF16", [H]), (p + "hnorm.weight", "BF16", [H]),
                  (p + "embed_tokens.weight", "BF16", [V, H]),
                  (p + "shared_head.norm.weight", "BF16", [H]),
                  (p + "shared_head.head.weight", "BF16", [V, H])]
            t += lin(p + "eh_proj", H, 2 * H, quant=False)
        layers.append(t)
    layers[0] = [("model.embed_tokens.weight", "BF16", [V, H])] + layers[0]
    layers[-1] = layers[-1] + [("model.norm.weight", "BF16", [H]),
                               ("lm_head.weight", "BF16", [V, H])]
    return layers


ESIZE = {"BF16": 2, "F32": 4, "F8_E4M3": 1}


def pattern(dtype):
    """64 KiB of bytes to cut every tensor of dtype from."""
    n = 1 << 16
    if dtype == "F8_E4M3":  # small finite E4M3 codes of both signs, never 0x7F/0xFF
        return bytes(((i * 37 + (i >> 7)) & 0x37) | ((i & 1) << 7) for i in range(n))
    if dtype == "F32":  # 2^-6 .. 2^-5: plausible block scales
        return b"".join(struct.pack("<f", 2.0 ** -6 * (1 + (i % 97) / 97.0))
                        for i in range(n // 4))
    return b"".join(struct.pack("<H", 0x3C00 | (i * 13 % 0x100) | ((i & 1) << 15))
                    for i in range(n // 2))  # BF16 magnitudes around 2^-7 .. 2^-6


def write_part(path, ts, pats):
    hdr, off = {}, 0
    for name, dt, shape in ts:
        nb = ESIZE[dt]
        for s in shape:
            nb *= s
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + nb]}
        off += nb
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for i, (name, dt, shape) in enumerate(ts):
            nb = hdr[name]["data_offsets"][1] - hdr[name]["data_offsets"][0]
            pat, k = pats[dt], (i * 4099) % (1 << 12)
            while nb > 0:
                c = pat[k:k + nb]
                f.write(c)
                nb -= len(c)
                k = 0
    os.replace(tmp, path)
    return off


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=61)
    ap.add_argument("--dense", type=int, default=3, help="first_k_dense_replace")
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--moe-inter", type=int, default=128)
    ap.add_argument("--inter", type=int, default=512)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--q-lora", type=int, default=128)
    ap.add_argument("--kv-lora", type=int, default=64)
    ap.add_argument("--nope", type=int, default=32)
    ap.add_argument("--rope", type=int, default=16)
    ap.add_argument("--v-head", type=int, default=32)
    ap.add_argument("--vocab", type=int, default=1024)
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--parts", type=int, default=8)
    ap.add_argument("--bf16", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    groups = tensors(a)
    pats = {dt: pattern(dt) for dt in ESIZE}
    P = max(1, min(a.parts, len(groups)))
    per = -(-len(groups) // P)
    wmap, total, count = {}, 0, 0
    for k in range(P):
        ts = [t for g in groups[k * per:(k + 1) * per] for t in g]
        if not ts:
            continue
        fn = f"model-{k + 1:05d}-of-{P:05d}.safetensors"
        total += write_part(os.path.join(a.out, fn), ts, pats)
        for name, _, _ in ts:
            wmap[name] = fn
        count += len(ts)
    with open(os.path.join(a.out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": wmap}, f, indent=1)
    cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
           "hidden_size": a.hidden, "intermediate_size": a.inter,
           "moe_intermediate_size": a.moe_inter, "num_attention_heads": a.heads,
           "num_key_value_heads": a.heads, "num_hidden_layers": a.layers,
           "q_lora_rank": a.q_lora, "kv_lora_rank": a.kv_lora, "qk_nope_head_dim": a.nope,
           "qk_rope_head_dim": a.rope, "v_head_dim": a.v_head, "head_dim": a.rope,
           "n_routed_experts": a.experts, "n_shared_experts": 1, "num_experts_per_tok": 8,
           "n_group": 8, "topk_group": 4, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
           "norm_topk_prob": True, "routed_scaling_factor": 2.5,
           "first_k_dense_replace": a.dense, "moe_layer_freq": 1,
           "num_nextn_predict_layers": 1, "vocab_size": a.vocab, "hidden_act": "silu",
           "max_position_embeddings": 16384, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
           "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
           "bos_token_id": 0, "eos_token_id": 1}
    if not a.bf16:
        cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic",
                                      "fmt": "e4m3", "weight_block_size": [a.block, a.block]}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    print(count, total)


if __name__ == "__main__":
    main()
