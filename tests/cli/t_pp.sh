#!/bin/sh
# split --pp: pipeline stages in the vllm layout (vLLM 0.33's
# model-pp-{stage}-tp-{rank}-part-{p}.safetensors). tp 2 x pp 2 and tp 1 x pp 3
# (uneven), 5 layers over 2 stages, tied and untied, a mixture of experts
# whose every stage holds the embedding, norm and head, --ep; the stages'
# layers (get_pp_indices, --pp-layers, VLLM_PP_LAYER_PARTITION); check,
# verify, merge byte for byte and reshard; --ranks subsets and --ranks auto
# over workers; --pp 1 as without; bad input (usage 2, model 1, nothing
# written). tests/py/test_pp_layouts.py checks every worker's tensors against
# an independent oracle.
. "$TOP/tests/cli/lib.sh"
unset VLLM_PP_LAYER_PARTITION

# files DIR: the safetensors file names in DIR, one line
files() { (cd "$1" && ls *.safetensors 2>/dev/null | tr '\n' ' '); }
# keys FILE: the tensor names of a safetensors file, sorted, one line
keys() {
  python3 -c '
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n]); h.pop("__metadata__", None); print(" ".join(sorted(h)))' "$1"
}
# top FILE: its tensors outside the layers
top() { keys "$1" | tr ' ' '\n' | grep -v '^model\.layers\.' | tr '\n' ' '; }
# layers FILE: the layer indices it holds
layers() { keys "$1" | tr ' ' '\n' | sed -n 's/^model\.layers\.\([0-9]*\)\..*/\1/p' | sort -nu | tr '\n' ' '; }
# same SRC DIR: merge DIR gives back SRC's model.safetensors byte for byte
same() {
  rm -rf "$2-merged"
  run tps merge "$2" -o "$2-merged" -q
  if [ "$RC" = 0 ] && cmp -s "$1/model.safetensors" "$2-merged/model.safetensors"; then
    ok "merge $(basename "$2") gives back the source byte for byte"
  else notok "merge $(basename "$2"): exit $RC or bytes differ"; diag "$ERR"; fi
}
# proven SRC DIR NAME: check and verify --source pass
proven() {
  expect_exit 0 "check $3" -- tps check "$2"
  run tps verify "$2" --source "$1"
  if [ "$RC" = 0 ] && grep -q '^verify: PASS' "$OUT"; then ok "verify $3 against the source"
  else notok "verify $3: exit $RC"; grep -E 'FAIL|error' "$OUT" | diag; diag "$ERR"; fi
}

U="$T/llama5" TIED="$T/qwen3tied"
gen llama "$U" --layers 5 --hidden 32 --heads 4 --kv-heads 2 --inter 64 --vocab 100 >/dev/null &&
  gen qwen3 "$TIED" --layers 3 --hidden 32 --heads 4 --kv-heads 2 --inter 64 --vocab 250 --tied >/dev/null ||
  notok "gen.py the models"

# ---- tp 2 x pp 2, 5 layers: stages [3, 2], untied
o="$T/u-tp2pp2"
expect_exit 0 "split llama (5 layers) --tp 2 --pp 2 --layout vllm" -- tps split "$U" --tp 2 --pp 2 --layout vllm -o "$o"
want="model-pp-0-tp-0-part-0.safetensors model-pp-0-tp-1-part-0.safetensors model-pp-1-tp-0-part-0.safetensors model-pp-1-tp-1-part-0.safetensors "
[ "$(files "$o")" = "$want" ] && ok "tp 2 x pp 2 writes the four files under vLLM's names" ||
  { notok "tp 2 x pp 2 files"; echo "#   $(files "$o")"; }
[ "$(layers "$o/model-pp-0-tp-1-part-0.safetensors")" = "0 1 2 " ] &&
  [ "$(layers "$o/model-pp-1-tp-0-part-0.safetensors")" = "3 4 " ] &&
  ok "5 layers over 2 stages: [3, 2], global indices kept" ||
  notok "stage layers: $(layers "$o/model-pp-0-tp-1-part-0.safetensors")| $(layers "$o/model-pp-1-tp-0-part-0.safetensors")"
