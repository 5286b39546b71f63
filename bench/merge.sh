#!/bin/sh
# bench/merge.sh [SIZE] - tpshard merge side by side with cp.
#
# Generates a synthetic Llama-shaped bf16 checkpoint of SIZE (default 1G),
# splits it once (--tp 8), checks that merge(split(x)) == x byte for byte,
# then PAIRS rounds (default 6) alternating, the order swapping every round:
#     tpshard merge OUT -o MERGED --force             (MERGED removed after)
#     cp M/model.safetensors COPY                      (COPY removed after)
# and prints best-of and median times, the ratio merge/cp, throughput and
# merge's peak RSS.  Benchmarks only print; no bar is set for merge.
# Environment: BENCH_DIR, PAIRS (6), TP (8), TPSHARD, KEEP (bench/common.sh).
. "$(dirname "$0")/common.sh"

PAIRS=${PAIRS:-6}
TP=${TP:-8}
S=${1:-1G}

prepare_model merge "$S" "# tpshard merge (tp $TP) vs cp"
SRC=$M/model.safetensors
OUT=$RUN/out
MERGED=$RUN/merged
COPY=$RUN/copy.safetensors
measure split "$TPSHARD" split "$M" --tp "$TP" -o "$OUT" --force -q
warm "$OUT"/*.safetensors

# merge(split(x)) == x ?  (MERGED may be a directory or a file)
measure merge-check "$TPSHARD" merge "$OUT" -o "$MERGED" --force
if [ -d "$MERGED" ]; then
	mf=$(find "$MERGED" -name "*.safetensors" | sort | head -n 1)
	nf=$(find "$MERGED" -name "*.safetensors" | wc -l)
else
	mf=$MERGED; nf=1
fi
if [ "$nf" = 1 ] && [ -n "$mf" ] && cmp -s "$mf" "$SRC"; then
	same="yes (byte for byte)"
else
	same="NO ($nf file(s); first: ${mf:-none})"
fi
rm -rf "$MERGED"
say "  merge(split(x)) == x: $same"

: >"$RUN/t-merge"; : >"$RUN/t-cp"; : >"$RUN/rss-merge"
i=1
while [ "$i" -le "$PAIRS" ]; do
	if [ $((i % 2)) = 1 ]; then order="merge cp"; else order="cp merge"; fi
	line="  round $i:"
	for what in $order; do
		if [ "$what" = merge ]; then
			measure merge "$TPSHARD" merge "$OUT" -o "$MERGED" --force
			echo "$M_wall_s" >>"$RUN/t-merge"; echo "$M_maxrss_kib" >>"$RUN/rss-merge"
			rm -rf "$MERGED"
		else
			measure cp cp "$SRC" "$COPY"
			echo "$M_wall_s" >>"$RUN/t-cp"
			rm -f "$COPY"
		fi
		line="$line $what $(fmt "$M_wall_s" 3)s"
	done
	say "$line"
	i=$((i + 1))
done
mb=$(best "$RUN/t-merge"); mm=$(median "$RUN/t-merge")
cb=$(best "$RUN/t-cp"); cm=$(median "$RUN/t-cp")
rb=$(calc "$mb / $cb"); rmed=$(calc "$mm / $cm")
rss=$(maxof "$RUN/rss-merge")
gbs=$(calc "$BYTES / 1e9 / $mb")
say "  input:    $BYTES bytes ($(gib "$BYTES") GiB)"
say "  cp:       best $(fmt "$cb" 3) s, median $(fmt "$cm" 3) s"
say "  merge:    best $(fmt "$mb" 3) s, median $(fmt "$mm" 3) s ($(fmt "$gbs" 2) GB/s), peak RSS $(mib "$rss") MiB"
say "  merge/cp: best $(fmt "$rb" 2)x, median $(fmt "$rmed" 2)x"
load_line "at end"
say ""
say "| input | cp s | merge s | merge/cp | merge GB/s | merge peak RSS MiB | merge(split(x)) == x |"
say "|---|---|---|---|---|---|---|"
printf '| %s GiB | %s (%s) | %s (%s) | %sx (%sx) | %s | %s | %s |\n' "$(gib "$BYTES")" "$(fmt "$cb" 3)" "$(fmt "$cm" 3)" \
	"$(fmt "$mb" 3)" "$(fmt "$mm" 3)" "$(fmt "$rb" 2)" "$(fmt "$rmed" 2)" "$(fmt "$gbs" 2)" "$(mib "$rss")" "$same"
say ""
say "Best of $PAIRS alternated runs (median in parentheses); tp $TP; machine: $MACHINE."
