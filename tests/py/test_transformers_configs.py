"""tpshard on config.json files as transformers itself saves them.

The configs are built with transformers' config classes (no torch needed) and
written with save_pretrained, the tensors' shapes are taken from transformers'
own per-layer view of the config (config.per_layer_config[i], kv_sharing_modes),
and the tiny tensors are written with the reference safetensors library. Then
the tpshard binary must accept or refuse each model with the right message,
split it as numpy slices of the source say, and show the per-layer counts.

Cases: Gemma4 whose full-attention layers have their own KV heads and head
size (per_layer_config, zero-padded keys, explicit serialization), the
E-series (KV-shared layers, head size only), untied Gemma4 (refused), tied
and untied Gemma3 (text-only and multimodal; --untie, merge back), a LLaMA
with a per-layer override, and configs whose tensors disagree with them.
Env: TPSHARD, TOP, TPS_TMP. Prints ok / not ok / skip lines.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jsonlog  # noqa: E402
from tap import fails, report  # noqa: E402

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

TOP = os.environ.get("TOP") or os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
TPSHARD = os.environ.get("TPSHARD") or os.path.join(TOP, "tpshard")
TMP = tempfile.mkdtemp(prefix="pytf.", dir=os.environ.get("TPS_TMP") or None)

try:
    import numpy as np
    from safetensors.numpy import save_file, load_file
    import transformers
except ImportError as e:  # pragma: no cover
    print(f"skip - transformers config tests: {e}")
    sys.exit(0)

print(f"# transformers {transformers.__version__} (configs only, no torch)")


def tps(*args):
    p = subprocess.run([TPSHARD, *map(str, args)], capture_output=True, text=True, timeout=300)
    jsonlog.save(args, p)
    return p.returncode, p.stdout, p.stderr


def have(*classes):
    """The transformers classes, or None after printing a skip line."""
    missing = [c for c in classes if not hasattr(transformers, c)]
    if missing:
        print(f"skip - transformers {transformers.__version__} has no {', '.join(missing)}")
        return None
    return [getattr(transformers, c) for c in classes]


def chunk(n, tp, r):
    c = -(-n // tp) if n else 0
    s = min(r * c, n)
    return s, min((r + 1) * c, n) - s


RNG = np.random.default_rng(16)


def arr(*shape):
    return (RNG.random(size=shape, dtype=np.float32) * 2 - 1).astype(np.float16)


def save(cfg, arch, tensors, name):
    """config.json by save_pretrained (architectures set as a model's
    save_pretrained sets it) and model.safetensors by save_file."""
    d = os.path.join(TMP, name)
    shutil.rmtree(d, ignore_errors=True)
    cfg.architectures = [arch]
    cfg.save_pretrained(d)
    save_file(tensors, os.path.join(d, "model.safetensors"), metadata={"format": "pt"})
    return d


def text_layers(tc, prefix, kv_shared=None):
    """Attention and MLP tensors of every layer, shaped as transformers builds
    them from its per-layer view of the config."""
    t = {}
    H, A, I = tc.hidden_size, tc.num_attention_heads, tc.intermediate_size
    for i in range(tc.num_hidden_layers):
        lc = tc.per_layer_config[i]
        hd, kv = lc.head_dim, lc.num_key_value_heads
        p = f"{prefix}layers.{i}."
        t[p + "input_layernorm.weight"] = arr(H)
        t[p + "self_attn.q_proj.weight"] = arr(A * hd, H)
        t[p + "self_attn.q_norm.weight"] = arr(hd)
        shared = kv_shared is not None and kv_shared[i] == "reuse"
        full = (getattr(tc, "layer_types", None) or [None] * (i + 1))[i] == "full_attention"
        if not shared:
            t[p + "self_attn.k_proj.weight"] = arr(kv * hd, H)
            t[p + "self_attn.k_norm.weight"] = arr(hd)
            if not (getattr(tc, "attention_k_eq_v", False) and full):
                t[p + "self_attn.v_proj.weight"] = arr(kv * hd, H)
        t[p + "self_attn.o_proj.weight"] = arr(H, A * hd)
        t[p + "mlp.gate_proj.weight"] = arr(I, H)
        t[p + "mlp.up_proj.weight"] = arr(I, H)
        t[p + "mlp.down_proj.weight"] = arr(H, I)
    t[prefix + "embed_tokens.weight"] = arr(tc.vocab_size, H)
    t[prefix + "norm.weight"] = arr(H)
    return t


LT4 = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]


def gemma4(name, tied=True, explicit=False, **text):
    G = have("Gemma4Config")
    if not G:
        return None
    base = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=4, head_dim=8, layer_types=LT4,
                hidden_size_per_layer_input=0, vocab_size_per_layer_input=64)
    base.update(text)
    cfg = G[0](text_config=base, tie_word_embeddings=tied)
    if explicit:
        cfg.text_config.serialize_explicit_per_layer_config = True
    tc = cfg.text_config
    t = text_layers(tc, "model.language_model.", tc.kv_sharing_modes)
    if tc.hidden_size_per_layer_input:
        L, P = tc.num_hidden_layers, tc.hidden_size_per_layer_input
        t["model.language_model.embed_tokens_per_layer.weight"] = arr(tc.vocab_size_per_layer_input, L * P)
        t["model.language_model.per_layer_model_projection.weight"] = arr(L * P, tc.hidden_size)
    if not tied:
        t["lm_head.weight"] = arr(tc.vocab_size, tc.hidden_size)
    return save(cfg, "Gemma4ForConditionalGeneration", t, name), cfg


def refused(label, model, tp, *words, extra=()):
    out = os.path.join(TMP, "refused-" + label.replace(" ", "_"))
    rc, so, se = tps("split", model, "--tp", tp, "-o", out, *extra)
    missing = [w for w in words if w not in se]
    report(rc == 1 and not missing and not os.path.exists(out),
           f"{label}: refused at tp {tp}" + (f", naming {', '.join(words)}" if words else ""),
           f"rc {rc}, missing {missing}, wrote {os.path.exists(out)}\n{se}")
    return se


def split_matches(label, model, tp, extra=(), want_untie=None):
    """split, then every rank's tensors are the numpy chunks of the source
    (the untied head: of the embedding)."""
    out = os.path.join(TMP, "out-" + label.replace(" ", "_"))
    shutil.rmtree(out, ignore_errors=True)
    rc, so, se = tps("split", model, "--tp", tp, "-o", out, *extra)
    if rc != 0:
        report(False, f"{label}: splits at tp {tp}", f"rc {rc}\n{se}")
        return None
    src = load_file(os.path.join(model, "model.safetensors"))
    man = json.load(open(os.path.join(out, "tpshard.json")))
    bad = []
    for e in man["tensors"]:
        full = src[e.get("derived_from") or e["name"]]
        for r in range(tp):
            got = load_file(os.path.join(out, f"model-rank-{r}-part-0.safetensors"))[e["name"]]
            want = full
            if e["dim"] >= 0:
                s, n = chunk(full.shape[e["dim"]], tp, r)
                want = np.take(full, range(s, s + n), axis=e["dim"])
            if got.shape != want.shape or got.tobytes() != want.tobytes():
                bad.append(f"{e['name']} rank {r}: {got.shape} vs {want.shape}")
    if want_untie:
        u = man.get("untie") or {}
        if (u.get("head"), u.get("embedding")) != want_untie:
            bad.append(f"manifest untie record {u.get('head')}, {u.get('embedding')}")
    report(not bad, f"{label}: split at tp {tp} holds torch.chunk slices of the source",
           "\n".join(bad[:10]))
    return out


def plan_json(model, tp, *extra):
    rc, so, se = tps("plan", model, "--tp", tp, "--json", *extra)
    try:
        return rc, json.loads(so), se
    except ValueError:
        return rc, None, se


# ------------------------------------------------------------------ Gemma4

def test_gemma4_global_kv():
    """The issue's model: full-attention layers with 2 KV heads of 32."""
    made = gemma4("g4-global", global_head_dim=32, num_global_key_value_heads=2,
                  attention_k_eq_v=True)
    if not made:
        return
    d, cfg = made
    raw = json.load(open(os.path.join(d, "config.json")))["text_config"]
    report("num_global_key_value_heads" not in raw and raw.get("per_layer_config", {}).get("1") ==
           {"head_dim": 32, "num_key_value_heads": 2},
           "gemma4: transformers writes per_layer_config, not num_global_key_value_heads",
           json.dumps(raw.get("per_layer_config")))
    refused("gemma4 per_layer_config", d, 4, "layer 1 (full_attention)", "num_key_value_heads = 2",
            "(per_layer_config)", "tp values that work for every layer: 1, 2")
    rc, j, se = plan_json(d, 2)
    lay = (j or {}).get("layers") or []
    ok = rc == 0 and len(lay) == 4 and \
        [(x["num_key_value_heads"], x["head_dim"]) for x in lay] == [(4, 8), (2, 32), (4, 8), (2, 32)] \
        and lay[1]["from"] == {"num_key_value_heads": "per_layer_config", "head_dim": "per_layer_config"} \
        and lay[0]["from"] == {} and lay[1]["type"] == "full_attention"
    report(ok, "gemma4: plan --json shows every layer's KV heads and head_dim, and where from",
           f"rc {rc}\n{json.dumps(lay)}\n{se}")
    rc, so, se = tps("plan", d, "--tp", 2)
    report(rc == 0 and "layers 1, 3 (full_attention): 4 heads, 2 KV heads, head_dim 32, from "
           "per_layer_config" in so and "layers 0, 2 (sliding_attention): 4 heads, 4 KV heads, "
           "head_dim 8" in so, "gemma4: plan shows the per-layer counts", so[-1500:] + se)
    out = split_matches("gemma4 per_layer_config", d, 2)
    if out:
        rc, so, se = tps("verify", out, "--source", d)
        report(rc == 0 and "verify: PASS" in so, "gemma4 per_layer_config: verify --source passes",
               so[-800:] + se)


