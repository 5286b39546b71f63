#!/bin/sh
# split reads its source through per-task mappings by default (tasks of
# 256 KiB or more) and with pread under --no-mmap: both must write the same
# bytes, file for file, for every conformance case (their tasks are small:
# these mostly check the threshold), a model whose tensors span many copy
# tasks (one file and indexed), resharded shard directories (tensors made
# of pieces), --ranks, --max-part-size and one thread. And the command does
# map by default.
. "$TOP/tests/cli/lib.sh"

# same_dirs A B: the same file names, each byte-identical.
same_dirs() {
  (cd "$1" && ls -A) >"$T/.la"; (cd "$2" && ls -A) >"$T/.lb"
  cmp -s "$T/.la" "$T/.lb" || { echo "#   files differ:"; diff "$T/.la" "$T/.lb" | head -n 5 | sed 's/^/#   /'; return 1; }
  for f in $(cat "$T/.la"); do
    cmp -s "$1/$f" "$2/$f" || { echo "#   $f differs"; return 1; }
  done
}

# both NAME SRC SPLIT-ARGS...: split with and without --no-mmap, compare.
# check exits 0, or 3 (partial) after --ranks.
both() {
  name=$1 src=$2; shift 2
  rm -rf "$T/a" "$T/b"
  want=0; case " $* " in *" --ranks "*) want=3 ;; esac
  if tps split "$src" -o "$T/a" -q "$@" 2>"$ERR" && tps split "$src" -o "$T/b" -q --no-mmap "$@" 2>>"$ERR" &&
     same_dirs "$T/a" "$T/b" && { st=0; tps check "$T/a" -q 2>>"$ERR" || st=$?; [ "$st" = "$want" ]; }; then
    ok "mapped and pread splits are identical: $name"
  else
    notok "mapped and pread splits differ: $name"; diag "$ERR"
  fi
}

for c in "$TOP"/testdata/conformance/*/; do
  grep -q '"expect": *"split"' "$c/case.json" || continue
  tp=$(sed -n 's/.*"tp": *\([0-9]*\).*/\1/p' "$c/case.json")
  fam=$(sed -n 's/.*"family": *"\([a-z0-9_]*\)".*/\1/p' "$c/case.json")
  lay=$(sed -n 's/.*"layout": *"\([a-z0-9]*\)".*/\1/p' "$c/case.json")
  both "conformance $(basename "$c") (tp $tp)" "$c/model" --tp "$tp" --family "$fam" ${lay:+--layout "$lay"}
done

# Embeddings of 4.3 MB (two 4 MiB copy tasks in 256 KiB steps) and
# row gathers of many rows; one file and three.
gen llama "$T/big" --hidden 512 --heads 8 --kv-heads 8 --inter 1408 --vocab 4200 --layers 1 --seed 3 >/dev/null
gen llama "$T/bigx" --hidden 256 --heads 8 --kv-heads 4 --inter 704 --vocab 8200 --layers 2 --seed 4 --index 3 >/dev/null
both "large llama at tp 8" "$T/big" --tp 8
both "large llama at tp 4, one thread" "$T/big" --tp 4 --threads 1
sed '/^checks:/,$d' "$TOP/plans/llama.yaml" >"$T/nocheck.yaml"
both "large llama at tp 3 (uneven shards)" "$T/big" --tp 3 --plan "$T/nocheck.yaml"
both "indexed llama at tp 4" "$T/bigx" --tp 4
both "--ranks 1,6" "$T/big" --tp 8 --ranks 1,6
both "--max-part-size 1M" "$T/big" --tp 2 --max-part-size 1M

# Resharding reads a shard directory: tensors made of pieces in rank files.
rm -rf "$T/s8"
tps split "$T/big" --tp 8 -o "$T/s8" -q 2>"$ERR" || { notok "split for reshard"; diag "$ERR"; }
both "reshard tp 8 -> 4 (pieces)" "$T/s8" --tp 4
rm -rf "$T/d4"
if tps split "$T/big" --tp 4 -o "$T/d4" -q 2>"$ERR"; then
  bad=""
  for f in "$T/d4"/model-rank-*.safetensors; do
    cmp -s "$f" "$T/a/$(basename "$f")" || bad="$bad $(basename "$f")"
  done
  [ -z "$bad" ] && ok "reshard through pieces equals a direct split" ||
    notok "reshard through pieces differs from a direct split:$bad"
else
  notok "direct split at tp 4"; diag "$ERR"
fi

both "reshard tp 8 -> 8 (whole pieces)" "$T/s8" --tp 8
both "reshard tp 8 -> 2" "$T/s8" --tp 2

# The command maps by default: bytes it read(2)/pread(2) (rchar of
# /proc/PID/io, read before the child is reaped) stay far below the input's
# size, where --no-mmap reads all of it. --copy in both: rchar also counts
# the bytes copy_file_range copies, and this is about the read path.
rchar() { # ARGS...: prints the rchar of `tpshard ARGS...`
  python3 - "$TPSHARD" "$@" <<'PY'
import os, subprocess, sys
p = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
io = open(f"/proc/{p.pid}/io").read()
p.wait()
print(next(l.split()[1] for l in io.splitlines() if l.startswith("rchar:")) if p.returncode == 0 else -1)
PY
}
if [ -r /proc/self/io ]; then
  size=$(cat "$T/big/model.safetensors" | wc -c)
  rm -rf "$T/a" "$T/b"
  ra=$(rchar split "$T/big" --tp 2 -o "$T/a" -q --copy)
  rb=$(rchar split "$T/big" --tp 2 -o "$T/b" -q --no-mmap --copy)
  if [ "$ra" -ge 0 ] && [ "$rb" -ge "$size" ] && [ $((ra * 2)) -lt "$size" ]; then
    ok "split maps by default (read $ra bytes of $size; --no-mmap read $rb)"
  else
    notok "split does not map by default: read $ra bytes of $size; --no-mmap read $rb"
  fi
else
  ok "split maps by default # SKIP no /proc/self/io"
fi

finish
