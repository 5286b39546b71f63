#!/bin/sh
# make install / uninstall under DESTDIR, the pkg-config file, a program built
# against the installed library, and plans compiled into the binary.
. "$TOP/tests/cli/lib.sh"
D="$T/dest"
if make -s -C "$TOP" install PREFIX=/usr/local DESTDIR="$D" >"$OUT" 2>"$ERR"; then
  ok "make install DESTDIR"
else
  notok "make install DESTDIR"; diag "$ERR"
fi
missing=""
for f in bin/tpshard lib/libtpshard.a include/tpshard.h lib/pkgconfig/tpshard.pc \
         share/man/man1/tpshard.1 share/man/man1/tpshard-split.1 share/man/man5/tpshard-plan.5 \
         share/tpshard/schema/check.schema.json share/tpshard/schema/error.schema.json; do
  [ -f "$D/usr/local/$f" ] || missing="$missing $f"
done
[ -z "$missing" ] && ok "installs binary, library, header, pkg-config file, man pages, JSON schemas" || notok "missing:$missing"

# A program against the installed header and library, found through pkg-config.
cat > "$T/use.c" <<'C'
#include <stdio.h>
#include <tpshard.h>
int main(void) { printf("%s %s\n", tps_version(), tps_dtype_name(TPS_BF16)); return 0; }
C
# An instrumented build (make test SANITIZE=...) needs the same flags to link.
san=""; [ -n "${SANITIZE:-}" ] && san="-fsanitize=$SANITIZE"
PKG_CONFIG_PATH="$D/usr/local/lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$D" \
  cc $san "$T/use.c" -o "$T/use" $(PKG_CONFIG_PATH="$D/usr/local/lib/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$D" \
  pkg-config --cflags --libs --static tpshard) 2>"$ERR" && "$T/use" | grep -q BF16 &&
  ok "a program builds against the installed library via pkg-config" || { notok "pkg-config build"; diag "$ERR"; }

# The installed binary carries its plans: it splits from any directory.
(cd / && "$D/usr/local/bin/tpshard" split "$TOP/testdata/conformance/llama-tp3/model" --tp 3 -o "$T/anywhere" -q) 2>"$ERR" &&
  [ -f "$T/anywhere/tpshard.json" ] && ok "the installed binary splits from / with its built-in plans" ||
  { notok "split from another directory"; diag "$ERR"; }
expect_exit 0 "plan --list" -- "$D/usr/local/bin/tpshard" plan --list
expect_stdout_has "gemma4" "plan --list shows the built-in plans"

# Progress with -v when stderr is not a terminal; none with -q.
expect_exit 0 "split -v" -- tps split "$TOP/testdata/conformance/llama-tp3/model" --tp 3 -o "$T/v" -v
grep -q "%.*/s" "$ERR" && ok "-v shows progress on stderr" || { notok "-v progress"; diag "$ERR"; }
expect_exit 0 "split -q" -- tps split "$TOP/testdata/conformance/llama-tp3/model" --tp 3 -o "$T/q" -q
[ ! -s "$OUT" ] && [ ! -s "$ERR" ] && ok "-q prints nothing" || notok "-q printed something"

make -s -C "$TOP" uninstall PREFIX=/usr/local DESTDIR="$D" >/dev/null 2>&1
left=$(find "$D" -type f | wc -l)
[ "$left" = 0 ] && ok "make uninstall removes every installed file" || notok "uninstall left $left files"
finish
