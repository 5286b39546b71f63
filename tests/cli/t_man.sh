#!/bin/sh
# The man pages are tested (after git's t0450 and jq's manual tests):
#  - `tpshard <cmd> -h` exits 0 and its first line, minus "usage: ", equals the
#    SYNOPSIS line of man/tpshard-<cmd>.1 and appears in tpshard.1's SYNOPSIS;
#  - every option in a synopsis is described in the page's OPTIONS;
#  - every page has the required sections and renders without groff warnings;
#  - every command in the EXAMPLES sections runs and exits 0, pages in the
#    order split, inspect, plan, check, verify, merge, tpshard (later pages read
#    what the split examples wrote). An example command is a line inside
#    .nf/.fi in EXAMPLES that starts with "tpshard " or "cmp "; /tmp/tpshard-ex
#    is replaced by a scratch directory and the commands run from the repo root.
# Env: TPSHARD (binary), TOP (repo root), TPS_TMP (scratch). Prints ok/not ok lines.

TOP=${TOP:-$(cd "$(dirname "$0")/../.." && pwd)}
TPSHARD=${TPSHARD:-$TOP/tpshard}
own_tmp=""
[ -n "${TPS_TMP:-}" ] || { TPS_TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpshard-test.XXXXXX") && own_tmp=1; }
mkdir -p "$TPS_TMP" || exit 1
if [ -f "$TOP/tests/cli/lib.sh" ]; then
  . "$TOP/tests/cli/lib.sh" # ok, notok, tps (valgrind when VALGRIND=1), finish
else
  FAILS=0
  ok() { echo "ok - $*"; }
  notok() { echo "not ok - $*"; FAILS=$((FAILS + 1)); }
  tps() { "$TPSHARD" "$@"; }
  finish() { [ "$FAILS" -eq 0 ]; exit $?; }
fi
MAN=$TOP/man
EX=$TPS_TMP/ex
cmds="inspect plan split check merge verify"

# Prints up to 20 lines of $1 as "# " comments.
show() { printf '%s\n' "$1" | head -n 20 | sed 's/^/#   /'; }
# The EXAMPLES say "tpshard ...": run the binary under test.
tpshard() { tps "$@"; }

# Roff text to plain text: font escapes, \- \(aq \(dq \e \& and "\ ".
unroff() {
  sed -e 's/\\f[BIRP]//g' -e 's/\\f([A-Z][A-Z]//g' -e 's/\\-/-/g' -e "s/\\\\(aq/'/g" \
      -e 's/\\(dq/"/g' -e 's/\\&//g' -e 's/\\ / /g' -e 's/\\e/\\/g'
}
# Text lines inside .nf/.fi of section $2 of page $1, as plain text.
nf_lines() {
  awk -v want="$2" '
    /^\.SH/ { sec = $0; sub(/^\.SH[ \t]+/, "", sec); gsub(/"/, "", sec); nf = 0; next }
    sec != want { next }
    /^\.nf/ { nf = 1; next }
    /^\.fi/ { nf = 0; next }
    nf && !/^[.\047]/ { print }' "$1" | unroff
}
# All text of section $2 of page $1 (macro lines included), as plain text.
section() {
  awk -v want="$2" '
    /^\.SH/ { sec = $0; sub(/^\.SH[ \t]+/, "", sec); gsub(/"/, "", sec); next }
    sec == want { print }' "$1" | unroff
}

[ -x "$TPSHARD" ] || { notok "man: binary $TPSHARD not built"; exit 1; }

# --- the binary's own contract
tps --version >/dev/null 2>&1; rc=$?
[ $rc -eq 0 ] && ok "tpshard --version exits 0" || notok "tpshard --version exits 0 (got $rc)"
tps >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] && ok "tpshard with no arguments exits 2" ||
  notok "tpshard with no arguments exits 2 (got $rc)"
tps -h >/dev/null 2>&1; rc=$?
[ $rc -eq 0 ] && ok "tpshard -h exits 0" || notok "tpshard -h exits 0 (got $rc)"

# --- pages: sections and rendering
pages="tpshard.1"
for c in $cmds; do pages="$pages tpshard-$c.1"; done
[ -f "$MAN/tpshard-plan.5" ] && pages="$pages tpshard-plan.5"
for p in $pages; do
  f=$MAN/$p
  if [ ! -f "$f" ]; then notok "man: $p exists"; continue; fi
  missing=""
  case $p in *.5) need="NAME DESCRIPTION" ;;
             *) need="NAME SYNOPSIS DESCRIPTION OPTIONS EXIT_STATUS EXAMPLES SEE_ALSO" ;; esac
  for s in $need; do
    s=$(echo "$s" | tr _ ' ')
    grep -Eq "^\.SH +\"?$s\"?\$" "$f" || missing="$missing [$s]"
  done
  [ -z "$missing" ] && ok "man: $p has its sections" || notok "man: $p lacks sections:$missing"
  if command -v groff >/dev/null 2>&1; then
    w=$(groff -man -Tutf8 -ww -z "$f" 2>&1)
    [ -z "$w" ] && ok "man: $p renders without groff warnings" ||
      { notok "man: $p renders without groff warnings"; show "$w"; }
  else
    echo "skip - man: $p rendering not checked: groff is not installed (apt-get install groff-base)"
  fi
done

# --- synopsis of each subcommand == first line of `tpshard <cmd> -h`
main_syn=$(nf_lines "$MAN/tpshard.1" SYNOPSIS)
for c in $cmds; do
  f=$MAN/tpshard-$c.1
  [ -f "$f" ] || continue
  out=$(tps "$c" -h 2>/dev/null); rc=$?
  [ $rc -eq 0 ] && ok "tpshard $c -h exits 0" || notok "tpshard $c -h exits 0 (got $rc)"
  first=$(printf '%s\n' "$out" | head -n 1)
  case $first in
  "usage: "*) ok "tpshard $c -h starts with \"usage: \"" ;;
  *) notok "tpshard $c -h starts with \"usage: \""; show "$first" ;;
  esac
  first=${first#usage: }
  syn=$(nf_lines "$f" SYNOPSIS)
  if [ "$first" = "$syn" ]; then
    ok "man: tpshard-$c.1 SYNOPSIS equals tpshard $c -h"
  else
    notok "man: tpshard-$c.1 SYNOPSIS equals tpshard $c -h"
    show "-h:  $first"; show "man: $syn"
  fi
  if printf '%s\n' "$main_syn" | grep -Fxq -- "$first"; then
    ok "man: tpshard.1 SYNOPSIS lists tpshard $c"
  else
    notok "man: tpshard.1 SYNOPSIS lists tpshard $c"; show "-h: $first"
  fi
  # Every option of the synopsis is described under OPTIONS.
  opts=$(section "$f" OPTIONS)
  undoc=""
  for o in $(printf '%s\n' "$syn" | grep -oE -- '(^|[[ |])--?[a-z][-a-z]*' | sed 's/^[[ |]*//'); do
    printf '%s\n' "$opts" | grep -Eq -- "(^|[ ,\"])$o([ ,\"]|\$)" || undoc="$undoc $o"
  done
  [ -z "$undoc" ] && ok "man: tpshard-$c.1 OPTIONS describes every option" ||
    notok "man: tpshard-$c.1 OPTIONS lacks:$undoc"
  # And the other way: every option `-h` describes is in its usage line
  # (but -h, -q and -v, which every command takes).
  unlisted=""
  for o in $(printf '%s\n' "$out" | sed -n 's/^  \(-[a-z], \)\{0,1\}\(--[a-z][-a-z]*\).*/\1\2/p' | tr -d ' '); do
    long=${o#*,} short=${o%%,*}
    [ "$short" = "$o" ] && short=""
    case $long in --help|--quiet|--verbose) continue ;; esac
    printf '%s\n' "$first" | grep -Eq -- "[[ |]$long([] |]|\$)" && continue
    [ -n "$short" ] && printf '%s\n' "$first" | grep -Eq -- "[[ |]$short([] |]|\$)" && continue
    unlisted="$unlisted $long"
  done
  [ -z "$unlisted" ] && ok "tpshard $c -h: the usage line lists every option it describes" ||
    notok "tpshard $c -h: the usage line lacks:$unlisted"
done

# --- EXAMPLES run, in an order where the split examples come first
rm -rf "$EX" && mkdir -p "$EX"
for p in split inspect plan check verify merge ""; do
  f=$MAN/tpshard${p:+-$p}.1
  [ -f "$f" ] || continue
  page=$(basename "$f")
  n=0
  nf_lines "$f" EXAMPLES | grep -E '^(tpshard|cmp) ' > "$TPS_TMP/man-examples"
  if [ ! -s "$TPS_TMP/man-examples" ]; then notok "man: $page has runnable EXAMPLES"; continue; fi
  while IFS= read -r line; do
    n=$((n + 1))
    cmd=$(printf '%s\n' "$line" | sed 's|/tmp/tpshard-ex|"$EX"|g')
    out=$(cd "$TOP" && eval "$cmd" 2>&1 </dev/null)
    rc=$?
    if [ $rc -eq 0 ]; then
      ok "man: $page example $n: $line"
    else
      notok "man: $page example $n exits 0 (got $rc): $line"; show "$out"
    fi
  done < "$TPS_TMP/man-examples"
done
rm -rf "$EX" "$TPS_TMP/man-examples"
[ -n "$own_tmp" ] && [ -z "${KEEP_TMP:-}" ] && rm -rf "$TPS_TMP"
finish
