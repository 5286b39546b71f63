# lib.sh - helpers for tests/cli/t_*.sh (POSIX sh). Source it first:
#   . "$TOP/tests/cli/lib.sh"
# Env: TPSHARD (the binary), TOP (repo root), TPS_TMP (scratch root).
# Gives: $T, a fresh scratch dir for this test script; $OUT/$ERR/$RC, the
# stdout file, stderr file and exit status of the last `run`/`expect_exit`.
# Every check prints exactly one "ok - name" or "not ok - name" line;
# lines starting with "#" are diagnostics.  VALGRIND=1 runs tpshard under
# valgrind (memcheck; a leak or error gives exit 99).

: "${TOP:=$(cd "$(dirname "$0")/../.." && pwd)}"
: "${TPSHARD:=$TOP/tpshard}"
: "${TPS_TMP:=${TMPDIR:-/tmp}}"
mkdir -p "$TPS_TMP" && T=$(mktemp -d "$TPS_TMP/cli.$(basename "$0" .sh).XXXXXX") || exit 1
OUT="$T/.stdout" ERR="$T/.stderr" RC=0
FAILS=0

ok() { echo "ok - $*"; }
notok() { echo "not ok - $*"; FAILS=$((FAILS + 1)); }
diag() { sed 's/^/#   /' "$@" | head -n 20; }

# tps ARGS...: the binary, under valgrind when VALGRIND=1, or timeout(1) when
# TPS_TIMEOUT is set (a hang becomes exit 124). With TPS_JSON_DIR set (tests/run.sh
# sets it), the standard output of every --json run is also kept there, with
# its arguments (NAME.args) and exit status (NAME.rc), for the schema test
# (tests/py/check_json_docs.py).
tps() {
  if [ -n "${TPS_JSON_DIR:-}" ]; then
    for _tps_a in "$@"; do
      [ "$_tps_a" = --json ] || continue
      mkdir -p "$TPS_JSON_DIR" && _tps_j=$(mktemp "$TPS_JSON_DIR/$(basename "$0" .sh).XXXXXX") || break
      printf '%s\n' "$@" >"$_tps_j.args"
      _tps_st=0
      tps_exec "$@" >"$_tps_j" || _tps_st=$?
      echo "$_tps_st" >"$_tps_j.rc"
      cat "$_tps_j"
      return "$_tps_st"
    done
  fi
  tps_exec "$@"
}
tps_exec() {
  if [ "${VALGRIND:-0}" = 1 ]; then
    valgrind -q --error-exitcode=99 --leak-check=full --show-leak-kinds=definite --errors-for-leak-kinds=definite \
      "$TPSHARD" "$@"
  elif [ -n "${TPS_TIMEOUT:-}" ]; then
    timeout "$TPS_TIMEOUT" "$TPSHARD" "$@"
  else
    "$TPSHARD" "$@"
  fi
}

# run CMD...: runs it, stdout to $OUT, stderr to $ERR, status to $RC.
run() { RC=0; "$@" >"$OUT" 2>"$ERR" </dev/null || RC=$?; }

# expect_exit CODE NAME -- CMD...: one ok/not ok line for "CMD exits CODE".
# Exit >= 124 (timeout, signal, crash) never matches unless asked for.
expect_exit() {
  want=$1 name=$2; shift 2; [ "$1" = -- ] && shift
  run "$@"
  if [ "$RC" = "$want" ]; then ok "$name"; return 0; fi
  notok "$name"
  echo "#   expected exit $want, got $RC: $*"
  diag "$ERR"
  return 1
}

# expect_stderr_has WORD [NAME]: $ERR contains WORD (case-insensitive, fixed string).
expect_stderr_has() {
  if grep -qiF -- "$1" "$ERR"; then ok "${2:-stderr has '$1'}"; return 0; fi
  notok "${2:-stderr has '$1'}"; diag "$ERR"; return 1
}
# expect_stdout_has WORD [NAME]: same for $OUT.
expect_stdout_has() {
  if grep -qiF -- "$1" "$OUT"; then ok "${2:-stdout has '$1'}"; return 0; fi
  notok "${2:-stdout has '$1'}"; diag "$OUT"; return 1
}

# gen ARGS...: testdata/gen.py (tiny checkpoints).
gen() { python3 "$TOP/testdata/gen.py" "$@"; }

# finish: removes $T (unless KEEP_TMP) and exits 1 if any check failed.
finish() { [ -z "${KEEP_TMP:-}" ] && rm -rf "$T"; [ "$FAILS" -eq 0 ]; exit $?; }