def test_gemma4_more_forms():
    made = gemma4("g4-12", num_hidden_layers=12,
                  layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 2,
                  global_head_dim=16, num_global_key_value_heads=2, attention_k_eq_v=True)
    if not made:
        return
    d, _ = made
    keys = sorted(json.load(open(os.path.join(d, "config.json")))["text_config"]["per_layer_config"])
    report(keys == ["05", "11"], "gemma4 12 layers: transformers zero-pads the layer keys", keys)
    refused("gemma4 zero-padded keys", d, 4, "layer 5 (full_attention)", "the same on layer 11")
    split_matches("gemma4 zero-padded keys", d, 2)

    d, _ = gemma4("g4-explicit", explicit=True, global_head_dim=16, num_global_key_value_heads=2,
                  attention_k_eq_v=True)
    plc = json.load(open(os.path.join(d, "config.json")))["text_config"]["per_layer_config"]
    report(sorted(plc) == ["0", "1", "2", "3"], "gemma4 explicit: every layer listed", plc)
    refused("gemma4 explicit per_layer_config", d, 4, "layer 1 (full_attention)")
    split_matches("gemma4 explicit per_layer_config", d, 2)

    # E-series: KV-shared layers (no k/v_proj), per-layer table, head size only
    # (without attention_k_eq_v transformers drops num_global_key_value_heads).
    d, cfg = gemma4("g4-e", num_key_value_heads=2, global_head_dim=16, num_kv_shared_layers=2,
                    hidden_size_per_layer_input=4, num_global_key_value_heads=1)
    plc = json.load(open(os.path.join(d, "config.json")))["text_config"]["per_layer_config"]
    report(plc == {"1": {"head_dim": 16}, "3": {"head_dim": 16}},
           "gemma4 E-series: per_layer_config holds the head size only", plc)
    out = split_matches("gemma4 E-series", d, 2)
    if out:
        names = {e["name"] for e in json.load(open(os.path.join(out, "tpshard.json")))["tensors"]}
        report("model.language_model.layers.3.self_attn.k_proj.weight" not in names and
               "model.language_model.layers.1.self_attn.k_proj.weight" in names,
               "gemma4 E-series: KV-shared layers have no k_proj, and that is fine")
    rc, j, se = plan_json(d, 2)
    lay = (j or {}).get("layers") or []
    report(rc == 0 and [x["head_dim"] for x in lay] == [8, 16, 8, 16] and
           all(x["num_key_value_heads"] == 2 for x in lay),
           "gemma4 E-series: plan shows head_dim 16 on full-attention layers", json.dumps(lay))
    refused("gemma4 E-series", d, 4, "num_key_value_heads = 2 is not divisible by tp 4")


