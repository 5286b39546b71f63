"""config.json fields as transformers reads them: defaults and other names.

transformers fills every field a config.json leaves out from the config class
of its model type, and reads some fields under two names (Qwen3-MoE's
num_experts, written num_local_experts by transformers 5; dtype/torch_dtype).
The engines build their models from that config object, so tpshard must read
the same values in every layout. Oracle: transformers' own config classes
(AutoConfig.from_pretrained on the very file tpshard reads), no torch.

1. For every family tpshard has a plan for, and every TP field tpshard reads:
   the field removed from a config.json saved by save_pretrained (and, for
   fields with two names, written under the other name only) gives the value
   transformers gives, as `tpshard inspect --json` shows it.
2. A LLaMA without num_key_value_heads splits in every layout, kv heads =
   heads (transformers' default); a Qwen2 without it is refused by every
   layout alike (Qwen2Config's default is 32 KV heads, not the head count).
3. A Qwen3-MoE config.json as transformers 5 writes it (num_local_experts)
   and a Mixtral written with num_experts split with --layout vllm|sglang to
   the oracle's tensors; a config that has neither name (no model type to take
   a default from) is refused naming config.json, the field and its other name.
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
TMP = tempfile.mkdtemp(prefix="pycfg.", dir=os.environ.get("TPS_TMP") or None)

try:
    import numpy as np  # noqa: F401
    import transformers
    import family_oracle as fo
    from ranktest import rank_file_problems, refusal_problems
    sys.path.insert(0, os.path.join(TOP, "testdata"))
    import gen
except ImportError as e:  # pragma: no cover
    print(f"skip - config default tests: {e}")
    sys.exit(0)

print(f"# transformers {transformers.__version__} (configs only, no torch)")


def tps(*args):
    p = subprocess.run([TPSHARD, *map(str, args)], capture_output=True, text=True, timeout=300)
    jsonlog.save(args, p)
    return p.returncode, p.stdout, p.stderr


# The config classes of the families tpshard has plans for, with small
# values that differ from every default, so that a value that comes back is
# the default and not the one removed.
SMALL = dict(hidden_size=48, num_attention_heads=6, num_key_value_heads=3, intermediate_size=40,
             vocab_size=128, num_hidden_layers=2)
FAMILIES = [
    ("llama", "LlamaConfig", "LlamaForCausalLM", dict(head_dim=12)),
    ("mistral", "MistralConfig", "MistralForCausalLM", dict(head_dim=12)),
    ("qwen2", "Qwen2Config", "Qwen2ForCausalLM", {}),
    ("qwen3", "Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=12)),
    ("phi3", "Phi3Config", "Phi3ForCausalLM", {}),
    ("qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM",
     dict(num_experts=6, moe_intermediate_size=20, head_dim=12)),
    ("mixtral", "MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=6, head_dim=12)),
    ("gemma3_text", "Gemma3TextConfig", "Gemma3ForCausalLM", dict(head_dim=12)),
    ("gemma3", "Gemma3Config", "Gemma3ForConditionalGeneration", dict(head_dim=12)),
    ("gemma4", "Gemma4Config", "Gemma4ForConditionalGeneration",
     dict(head_dim=12, hidden_size_per_layer_input=0, vocab_size_per_layer_input=64)),
]
FIELDS = ["num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
          "intermediate_size", "vocab_size", "num_hidden_layers", "tie_word_embeddings",
          "num_experts", "moe_intermediate_size", "hidden_size_per_layer_input",
          "vocab_size_per_layer_input", "enable_moe_block"]
# The names transformers writes one field under (attribute_map, 4.x vs 5.x).
ALIASES = {"num_experts": "num_local_experts", "num_local_experts": "num_experts",
           "torch_dtype": "dtype", "dtype": "torch_dtype"}


def text_cfg(c):
    return c.get_text_config() if hasattr(c, "get_text_config") else c


def expected(cfg, field):
    """What transformers (and the engines reading its config) take for field."""
    t = text_cfg(cfg)
    if field == "head_dim":
        v = getattr(t, "head_dim", None)
        # model code: getattr(config, "head_dim", None) or hidden // heads
        return v if v is not None else t.hidden_size // t.num_attention_heads
    return getattr(t, field, None)


def one_tensor(d):
    gen.write_checkpoint(d, {"x.weight": ("F32", [2], b"\0" * 8)}, 0)


def drop(j, field):
    """Removes field and its other names from both levels of a config dict."""
    for obj in (j, j.get("text_config") if isinstance(j.get("text_config"), dict) else {}):
        for f in (field, ALIASES.get(field)):
            if f:
                obj.pop(f, None)


def inspect_config(d):
    rc, out, err = tps("inspect", d, "--json")
    if rc != 0:
        return None, err
    return json.loads(out)["config"], ""


# ------------------------------------------------------------ 1. every default

def test_defaults():
    for mt, cls, arch, extra in FAMILIES:
        C = getattr(transformers, cls, None)
        if C is None:
            print(f"skip - transformers {transformers.__version__} has no {cls}")
            continue
        kw = dict(SMALL, **extra)
        if mt in ("gemma3", "gemma4"):
            tkw = dict(kw)
            if mt == "gemma4":
                tkw["layer_types"] = ["sliding_attention", "full_attention"]
            cfg = C(text_config=tkw)
        else:
            cfg = C(**kw)
        cfg.architectures = [arch]
        base = os.path.join(TMP, f"base-{mt}")
        cfg.save_pretrained(base)
        with open(os.path.join(base, "config.json")) as f:
            saved = json.load(f)
        bad, n = [], 0
        for field in FIELDS:
            j = json.loads(json.dumps(saved))
            drop(j, field)
            d = os.path.join(TMP, f"{mt}-{field}")
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(j, f)
            one_tensor(d)
            try:
                want = expected(transformers.AutoConfig.from_pretrained(d), field)
            except Exception as e:  # a class that refuses the config: nothing to compare
                print(f"# {mt} without {field}: transformers refuses it ({type(e).__name__})")
                continue
            got, err = inspect_config(d)
            n += 1
            if got is None:
                bad.append(f"{field}: inspect failed: {err.strip()}")
            elif got.get(field) != want:
                bad.append(f"{field} absent: transformers takes {want!r}, tpshard {got.get(field)!r}")
        report(not bad and n > 0,
               f"{mt}: {n} fields left out of config.json read as transformers' {cls} fills them",
               "\n".join(bad) or "nothing compared")


def test_other_names():
    """4.x names and attribute_map aliases: each read as transformers reads it."""
    cases = [("Qwen3MoeConfig", "Qwen3MoeForCausalLM", "num_local_experts", "num_experts", 6),
             ("MixtralConfig", "MixtralForCausalLM", "num_local_experts", "num_experts", 6),
             ("LlamaConfig", "LlamaForCausalLM", "dtype", "torch_dtype", "float16")]
    for cls, arch, written, other, value in cases:
        C = getattr(transformers, cls, None)
        if C is None:
            print(f"skip - transformers {transformers.__version__} has no {cls}")
            continue
        cfg = C(**SMALL)
        cfg.architectures = [arch]
        d = os.path.join(TMP, f"alias-{cls}-{other}")
        cfg.save_pretrained(d)
        with open(os.path.join(d, "config.json")) as f:
            j = json.load(f)
        j.pop(written, None)
        j.pop(other, None)
        j[other] = value
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(j, f)
        one_tensor(d)
        t = transformers.AutoConfig.from_pretrained(d)
        want = getattr(t, written, None)
        if written == "dtype":
            want = str(want).replace("torch.", "") if want is not None else None
        got, err = inspect_config(d)
        show = "torch_dtype" if written == "dtype" else "num_experts"
        report(got is not None and want == value and got.get(show) == value,
               f"{cls}: config.json with {other} only: read as {written} = {value!r}, as "
               f"transformers reads it",
               err or f"transformers {want!r}, tpshard {show} = {got.get(show) if got else None!r}")


# ------------------------------------------------------------ 2. num_key_value_heads

def without_kv(d):
    """Removes num_key_value_heads from d/config.json; returns the config left."""
    cj = os.path.join(d, "config.json")
    with open(cj) as f:
        j = json.load(f)
    del j["num_key_value_heads"]
    with open(cj, "w") as f:
        json.dump(j, f)
    return j


def test_kv_default():
    d = os.path.join(TMP, "llama-nokv")
    gen.main(["llama", d, "--heads", "4", "--kv-heads", "4", "--layers", "1"])
    j = without_kv(d)
    # The same checkpoint with the default spelled out: the rank files must be
    # byte for byte those of the config that says so.
    e = os.path.join(TMP, "llama-kv4")
    shutil.copytree(d, e)
    with open(os.path.join(e, "config.json"), "w") as f:
        json.dump(dict(j, num_key_value_heads=4), f)
    kv = {}
    for lay in ("dtensor", "vllm", "sglang"):
        out, ref = os.path.join(TMP, f"llama-nokv-{lay}"), os.path.join(TMP, f"llama-kv4-{lay}")
        rc, _, err = tps("split", d, "--tp", 2, "--layout", lay, "-o", out, "-q")
        problems = [] if rc == 0 else [f"exit {rc}: {err.strip()}"]
        rc1, _, err1 = tps("split", e, "--tp", 2, "--layout", lay, "-o", ref, "-q")
        if rc1:
            problems.append(f"with num_key_value_heads 4: exit {rc1}: {err1.strip()}")
        for r in range(2):
            f = f"model-rank-{r}-part-0.safetensors"
            if not rc and not rc1 and open(os.path.join(out, f), "rb").read() != \
                    open(os.path.join(ref, f), "rb").read():
                problems.append(f"{f} differs from the split of the config that says 4")
        rc2, po, _ = tps("plan", d, "--tp", 2, "--layout", lay, "--json")
        if rc2 == 0:
            kv[lay] = [x["num_key_value_heads"] for x in json.loads(po).get("layers", [])]
        report(not problems, f"llama without num_key_value_heads: --layout {lay} splits at tp 2 "
               "with transformers' default (one KV head per head)", "\n".join(problems))
    report(len(set(map(tuple, kv.values()))) == 1 and list(kv.values())[0] == [4],
           "llama without num_key_value_heads: every layout reads 4 KV heads", repr(kv))
    q = os.path.join(TMP, "qwen2-nokv")
    gen.main(["qwen2", q, "--heads", "4", "--kv-heads", "4", "--layers", "1"])
    without_kv(q)
    want_kv = transformers.AutoConfig.from_pretrained(q).num_key_value_heads
    for lay in ("dtensor", "vllm", "sglang"):
        out = os.path.join(TMP, f"qwen2-nokv-{lay}")
        rc, _, err = tps("split", q, "--tp", 2, "--layout", lay, "-o", out, "-q")
        problems = refusal_problems(rc, err, out, f"num_key_value_heads {want_kv}",
                                    "Qwen2Config's default")
        if "transformers' default" not in err:
            problems.append("the error does not say the count is transformers' default")
        report(want_kv == 32 and not problems,
               f"qwen2 without num_key_value_heads: --layout {lay} refuses it as transformers "
               f"reads it ({want_kv} KV heads, which the tensors do not hold)",
               "\n".join(problems) + "\n" + err)


def test_kv_default_other_families():
    """A default that the tensors contradict is refused in every layout, for
    every family whose plan splits heads (MistralConfig's default is 8 KV
    heads; a checkpoint holding 2 must say so), and the error says what to
    add. Without a head-shape check the split went on with 8 in mind: at
    tp 4 it cut the 2 KV heads in halves and called the result ok."""
    for fam in ("mistral", "qwen3"):
        d = os.path.join(TMP, f"{fam}-nokv2")
        gen.main([fam, d, "--heads", "8", "--kv-heads", "2", "--hidden", "64", "--layers", "1"])
        without_kv(d)
        want_kv = transformers.AutoConfig.from_pretrained(d).num_key_value_heads
        for lay in ("dtensor", "vllm", "sglang"):
            for tp in (2, 4):
                out = os.path.join(TMP, f"{fam}-nokv2-{lay}-{tp}")
                rc, _, err = tps("split", d, "--tp", tp, "--layout", lay, "-o", out, "-q")
                problems = refusal_problems(rc, err, out, f"num_key_value_heads {want_kv}",
                                            f"{fam} default")
                if '"num_key_value_heads": 2' not in err:
                    problems.append("the error does not say what to add to config.json")
                report(want_kv != 2 and not problems,
                       f"{fam} without num_key_value_heads, tensors of 2 KV heads: --layout {lay} "
                       f"refuses tp {tp} ({want_kv} by default) and says what to add",
                       "\n".join(problems) + "\n" + err)


# ------------------------------------------------------------ 3. num_experts / num_local_experts

def serving_oracle(config, d, lay, tp):
    """The oracle's tensors, from the config with num_experts spelled the way
    the oracle reads it (family_oracle.n_experts)."""
    _, tensors = fo.so.load_checkpoint(d)
    return fo.expected_ranks_from(config, tensors, lay, tp)


def test_expert_names():
    d = os.path.join(TMP, "qwen3moe-v5")
    fo.qwen3_moe_checkpoint(d, experts=4)
    cj = os.path.join(d, "config.json")
    with open(cj) as f:
        j = json.load(f)
    oracle_cfg = dict(j)
    j["num_local_experts"] = j.pop("num_experts")  # as transformers 5 writes it
    with open(cj, "w") as f:
        json.dump(j, f)
    if transformers.AutoConfig.from_pretrained(d).num_experts != 4:
        report(False, "transformers reads num_local_experts as Qwen3-MoE's num_experts")
    m = os.path.join(TMP, "mixtral-num-experts")
    fo.mixtral_checkpoint(m, experts=4)
    mj = os.path.join(m, "config.json")
    with open(mj) as f:
        k = json.load(f)
    mixtral_cfg = dict(k)
    k["num_experts"] = k.pop("num_local_experts")  # Mixtral's attribute_map name
    with open(mj, "w") as f:
        json.dump(k, f)
    for model, cfg, label in ((d, oracle_cfg, "qwen3_moe with num_local_experts (transformers 5)"),
                              (m, mixtral_cfg, "mixtral with num_experts (its attribute_map)")):
        for lay in ("vllm", "sglang"):
            out = os.path.join(TMP, os.path.basename(model) + "-" + lay)
            rc, _, err = tps("split", model, "--tp", 2, "--layout", lay, "-o", out, "-q")
            problems = [f"exit {rc}: {err.strip()}"] if rc else \
                rank_file_problems(out, model, serving_oracle(cfg, model, lay, 2), 2, engine=True)
            report(not problems, f"{label}: --layout {lay} splits at tp 2 as the engine loads it",
                   "\n".join(problems))
    # Truly missing: no model type to take a default from, neither name.
    x = os.path.join(TMP, "moe-no-experts")
    shutil.copytree(d, x)
    with open(os.path.join(x, "config.json")) as f:
        j = json.load(f)
    del j["num_local_experts"], j["model_type"]
    with open(os.path.join(x, "config.json"), "w") as f:
        json.dump(j, f)
    for lay in ("vllm", "sglang"):
        out = os.path.join(TMP, f"moe-no-experts-{lay}")
        rc, _, err = tps("split", x, "--tp", 2, "--layout", lay, "-o", out)
        problems = refusal_problems(rc, err, out, "config.json lacks num_experts",
                                    "the field to add")
        if "num_local_experts" not in err:
            problems.append("the error does not name the other name, num_local_experts")
        report(not problems, f"a MoE config.json with no expert count: --layout {lay} says "
               "which field to add and its other name", "\n".join(problems) + "\n" + err)


test_defaults()
test_other_names()
test_kv_default()
test_kv_default_other_families()
test_expert_names()
shutil.rmtree(TMP, ignore_errors=True)
sys.exit(1 if fails() else 0)
