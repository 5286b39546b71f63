#!/bin/sh
# bench/deepseek.sh - the scale of a DeepSeek-V3-shaped checkpoint (issue 27's item 5):
# bench/gen_deepseek.py's 61 layers (3 dense), 256 routed experts and one shared in each
# MoE layer, an MTP layer, block FP8 16 x 16, tiny dims (92k source tensors, 1.4 GiB, in
# 8 parts with an index). For each layout (LAYOUTS, default "vllm sglang dtensor") at
# tp 8: wall time and peak RSS (gen_llama --measure: ru_maxrss, max of ROUNDS runs) of
#   tpshard plan M --tp 8 --layout L          (bar: under 10 s)
#   tpshard split M --tp 8 --layout L -o OUT  (bar: 64 MiB)
#   tpshard check OUT                         (bar: 128 MiB)
#   tpshard verify OUT --source M             (bar: 128 MiB)
#   tpshard merge OUT -o MERGED               (bar: 128 MiB; the merged parts compared
#                                              with the source's, the MTP layer aside)
# and the rank tensors each split wrote. Benchmarks only print: the exit status says
# whether the runs worked, not whether a bar was met.
#
# Environment: BENCH_DIR (default /dev/shm/tpshard-bench; about 3 GiB at a time: the
# model, one split, one merge), LAYOUTS, ROUNDS (1), TP (8), PYTHON (python3), GEN_OPTS
# (extra bench/gen_deepseek.py options, e.g. "--layers 20"), TPSHARD, KEEP.
. "$(dirname "$0")/common.sh"

LAYOUTS=${LAYOUTS:-vllm sglang dtensor}
ROUNDS=${ROUNDS:-1}
TP=${TP:-8}
PYTHON=${PYTHON:-python3}

bench_setup
say "# DeepSeek-V3-shaped checkpoint at tp $TP: time and peak RSS of plan, split, check, verify, merge"
say "machine: $(machine_line)"
load_line "at start"
M=$RUN/model OUT=$RUN/out MERGED=$RUN/merged
# shellcheck disable=SC2086 # GEN_OPTS is a list of options
set -- $("$PYTHON" "$BENCH_SRC/gen_deepseek.py" "$M" ${GEN_OPTS:-}) ||
	die "bench/gen_deepseek.py failed"
say "model: $1 tensors, $(gib "$2") GiB of tensor data in $(ls "$M"/*.safetensors | wc -l) parts" \
	"(bench/gen_deepseek.py ${GEN_OPTS:-defaults})"
warm "$M"/*.safetensors
say ""
say "| layout | command | time s | peak RSS MiB | bar |"
say "|---|---|---|---|---|"

# row LAYOUT LABEL BAR_KIND BAR CMD...: ROUNDS runs of CMD (the output removed before each
# split and merge), the slowest time and the largest RSS
row() {
	_lay=$1 _lab=$2 _kind=$3 _lim=$4
	shift 4
	_t=0 _r=0
	for _i in $(seq "$ROUNDS"); do
		case $_lab in split) rm -rf "$OUT" ;; merge) rm -rf "$MERGED" ;; esac
		measure "$_lay-$_lab" "$@"
		_t=$(awk -v a="$_t" -v b="$M_wall_s" 'BEGIN { print (b > a) ? b : a }')
		_r=$(awk -v a="$_r" -v b="$M_maxrss_kib" 'BEGIN { print (b > a) ? b : a }')
	done
	if [ "$_kind" = time ]; then _v=$_t _u="$_lim s"; else _v=$(mib "$_r") _u="$_lim MiB"; fi
	say "| $_lay | $_lab | $(calc "$_t") | $(mib "$_r") | $_u: $(bar "$_v" "$_lim") |"
}

for lay in $LAYOUTS; do
	row "$lay" plan time 10 "$TPSHARD" plan "$M" --tp "$TP" --layout "$lay"
	row "$lay" split rss 64 "$TPSHARD" split "$M" --tp "$TP" --layout "$lay" -o "$OUT" -q
	row "$lay" check rss 128 "$TPSHARD" check "$OUT"
	row "$lay" verify rss 128 "$TPSHARD" verify "$OUT" --source "$M"
	row "$lay" merge rss 128 "$TPSHARD" merge "$OUT" -o "$MERGED" -q
	# every part merge gives back is the source's, byte for byte, but the one holding the
	# MTP layer in a serving layout (the engines drop it; the manifest lists it)
	_same=0 _diff=
	for f in "$M"/*.safetensors; do
		if cmp -s "$f" "$MERGED/$(basename "$f")"; then _same=$((_same + 1)); else _diff="$_diff $(basename "$f")"; fi
	done
	_nrt=$("$PYTHON" -c 'import json, sys; m = json.load(open(sys.argv[1]))
print(sum(len(t.get("ranks", [])) for t in m["tensors"]), len(m.get("rank_tensors", [])),
      len(m.get("dropped", [])))' "$OUT/tpshard.json")
	say "|  $lay | (tensor-rank entries, rank_tensors, dropped: $_nrt; merged parts identical: $_same${_diff:+, differ:$_diff}) | | | |"
	rm -rf "$OUT" "$MERGED"
done
load_line "at end"
