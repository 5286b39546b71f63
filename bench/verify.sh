#!/bin/sh
# bench/verify.sh [SIZE] - CPU verify side by side with the split it checks.
#
# Generates a synthetic Llama-shaped bf16 checkpoint of SIZE (default 1G),
# splits it once (kept as the directory to verify), then PAIRS rounds
# (default 3) alternating, the order swapping every round:
#     tpshard split M --tp 8 -o OUT2 --force -q          (OUT2 removed after)
#     tpshard verify OUT --source M --backend cpu
# and prints best-of and median times, the ratio verify/split (bar: <= 3x,
# best and median), verify's peak RSS and its verdict.  Benchmarks only
# print; the exit status is 1 only when a command fails (a verify mismatch
# included).
# Environment: BENCH_DIR, PAIRS (3), TP (8), TPSHARD, KEEP (bench/common.sh).
. "$(dirname "$0")/common.sh"

PAIRS=${PAIRS:-3}
TP=${TP:-8}
S=${1:-1G}

prepare_model verify "$S" "# tpshard verify --backend cpu vs split --tp $TP"
OUT=$RUN/out
OUT2=$RUN/out2
measure split-ref "$TPSHARD" split "$M" --tp "$TP" -o "$OUT" --force -q
: >"$RUN/t-split"; : >"$RUN/t-verify"; : >"$RUN/rss-verify"
i=1
while [ "$i" -le "$PAIRS" ]; do
	if [ $((i % 2)) = 1 ]; then order="split verify"; else order="verify split"; fi
	line="  round $i:"
	for what in $order; do
		if [ "$what" = split ]; then
			measure split "$TPSHARD" split "$M" --tp "$TP" -o "$OUT2" --force -q
			echo "$M_wall_s" >>"$RUN/t-split"
			rm -rf "$OUT2"
		else
			measure verify "$TPSHARD" verify "$OUT" --source "$M" --backend cpu
			echo "$M_wall_s" >>"$RUN/t-verify"; echo "$M_maxrss_kib" >>"$RUN/rss-verify"
		fi
		line="$line $what $(fmt "$M_wall_s" 3)s"
	done
	say "$line"
	i=$((i + 1))
done
sb=$(best "$RUN/t-split"); sm=$(median "$RUN/t-split")
vb=$(best "$RUN/t-verify"); vm=$(median "$RUN/t-verify")
rb=$(calc "$vb / $sb"); rm_=$(calc "$vm / $sm")
rss=$(maxof "$RUN/rss-verify")
say "  input:        $BYTES bytes ($(gib "$BYTES") GiB)"
say "  split:        best $(fmt "$sb" 3) s, median $(fmt "$sm" 3) s"
say "  verify (cpu): best $(fmt "$vb" 3) s, median $(fmt "$vm" 3) s, peak RSS $(mib "$rss") MiB"
say "  verify/split: best $(fmt "$rb" 2)x, median $(fmt "$rm_" 2)x   (bar <= 3x: $(bar "$rb" 3))"
say "  verify's last lines:"
tail -n 3 "$RUN/verify.log" | sed 's/^/    /'
load_line "at end"
say ""
say "| input | split s | verify --backend cpu s | verify/split | verify peak RSS MiB |"
say "|---|---|---|---|---|"
printf '| %s GiB | %s (%s) | %s (%s) | %sx (%sx) | %s |\n' "$(gib "$BYTES")" "$(fmt "$sb" 3)" "$(fmt "$sm" 3)" \
	"$(fmt "$vb" 3)" "$(fmt "$vm" 3)" "$(fmt "$rb" 2)" "$(fmt "$rm_" 2)" "$(mib "$rss")"
say ""
say "Best of $PAIRS alternated runs (median in parentheses); tp $TP; machine: $MACHINE. Bar: verify <= 3x split."
