#!/bin/sh
# bench/split.sh [SIZES...] - tpshard split --tp 8 side by side with cp.
#
# For each size (default "1G 4G 8G"): generate a synthetic Llama-shaped bf16
# checkpoint (bench/gen_llama.c, one file), read it once (warm-up), then
# PAIRS rounds (default 6) of three alternated runs, the order rotating each
# round:   tpshard split M --tp 8 -o OUT --force -q
#          cp M/model.safetensors COPY
#          tpshard split M --tp 8 -o OUT --force -q --threads 1
# Outputs are removed between runs, outside the timed region.  Then
# `--ranks 3` alone (time, bytes read).  Peak RSS is also taken at RSS_SMALL
# (default 256M) to show it is flat in model size.  Prints best-of and
# median times, ratios to cp, throughput, peak RSS, and a markdown table.
# Benchmarks only print: the exit status says whether the runs worked, not
# whether a bar was met.
#
# Environment: BENCH_DIR (default /dev/shm/tpshard-bench), PAIRS (6),
# TP (8), RANK (3), RSS_SMALL (256M; empty to skip), WARMUP (1: one untimed
# split and cp first), LAYOUT (dtensor; vllm or sglang: every split writes
# that layout), SPLIT_OPTS (more split options, e.g. --ep), TPSHARD, KEEP,
# GEN_OPTS (gen_llama options: --fp8, --experts E; see bench/common.sh).
. "$(dirname "$0")/common.sh"

PAIRS=${PAIRS:-6}
TP=${TP:-8}
RANK=${RANK:-3}
RSS_SMALL=${RSS_SMALL-256M}
WARMUP=${WARMUP:-1}
LAYOUT=${LAYOUT:-dtensor}
SIZES=${*:-1G 4G 8G}

bench_setup
MACHINE=$(machine_line)
say "# tpshard split --tp $TP --layout $LAYOUT vs cp"
say "machine: $MACHINE"
load_line "at start"
say "pairs: $PAIRS (best of $PAIRS alternated runs per side, medians too)"
say ""

TABLE=$RUN/table.md
RANKTAB=$RUN/ranks.md
: >"$TABLE"
: >"$RANKTAB"
RSS_SMALL_KIB=
RSS_SMALL_BYTES=
RSS_BIG_KIB=
RSS_BIG_BYTES=
RSS_BIG_SIZE=

# cores: CPU seconds (user + sys) / wall seconds of the last measured run
cores() { calc "($M_user_s + $M_sys_s) / $M_wall_s"; echo; }

run_split() { # LABEL OUTDIR [extra split options]
	_l=$1; _o=$2; shift 2
	# shellcheck disable=SC2086  # SPLIT_OPTS is a list of options
	measure "$_l" "$TPSHARD" split "$M" --tp "$TP" --layout "$LAYOUT" ${SPLIT_OPTS:-} -o "$_o" --force -q "$@"
}

# ---------------------------------------------------------------- flat RSS
if [ -n "$RSS_SMALL" ]; then
	M=$RUN/model-$RSS_SMALL
	say "## peak RSS at $RSS_SMALL"
	gen_model "$RSS_SMALL" "$M"; RSS_SMALL_BYTES=$GEN_BYTES
	warm "$M/model.safetensors"
	: >"$RUN/rss-small"
	for i in 1 2 3; do
		run_split split-small "$RUN/out"
		echo "$M_maxrss_kib" >>"$RUN/rss-small"
		rm -rf "$RUN/out"
	done
	RSS_SMALL_KIB=$(maxof "$RUN/rss-small")
	say "split peak RSS: $(mib "$RSS_SMALL_KIB") MiB (max of 3 runs), input $(gib "$RSS_SMALL_BYTES") GiB"
	say ""
	rm -rf "$M"
fi

