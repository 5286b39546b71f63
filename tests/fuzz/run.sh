#!/bin/sh
# run.sh SECONDS [TARGET...] - builds each libFuzzer target with clang
# (-fsanitize=fuzzer,address,undefined) into build/fuzz/ and runs it for
# SECONDS on a copy of its seed corpus testdata/fuzz/<target>/. Prints the
# executions per target. A crash, leak, timeout or OOM input is copied into
# testdata/fuzz/<target>/ so that `make test` replays it from then on (commit
# it with the fix). Exit 1 when any target found something.
# Env: CLANG (default clang), FUZZ_JOBS (parallel fuzzing jobs per target, 1).
set -u
secs=${1:-60}; shift 2>/dev/null || true
targets=${*:-"header index config plan manifest"}
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top" || exit 1
CLANG=${CLANG:-clang}
command -v "$CLANG" >/dev/null 2>&1 || { echo "fuzz: $CLANG not found (apt-get install clang)"; exit 1; }
b=build/fuzz
mkdir -p "$b/obj"
[ -f lib/plans_gen.c ] || make -s lib/plans_gen.c || exit 1

PKG_CFLAGS=$(pkg-config --cflags libcjson yaml-0.1 zlib)
PKG_LIBS=$(pkg-config --libs libcjson yaml-0.1 zlib)
SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined"
CFLAGS="-g -O1 -std=c11 -D_GNU_SOURCE -D_FILE_OFFSET_BITS=64 -Ilib $PKG_CFLAGS $SAN"

# The library, instrumented for coverage (no main): the same sources as the
# Makefile's CUDA=0 build.
objs=""
for src in $(ls lib/*.c lib/*/*.c | sort -u); do
  o="$b/obj/$(basename "$src" .c).o"
  if [ ! -f "$o" ] || [ "$src" -nt "$o" ] || [ lib/internal.h -nt "$o" ] || [ lib/tpshard.h -nt "$o" ]; then
    $CLANG $CFLAGS -fsanitize=fuzzer-no-link -c "$src" -o "$o" || { echo "fuzz: cannot compile $src"; exit 1; }
  fi
  objs="$objs $o"
done

found=0
for t in $targets; do
  src=tests/fuzz/fuzz_$t.c
  [ -f "$src" ] || { echo "fuzz: no $src"; found=1; continue; }
  exe=$b/fuzz_$t
  $CLANG $CFLAGS -fsanitize=fuzzer "$src" $objs $PKG_LIBS -lm -lpthread -o "$exe" \
    || { echo "fuzz: cannot build $exe"; found=1; continue; }
  corpus=$b/corpus/$t
  rm -rf "$corpus" "$b/art-$t"; mkdir -p "$corpus" "$b/art-$t"
  cp testdata/fuzz/"$t"/* "$corpus"/ 2>/dev/null
  dict=""; [ -f tests/fuzz/$t.dict ] && dict="-dict=tests/fuzz/$t.dict"
  [ -z "$dict" ] && [ "$t" != plan ] && dict="-dict=tests/fuzz/json.dict"
  log=$b/fuzz_$t.log
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
    "$exe" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$b/art-$t/" $dict "$corpus" >"$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1)
  arts=$(ls "$b/art-$t" 2>/dev/null)
  if [ -n "$arts" ] || [ "$rc" -ne 0 ]; then
    found=1
    for a in $arts; do cp "$b/art-$t/$a" "testdata/fuzz/$t/$a"; done
    echo "fuzz $t: FOUND A PROBLEM (exit $rc) after ${execs:-?} executions; log $log"
    [ -n "$arts" ] && echo "  copied to testdata/fuzz/$t/: $arts"
    grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error)' "$log" | head -n 5 | sed 's/^/  /'
  else
    echo "fuzz $t: ${execs:-?} executions in ${secs}s, ${cov:-cov ?}, $(ls "$corpus" | wc -l) corpus files, clean"
  fi
done
exit $found