def test_gemma4_untied():
    made = gemma4("g4-untied", tied=False, global_head_dim=16, num_global_key_value_heads=2,
                  attention_k_eq_v=True)
    if not made:
        return
    d, _ = made
    raw = json.load(open(os.path.join(d, "config.json")))
    report(raw.get("tie_word_embeddings") is False, "gemma4 untied: config says tie_word_embeddings false")
    refused("untied gemma4", d, 2, "tie_word_embeddings=False", "ties its input and output embeddings")


def test_shapes_disagree():
    """Tensors made from the top-level counts only (what reading them alone
    assumes) do not fit transformers' per-layer config: refused, named."""
    G = have("Gemma4Config")
    if not G:
        return
    cfg = G[0](text_config=dict(vocab_size=64, hidden_size=32, intermediate_size=48,
                                num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                                head_dim=8, layer_types=LT4, hidden_size_per_layer_input=0,
                                global_head_dim=32, num_global_key_value_heads=2,
                                attention_k_eq_v=True))
    t = {}
    for i in range(4):
        p = f"model.language_model.layers.{i}.self_attn."
        t[p + "q_proj.weight"] = arr(32, 32)
        t[p + "k_proj.weight"] = arr(32, 32)
        t[p + "o_proj.weight"] = arr(32, 32)
    t["model.language_model.embed_tokens.weight"] = arr(64, 32)
    d = save(cfg, "Gemma4ForConditionalGeneration", t, "g4-disagree")
    refused("gemma4 tensors that disagree with per_layer_config", d, 2, "head shapes",
            "model.language_model.layers.1.self_attn.", "layer 1 (full_attention)")


