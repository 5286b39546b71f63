#!/bin/sh
# Splits into one output directory at the same time: a split into a
# directory another split is writing is refused at once, naming that split;
# exit 0 always leaves a complete directory; --ranks runs of one split still
# fill one directory together.
. "$TOP/tests/cli/lib.sh"
gen llama "$T/m" --hidden 256 --heads 8 --kv-heads 8 --inter 704 --vocab 4200 --layers 2 --seed 3 >/dev/null
O="$T/o"

# race ROUNDS ARGS_A -- ARGS_B: two splits into $O at once, ROUNDS times.
# Each round: exactly one exits 0, with a complete directory (check exits 0,
# or 3 for a --ranks run's partial one); the other exits 1, refused while the
# winner wrote ("another split (pid WINNER) is writing"), or after it ended
# (the output it found). Counts go to $T/.tally.
race() {
  rounds=$1; shift
  a=""; while [ "$1" != -- ]; do a="$a $1"; shift; done; shift
  : >"$T/.tally"
  bad=0 i=0
  while [ "$i" -lt "$rounds" ]; do
    i=$((i + 1))
    rm -rf "$O"
    # shellcheck disable=SC2086
    "$TPSHARD" split "$T/m" --tp 4 -o "$O" -q $a >/dev/null 2>"$T/.e1" </dev/null & p1=$!
    "$TPSHARD" split "$T/m" --tp 4 -o "$O" -q "$@" >/dev/null 2>"$T/.e2" </dev/null & p2=$!
    r1=0 r2=0
    wait "$p1" || r1=$?
    wait "$p2" || r2=$?
    if [ "$r1" = 0 ] && [ "$r2" = 1 ]; then win=$p1 lose="$T/.e2"
    elif [ "$r2" = 0 ] && [ "$r1" = 1 ]; then win=$p2 lose="$T/.e1"
    else echo "#   round $i: exits $r1 and $r2"; cat "$T/.e1" "$T/.e2" | diag; bad=1; continue; fi
    st=0; "$TPSHARD" check "$O" -q >/dev/null 2>"$T/.ec" || st=$?
    if [ "$st" != 0 ] && [ "$st" != 3 ]; then
      echo "#   round $i: the winner exited 0 but check exits $st"; diag "$T/.ec"; bad=1; continue
    fi
    if [ -e "$O/.tpshard.writing" ]; then echo "#   round $i: .tpshard.writing left behind"; bad=1; continue; fi
    if grep -q "another split (pid $win) is writing $O" "$lose"; then echo refused >>"$T/.tally"
    elif grep -qE "already holds a tpshard output|is already written here" "$lose"; then echo after >>"$T/.tally"
    else echo "#   round $i: the loser's error:"; diag "$lose"; bad=1; fi
  done
  return $bad
}
tally() { echo "$(grep -c refused "$T/.tally") refused while the other wrote, $(grep -c after "$T/.tally") after it ended"; }

race 16 -- && ok "two plain splits at once, 16 rounds: one exits 0 with a complete directory, the other is refused ($(tally))" ||
  notok "two plain splits at once"
race 8 --force -- --force && ok "two splits --force at once, 8 rounds: the same ($(tally))" ||
  notok "two splits --force at once"
race 8 -- --ranks 0,1 && ok "a plain split and a --ranks run at once, 8 rounds: the same ($(tally))" ||
  notok "a plain split and a --ranks run at once"
# --ranks runs of one split join: both exit 0, the directory complete.
bad=0 i=0
while [ "$i" -lt 8 ]; do
  i=$((i + 1))
  rm -rf "$O"
  "$TPSHARD" split "$T/m" --tp 4 -o "$O" -q --ranks 0,1 2>"$T/.e1" & p1=$!
  "$TPSHARD" split "$T/m" --tp 4 -o "$O" -q --ranks 2,3 2>"$T/.e2" & p2=$!
  r1=0 r2=0
  wait "$p1" || r1=$?
  wait "$p2" || r2=$?
  if [ "$r1$r2" != 00 ] || ! "$TPSHARD" check "$O" -q 2>"$T/.ec" || [ -e "$O/.tpshard.writing" ]; then
    echo "#   round $i: exits $r1 $r2"; cat "$T/.e1" "$T/.e2" "$T/.ec" | diag; bad=1
  fi
done
[ "$bad" = 0 ] && ok "two --ranks runs of one split at once, 8 rounds: both exit 0, check exits 0" ||
  notok "two --ranks runs of one split at once"

# A split holding the directory, held still: a stand-in holds the lock the
# way a split does (its record: pid, host, kind) until told to stop.
# hold KIND: the stand-in's pid in $HP once it holds $O/.tpshard.writing.
hold() {
  rm -f "$T/.held"
  python3 -c '
import fcntl, os, socket, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_SH if sys.argv[2] == "ranks" else fcntl.LOCK_EX)
os.pwrite(fd, ("%d %s %s\n" % (os.getpid(), socket.gethostname(), sys.argv[2])).encode(), 0)
open(sys.argv[3], "w").write("held\n")
time.sleep(600)
' "$O/.tpshard.writing" "$1" "$T/.held" & HP=$!
  n=0; while [ ! -s "$T/.held" ] && [ "$n" -lt 3000 ]; do sleep 0.01; n=$((n + 1)); done
}
release() { kill "$HP" 2>/dev/null; wait "$HP" 2>/dev/null; }

rm -rf "$O"; mkdir -p "$O"
hold split
expect_exit 1 "a split into a directory another split is writing is refused" -- tps split "$T/m" --tp 4 -o "$O"
expect_stderr_has "tpshard: error: another split (pid $HP) is writing $O" "the refusal names the other split's pid and the directory"
expect_exit 1 "--force does not override it" -- tps split "$T/m" --tp 4 -o "$O" --force
expect_exit 1 "a --ranks run into it is refused too" -- tps split "$T/m" --tp 4 -o "$O" --ranks 1
expect_stderr_has "another split (pid $HP) is writing" "the --ranks run's refusal names it"
[ "$(ls -A "$O")" = .tpshard.writing ] && ok "the refused splits wrote nothing" || { notok "the refused splits wrote nothing"; ls -A "$O" | diag; }
release
expect_exit 0 "once it has ended, a split is taken" -- tps split "$T/m" --tp 4 -o "$O"
[ ! -e "$O/.tpshard.writing" ] && tps check "$O" -q && ok "the lock a killed split left behind is taken over and removed" ||
  notok "the stale lock"

rm -rf "$O"; mkdir -p "$O"
hold ranks
expect_exit 1 "a split into a directory --ranks runs are writing is refused" -- tps split "$T/m" --tp 4 -o "$O"
expect_stderr_has "another split (pid $HP) is writing $O" "the refusal names a --ranks run"
expect_exit 0 "a --ranks run joins the --ranks runs writing" -- tps split "$T/m" --tp 4 -o "$O" --ranks 0,1
[ -e "$O/.tpshard.writing" ] && ok "the lock stays while another --ranks run holds it" || notok "the shared lock stays"
release
expect_exit 0 "the last --ranks run" -- tps split "$T/m" --tp 4 -o "$O" --ranks 2,3
[ ! -e "$O/.tpshard.writing" ] && tps check "$O" -q && ok "the last --ranks run removes the lock; check exits 0" ||
  { notok "the last --ranks run"; ls -A "$O" | diag; }
finish
