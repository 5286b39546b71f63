#!/bin/sh
# tpshard verify (cpu backend): good shards pass for every family; a one-bit
# flip fails and names the tensor; a plan that pairs styles wrongly fails the
# block check; a truncated rank file is an error, not a crash; --json parses.
if [ -f "$TOP/tests/cli/lib.sh" ]; then
  . "$TOP/tests/cli/lib.sh"
else # standalone fallback with the same names
  : "${TOP:=$(cd "$(dirname "$0")/../.." && pwd)}" "${TPSHARD:=$TOP/tpshard}" "${TPS_TMP:=/tmp}"
  T=$(mktemp -d "$TPS_TMP/cli.t_verify.XXXXXX") || exit 1
  OUT="$T/.stdout" ERR="$T/.stderr" RC=0 FAILS=0
  ok() { echo "ok - $*"; }
  notok() { echo "not ok - $*"; FAILS=$((FAILS + 1)); }
  diag() { sed 's/^/#   /' "$@" | head -n 20; }
  tps() { "$TPSHARD" "$@"; }
  run() { RC=0; "$@" >"$OUT" 2>"$ERR" </dev/null || RC=$?; }
  finish() { [ -z "${KEEP_TMP:-}" ] && rm -rf "$T"; [ "$FAILS" -eq 0 ]; exit $?; }
fi
CONF="$TOP/testdata/conformance"