# ------------------------------------------------------------------ Gemma3

def gemma3_text(name, tied, **kw):
    G = have("Gemma3TextConfig")
    if not G:
        return None
    cfg = G[0](vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=6,
               num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window_pattern=3,
               tie_word_embeddings=tied, **kw)
    t = text_layers(cfg, "model.")
    if not tied:
        t["lm_head.weight"] = arr(64, 32)
    return save(cfg, "Gemma3ForCausalLM", t, name)


def gemma3_mm(name, tied):
    G = have("Gemma3Config")
    if not G:
        return None
    cfg = G[0](text_config=dict(vocab_size=64, hidden_size=32, intermediate_size=48,
                                num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                                head_dim=8, tie_word_embeddings=tied),
               vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                  num_attention_heads=2, patch_size=2, image_size=8),
               tie_word_embeddings=tied)
    t = text_layers(cfg.text_config, "model.language_model.")
    t["model.vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight"] = arr(16, 16)
    t["model.multi_modal_projector.mm_input_projection_weight"] = arr(16, 32)
    if not tied:
        t["lm_head.weight"] = arr(64, 32)
    return save(cfg, "Gemma3ForConditionalGeneration", t, name)


def same_files(a, b, names):
    return [n for n in names if open(os.path.join(a, n), "rb").read() != open(os.path.join(b, n), "rb").read()]


