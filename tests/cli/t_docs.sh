#!/bin/sh
# The README and tpshard(1) say what the binary does: the README's
# `plan --list` sample is its output, tpshard(1) names every built-in plan's
# family, tpshard-split(1) gives the exit status of an interrupt, and the
# README's Quick start (whose first block .ci/run runs: exactly 2 commands)
# comes before the pip section that builds on it.
. "$TOP/tests/cli/lib.sh"
R="$TOP/README.md"
tps plan --list >"$T/list" 2>"$ERR" || notok "plan --list"
# The indented block after "$ ./tpshard plan --list", up to the next heading.
awk '/^    \$ \.\/tpshard plan --list$/ {on = 1; next}
     on && /^(#|[^ \n])/ {exit}
     on {sub(/^    /, ""); print}' "$R" | sed -e '/./,$!d' >"$T/readme"
# trailing blank lines off both
sed -e :a -e '/^\n*$/{$d;N;ba' -e '}' "$T/readme" >"$T/a"; sed -e :a -e '/^\n*$/{$d;N;ba' -e '}' "$T/list" >"$T/b"
if [ -s "$T/a" ] && cmp -s "$T/a" "$T/b"; then
  ok "README: the plan --list sample is tpshard plan --list's output"
else
  notok "README: the plan --list sample is tpshard plan --list's output"; diff "$T/a" "$T/b" | diag
fi
# tpshard(1)'s DESCRIPTION names each plan's family (its first word in --list).
desc=$(awk '/^\.SH DESCRIPTION/ {on = 1; next} /^\.SH/ {on = 0} on' "$TOP/man/tpshard.1" | tr '\n' ' ')
missing=""
for fam in $(sed -n 's/^  [a-z0-9_]*  *\([^ ]*\) .*/\1/p' "$T/list"); do
  printf '%s\n' "$desc" | grep -qF -- "$fam" || missing="$missing $fam"
done
[ -n "$(sed -n 's/^  [a-z0-9_]*  *\([^ ]*\) .*/\1/p' "$T/list")" ] && [ -z "$missing" ] &&
  ok "tpshard(1) names the family of every built-in plan" || notok "tpshard(1)'s family list lacks:$missing"
# An interrupted split exits 130 (cli_lib_error); its page says so.
awk '/^\.SH EXIT STATUS/ {on = 1; next} /^\.SH/ {on = 0} on' "$TOP/man/tpshard-split.1" >"$T/exit"
grep -qx '\.B 130' "$T/exit" && grep -qi interrupt "$T/exit" && ! grep -B3 -A6 -x '\.B 1' "$T/exit" | grep -qi 'or an interrupt' &&
  ok "tpshard-split(1) EXIT STATUS: an interrupt exits 130" || notok "tpshard-split(1) EXIT STATUS: an interrupt exits 130"
# Quick start before the pip section; its first block: the 2 commands .ci/run runs.
q=$(grep -n '^## Quick start$' "$R" | cut -d: -f1) p=$(grep -n '^## Install with pip$' "$R" | cut -d: -f1)
[ -n "$q" ] && [ -n "$p" ] && [ "$q" -lt "$p" ] && ok "README: Quick start comes before Install with pip" ||
  notok "README: Quick start comes before Install with pip (lines $q, $p)"
n=$(awk '/^## Quick start/ {on = 1; next} /^## / {on = 0}
         on && /^    [^ ]/ {print; got = 1; next}
         on && got {exit}' "$R" | wc -l)
[ "$n" -eq 2 ] && ok "README: Quick start's first block has the 2 commands .ci/run runs" ||
  notok "README: Quick start's first block has $n commands, .ci/run expects 2"
finish
