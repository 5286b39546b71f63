#!/bin/sh
# bench/gpt_oss.sh [SIZE] - gpt-oss MXFP4 checkpoints (bench/gen_gpt_oss.py);
# BF16=1: BF16 experts instead (the vLLM layout transposes each expert's slice).
#
# 1. A SIZE (default 1G) MXFP4 checkpoint at tp 4, side by side with cp of its
#    model.safetensors, PAIRS (default 6) alternated rounds, the order rotating:
#      tpshard split M --tp 4 --layout LAYOUT -o OUT --force -q
#      tpshard split M --tp 4 --ranks 0 ...   (one rank: about the bytes cp moves)
#      cp M/model.safetensors COPY
#    medians and bests, ratios to cp, bytes written. LAYOUT defaults to vllm,
#    the issue's bar (0.85x cp); when the layout refuses the checkpoint, the
#    refusal is printed and the dtensor layout is measured instead.
# 2. Peak RSS (/usr/bin/time -v, max of 3 runs; gen_llama --measure beside it)
#    of split --tp 4 and --tp 8 of a gpt-oss-120b-shaped checkpoint: 36
#    layers, 128 experts, tiny dims (bar 64 MiB).
# Benchmarks only print: the exit status says whether the runs worked, not
# whether a bar was met.
#
# Environment: BENCH_DIR (default /dev/shm/tpshard-bench), PAIRS (6), LAYOUT
# (vllm), BF16 (unset), PYTHON (python3), TPSHARD, KEEP.
. "$(dirname "$0")/common.sh"

PAIRS=${PAIRS:-6}
LAYOUT=${LAYOUT:-vllm}
PYTHON=${PYTHON:-python3}
SIZE=${1:-1G}
TP=4
if [ -n "${BF16:-}" ]; then FMT=BF16; GENOPT=--bf16; else FMT=MXFP4; GENOPT=; fi

bench_setup
say "# gpt-oss $FMT: tpshard split --tp $TP vs cp, peak RSS of a 120b-shaped checkpoint"
say "machine: $(machine_line)"
load_line "at start"
say ""

gen() { # DIR [gen_gpt_oss options]
	_d=$1; shift
	GEN_BYTES=$("$PYTHON" "$BENCH_SRC/gen_gpt_oss.py" "$_d" "$@" 2>"$RUN/gen.log") ||
		{ cat "$RUN/gen.log" >&2; die "gen_gpt_oss.py failed"; }
	sed 's/^gen_gpt_oss: /  generated /' "$RUN/gen.log"
}

# ---------------------------------------------------------------- 1. speed
M=$RUN/model
OUT=$RUN/out
COPY=$RUN/copy.safetensors
want=$(size_bytes "$SIZE")
have_room $((want * 6)) || die "not enough room in $BENCH_DIR for a $SIZE model and a tp $TP output"
say "## $SIZE $FMT checkpoint, tp $TP"
gen "$M" --size "$SIZE" $GENOPT
BYTES=$GEN_BYTES
SRC=$M/model.safetensors
warm "$SRC"
if ! "$TPSHARD" split "$M" --tp "$TP" --layout "$LAYOUT" -o "$OUT" --dry-run -q >"$RUN/dry.log" 2>&1; then
	say "  --layout $LAYOUT refuses: $(grep -m1 '^tpshard: error' "$RUN/dry.log" | sed 's/.*rejects tp [0-9]*: //' | cut -c1-300)"
	say "  (measuring --layout dtensor instead: transformers' plan replicates the experts, so"
	say "  every rank holds nearly the whole checkpoint; --ranks 0 moves about what cp moves)"
	LAYOUT=dtensor