# check NAME: ok when the last run exited 0 and printed verify: PASS.
pass() {
  if [ "$RC" = 0 ] && grep -q '^verify: PASS' "$OUT"; then ok "$1"; else
    notok "$1"; echo "#   exit $RC"; diag "$OUT"; diag "$ERR"; fi
}
# failnames NAME WORD...: exit 1, verify: FAIL, and every WORD on stdout.
failnames() {
  name=$1; shift
  good=1
  [ "$RC" = 1 ] && grep -q '^verify: FAIL' "$OUT" || good=0
  for w in "$@"; do grep -qF -- "$w" "$OUT" || good=0; done
  if [ $good = 1 ]; then ok "$name"; else
    notok "$name"; echo "#   exit $RC, wanted: $*"; diag "$OUT"; diag "$ERR"; fi
}
json_ok() { # NAME WANT(true|false): stdout is one JSON document with "ok": WANT and checks
  if python3 - "$OUT" "$2" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
want = sys.argv[2] == "true"
assert d["ok"] is want, d["ok"]
assert isinstance(d["checks"], list) and d["checks"], "no checks"
for c in d["checks"]:
    for k in ("check", "kind", "max_abs_err", "tolerance", "wrong", "total", "ok", "note"):
        assert k in c, k
s = d["summary"]
assert s["failed"] == sum(1 for c in d["checks"] if not c["ok"])
assert s["passed"] + s["failed"] == len(d["checks"])
assert isinstance(d["backend"], str) and d["backend"]
EOF
  then ok "$1"; else notok "$1"; diag "$OUT"; fi
}
# flip FILE TENSOR|@sharded|@replicated [BIT]: flips bit BIT (0..15, default 2)
# of the 16-bit little-endian word in the middle of a tensor's bytes in a rank
# file; prints the tensor's name.
flip() {
  python3 - "$@" <<'EOF'
import json, struct, sys
path, which = sys.argv[1], sys.argv[2]
bit = int(sys.argv[3]) if len(sys.argv) > 3 else 2
b = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
meta = h.pop("__metadata__", {})
d = path.rsplit("/", 1)[0]
man = {t["name"]: t for t in json.load(open(d + "/tpshard.json"))["tensors"]}
names = sorted(k for k, v in h.items() if v["data_offsets"][1] > v["data_offsets"][0])
if which == "@sharded":
    names = [k for k in names if man[k]["dim"] >= 0]
elif which == "@replicated":
    names = [k for k in names if man[k]["dim"] < 0]
else:
    names = [which]
name = names[len(names) // 2]
s, e = h[name]["data_offsets"]
b[8 + n + s + (((e - s) // 2) & ~1) + bit // 8] ^= 1 << (bit % 8)
open(path, "wb").write(b)
print(name)
EOF
}
tp_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tp"])' "$1/case.json"; }
expect_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["expect"])' "$1/case.json"; }

# 1. Every conformance split case: split, then verify against the source.
for c in "$CONF"/*/; do
  c=${c%/}; name=$(basename "$c")
  [ "$(expect_of "$c")" = split ] || continue
  tp=$(tp_of "$c")
  lay=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("layout", "dtensor"))' "$c/case.json")
  rm -rf "$T/$name"
  run tps split "$c/model" --tp "$tp" --layout "$lay" -o "$T/$name" -q
  if [ "$RC" != 0 ]; then notok "split $name for verify"; diag "$ERR"; continue; fi
  run tps verify "$T/$name" --source "$c/model"
  pass "verify $name (tp $tp) passes with --source"
done

# 2. Generated checkpoints of every family, other dtypes, seeds and batches.
sed '/^checks:/,$d' "$TOP/plans/llama.yaml" >"$T/nocheck.yaml"
for fam in llama qwen2 qwen3 gemma3 gemma4; do
  python3 "$TOP/testdata/gen.py" "$fam" "$T/g-$fam" --seed 3 >/dev/null 2>"$ERR" ||
    { notok "gen.py $fam"; diag "$ERR"; continue; }
  tp=2; [ "$fam" = gemma3 ] && tp=1
  run tps split "$T/g-$fam" --tp $tp -o "$T/g-$fam-s" -q
  [ "$RC" = 0 ] || { notok "split generated $fam"; diag "$ERR"; continue; }
  run tps verify "$T/g-$fam-s" --source "$T/g-$fam" --seed 11 --batch 3
  pass "verify generated $fam (tp $tp, --seed 11 --batch 3) passes"
done
for dt in F16 F32 F8_E4M3 F64; do
  python3 "$TOP/testdata/gen.py" llama "$T/d-$dt" --dtype $dt --hidden 40 --inter 30 --vocab 37 \
    --seed 5 >/dev/null 2>"$ERR" && tps split "$T/d-$dt" --tp 3 --plan "$T/nocheck.yaml" \
    -o "$T/d-$dt-s" -q 2>"$ERR" || { notok "make a $dt checkpoint"; diag "$ERR"; continue; }
  run tps verify "$T/d-$dt-s" --source "$T/d-$dt"
  pass "verify $dt weights at tp 3 (uneven shards) passes"
done
python3 "$TOP/testdata/gen.py" llama "$T/all" --all-dtypes --hidden 20 --inter 13 --vocab 11 \
  >/dev/null 2>&1 && tps split "$T/all" --tp 5 --plan "$T/nocheck.yaml" -o "$T/all-s" -q 2>"$ERR"
run tps verify "$T/all-s" --source "$T/all" -v
pass "verify every dtype at tp 5 (integer tensors: reconstruction only)"

# 3. Without --source: the manifest's CRC32s, and a note that numerics need it.
L=$T/llama-tp3
run tps verify "$L"
pass "verify without --source passes" &&
  { grep -q 'need --source' "$OUT" && ok "without --source, says the numeric checks need it" ||
    { notok "no --source note"; diag "$OUT"; }; }
grep -q 'crc' "$OUT" && ok "without --source, checks CRC32s" || notok "no crc rows without --source"

# 4. --json: one document, for a pass and for a failure.
run tps verify "$L" --source "$CONF/llama-tp3/model" --json
[ "$RC" = 0 ] && json_ok "verify --json parses (pass)" true || { notok "verify --json exit $RC"; diag "$ERR"; }
python3 -m json.tool "$OUT" >/dev/null 2>&1 && ok "verify --json passes python3 -m json.tool" ||
  notok "python3 -m json.tool rejects verify --json"

# 5. One bit flipped in a sharded tensor of one rank: caught, tensor named.
for src in with without; do
  rm -rf "$T/flip"; cp -r "$L" "$T/flip"
  t=$(flip "$T/flip/model-rank-1-part-0.safetensors" @sharded)
  if [ $src = with ]; then run tps verify "$T/flip" --source "$CONF/llama-tp3/model"
  else run tps verify "$T/flip"; fi
  failnames "one flipped bit in rank 1's $t is caught ($src --source) and named" "$t" "rank 1"
done
run tps verify "$T/flip" --source "$CONF/llama-tp3/model" --json
json_ok "verify --json parses (fail)" false
# a high (exponent) bit: the numerics see it too (colwise for up_proj; rowwise
# and the MLP block for down_proj)
rm -rf "$T/flip"; cp -r "$L" "$T/flip"
flip "$T/flip/model-rank-2-part-0.safetensors" model.layers.1.mlp.up_proj.weight 14 >/dev/null
flip "$T/flip/model-rank-1-part-0.safetensors" model.layers.0.mlp.down_proj.weight 14 >/dev/null
run tps verify "$T/flip" --source "$CONF/llama-tp3/model" -v
if [ "$RC" = 1 ] && grep 'model.layers.1.mlp.up_proj.weight *colwise' "$OUT" | grep -q FAIL &&
   grep 'model.layers.0.mlp.down_proj.weight *rowwise' "$OUT" | grep -q FAIL &&
   grep 'model.layers.0.mlp  *mlp' "$OUT" | grep -q FAIL; then
  ok "exponent-bit flips fail the colwise and rowwise products and the MLP block"
else notok "exponent-bit flips not seen by the numerics"; diag "$OUT"; fi
# a replicated tensor differing on one rank
rm -rf "$T/flip"; cp -r "$L" "$T/flip"
t=$(flip "$T/flip/model-rank-2-part-0.safetensors" @replicated)
run tps verify "$T/flip" --source "$CONF/llama-tp3/model"
failnames "a replicated tensor that differs on rank 2 is caught and named" "$t" "replicated"

# 6. A plan that pairs styles wrongly: down_proj colwise fails the MLP block,
#    o_proj colwise the attention block, though each tensor alone is consistent.
sed '/mlp.down_proj$/{n;s/rowwise/colwise/}' "$T/nocheck.yaml" >"$T/bad-mlp.yaml"
sed '/self_attn.o_proj$/{n;s/rowwise/colwise/}' "$T/nocheck.yaml" >"$T/bad-attn.yaml"
for b in mlp attn; do
  if grep -q colwise "$T/bad-$b.yaml" && ! cmp -s "$T/bad-$b.yaml" "$T/nocheck.yaml"; then :; else
    notok "could not write the bad-$b plan"; continue; fi
  rm -rf "$T/bad"
  run tps split "$CONF/llama-tp4-uneven-vocab/model" --tp 4 --plan "$T/bad-$b.yaml" -o "$T/bad" -q
  [ "$RC" = 0 ] || { notok "split with the bad-$b plan"; diag "$ERR"; continue; }
  run tps verify "$T/bad" --source "$CONF/llama-tp4-uneven-vocab/model"
  if [ $b = mlp ]; then
    failnames "down_proj colwise fails the MLP block check" "model.layers.0.mlp " "down_proj Shard(0)"
  else
    failnames "o_proj colwise fails the attention block check" "model.layers.0.self_attn " "o_proj Shard(0)"
  fi
  grep -E '^(reconstruct|colwise) .* 0 failed' "$OUT" | grep -q colwise &&
    ok "bad-$b plan: every tensor alone still passes" || { notok "bad-$b: tensor rows failed"; diag "$OUT"; }
  run tps verify "$T/bad"
  [ "$RC" = 1 ] && grep -q 'do not pair' "$OUT" &&
    ok "bad-$b plan: the pairing is caught without --source too" || { notok "bad-$b without source"; diag "$OUT"; }
done

# 7. A truncated rank file: an error naming the file, exit 1, no crash.
rm -rf "$T/trunc"; cp -r "$L" "$T/trunc"
f="$T/trunc/model-rank-2-part-0.safetensors"
size=$(wc -c <"$f")
head -c $((size - 100)) "$f" >"$f.t" && mv "$f.t" "$f"
run tps verify "$T/trunc" --source "$CONF/llama-tp3/model"
if [ "$RC" = 1 ] && grep -q 'model-rank-2-part-0.safetensors' "$ERR"; then
  ok "a truncated rank file is an error naming it (exit 1)"
else notok "truncated rank file: exit $RC"; diag "$ERR"; fi
head -c 20 "$f" >"$f.t" && mv "$f.t" "$f"
run tps verify "$T/trunc"
[ "$RC" = 1 ] && ok "a rank file cut inside its header is an error (exit 1)" ||
  { notok "header-truncated rank file: exit $RC"; diag "$ERR"; }

# 8. Ranks not written (split --ranks): one line naming them, exit 3 as check's.
rm -rf "$T/part"
run tps split "$CONF/llama-tp3/model" --tp 3 --ranks 0,2 -o "$T/part" -q
if [ "$RC" = 0 ]; then
  for src in with without; do
    if [ $src = with ]; then run tps verify "$T/part" --source "$CONF/llama-tp3/model"
    else run tps verify "$T/part"; fi
    if [ "$RC" = 3 ] && [ "$(wc -l <"$ERR")" = 1 ] && [ ! -s "$OUT" ] &&
       grep -q "^tpshard: error: $T/part: partial: rank 1 is not written here yet" "$ERR"; then
      ok "a directory missing rank 1: verify ($src --source) says so in one line, exit 3"
    else notok "verify of a partial directory ($src --source): exit $RC"; diag "$ERR"; diag "$OUT"; fi
  done
  run tps verify "$T/part" --json
  [ "$RC" = 3 ] && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"] is False and "partial: rank 1 " in d["error"], d' "$OUT" &&
    ok "verify --json of a partial directory: the error document, exit 3" || { notok "partial --json: exit $RC"; diag "$OUT"; }
  run tps split "$CONF/llama-tp3/model" --tp 3 --ranks 1 -o "$T/part" -q
  expect_exit 0 "once --ranks 1 joins, verify passes" -- tps verify "$T/part" --source "$CONF/llama-tp3/model"
else notok "split --ranks 0,2"; diag "$ERR"; fi

# 9. --tensors, the source missing a tensor, usage.
run tps verify "$L" --source "$CONF/llama-tp3/model" --tensors '*layers.1.mlp*' -v
if [ "$RC" = 0 ] && grep -q 'model.layers.1.mlp ' "$OUT" && ! grep -q 'layers.0' "$OUT" &&
   ! grep -q 'self_attn' "$OUT"; then ok "--tensors GLOB limits the checks (and keeps the block)"
else notok "--tensors"; diag "$OUT"; fi
run tps verify "$L" --tensors 'nothing*'
[ "$RC" = 1 ] && ok "--tensors matching nothing is an error" || notok "--tensors nothing: exit $RC"
run tps verify "$L" --source "$CONF/llama-tp4-uneven-vocab/model"
[ "$RC" = 1 ] && grep -q "is not the checkpoint $L was split from" "$ERR" && [ ! -s "$OUT" ] &&
  ok "the wrong source fails first, as not the checkpoint split" ||
  { notok "wrong source: exit $RC"; diag "$OUT"; diag "$ERR"; }
run tps verify "$CONF/llama-tp3/model"
[ "$RC" = 1 ] && grep -qi 'not a tpshard output' "$ERR" && ok "a plain checkpoint is not a shard directory" ||
  { notok "verify MODEL: exit $RC"; diag "$ERR"; }
run tps verify "$L" --bogus
[ "$RC" = 2 ] && ok "verify: a bad option is a usage error (exit 2)" || notok "bad option: exit $RC"
run tps verify "$L" --backend tpu
[ "$RC" = 2 ] && ok "verify: an unknown backend is a usage error" || notok "bad backend: exit $RC"
run tps verify "$L" --batch 0
[ "$RC" = 2 ] && ok "verify: --batch 0 is a usage error" || notok "--batch 0: exit $RC"
run tps verify -h
if [ "$RC" = 0 ] && [ "$(head -n 1 "$OUT")" = "usage: tpshard verify DIR [--source MODEL] [--backend cpu|cuda|nccl] [--tensors GLOB] [--seed N] [--batch N] [--tensors-per-pass N] [--nccl-id-file PATH] [--threads N] [--json]" ]; then
  ok "verify -h prints the synopsis on stdout"
else notok "verify -h"; diag "$OUT"; fi
if tps --version 2>/dev/null | grep -q '^backends: cpu$'; then
  for b in cuda nccl; do
    run tps verify "$L" --backend $b
    [ "$RC" = 1 ] && grep -q 'make CUDA=1' "$ERR" &&
      ok "--backend $b without CUDA says how to build it" || { notok "--backend $b: exit $RC"; diag "$ERR"; }
  done
fi

# Many layers: more blocks than the first allocation held (a crash once).
gen llama "$T/deep" --layers 20 --hidden 32 --heads 4 --kv-heads 4 --inter 40 --vocab 50 >/dev/null
if tps split "$T/deep" --tp 2 -o "$T/deep2" -q 2>"$ERR"; then
  expect_exit 0 "verify a 20-layer model (40 blocks)" -- tps verify "$T/deep2" --source "$T/deep"
  expect_stdout_has "verify: PASS" "20-layer model passes"
else
  notok "split a 20-layer model"; diag "$ERR"
fi

finish
