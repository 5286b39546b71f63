#!/bin/sh
# bench/fs.sh [SIZE] - tpshard split side by side with cp on the file systems
# a split can share blocks or copy in the kernel on (issue 31). Needs root:
# every file system but tmpfs is a loop-mounted image.
#
# For each of xfs (mkfs.xfs -m reflink=1), btrfs, ext4 (loop images under
# IMG_DIR, default ${TMPDIR:-/var/tmp}, sparse, about 3x SIZE each) and
# tmpfs: a synthetic Llama of SIZE (default 2G) generated there, read once,
# then PAIRS rounds (default 5), the order rotating every round, of
#     rm -rf OUT; sync -f; tpshard split M --tp 8 -o OUT -q; sync -f
#     rm -f COPY; sync -f; cp --reflink=never M/model.safetensors COPY; sync -f
# (tmpfs: without the syncs), plus `--threads 1` on ext4 and tmpfs and
# `--copy` (every byte through tpshard, as before issue 31) on all four.
# Printed: best and median seconds of each, split/cp by medians (and best),
# and for the split the disk space it took (df's used blocks before and after,
# the one measure that counts shared blocks once: du counts them in every file
# that holds them) against the bytes of its rank files.
# Environment: PAIRS (5), TP (8), FS ("xfs btrfs ext4 tmpfs"), IMG_DIR,
# TPSHARD, KEEP (bench/common.sh).
IMG_DIR=${IMG_DIR:-${TMPDIR:-/var/tmp}}
# the images live on a disk, not in tmpfs (common.sh's default)
BENCH_DIR=${BENCH_DIR:-$IMG_DIR/tpshard-bench-fs}
. "$(dirname "$0")/common.sh"

PAIRS=${PAIRS:-5}
TP=${TP:-8}
S=${1:-2G}
FS=${FS:-xfs btrfs ext4 tmpfs}
[ "$(id -u)" = 0 ] || die "needs root to loop-mount the images (tmpfs alone: FS=tmpfs, still as root)"

