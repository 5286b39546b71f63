#!/bin/sh
# bench/paths.sh [SIZE] - the read and copy paths of tpshard split against
# cp, side by side in one run, medians (best in parentheses):
#   1. a mixture of experts (gen_llama --experts 128 --moe-intermediate 128,
#      SIZE, default 1G), DTensor layout, tp 8: split vs cp -r of its rank
#      files (cp of as many bytes as the split writes: transformers' plan
#      keeps embed_tokens whole on every rank);
#   2. the Llama of SIZE: split (mapped) vs split --no-mmap vs cp, and the
#      same with --copy (every byte through tpshard);
#   3. with BIG set (e.g. 12G) and root: a checkpoint of BIG on a disk
#      (BIG_DIR, default ${TMPDIR:-/var/tmp}) split inside a memory cgroup
#      of CGROUP_MEM (default 2G), cold (page cache dropped before every
#      run), +sync, vs cp in the same cgroup, cold, +sync.
# PAIRS rounds (default 5), the order rotating. Environment: BENCH_DIR
# (tmpfs, for 1 and 2), PAIRS, TP (8), BIG, BIG_DIR, CGROUP_MEM, TPSHARD, KEEP.
. "$(dirname "$0")/common.sh"

PAIRS=${PAIRS:-5}
TP=${TP:-8}
S=${1:-1G}
BIG=${BIG:-}
BIG_DIR=${BIG_DIR:-${TMPDIR:-/var/tmp}}
CGROUP_MEM=${CGROUP_MEM:-2G}

bench_setup
MACHINE=$(machine_line)
say "# tpshard split (tp $TP): MoE vs cp of as many bytes, --no-mmap vs mapped${BIG:+, $BIG beyond a $CGROUP_MEM cgroup}"
say "machine: $MACHINE"
load_line "at start"

# rounds NAME:CMD...: PAIRS rounds of the named commands (each a shell
# string run with sh -c, its output removed before), order rotating; times
# in $RUN/t-NAME
rounds() {
	for c in "$@"; do : >"$RUN/t-${c%%:*}"; done
	i=1
	while [ "$i" -le "$PAIRS" ]; do
		line="  round $i:"
		n=$#; r=$(( (i - 1) % n ))
		while [ "$r" -gt 0 ]; do c=$1; shift; set -- "$@" "$c"; r=$((r - 1)); done
		for c in "$@"; do
			rm -rf "$RUN/out" "$RUN/copy"
			[ -n "${BEFORE:-}" ] && sh -c "$BEFORE"
			measure "${c%%:*}" sh -c "${c#*:}"
			echo "$M_wall_s" >>"$RUN/t-${c%%:*}"
			line="$line ${c%%:*} $(fmt "$M_wall_s" 3)s"
		done
		say "$line"
		i=$((i + 1))
	done
	rm -rf "$RUN/out" "$RUN/copy"
}
# ratio A B: "median x (best x)" of A over B
ratio() {
	printf '%sx (%sx)' "$(fmt "$(calc "$(median "$RUN/t-$1") / $(median "$RUN/t-$2")")" 2)" \
		"$(fmt "$(calc "$(best "$RUN/t-$1") / $(best "$RUN/t-$2")")" 2)"
}
secs() { printf '%s s (%s)' "$(fmt "$(median "$RUN/t-$1")" 3)" "$(fmt "$(best "$RUN/t-$1")" 3)"; }

want=$(size_bytes "$S")
have_room $((want * 4)) || die "not enough room in $BENCH_DIR for a $S model and its outputs"