# ---------------------------------------------------------------- sizes
for S in $SIZES; do
	M=$RUN/model-$S
	OUT=$RUN/out
	COPY=$RUN/copy.safetensors
	want=$(size_bytes "$S")
	say "## $S"
	if ! have_room $((want * 2 + want / 10)); then
		say "skipped: not enough room in $BENCH_DIR (memory or disk) for a $S model plus one output"
		say ""
		continue
	fi
	gen_model "$S" "$M"; BYTES=$GEN_BYTES
	SRC=$M/model.safetensors
	warm "$SRC"
	if [ "$WARMUP" = 1 ]; then
		run_split warmup-split "$OUT"; rm -rf "$OUT"
		measure warmup-cp cp "$SRC" "$COPY"; rm -f "$COPY"
	fi
	: >"$RUN/t-split"; : >"$RUN/t-cp"; : >"$RUN/t-t1"; : >"$RUN/rss-split"; : >"$RUN/rss-t1"
	: >"$RUN/cores-split"; : >"$RUN/cores-t1"; : >"$RUN/cores-cp"
	i=1
	while [ "$i" -le "$PAIRS" ]; do
		case $((i % 3)) in
		1) order="split cp t1" ;;
		2) order="cp t1 split" ;;
		0) order="t1 split cp" ;;
		esac
		line="  round $i:"
		for what in $order; do
			case $what in
			split)
				run_split split "$OUT"
				echo "$M_wall_s" >>"$RUN/t-split"; echo "$M_maxrss_kib" >>"$RUN/rss-split"
				cores >>"$RUN/cores-split"
				rm -rf "$OUT" ;;
			t1)
				run_split split-t1 "$OUT" --threads 1
				echo "$M_wall_s" >>"$RUN/t-t1"; echo "$M_maxrss_kib" >>"$RUN/rss-t1"
				cores >>"$RUN/cores-t1"
				rm -rf "$OUT" ;;
			cp)
				measure cp cp "$SRC" "$COPY"
				echo "$M_wall_s" >>"$RUN/t-cp"
				cores >>"$RUN/cores-cp"
				rm -f "$COPY" ;;
			esac
			line="$line $what $(fmt "$M_wall_s" 3)s"
		done
		say "$line"
		i=$((i + 1))
	done
	sb=$(best "$RUN/t-split"); sm=$(median "$RUN/t-split")
	cb=$(best "$RUN/t-cp"); cm=$(median "$RUN/t-cp")
	tb=$(best "$RUN/t-t1"); tm=$(median "$RUN/t-t1")
	rss=$(maxof "$RUN/rss-split")
	rss1=$(maxof "$RUN/rss-t1")
	r_best=$(calc "$sb / $cb"); r_med=$(calc "$sm / $cm")
	t_best=$(calc "$tb / $cb"); t_med=$(calc "$tm / $cm")
	gbs=$(calc "$BYTES / 1e9 / $sb"); cgbs=$(calc "$BYTES / 1e9 / $cb")
	# shellcheck disable=SC2086
	trss=$(time_rss "$TPSHARD" split "$M" --tp "$TP" --layout "$LAYOUT" ${SPLIT_OPTS:-} -o "$OUT" --force -q)
	OBYTES=$(cat "$OUT"/model-rank-*.safetensors 2>/dev/null | wc -c); rm -rf "$OUT"
	say "  input:            $BYTES bytes ($(gib "$BYTES") GiB)"
	say "  output:           $OBYTES bytes in the rank files ($(fmt "$(calc "$OBYTES / $BYTES")" 2)x the input)"
	say "  cp:               best $(fmt "$cb" 3) s, median $(fmt "$cm" 3) s ($(fmt "$cgbs" 2) GB/s), CPU/wall median $(fmt "$(median "$RUN/cores-cp")" 2)"
	say "  split:            best $(fmt "$sb" 3) s, median $(fmt "$sm" 3) s ($(fmt "$gbs" 2) GB/s), CPU/wall median $(fmt "$(median "$RUN/cores-split")" 2), --threads 1 $(fmt "$(median "$RUN/cores-t1")" 2)"
	say "  split/cp:         best $(fmt "$r_best" 3)x, median $(fmt "$r_med" 3)x   (bar <= 0.85x best: $(bar "$r_best" 0.85))"
	# A plan that replicates a big tensor (Qwen3-MoE's embed_tokens in
	# transformers' plan) writes more than cp does: the bar is set for
	# output = input, so say the ratio per byte written too.
	if awk "BEGIN { exit !($OBYTES > $BYTES * 1.05) }"; then
		say "  split/cp per byte: best $(fmt "$(calc "$r_best * $BYTES / $OBYTES")" 3)x, median $(fmt "$(calc "$r_med * $BYTES / $OBYTES")" 3)x (time per byte written over cp's per byte copied; the bar is for output = input)"
	fi
	say "  split --threads 1: best $(fmt "$tb" 3) s, median $(fmt "$tm" 3) s; /cp best $(fmt "$t_best" 3)x, median $(fmt "$t_med" 3)x   (bar <= 1.2x best: $(bar "$t_best" 1.2))"
	say "  peak RSS:         split $(mib "$rss") MiB, --threads 1 $(mib "$rss1") MiB, /usr/bin/time %M: $( [ "$trss" = n/a ] && echo n/a || echo "$(mib "$trss") MiB")   (bar <= 64 MiB: $(bar "$(mib "$rss")" 64))"
	printf '| %s GiB | %s (%s) | %s (%s) | %sx (%sx) | %s | %s (%s) | %sx (%sx) | %s |\n' \
		"$(gib "$BYTES")" "$(fmt "$cb" 3)" "$(fmt "$cm" 3)" "$(fmt "$sb" 3)" "$(fmt "$sm" 3)" \
		"$(fmt "$r_best" 2)" "$(fmt "$r_med" 2)" "$(fmt "$gbs" 2)" "$(fmt "$tb" 3)" "$(fmt "$tm" 3)" \
		"$(fmt "$t_best" 2)" "$(fmt "$t_med" 2)" "$(mib "$rss")" >>"$TABLE"
	RSS_BIG_KIB=$rss; RSS_BIG_BYTES=$BYTES; RSS_BIG_SIZE=$S

	# --ranks RANK alone: time, then bytes read. rchar counts read(2),
	# pread(2) and copy_file_range(2) bytes but not pages read through a
	# mapping, which is how split reads by default; so the bytes are counted
	# on one more run with --no-mmap, which reads the same ranges with pread.
	: >"$RUN/t-rank"
	for i in 1 2 3; do
		run_split split-rank "$OUT" --ranks "$RANK"
		echo "$M_wall_s" >>"$RUN/t-rank"
		rm -rf "$OUT"
	done
	run_split split-rank-pread "$OUT" --ranks "$RANK" --no-mmap
	kb=$(best "$RUN/t-rank")
	rbytes=$(cat "$OUT"/model-rank-"$RANK"-part-*.safetensors 2>/dev/null | wc -c)
	rm -rf "$OUT"
	if [ "$M_rchar" -ge 0 ] 2>/dev/null && [ "$rbytes" -gt 0 ]; then
		rr=$(fmt "$(calc "$M_rchar / $rbytes")" 2)x
		rread="$M_rchar bytes ($rr rank $RANK's output, $(fmt "$(calc "100 * $M_rchar / $BYTES")" 1)% of the input)"
	else
		rread="n/a (no /proc/PID/io or no rank file)"; rr=n/a
	fi
	say "  --ranks $RANK:        best $(fmt "$kb" 3) s of 3, rank $RANK output $rbytes bytes, read $rread, peak RSS $(mib "$M_maxrss_kib") MiB"
	printf '| %s GiB | %s | %s | %s | %s | %s |\n' "$(gib "$BYTES")" "$(fmt "$kb" 3)" "$rbytes" \
		"$( [ "$rr" = n/a ] && echo n/a || echo "$M_rchar")" "$rr" "$(fmt "$(calc "100 * $rbytes / $BYTES")" 1)%" >>"$RANKTAB"
	rm -rf "$M"
	say ""
