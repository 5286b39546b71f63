# bench/common.sh - helpers shared by bench/split.sh, verify.sh and merge.sh.
# POSIX sh; sourced, not run.  Environment knobs (all optional):
#   TPSHARD    the binary to measure (default: ./tpshard at the repo root)
#   BENCH_DIR  where models and outputs go (default /dev/shm/tpshard-bench;
#              tmpfs, so input and output are in the page cache)
#   CC         compiler for bench/gen_llama.c (default cc)
#   KEEP=1     keep the run directory at the end (default: delete it)
#   GEN_OPTS   extra gen_llama options for every model, e.g. "--hidden 4096"

set -eu

BENCH_SRC=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$BENCH_SRC/.." && pwd)
TPSHARD=${TPSHARD:-$ROOT/tpshard}
BENCH_DIR=${BENCH_DIR:-/dev/shm/tpshard-bench}
CC=${CC:-cc}
KEEP=${KEEP:-0}

say() { printf '%s\n' "$*"; }
die() { printf 'bench: error: %s\n' "$*" >&2; exit 1; }

# ---------------------------------------------------------------- setup
# One directory per run, removed at exit (also on ^C), so nothing large is
# left behind in tmpfs (which is RAM).
bench_setup() {
	mkdir -p "$BENCH_DIR" || die "cannot create $BENCH_DIR"
	RUN=$(mktemp -d "$BENCH_DIR/run.XXXXXX") || die "cannot create a run directory in $BENCH_DIR"
	trap 'bench_cleanup' EXIT
	trap 'bench_cleanup; trap - EXIT; exit 130' INT TERM HUP PIPE
	GEN=$RUN/gen_llama
	$CC -O2 -o "$GEN" "$BENCH_SRC/gen_llama.c" || die "cannot compile bench/gen_llama.c with $CC"
	[ -x "$TPSHARD" ] || die "$TPSHARD not found: build it first (make)"
	"$TPSHARD" split --help >/dev/null 2>&1 || "$TPSHARD" split -h >/dev/null 2>&1 ||
		die "$TPSHARD split --help fails: is split implemented?"
}

bench_cleanup() {
	if [ "${RUN:-}" ] && [ -d "$RUN" ]; then
		if [ "$KEEP" = 1 ]; then
			say "(KEEP=1: leaving $RUN)"
		else
			rm -rf "$RUN"
		fi
	fi
}

# ---------------------------------------------------------------- machine
machine_line() {
	_cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
	_mem=$(awk '/^MemTotal:/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo 2>/dev/null)
	_fs=$(df -PT "$BENCH_DIR" 2>/dev/null | awk 'NR == 2 {print $2}')
	_ver=$("$TPSHARD" --version 2>/dev/null | head -n 1 || true)
	printf '%s cores (%s), %s RAM, Linux %s, %s on %s, %s' "$(nproc)" "${_cpu:-unknown CPU}" "$_mem" \
		"$(uname -r)" "$BENCH_DIR" "${_fs:-?}" "${_ver:-tpshard ?}"
}

# load_line WHEN: how busy the CPUs are, sampled from /proc/stat over one
# second (not the load average, which still counts a benchmark that just
# ended), with a warning over 10%: on 2 cores a concurrent build or test run
# inflates and scatters the times, so rerun on a quiet machine.
load_line() {
	_a=$(awk '/^cpu / { print $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9, $5 + $6 }' /proc/stat 2>/dev/null || true)
	sleep 1
	_b=$(awk '/^cpu / { print $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9, $5 + $6 }' /proc/stat 2>/dev/null || true)
	if [ -z "$_a" ] || [ -z "$_b" ]; then
		say "CPU busy $1: n/a"
		return 0
	fi
	_busy=$(printf '%s %s\n' "$_a" "$_b" | awk '{ t = $3 - $1; i = $4 - $2; printf "%.0f", (t > 0 ? 100 * (t - i) / t : 0) }')
	if [ "$_busy" -gt 10 ]; then
		say "CPU busy $1: ${_busy}% over 1 s (other processes are using the CPUs: timings are noisy)"
	else
		say "CPU busy $1: ${_busy}% over 1 s"
	fi
}

# ---------------------------------------------------------------- sizes
# size_bytes 1G -> 1073741824 (K/M/G/T binary suffixes, as gen_llama reads them)
size_bytes() {
	awk -v s="$1" 'BEGIN {
		n = s + 0; u = toupper(s); gsub(/[0-9.]/, "", u); u = substr(u, 1, 1)
		if (u == "K") n *= 1024; else if (u == "M") n *= 1048576
		else if (u == "G") n *= 1073741824; else if (u == "T") n *= 1099511627776
		printf "%.0f\n", n }'
}

# have_room BYTES: is there room (filesystem and, on tmpfs, RAM) for BYTES more?
have_room() {
	_need_k=$(( $1 / 1024 + 262144 ))
	_fs_k=$(df -Pk "$RUN" | awk 'NR == 2 {print $4}')
	[ "$_fs_k" -ge "$_need_k" ] || return 1
	if [ "$(df -PT "$RUN" | awk 'NR == 2 {print $2}')" = tmpfs ]; then
		_mem_k=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
		[ "$_mem_k" -ge "$_need_k" ] || return 1
	fi
	return 0
}

