#!/bin/sh
# Every malformed input of testdata/bad/EXPECT: `tpshard inspect` exits 1 within
# 10 s (never 0, 2, a signal or a hang), stderr starts with "tpshard: error:"
# and names the problem (the word in EXPECT, case-insensitive).
. "${TOP:-$(cd "$(dirname "$0")/../.." && pwd)}/tests/cli/lib.sh"
bad="$TOP/testdata/bad"
n=0
TPS_TIMEOUT=10 # a hang is a failure (valgrind runs without it: it is slow)
while read -r file word; do
  case $file in ''|'#'*) continue ;; esac
  n=$((n + 1))
  if [ ! -e "$bad/$file" ]; then notok "bad input $file: missing (rerun testdata/bad/make.py)"; continue; fi
  run tps inspect "$bad/$file"
  why=""
  if [ "$RC" = 124 ]; then why="hung (killed after 10 s)"
  elif [ "$RC" -ge 128 ]; then why="crashed (exit $RC)"
  elif [ "$RC" != 1 ]; then why="exit $RC, expected 1"
  elif ! head -n 1 "$ERR" | grep -q '^tpshard: error:'; then why="stderr does not start with 'tpshard: error:'"
  elif ! grep -qiF -- "$word" "$ERR"; then why="error does not mention '$word'"
  fi
  if [ -z "$why" ]; then
    ok "bad input $file"
  else
    notok "bad input $file: $why"
    diag "$ERR"
  fi
done < "$bad/EXPECT"
[ "$n" -ge 30 ] && ok "bad inputs: $n cases" || notok "bad inputs: only $n cases in EXPECT"
finish