bench_setup
MNTS=""
fs_cleanup() {
	for m in $MNTS; do umount "$m" 2>/dev/null || true; done
	rm -f "$RUN"/*.img
	bench_cleanup
}
trap 'fs_cleanup' EXIT
trap 'fs_cleanup; trap - EXIT; exit 130' INT TERM HUP PIPE
MACHINE=$(machine_line)
say "# tpshard split (tp $TP) vs cp on xfs, btrfs, ext4 and tmpfs, $S"
say "machine: $MACHINE"
load_line "at start"
want=$(size_bytes "$S")

# mount_fs FS DIR: DIR holds a fresh FS
mount_fs() {
	mkdir -p "$2"
	if [ "$1" = tmpfs ]; then
		mount -t tmpfs -o size=$((want * 3 / 1048576 + 1024))m tmpfs "$2" || return 1
	else
		truncate -s $((want * 3 / 1048576 + 1024))M "$RUN/$1.img" || return 1
		case $1 in
		xfs) mkfs.xfs -q -m reflink=1 "$RUN/$1.img" ;;
		btrfs) mkfs.btrfs -q "$RUN/$1.img" >/dev/null 2>&1 ;;
		ext4) mkfs.ext4 -q -F "$RUN/$1.img" ;;
		esac || return 1
		mount -o loop "$RUN/$1.img" "$2" || return 1
	fi
	MNTS="$2 $MNTS"
}
used_k() { df -Pk "$1" | awk 'NR == 2 {print $3}'; }

# timed LABEL SYNC CMD...: CMD (then sync -f when SYNC is 1) under measure
timed() {
	_l=$1 _s=$2; shift 2
	if [ "$_s" = 1 ]; then
		measure "$_l" sh -c '"$@" && sync -f "$0"' "$D" "$@"
	else
		measure "$_l" "$@"
	fi
}

ROWS=""
for fs in $FS; do
	D=$RUN/$fs
	if ! mount_fs "$fs" "$D"; then
		say ""
		say "## $fs: cannot make or mount it here (mkfs.$fs missing, no loop device?): skipped"
		continue
	fi
	sy=1
	[ "$fs" = tmpfs ] && sy=0
	say ""
	say "## $fs"
	M=$D/model
	gen_model "$S" "$M"
	BYTES=$GEN_BYTES
	sync -f "$D"
	warm "$M/model.safetensors"
	OUT=$D/out COPY=$D/copy.safetensors
	# how the split goes there, and the space it takes (the first output on
	# this file system: a removed one frees its blocks in the background)
	u0=$(used_k "$D")
	"$TPSHARD" split "$M" --tp "$TP" -o "$OUT" -v --json 2>"$RUN/v.txt" >"$RUN/split.json" ||
		die "split on $fs failed"
	sync -f "$D"; sleep 1; u1=$(used_k "$D")
	how=$(grep -m1 "$OUT ($fs): " "$RUN/v.txt" | sed 's/^.*): //')
	say "  tpshard -v: $how"
	size_b=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["bytes_written"])' "$RUN/split.json")
	shared_b=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["bytes_shared"])' "$RUN/split.json")
	du_k=$(du -sk "$OUT" | awk '{print $1}')
	disk_b=$(( (u1 - u0) * 1024 ))
	[ "$disk_b" -lt 0 ] && disk_b=0
	say "  rank files $(gib "$size_b") GiB, $(gib "$shared_b") GiB of it shared (split --json);" \
		"disk space taken (df) $(gib "$disk_b") GiB = $(calc "$disk_b / $size_b")x their size;" \
		"du $(calc "$du_k * 1024 / $size_b")x (du counts shared blocks in full)"
	rm -rf "$OUT"
	kinds="split cp copy"
	[ "$fs" = ext4 ] || [ "$fs" = tmpfs ] && kinds="split cp t1 copy"
	for k in $kinds; do : >"$RUN/t-$k"; done
	i=1
	while [ "$i" -le "$PAIRS" ]; do
		# rotate the order so no side always runs first
		set -- $kinds
		r=$(( (i - 1) % $# )); while [ "$r" -gt 0 ]; do k=$1; shift; set -- "$@" "$k"; r=$((r - 1)); done
		line="  round $i:"
		for k in "$@"; do
			rm -rf "$OUT" "$COPY"; [ "$sy" = 1 ] && sync -f "$D"
			case $k in
			split) timed split "$sy" "$TPSHARD" split "$M" --tp "$TP" -o "$OUT" -q ;;
			t1) timed t1 "$sy" "$TPSHARD" split "$M" --tp "$TP" -o "$OUT" -q --threads 1 ;;
			copy) timed copy "$sy" "$TPSHARD" split "$M" --tp "$TP" -o "$OUT" -q --copy ;;
			cp) timed cp "$sy" cp --reflink=never "$M/model.safetensors" "$COPY" ;;
			esac
			echo "$M_wall_s" >>"$RUN/t-$k"
			line="$line $k $(fmt "$M_wall_s" 3)s"
		done
		say "$line"
		i=$((i + 1))
	done
	rm -rf "$OUT" "$COPY"
	cm=$(median "$RUN/t-cp"); cb=$(best "$RUN/t-cp")
	sm=$(median "$RUN/t-split"); sb=$(best "$RUN/t-split")
	om=$(median "$RUN/t-copy"); ob=$(best "$RUN/t-copy")
	say "  cp --reflink=never: median $(fmt "$cm" 3) s (best $(fmt "$cb" 3))"
	say "  split:              median $(fmt "$sm" 3) s (best $(fmt "$sb" 3)); split/cp $(fmt "$(calc "$sm / $cm")" 2)x median, $(fmt "$(calc "$sb / $cb")" 2)x best"
	say "  split --copy:       median $(fmt "$om" 3) s (best $(fmt "$ob" 3)); --copy/cp $(fmt "$(calc "$om / $cm")" 2)x median"
	t1m=-; t1r=-
	if [ -s "$RUN/t-t1" ]; then
		t1m=$(median "$RUN/t-t1")
		t1r=$(fmt "$(calc "$t1m / $cm")" 2)x
		say "  split --threads 1:  median $(fmt "$t1m" 3) s (best $(fmt "$(best "$RUN/t-t1")" 3)); --threads 1/cp $t1r median"
		t1m=$(fmt "$t1m" 3)
	fi
	ROWS="$ROWS
| $fs | $(gib "$BYTES") GiB | $(fmt "$cm" 3) | $(fmt "$sm" 3) | $(fmt "$(calc "$sm / $cm")" 2)x ($(fmt "$(calc "$sb / $cb")" 2)x) | $(fmt "$(calc "$om / $cm")" 2)x | $t1r | $(calc "$disk_b / $size_b")x | $(calc "$du_k * 1024 / $size_b")x | $how |"
	rm -rf "$M"
	umount "$D" && MNTS=$(printf '%s\n' $MNTS | grep -vx "$D" | tr '\n' ' ')
	rm -f "$RUN/$fs.img"
done
load_line "at end"
say ""
say "| fs | input | cp s (median) | split s (median) | split/cp median (best) | --copy/cp | --threads 1/cp | disk taken / size (df) | du / size | how |"
say "|---|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "$ROWS" | sed '/^$/d'
say ""
say "$PAIRS rounds each, order rotating; loop images sync'd with sync -f after every run (not tmpfs); tp $TP; machine: $MACHINE."