# gen_model SIZE DIR [gen_llama options]: generate; sets GEN_BYTES (file
# bytes) and prints what gen_llama made.
gen_model() {
	_s=$1; _d=$2; shift 2
	# shellcheck disable=SC2086  # GEN_OPTS is a list of options
	"$GEN" "$_d" --size "$_s" ${GEN_OPTS:-} "$@" 2>"$RUN/gen.log" >"$RUN/gen.out" || { cat "$RUN/gen.log" >&2; die "gen_llama failed"; }
	sed 's/^gen_llama: /  generated /; s/^  generated note: /  note: /' "$RUN/gen.log"
	# shellcheck disable=SC2034
	GEN_BYTES=$(cat "$RUN/gen.out")
}

warm() { cat "$@" >/dev/null; }

# prepare_model SUBCOMMAND SIZE TITLE: set up the run, check that tpshard has
# SUBCOMMAND, print the title, machine and load, then make a SIZE model in $M
# (its byte count in $BYTES) with room for two outputs, and warm it.
prepare_model() {
	bench_setup
	"$TPSHARD" "$1" --help >/dev/null 2>&1 || "$TPSHARD" "$1" -h >/dev/null 2>&1 ||
		die "$TPSHARD $1 --help fails: is $1 implemented?"
	MACHINE=$(machine_line)
	say "$3"
	say "machine: $MACHINE"
	load_line "at start"
	want=$(size_bytes "$2")
	have_room $((want * 3 + want / 10)) || die "not enough room in $BENCH_DIR for a $2 model and two outputs"
	M=$RUN/model-$2
	gen_model "$2" "$M"
	# shellcheck disable=SC2034 # BYTES is for the calling script
	BYTES=$GEN_BYTES
	warm "$M/model.safetensors"
}

# ---------------------------------------------------------------- measuring
# measure LABEL CMD...: runs CMD under gen_llama --measure (CLOCK_MONOTONIC
# wall time, ru_maxrss from wait4 = /usr/bin/time's %M, /proc/PID/io), output
# to $RUN/LABEL.log.  Sets M_rc M_wall_s M_user_s M_sys_s M_maxrss_kib M_rchar M_read_bytes
# M_wchar M_write_bytes (-1: not available).  A failing command stops the benchmark.
# shellcheck disable=SC2034  # used by the scripts that source this file
M_rc=0 M_wall_s=0 M_user_s=0 M_sys_s=0 M_maxrss_kib=0 M_rchar=-1 M_read_bytes=-1 M_wchar=-1 M_write_bytes=-1
measure() {
	_label=$1; shift
	_rc=0
	"$GEN" --measure -o "$RUN/m.txt" -- "$@" >"$RUN/$_label.log" 2>&1 || _rc=$?
	eval "$(sed 's/\([a-z_]*\)=/M_\1=/g' "$RUN/m.txt")"
	if [ "$_rc" -ne 0 ]; then
		say "command failed (exit $_rc): $*" >&2
		tail -n 20 "$RUN/$_label.log" >&2
		die "$_label failed"
	fi
}

# cross-check the peak RSS of one command with /usr/bin/time -f %M (KiB);
# prints the number or "n/a".  Installs GNU time when missing and root.
time_rss() {
	if [ ! -x /usr/bin/time ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		apt-get install -y -q time >/dev/null 2>&1 || true
	fi
	if [ -x /usr/bin/time ]; then
		/usr/bin/time -f '%M' -o "$RUN/time.txt" "$@" >/dev/null 2>&1 || { say n/a; return 0; }
		tail -n 1 "$RUN/time.txt"
	else
		say n/a
	fi
}

# ---------------------------------------------------------------- numbers
# best FILE / median FILE: of the numbers in FILE (one per line)
best() { sort -g "$1" | awk 'NR == 1 { printf "%.6f\n", $1 }'; }
median() {
	sort -g "$1" | awk '{ v[NR] = $1 } END {
		if (NR == 0) { print "nan"; exit }
		printf "%.6f\n", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
maxof() { sort -g "$1" | tail -n 1; }
# calc EXPR: awk arithmetic, e.g. calc "1.5 / 2"
calc() { awk "BEGIN { printf \"%.4f\", $1 }"; }
# fmt NUMBER DECIMALS
fmt() { awk -v x="$1" -v d="$2" 'BEGIN { printf "%.*f", d, x }'; }
# sfmt NUMBER DECIMALS: with an explicit sign
sfmt() { awk -v x="$1" -v d="$2" 'BEGIN { printf "%+.*f", d, x }'; }
mib() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
gib() { awk -v b="$1" 'BEGIN { printf "%.2f", b / 1073741824 }'; }
# bar VALUE LIMIT -> "ok" or "OVER"
bar() { awk -v v="$1" -v l="$2" 'BEGIN { print (v <= l) ? "ok" : "OVER" }'; }
