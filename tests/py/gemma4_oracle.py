"""Independent oracle for Gemma 4 text models in `tpshard split --layout vllm`.

What vLLM 0.33's Gemma4ForCausalLM (models/gemma4.py) holds on each
tensor-parallel rank when it loads a checkpoint with load_format="sharded_state":
the keys of `_filter_subtensors(model.state_dict())`, with dtypes, shapes and
bytes.  Read from the engine's model code, never from tpshard's sources; Python
standard library and numpy only.  The facts it encodes:

- Gemma4Attention: non-KV-shared layers fuse q/k/v into `self_attn.qkv_proj`
  (QKVParallelLinear, whole heads, fewer KV heads than ranks replicated); a
  full-attention layer of an `attention_k_eq_v` model has no v_proj and its
  k_proj is loaded into both the K and the V slot (_gemma4_layer_weights_mapper);
  KV-shared layers (the last num_kv_shared_layers) build only `q_proj`
  (ColumnParallelLinear, rows split) and no k_norm, and the checkpoint's
  k_proj/v_proj/k_norm of those layers are mapped to None.  Head size and KV
  heads are the layer's own (config.per_layer_config: head_dim/global_head_dim,
  num_key_value_heads/num_global_key_value_heads on full-attention layers when
  attention_k_eq_v).  Every attention registers the F32 0-dim buffers
  `attn._k_scale/_v_scale/_q_scale/_prob_scale` = 1.0.
- Gemma4MLP: gate/up fused into `mlp.gate_up_proj`; the intermediate size is
  doubled on KV-shared layers when use_double_wide_mlp is set.
- Gemma4Model: `embed_tokens` and `embed_tokens_per_layer` are
  VocabParallelEmbedding (rows padded to a multiple of 64, zeros past the
  vocabulary; the per-layer table's vocabulary is vocab_size_per_layer_input);
  `per_layer_model_projection` is ColumnParallelLinear (its rows split);
  `per_layer_projection_norm`, each layer's `per_layer_input_gate`,
  `per_layer_projection`, `post_per_layer_input_norm`, every norm and the
  persistent `layer_scalar` buffer are whole on every rank.
- The decoder layers are registered three times (model.layers, and
  model.self_decoder.decoder_layers / model.cross_decoder.decoder_layers split at
  the first KV-shared layer); _filter_subtensors keeps the smallest name, so the
  KV-shared layers are written as `model.cross_decoder.decoder_layers.{i - first}`.
- Tied (Gemma4TextConfig's default): only `lm_head.weight` (the embedding).

    make_checkpoint(outdir, **shape) -> outdir
    expected_ranks(model_dir, tp) -> [{name: (dtype, shape, bytes)} per rank]
"""
import json
import os

import numpy as np

from serving_oracle import load_checkpoint, Rejected  # the safetensors reader only

VOCAB_PADDING = 64  # layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE
ATTN_BUFFERS = ("_k_scale", "_v_scale", "_q_scale", "_prob_scale")


# ------------------------------------------------------------------ tiny checkpoints

def _bf16(rng, shape):
    """Random BF16 bytes (finite values)."""
    f = rng.standard_normal(int(np.prod(shape))).astype(np.float32)
    return (f.view(np.uint32) >> 16).astype(np.uint16).tobytes()


def _write(outdir, tensors, config):
    os.makedirs(outdir, exist_ok=True)
    hdr, off, blobs = {"__metadata__": {"format": "pt"}}, 0, []
    for name in sorted(tensors):
        dt, shape, data = tensors[name]
        hdr[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(os.path.join(outdir, "model.safetensors"), "wb") as f:
        f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))
    with open(os.path.join(outdir, "config.json"), "w") as f:
        f.write(json.dumps(config, indent=2) + "\n")
    return outdir


def make_checkpoint(outdir, hidden=64, heads=4, kv_heads=2, head_dim=16, global_head_dim=32,
                    global_kv_heads=1, inter=96, vocab=250, vocab_pl=200, layers=4, ple=8,
                    kv_shared=2, k_eq_v=True, double_wide=True, ship_shared_kv=False,
                    tied=True, seed=0):
    """A Gemma4ForCausalLM checkpoint (model_type gemma4_text, tensors model.*):
    layers alternate sliding/full attention (the last one full), the last
    kv_shared share KV, ple the per-layer input width (0: none)."""
    rng = np.random.default_rng(seed)
    H, L = hidden, layers
    types = ["full_attention" if (i % 2 == 1 or i == L - 1) else "sliding_attention"
             for i in range(L)]
    first_shared = L - kv_shared
    t = {}

    def add(name, *shape):
        t[name] = ("BF16", list(shape), _bf16(rng, shape))

    add("model.embed_tokens.weight", vocab, H)
    if ple:
        add("model.embed_tokens_per_layer.weight", vocab_pl, L * ple)
        add("model.per_layer_model_projection.weight", L * ple, H)
        add("model.per_layer_projection_norm.weight", ple)
    for i in range(L):
        p = f"model.layers.{i}."
        full = types[i] == "full_attention"
        hd = global_head_dim if full else head_dim
        kv = global_kv_heads if (full and k_eq_v and global_kv_heads) else kv_heads
        shared = i >= first_shared
        I = inter * (2 if (double_wide and shared and kv_shared) else 1)
        add(p + "input_layernorm.weight", H)
        add(p + "post_attention_layernorm.weight", H)
        add(p + "pre_feedforward_layernorm.weight", H)
        add(p + "post_feedforward_layernorm.weight", H)
        add(p + "layer_scalar", 1)
        add(p + "self_attn.q_proj.weight", heads * hd, H)
        add(p + "self_attn.q_norm.weight", hd)
        if not shared or ship_shared_kv:
            add(p + "self_attn.k_proj.weight", kv * hd, H)
            add(p + "self_attn.k_norm.weight", hd)
            if not (full and k_eq_v) or shared:
                add(p + "self_attn.v_proj.weight", kv * hd, H)
        add(p + "self_attn.o_proj.weight", H, heads * hd)
        add(p + "mlp.gate_proj.weight", I, H)
        add(p + "mlp.up_proj.weight", I, H)
        add(p + "mlp.down_proj.weight", H, I)
        if ple:
            add(p + "per_layer_input_gate.weight", ple, H)
            add(p + "per_layer_projection.weight", H, ple)
            add(p + "post_per_layer_input_norm.weight", H)
    add("model.norm.weight", H)
    if not tied:
        add("lm_head.weight", vocab, H)
    config = {
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "hidden_size": H,
        "intermediate_size": inter,
        "num_hidden_layers": L,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "global_head_dim": global_head_dim,
        "num_global_key_value_heads": global_kv_heads if k_eq_v else None,
        "attention_k_eq_v": k_eq_v,
        "layer_types": types,
        "num_kv_shared_layers": kv_shared,
        "use_double_wide_mlp": double_wide,
        "hidden_size_per_layer_input": ple,
        "vocab_size": vocab,
        "vocab_size_per_layer_input": vocab_pl,
        "max_position_embeddings": 512,
        "sliding_window": 64,
        "rms_norm_eps": 1e-6,
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": tied,
        "torch_dtype": "bfloat16",
        "enable_moe_block": False,
    }
    return _write(outdir, t, config)