[ "$(top "$o/model-pp-0-tp-0-part-0.safetensors")" = "model.embed_tokens.weight " ] &&
  [ "$(top "$o/model-pp-1-tp-1-part-0.safetensors")" = "lm_head.weight model.norm.weight " ] &&
  ok "untied: embedding on the first stage, norm and lm_head on the last" ||
  notok "untied top-level tensors: $(top "$o/model-pp-0-tp-0-part-0.safetensors")| $(top "$o/model-pp-1-tp-1-part-0.safetensors")"
python3 - "$o/tpshard.json" <<'PY' && ok "the manifest records pp, the stages, and each file's stage and layers" || notok "manifest pp fields"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["tp"] == 2 and m["pp"] == 2, m.get("pp")
assert m["stages"] == [{"stage": 0, "layers": [0, 3], "ranks": [0, 2]},
                       {"stage": 1, "layers": [3, 5], "ranks": [2, 4]}], m["stages"]
f = {e["name"]: e for e in m["files"]}
e = f["model-pp-1-tp-0-part-0.safetensors"]
assert (e["rank"], e["stage"], e["tp_rank"], e["layers"]) == (2, 1, 0, [3, 5]), e
PY
proven "$U" "$o" "tp 2 x pp 2"
run tps verify "$o" --source "$U" -v
grep -q 'pipeline: every layer on its stage.s ranks  *stage .* ok$' "$OUT" &&
  grep -q 'stage 0: layers 0-2 on ranks 0-1  *stage .* ok$' "$OUT" &&
  grep -q 'stage 1: layers 3-4 on ranks 2-3  *stage .* ok$' "$OUT" &&
  ok "verify -v: the whole (every layer on its stage's ranks) and a row per stage" ||
  { notok "verify's stage rows"; grep -i stage "$OUT" | diag; }
same "$U" "$o"

# check catches one flipped byte of the last stage's head; verify names it
python3 - "$o/model-pp-1-tp-1-part-0.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); n = struct.unpack("<Q", b[:8])[0]
s, e = json.loads(b[8:8 + n])["lm_head.weight"]["data_offsets"]
b[8 + n + s + 5] ^= 0x20
open(p, "wb").write(b)
PY
run tps check "$o"
[ "$RC" = 1 ] && grep -q "model-pp-1-tp-1-part-0" "$ERR" && ok "check fails on one flipped byte of stage 1's lm_head, naming the file" ||
  { notok "check after a flipped byte: exit $RC"; diag "$ERR"; }
run tps verify "$o" --source "$U"
[ "$RC" = 1 ] && grep 'lm_head.weight' "$OUT" | grep -q FAIL && ok "verify fails on it, naming lm_head.weight" ||
  { notok "verify after a flipped byte: exit $RC"; diag "$OUT"; }

# ---- tp 1 x pp 3, uneven: 5 layers are [2, 2, 1]; tied: 3 layers [1, 1, 1]
o="$T/u-tp1pp3"
expect_exit 0 "split --tp 1 --pp 3" -- tps split "$U" --tp 1 --pp 3 --layout vllm -o "$o" -q
[ "$(files "$o")" = "model-pp-0-tp-0-part-0.safetensors model-pp-1-tp-0-part-0.safetensors model-pp-2-tp-0-part-0.safetensors " ] &&
  [ "$(layers "$o/model-pp-0-tp-0-part-0.safetensors")|$(layers "$o/model-pp-1-tp-0-part-0.safetensors")|$(layers "$o/model-pp-2-tp-0-part-0.safetensors")" = "0 1 |2 3 |4 " ] &&
  [ -z "$(top "$o/model-pp-1-tp-0-part-0.safetensors")" ] &&
  ok "tp 1 x pp 3: pp names at tp 1, layers [2, 2, 1], the middle stage only its layers" ||
  notok "tp 1 x pp 3 files or layers: $(files "$o")"
