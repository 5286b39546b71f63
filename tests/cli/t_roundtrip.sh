#!/bin/sh
# Nothing lost: merge(split(x)) == x byte for byte for every dtype, tp 1..9,
# uneven and empty shards, parts, single and indexed inputs; and resharding
# through a shard directory equals splitting the source: split(split(x,8),4)
# == split(x,4), rank file for rank file.
. "$TOP/tests/cli/lib.sh"

# The llama rules without the head-count checks, so every tp is accepted.
sed '/^checks:/,$d' "$TOP/plans/llama.yaml" > "$T/nocheck.yaml"
gen llama "$T/single" --all-dtypes --hidden 20 --inter 13 --vocab 11 --seed 1 >/dev/null
gen llama "$T/indexed" --all-dtypes --hidden 20 --inter 13 --vocab 11 --seed 2 --index 3 >/dev/null

same_files() { # a b: every .safetensors and the index of a equal in b
  for f in "$1"/*.safetensors; do cmp -s "$f" "$2/$(basename "$f")" || return 1; done
  [ ! -f "$1/model.safetensors.index.json" ] || [ -f "$2/model.safetensors.index.json" ]
}

for src in single indexed; do
  bad=""
  for tp in 1 2 3 4 5 6 7 8 9; do
    rm -rf "$T/s" "$T/m"
    if ! tps split "$T/$src" --tp $tp --plan "$T/nocheck.yaml" -o "$T/s" -q >"$OUT" 2>"$ERR" ||
       ! tps check "$T/s" -q >>"$OUT" 2>>"$ERR" ||
       ! tps merge "$T/s" -o "$T/m" -q >>"$OUT" 2>>"$ERR" || ! same_files "$T/$src" "$T/m"; then
      bad="$bad $tp"; diag "$ERR"
    fi
  done
  [ -z "$bad" ] && ok "merge(split(x)) == x for every dtype, $src input, tp 1..9" ||
    notok "merge(split(x)) != x for $src input at tp$bad"
done

# Parts: every rank cut into parts of at most 1 KiB of data.
rm -rf "$T/s" "$T/m"
tps split "$T/indexed" --tp 4 --plan "$T/nocheck.yaml" --max-part-size 1K -o "$T/s" -q 2>"$ERR" &&
  tps merge "$T/s" -o "$T/m" -q 2>>"$ERR" && same_files "$T/indexed" "$T/m" &&
  [ "$(ls "$T/s"/model-rank-0-part-*.safetensors | wc -l)" -gt 3 ] &&
  ok "merge(split(x)) == x with --max-part-size 1K (several parts per rank)" ||
  { notok "round trip with parts"; diag "$ERR"; }

# A reference-layout file (what save_file writes) comes back identical too,
# and so does one written in another order (the header is restored verbatim).
for case in llama-tp3 qwen2-tp2-bias-sharded-input gemma4-e-tp2; do
  m="$TOP/testdata/conformance/$case/model"
  tp=$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['tp'])" "$TOP/testdata/conformance/$case/case.json")
  rm -rf "$T/s" "$T/m"
  tps split "$m" --tp "$tp" -o "$T/s" -q 2>"$ERR" && tps merge "$T/s" -o "$T/m" -q 2>>"$ERR" &&
    same_files "$m" "$T/m" && cmp -s "$m/config.json" "$T/m/config.json" &&
    ok "merge(split($case)) == source, config copied" || { notok "round trip $case"; diag "$ERR"; }
done

# Sub-byte F4: shards that cut inside a byte are refused, naming the tensor;
# shards on byte boundaries round-trip.
gen llama "$T/f4bad" --dtype F4 --hidden 20 --heads 2 --kv-heads 2 --inter 14 --vocab 10 >/dev/null
expect_exit 1 "F4 shards that would cut a byte are refused" -- tps split "$T/f4bad" --tp 2 -o "$T/f4bad2"
expect_stderr_has "byte boundary" "the F4 refusal names the rule"
[ ! -e "$T/f4bad2" ] && ok "the refused F4 split wrote nothing" || notok "the refused F4 split wrote something"
gen llama "$T/f4" --dtype F4 --hidden 20 --heads 2 --kv-heads 2 --inter 12 --vocab 12 >/dev/null
rm -rf "$T/s" "$T/m"
tps split "$T/f4" --tp 2 -o "$T/s" -q 2>"$ERR" && tps merge "$T/s" -o "$T/m" -q 2>>"$ERR" &&
  same_files "$T/f4" "$T/m" && ok "F4 on byte boundaries: merge(split(x)) == x" || { notok "F4 round trip"; diag "$ERR"; }

# Reshard: split(split(x, 8), 4) == split(x, 4), file by file.
rm -rf "$T/s8" "$T/s4" "$T/s84"
gen llama "$T/big" --hidden 64 --heads 8 --kv-heads 8 --inter 96 --vocab 250 --seed 3 >/dev/null
if tps split "$T/big" --tp 8 -o "$T/s8" -q 2>"$ERR" && tps split "$T/big" --tp 4 -o "$T/s4" -q 2>>"$ERR" &&
   tps split "$T/s8" --tp 4 -o "$T/s84" -q 2>>"$ERR"; then
  d=0
  for f in "$T/s4"/model-rank-*.safetensors; do cmp -s "$f" "$T/s84/$(basename "$f")" || d=$((d + 1)); done
  [ $d = 0 ] && ok "split(split(x, 8), 4) == split(x, 4), rank files byte for byte" ||
    notok "reshard differs in $d rank files"
  rm -rf "$T/m"
  tps merge "$T/s84" -o "$T/m" -q && same_files "$T/big" "$T/m" &&
    ok "merge(split(split(x, 8), 4)) == x" || notok "merge after reshard differs"
else
  notok "reshard 8 -> 4 ran"; diag "$ERR"
fi
finish