def test_gemma3_untie():
    for label, make, head, emb in (
            ("gemma3 multimodal", gemma3_mm, "lm_head.weight", "model.language_model.embed_tokens.weight"),
            ("gemma3 text-only", gemma3_text, "lm_head.weight", "model.embed_tokens.weight")):
        d = make(label.replace(" ", "-") + "-tied", True)
        if not d:
            continue
        refused(f"tied {label}", d, 2, "tied", "--untie")
        out = split_matches(f"{label} --untie", d, 2, extra=("--untie",), want_untie=(head, emb))
        if not out:
            continue
        G = have("Gemma3Config" if "multi" in label else "Gemma3TextConfig")
        loaded = G[0].from_pretrained(out)
        flags = [loaded.tie_word_embeddings]
        if "multi" in label:
            flags.append(loaded.text_config.tie_word_embeddings)
        report(flags and not any(flags),
               f"{label} --untie: transformers loads the output config as untied", flags)
        rc, so, se = tps("check", out)
        report(rc == 0, f"{label} --untie: check passes", so + se)
        rc, so, se = tps("verify", out, "--source", d)
        report(rc == 0 and "verify: PASS" in so, f"{label} --untie: verify --source passes",
               so[-600:] + se)
        m = os.path.join(TMP, label.replace(" ", "-") + "-merged")
        rc, so, se = tps("merge", out, "-o", m)
        diff = same_files(d, m, ["config.json", "model.safetensors"]) if rc == 0 else ["merge failed"]
        report(rc == 0 and not diff and sorted(os.listdir(m)) == sorted(os.listdir(d)),
               f"{label} --untie: merge gives back the tied original byte for byte",
               f"rc {rc} {diff} {sorted(os.listdir(m)) if os.path.isdir(m) else ''}\n{se}")
        rc, j, se = plan_json(d, 2, "--untie")
        report(rc == 0 and (j or {}).get("untie") == {"head": head, "embedding": emb},
               f"{label}: plan --untie says which head and embedding", se)
    d = gemma3_mm("gemma3-mm-untied", False)
    if d:
        split_matches("untied gemma3 multimodal", d, 2)
        rc, so, se = tps("split", d, "--tp", 2, "-o", os.path.join(TMP, "never"), "--untie")
        report(rc == 2 and "not a tied checkpoint" in se and not os.path.exists(os.path.join(TMP, "never")),
               "untied gemma3: --untie is a usage error", f"rc {rc}\n{se}")


# ------------------------------------------------------------------ LLaMA, Qwen

def test_llama_qwen():
    C = have("LlamaConfig")
    if C:
        cfg = C[0](vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=4, head_dim=8,
                   per_layer_config={1: {"num_key_value_heads": 2}})
        t = text_layers(cfg, "model.")
        t["lm_head.weight"] = arr(64, 32)
        d = save(cfg, "LlamaForCausalLM", t, "llama-per-layer")
        refused("llama per_layer_config", d, 4, "layer 1: num_key_value_heads = 2 (per_layer_config)")
        split_matches("llama per_layer_config", d, 2)
        # An untied checkpoint: the checkpoint is not tied, whatever the plan has.
        rc, so, se = tps("split", d, "--tp", 2, "-o", os.path.join(TMP, "never"), "--untie")
        report(rc == 2 and "not a tied checkpoint" in se and "no tied embedding" not in se,
               "untied llama: --untie is a usage error saying the checkpoint is not tied",
               f"rc {rc}\n{se}")
        # A tied one: then it is the plan that has no untie entries.
        tied = C[0](vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                    num_attention_heads=4, num_key_value_heads=4, head_dim=8,
                    tie_word_embeddings=True)
        d = save(tied, "LlamaForCausalLM", text_layers(tied, "model."), "llama-tied")
        rc, so, se = tps("split", d, "--tp", 2, "-o", os.path.join(TMP, "never"), "--untie")
        report(rc == 2 and "no tied embedding" in se,
               "tied llama: --untie without plan entries is a usage error naming the plan",
               f"rc {rc}\n{se}")
    for cls, arch, name in (("Qwen2Config", "Qwen2ForCausalLM", "qwen2"),
                            ("Qwen3Config", "Qwen3ForCausalLM", "qwen3")):
        C = have(cls)
        if not C:
            continue
        cfg = C[0](vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, head_dim=8)
        t = text_layers(cfg, "model.")
        d = save(cfg, arch, t, name)
        split_matches(f"{name} (layer_types)", d, 2)


def main():
    test_gemma4_global_kv()
    test_gemma4_more_forms()
    test_gemma4_untied()
    test_shapes_disagree()
    test_gemma3_untie()
    test_llama_qwen()
    shutil.rmtree(TMP, ignore_errors=True)
    return 1 if fails() else 0


if __name__ == "__main__":
    sys.exit(main())