fi
split_all() { measure split "$TPSHARD" split "$M" --tp "$TP" --layout "$LAYOUT" -o "$OUT" --force -q; }
split_one() { measure rank0 "$TPSHARD" split "$M" --tp "$TP" --layout "$LAYOUT" --ranks 0 -o "$OUT" --force -q; }
split_all; rm -rf "$OUT"; measure warmup-cp cp "$SRC" "$COPY"; rm -f "$COPY"
: >"$RUN/t-split"; : >"$RUN/t-rank0"; : >"$RUN/t-cp"
i=1
while [ "$i" -le "$PAIRS" ]; do
	case $((i % 3)) in
	1) order="split rank0 cp" ;;
	2) order="cp split rank0" ;;
	0) order="rank0 cp split" ;;
	esac
	line="  round $i:"
	for what in $order; do
		case $what in
		split) split_all; echo "$M_wall_s" >>"$RUN/t-split"
			OBYTES=$(cat "$OUT"/model-rank-*.safetensors | wc -c); rm -rf "$OUT" ;;
		rank0) split_one; echo "$M_wall_s" >>"$RUN/t-rank0"
			RBYTES=$(cat "$OUT"/model-rank-*.safetensors | wc -c); rm -rf "$OUT" ;;
		cp) measure cp cp "$SRC" "$COPY"; echo "$M_wall_s" >>"$RUN/t-cp"; rm -f "$COPY" ;;
		esac
		line="$line $what $(fmt "$M_wall_s" 3)s"
	done
	say "$line"
	i=$((i + 1))
done
cm=$(median "$RUN/t-cp"); cb=$(best "$RUN/t-cp")
sm=$(median "$RUN/t-split"); sb=$(best "$RUN/t-split")
rm0=$(median "$RUN/t-rank0"); rb0=$(best "$RUN/t-rank0")
say "  input:          $BYTES bytes ($(gib "$BYTES") GiB)"
say "  cp:             median $(fmt "$cm" 3) s, best $(fmt "$cb" 3) s"
say "  split (layout $LAYOUT, tp $TP, all ranks): median $(fmt "$sm" 3) s, best $(fmt "$sb" 3) s;" \
	"$(calc "$sm / $cm")x cp (median), $(calc "$sb / $cb")x (best); wrote $(gib "$OBYTES") GiB" \
	"($(calc "$OBYTES / $BYTES")x the input)"
say "  split --ranks 0: median $(fmt "$rm0" 3) s, best $(fmt "$rb0" 3) s;" \
	"$(calc "$rm0 / $cm")x cp (median), $(calc "$rb0 / $cb")x (best); wrote $(gib "$RBYTES") GiB" \
	"(bar 0.85x cp: $(bar "$(calc "$rm0 / $cm")" 0.85))"
say ""
rm -rf "$M"

# ---------------------------------------------------------------- 2. RSS
M=$RUN/model-120b-shape
say "## peak RSS: gpt-oss-120b-shaped (36 layers, 128 experts, hidden 64, intermediate 64, $FMT)"
gen "$M" --layers 36 --experts 128 --hidden 64 --inter 64 --vocab 2048 --heads 8 --kv-heads 8 --head-dim 8 $GENOPT
warm "$M/model.safetensors"
for lay in dtensor $LAYOUT; do
	[ "$lay" = dtensor ] || "$TPSHARD" split "$M" --tp 4 --layout "$lay" -o "$OUT" --dry-run -q \
		>/dev/null 2>&1 || continue
	for tp in 4 8; do
		: >"$RUN/rss"
		for i in 1 2 3; do
			measure rss "$TPSHARD" split "$M" --tp "$tp" --layout "$lay" -o "$OUT" --force -q
			echo "$M_maxrss_kib" >>"$RUN/rss"
			rm -rf "$OUT"
		done
		trss=$(time_rss "$TPSHARD" split "$M" --tp "$tp" --layout "$lay" -o "$OUT" --force -q)
		rm -rf "$OUT"
		r=$(maxof "$RUN/rss")
		say "  tp $tp ($lay): peak RSS $(mib "$r") MiB (max of 3; /usr/bin/time: $trss KiB)," \
			"input $(gib "$GEN_BYTES") GiB (bar 64 MiB: $(bar "$(mib "$r")" 64))"
	done
done
if ! "$TPSHARD" split "$M" --tp 4 --layout vllm -o "$OUT" --dry-run -q >"$RUN/dry.log" 2>&1; then
	say "  --layout vllm: refused ($(grep -m1 -o 'gpt-oss in vLLM[^:]*' "$RUN/dry.log"))"
fi
load_line "at end"