proven "$U" "$o" "tp 1 x pp 3"
same "$U" "$o"
o="$T/tied-tp2pp2"
expect_exit 0 "split a tied qwen3 --tp 2 --pp 2" -- tps split "$TIED" --tp 2 --pp 2 --layout vllm -o "$o" -q
[ "$(top "$o/model-pp-0-tp-1-part-0.safetensors")" = "model.embed_tokens.weight " ] &&
  [ "$(top "$o/model-pp-1-tp-1-part-0.safetensors")" = "lm_head.weight model.norm.weight " ] &&
  ok "tied: the first stage holds model.embed_tokens.weight, the last lm_head.weight" ||
  notok "tied top-level: $(top "$o/model-pp-0-tp-1-part-0.safetensors")| $(top "$o/model-pp-1-tp-1-part-0.safetensors")"
proven "$TIED" "$o" "tied tp 2 x pp 2"
same "$TIED" "$o"

# ---- a mixture of experts: every stage builds embedding, norm and head; --ep
MOE="$T/qwen3moe"
python3 - "$MOE" <<'PY' || notok "make the Qwen3-MoE model"
# A tiny Qwen3MoeForCausalLM (3 layers, 4 experts), BF16, standard library only.
import json, os, random, struct, sys
out = sys.argv[1]; os.makedirs(out)
H, A, K, D, E, MI, V, L = 32, 4, 2, 8, 4, 16, 128, 3
s = {"model.embed_tokens.weight": [V, H], "model.norm.weight": [H], "lm_head.weight": [V, H]}
for i in range(L):
    p = f"model.layers.{i}."
    for n, sh in (("input_layernorm", [H]), ("post_attention_layernorm", [H]),
                  ("self_attn.q_proj", [A * D, H]), ("self_attn.k_proj", [K * D, H]),
                  ("self_attn.v_proj", [K * D, H]), ("self_attn.o_proj", [H, A * D]),
                  ("self_attn.q_norm", [D]), ("self_attn.k_norm", [D]), ("mlp.gate", [E, H])):
        s[p + n + ".weight"] = sh
    for e in range(E):
        for n, sh in (("gate_proj", [MI, H]), ("up_proj", [MI, H]), ("down_proj", [H, MI])):
            s[p + f"mlp.experts.{e}.{n}.weight"] = sh
rng = random.Random(7)
hdr, blobs, off = {}, [], 0
for name in sorted(s):
    n = 1
    for d in s[name]: n *= d
    b = b"".join(struct.pack("<f", rng.uniform(-0.5, 0.5))[2:] for _ in range(n))
    hdr[name] = {"dtype": "BF16", "shape": s[name], "data_offsets": [off, off + len(b)]}
    blobs.append(b); off += len(b)
j = json.dumps(hdr, separators=(",", ":")).encode(); j += b" " * (-len(j) % 8)
open(out + "/model.safetensors", "wb").write(struct.pack("<Q", len(j)) + j + b"".join(blobs))
json.dump({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": H,
           "num_attention_heads": A, "num_key_value_heads": K, "head_dim": D, "num_experts": E,
           "num_experts_per_tok": 2, "moe_intermediate_size": MI, "intermediate_size": 48,
           "vocab_size": V, "num_hidden_layers": L, "tie_word_embeddings": False,
           "decoder_sparse_step": 1, "mlp_only_layers": [], "rms_norm_eps": 1e-6,
           "torch_dtype": "bfloat16"}, open(out + "/config.json", "w"), indent=2)
PY
o="$T/moe-ep"
expect_exit 0 "split qwen3_moe --tp 2 --pp 3 --ep" -- tps split "$MOE" --tp 2 --pp 3 --ep --layout vllm -o "$o" -q
good=1
for s in 0 1 2; do
  [ "$(top "$o/model-pp-$s-tp-1-part-0.safetensors")" = "lm_head.weight model.embed_tokens.weight model.norm.weight " ] || good=0