say ""
say "## 1. mixture of experts, DTensor layout"
E=$RUN/moe
gen_model "$S" "$E" --experts 128 --moe-intermediate 128
warm "$E/model.safetensors"
"$TPSHARD" split "$E" --tp "$TP" -o "$RUN/moe-out" -q --json >"$RUN/moe.json" || die "MoE split failed"
wb=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["bytes_written"])' "$RUN/moe.json")
warm "$RUN/moe-out"/*.safetensors
say "  input $(gib "$GEN_BYTES") GiB; the rank files $(gib "$wb") GiB ($(calc "$wb / $GEN_BYTES")x)"
rounds "split:\"$TPSHARD\" split \"$E\" --tp $TP -o \"$RUN/out\" -q" \
	"cp:mkdir \"$RUN/copy\" && cp \"$RUN/moe-out\"/*.safetensors \"$RUN/copy/\""
say "  split $(secs split), cp of as many bytes $(secs cp): split/cp $(ratio split cp)"
MOE_ROW="| MoE 128 experts, dtensor | $(gib "$GEN_BYTES") GiB -> $(gib "$wb") GiB | $(secs cp) | $(secs split) | $(ratio split cp) |"
rm -rf "$E" "$RUN/moe-out"

say ""
say "## 2. mapped vs --no-mmap"
M=$RUN/llama
gen_model "$S" "$M"
warm "$M/model.safetensors"
sp="\"$TPSHARD\" split \"$M\" --tp $TP -o \"$RUN/out\" -q"
rounds "map:$sp" "nommap:$sp --no-mmap" "mapc:$sp --copy" "nommapc:$sp --copy --no-mmap" \
	"cp:cp \"$M/model.safetensors\" \"$RUN/copy\""
say "  cp $(secs cp)"
say "  mapped $(secs map): /cp $(ratio map cp); --no-mmap $(secs nommap): /cp $(ratio nommap cp), /mapped $(ratio nommap map)"
say "  --copy: mapped $(secs mapc): /cp $(ratio mapc cp); --no-mmap $(secs nommapc): /cp $(ratio nommapc cp), /mapped $(ratio nommapc mapc)"
MAP_ROWS="| llama, mapped | $(gib "$GEN_BYTES") GiB | $(secs cp) | $(secs map) | $(ratio map cp) |
| llama, --no-mmap | $(gib "$GEN_BYTES") GiB | $(secs cp) | $(secs nommap) | $(ratio nommap cp) |
| llama --copy, mapped | $(gib "$GEN_BYTES") GiB | $(secs cp) | $(secs mapc) | $(ratio mapc cp) |
| llama --copy, --no-mmap | $(gib "$GEN_BYTES") GiB | $(secs cp) | $(secs nommapc) | $(ratio nommapc cp) |"
rm -rf "$M"

BIG_ROW=""
if [ -n "$BIG" ]; then
	say ""
	say "## 3. $BIG beyond a $CGROUP_MEM memory cgroup, cold"
	# cgroup v2 (memory.max), else v1's memory controller (memory.limit_in_bytes)
	if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
		cg=/sys/fs/cgroup/tpshard-bench.$$ lim=memory.max
	else
		cg=/sys/fs/cgroup/memory/tpshard-bench.$$ lim=memory.limit_in_bytes
	fi
	if [ "$(id -u)" != 0 ] || ! mkdir "$cg" 2>/dev/null || ! echo "$(size_bytes "$CGROUP_MEM")" >"$cg/$lim"; then
		say "  skipped: needs root and a memory cgroup (v2 at /sys/fs/cgroup, v1 at /sys/fs/cgroup/memory)"
		rmdir "$cg" 2>/dev/null || true
	else
		B=$(mktemp -d "$BIG_DIR/tpshard-bench-big.XXXXXX")
		gen_model "$BIG" "$B/m"
		sync
		# every command: in the cgroup, from a cold page cache, then sync
		BEFORE="sync; echo 3 > /proc/sys/vm/drop_caches"
		inc="echo \$\$ > $cg/cgroup.procs &&"
		rounds "split:$inc \"$TPSHARD\" split \"$B/m\" --tp $TP -o \"$B/out\" -q --force && sync -f \"$B\"" \
			"cp:$inc cp \"$B/m/model.safetensors\" \"$B/copy\" && sync -f \"$B\""
		BEFORE=""
		say "  split $(secs split), cp $(secs cp): split/cp $(ratio split cp) (disk: $(df -PT "$B" | awk 'NR == 2 {print $2}'))"
		BIG_ROW="| llama beyond a $CGROUP_MEM cgroup, cold, +sync | $(gib "$GEN_BYTES") GiB | $(secs cp) | $(secs split) | $(ratio split cp) |"
		rm -rf "$B"
		rmdir "$cg" 2>/dev/null || true
	fi
fi

load_line "at end"
say ""
say "| case | bytes | cp median (best) | split median (best) | split/cp median (best) |"
say "|---|---|---|---|---|"
say "$MOE_ROW"
say "$MAP_ROWS"
[ -n "$BIG_ROW" ] && say "$BIG_ROW"
say ""
say "$PAIRS rounds each, order rotating; tp $TP; machine: $MACHINE."