done

# ---------------------------------------------------------------- summary
load_line "at end"
say ""
say "## Summary (markdown)"
say ""
say "Machine: $MACHINE."
say "Synthetic Llama-shaped bf16 checkpoints (bench/gen_llama.c: hidden 2048, 32 heads / 8 KV heads,"
say "intermediate 5632, vocab 32000), one file, in tmpfs; \`tpshard split M --tp $TP -o OUT --force -q\`"
say "alternated with \`cp M/model.safetensors COPY\`, $PAIRS rounds; best of $PAIRS (median in parentheses)."
say ""
say "| input | cp s | split s | split/cp | split GB/s | --threads 1 s | --threads 1 / cp | peak RSS MiB |"
say "|---|---|---|---|---|---|---|---|"
cat "$TABLE"
say ""
say "Bars: split/cp <= 0.85x (best), --threads 1 / cp <= 1.2x (best), peak RSS <= 64 MiB."
if [ -n "$RSS_SMALL_KIB" ] && [ -n "$RSS_BIG_KIB" ]; then
	d=$(calc "($RSS_BIG_KIB - $RSS_SMALL_KIB) / 1024")
	say ""
	say "Peak RSS flat in model size: $(mib "$RSS_SMALL_KIB") MiB at $(gib "$RSS_SMALL_BYTES") GiB ($RSS_SMALL) vs $(mib "$RSS_BIG_KIB") MiB at $(gib "$RSS_BIG_BYTES") GiB ($RSS_BIG_SIZE): $(sfmt "$d" 1) MiB (bar: <= +16 MiB: $(bar "$d" 16))."
fi
if [ -s "$RANKTAB" ]; then
	say ""
	say "\`--ranks $RANK\` alone (best of 3); bytes read = rchar from /proc/PID/io of a run with --no-mmap (pread instead of mappings, the same ranges):"
	say ""
	say "| input | time s | rank $RANK bytes | bytes read | read / rank bytes | rank bytes / input |"
	say "|---|---|---|---|---|---|"
	cat "$RANKTAB"
fi