done
[ "$(layers "$o/model-pp-2-tp-0-part-0.safetensors")" = "2 " ] || good=0
[ $good = 1 ] && ok "Qwen3-MoE: every stage holds the embedding, the norm and lm_head" ||
  notok "Qwen3-MoE top-level: $(top "$o/model-pp-1-tp-1-part-0.safetensors")"
keys "$o/model-pp-1-tp-0-part-0.safetensors" | grep -q 'model.layers.1.mlp.experts.routed_experts.w13_weight' &&
  ok "--ep: stage 1 holds its layer's expert stacks" || notok "--ep expert stacks on stage 1"
proven "$MOE" "$o" "qwen3_moe tp 2 x pp 3 --ep"
same "$MOE" "$o"

# ---- partitions: --pp-layers, VLLM_PP_LAYER_PARTITION
o="$T/u-layers"
expect_exit 0 "split --pp-layers 1,4" -- tps split "$U" --tp 1 --pp-layers 1,4 --layout vllm -o "$o" -q
[ "$(layers "$o/model-pp-1-tp-0-part-0.safetensors")" = "1 2 3 4 " ] && ok "--pp-layers 1,4 gives stage 1 layers 1-4" ||
  notok "--pp-layers: $(layers "$o/model-pp-1-tp-0-part-0.safetensors")"
o="$T/u-env"
run env VLLM_PP_LAYER_PARTITION=4,1 "$TPSHARD" split "$U" --tp 1 --pp 2 --layout vllm -o "$o" -v
[ "$RC" = 0 ] && [ "$(layers "$o/model-pp-0-tp-0-part-0.safetensors")" = "0 1 2 3 " ] &&
  grep -q 'VLLM_PP_LAYER_PARTITION' "$ERR" && ok "VLLM_PP_LAYER_PARTITION=4,1 is honoured, and -v says so" ||
  { notok "VLLM_PP_LAYER_PARTITION: exit $RC"; diag "$ERR"; }
rm -rf "$T/x"
run env VLLM_PP_LAYER_PARTITION=4,1 "$TPSHARD" split "$U" --tp 1 --pp-layers 2,3 --layout vllm -o "$T/x"
[ "$RC" = 2 ] && grep -q 'disagree' "$ERR" && [ ! -e "$T/x" ] &&
  ok "--pp-layers and VLLM_PP_LAYER_PARTITION that disagree: usage error, nothing written" ||
  { notok "disagreeing partitions: exit $RC"; diag "$ERR"; }
run tps plan "$U" --tp 2 --pp 2 --layout vllm
[ "$RC" = 0 ] && grep -q 'stage 0: layers 0-2 (3), ranks 0-1' "$OUT" && grep -q 'stage 1: layers 3-4 (2), ranks 2-3' "$OUT" &&
  grep -q '^  model.layers.4.input_layernorm.weight  *1 ' "$OUT" &&
  ok "plan --pp shows the stage of every layer's tensors and the bytes of each stage's ranks" ||
  { notok "plan --pp: exit $RC"; diag "$OUT"; }
run tps plan "$U" --tp 2 --pp 2 --layout vllm --json
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert d["pp"] == 2 and len(d["rank_bytes"]) == 4 and d["stages"][1]["layers"] == [3, 5]
t = {x["name"]: x["stages"] for x in d["tensors"]}
assert t["model.layers.2.mlp.up_proj.weight"] == [0] and t["lm_head.weight"] == [1]
' "$OUT" && ok "plan --pp --json: pp, stages, each tensor's stages, bytes of every worker" || { notok "plan --pp --json"; diag "$OUT"; }

# ---- --ranks counts workers; a Slurm array over 2 nodes writes each node's stage
o="$T/ranks"
expect_exit 3 "split --ranks 2,3 (stage 1) leaves the directory partial" -- sh -c "\"$TPSHARD\" split \"$U\" --tp 2 --pp 2 --layout vllm -o \"$o\" --ranks 2,3 -q && \"$TPSHARD\" check \"$o\""
[ "$(files "$o")" = "model-pp-1-tp-0-part-0.safetensors model-pp-1-tp-1-part-0.safetensors " ] &&
  ok "--ranks 2,3 writes stage 1's two workers" || notok "--ranks 2,3 wrote $(files "$o")"
run env SLURM_ARRAY_TASK_ID=0 SLURM_ARRAY_TASK_COUNT=2 "$TPSHARD" split "$U" --tp 2 --pp 2 --layout vllm -o "$o" --ranks auto
[ "$RC" = 0 ] && grep -q 'ranks 0-1 of 4' "$ERR" && ok "--ranks auto: array task 0 of 2 writes ranks 0-1 of 4 (stage 0)" ||
  { notok "--ranks auto: exit $RC"; diag "$ERR"; }
expect_exit 0 "check: the two runs make the directory whole" -- tps check "$o"
same "$U" "$o"
expect_exit 2 "--ranks 4 at tp 2 x pp 2 is not a worker" -- tps split "$U" --tp 2 --pp 2 --layout vllm -o "$T/x" --ranks 4

# ---- reshard: a pp directory as the source, and pp from a tp directory
expect_exit 0 "reshard tp 2 x pp 2 to tp 4" -- tps split "$T/u-tp1pp3" --tp 2 --layout vllm -o "$T/re1" -q
proven "$U" "$T/re1" "tp 2 resharded from tp 1 x pp 3"
expect_exit 0 "reshard tp 2 x pp 2 (from tp 1 x pp 3) to tp 1 x pp 2" -- tps split "$T/re1" --tp 1 --pp 2 --layout vllm -o "$T/re2" -q
proven "$U" "$T/re2" "tp 1 x pp 2 resharded from tp 2"
same "$U" "$T/re2"

# ---- --pp 1 writes exactly the files it writes without --pp
tps split "$U" --tp 2 --layout vllm -o "$T/p0" -q && tps split "$U" --tp 2 --pp 1 --layout vllm -o "$T/p1" -q
good=1
for f in model-rank-0-part-0.safetensors model-rank-1-part-0.safetensors tpshard.json; do cmp -s "$T/p0/$f" "$T/p1/$f" || good=0; done
[ $good = 1 ] && [ "$(files "$T/p1")" = "model-rank-0-part-0.safetensors model-rank-1-part-0.safetensors " ] &&
  ok "--pp 1 writes the model-rank files and the manifest it writes without --pp, byte for byte" ||
  notok "--pp 1 differs from no --pp"

# ---- bad input: usage 2, the model 1; nothing written
for args in "--pp 2:dtensor" "--pp 2 --layout sglang:sglang" "--pp-layers 3,0 --layout vllm:no layer" \
            "--pp 2 --pp-layers 5 --layout vllm:stage" "--pp 0 --layout vllm:--pp"; do
  a=${args%%:*} w=${args#*:}
  rm -rf "$T/bad"
  run tps split "$U" --tp 1 $a -o "$T/bad"
  [ "$RC" = 2 ] && grep -qF -- "$w" "$ERR" && [ ! -e "$T/bad" ] && ok "split $a: usage error naming '$w', nothing written" ||
    { notok "split $a: exit $RC"; diag "$ERR"; }
done
run tps split "$U" --tp 1 --pp 2 --layout sglang -o "$T/bad"
grep -qF -- '--layout vllm' "$ERR" && ok "the usage error says which layouts take --pp" || { notok "which layouts"; diag "$ERR"; }
for args in "--pp 6:exceeds the model's 5 layers" "--pp-layers 2,2:holds 4 layers, the model has 5"; do
  a=${args%%:*} w=${args#*:}
  rm -rf "$T/bad"
  run tps split "$U" --tp 1 $a --layout vllm -o "$T/bad"
  [ "$RC" = 1 ] && grep -qF -- "$w" "$ERR" && [ ! -e "$T/bad" ] && ok "split $a: exit 1, '$w', nothing written" ||
    { notok "split $a: exit $RC"; diag "$ERR"; }
done
expect_exit 2 "plan --pp with the dtensor layout is a usage error" -- tps plan "$U" --tp 1 --pp 2

finish
