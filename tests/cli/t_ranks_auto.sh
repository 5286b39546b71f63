#!/bin/sh
# split --ranks auto: each launched task takes its share of the ranks from the
# launcher's variables (precedence, contiguous groups, extra tasks, bad
# values), and tasks running at the same time into one directory leave the
# bytes and the manifest of one split; a task killed mid-split leaves the
# directory partial for check (exit 3), never complete, until it runs again.
. "$TOP/tests/cli/lib.sh"
L="$TOP/testdata/conformance/llama-tp4-uneven-vocab/model"
TASKS="python3 $TOP/tests/cli/tasks.py"
# No launcher variable of the caller's own environment may leak in.
unset RANK WORLD_SIZE OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE SLURM_PROCID SLURM_NTASKS \
  SLURM_ARRAY_TASK_ID SLURM_ARRAY_TASK_COUNT SLURM_ARRAY_TASK_MIN SLURM_ARRAY_TASK_STEP

# ranks_of ENV...: the ranks `split --ranks auto` writes at tp 8 under ENV
# (from its manifest), or "none", or "exit N".
ranks_of() {
  rm -rf "$T/r"
  st=0
  env "$@" "$TPSHARD" split "$L" --tp 8 --layout vllm -o "$T/r" --ranks auto -q 2>"$ERR" || st=$?
  if [ "$st" != 0 ]; then echo "exit $st"; return; fi
  [ -f "$T/r/tpshard.json" ] || { echo none; return; }
  python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["ranks_written"])))' "$T/r/tpshard.json"
}
# share NAME WANT ENV...: --ranks auto under ENV writes ranks WANT.
share() {
  name=$1 want=$2; shift 2
  got=$(ranks_of "$@")
  [ "$got" = "$want" ] && ok "--ranks auto: $name: $want" || { notok "--ranks auto: $name: got '$got', want '$want'"; diag "$ERR"; }
}
share "RANK/WORLD_SIZE, task 1 of 4" 2,3 RANK=1 WORLD_SIZE=4
share "uneven: task 0 of 3 gets one more" 0,1,2 RANK=0 WORLD_SIZE=3
share "uneven: task 2 of 3" 6,7 RANK=2 WORLD_SIZE=3
share "one task writes every rank" 0,1,2,3,4,5,6,7 RANK=0 WORLD_SIZE=1
share "Open MPI" 4,5 OMPI_COMM_WORLD_RANK=2 OMPI_COMM_WORLD_SIZE=4
share "MPICH (PMI)" 7 PMI_RANK=7 PMI_SIZE=8
share "srun" 6,7 SLURM_PROCID=3 SLURM_NTASKS=4
share "a Slurm job array" 2,3 SLURM_ARRAY_TASK_ID=1 SLURM_ARRAY_TASK_COUNT=4
share "a job array counted from 1" 0,1 SLURM_ARRAY_TASK_ID=1 SLURM_ARRAY_TASK_COUNT=4 SLURM_ARRAY_TASK_MIN=1
share "a job array in steps of 10" 4,5 SLURM_ARRAY_TASK_ID=20 SLURM_ARRAY_TASK_COUNT=4 SLURM_ARRAY_TASK_MIN=0 SLURM_ARRAY_TASK_STEP=10
share "a job array's batch step (SLURM_PROCID=0 of 1) defers to the array" 6,7 \
  SLURM_PROCID=0 SLURM_NTASKS=1 SLURM_ARRAY_TASK_ID=3 SLURM_ARRAY_TASK_COUNT=4
share "torchrun under srun: RANK wins over the node's SLURM_PROCID" 5 \
  SLURM_PROCID=1 SLURM_NTASKS=2 RANK=5 WORLD_SIZE=8
share "mpirun in a batch job: Open MPI wins over SLURM_NTASKS" 3 \
  SLURM_PROCID=0 SLURM_NTASKS=8 OMPI_COMM_WORLD_RANK=3 OMPI_COMM_WORLD_SIZE=8
share "task 9 of 10 at tp 8: nothing to write" none RANK=9 WORLD_SIZE=10
share "no launcher variable: usage error" "exit 2"
expect_stderr_has "RANK" "the error says which variables to set"
share "RANK without WORLD_SIZE" "exit 2" RANK=1
expect_stderr_has "WORLD_SIZE is not" "the error names the missing variable"
share "RANK beyond WORLD_SIZE" "exit 2" RANK=4 WORLD_SIZE=4
share "a RANK that is not a number" "exit 2" RANK=one WORLD_SIZE=4
share "a job array id off its steps" "exit 2" SLURM_ARRAY_TASK_ID=5 SLURM_ARRAY_TASK_COUNT=4 SLURM_ARRAY_TASK_STEP=10
expect_stderr_has "SLURM_ARRAY_TASK_ID=5" "the error names the array variable"

# The note says which task this is and what it writes; an extra task says it writes nothing.
run env RANK=1 WORLD_SIZE=3 "$TPSHARD" split "$L" --tp 8 -o "$T/note" --ranks auto
expect_stderr_has "task 1 of 3 (RANK/WORLD_SIZE): ranks 3-5 of 8" "split names the task and its ranks"
run env RANK=5 WORLD_SIZE=6 "$TPSHARD" split "$L" --tp 4 -o "$T/extra" --ranks auto
[ "$RC" = 0 ] && grep -q "no rank to write" "$ERR" && grep -q "^wrote nothing" "$OUT" && [ ! -e "$T/extra" ] &&
  ok "a task beyond the last rank writes nothing, exits 0 and says so" ||
  { notok "extra task"; diag "$OUT"; diag "$ERR"; }

# Concurrent tasks into one directory: the bytes and the manifest of one split.
gen llama "$T/big" --hidden 256 --heads 8 --kv-heads 8 --inter 704 --vocab 4200 --layers 2 --seed 3 >/dev/null
# same_as_one REF DIR: DIR holds exactly REF's files (and the tasks' lock), each byte-identical.
same_as_one() {
  (cd "$1" && ls -A) >"$T/.la"; (cd "$2" && ls -A | grep -vx '.tpshard.lock') >"$T/.lb"
  cmp -s "$T/.la" "$T/.lb" || { echo "#   files differ:"; diff "$T/.la" "$T/.lb" | head -n 8 | sed 's/^/#   /'; return 1; }
  for f in $(cat "$T/.la"); do cmp -s "$1/$f" "$2/$f" || { echo "#   $f differs"; return 1; }; done
}
# together NAME LAUNCHER N TP ARGS...: N tasks at once, compared with one split.
together() {
  name=$1 launcher=$2 n=$3 tp=$4; shift 4
  rm -rf "$T/one" "$T/many"
  "$TPSHARD" split "$T/big" --tp "$tp" -o "$T/one" -q "$@" 2>"$ERR" || { notok "$name: one split"; diag "$ERR"; return; }
  $TASKS "$launcher" "$n" -- "$TPSHARD" split "$T/big" --tp "$tp" -o "$T/many" --ranks auto -q "$@" >"$T/.tasks" 2>"$ERR"
  if grep '^task ' "$T/.tasks" | grep -v ': exit 0$' | grep -q .; then notok "$name: every task exits 0"; diag "$T/.tasks"; diag "$ERR"; return; fi
  if same_as_one "$T/one" "$T/many" && tps check "$T/many" -q 2>"$ERR"; then
    ok "$name: rank files and tpshard.json byte-identical to one split; check exits 0"
  else
    notok "$name: the union differs from one split"; diag "$ERR"
  fi
}
for round in 1 2 3; do
  together "8 torchrun tasks at tp 8 (round $round)" torchrun 8 8
done
together "3 Slurm array tasks at tp 8 (3, 3, 2 ranks)" slurm-array 3 8
together "11 mpirun tasks at tp 8 (3 with nothing to write)" mpirun 11 8
together "4 srun tasks at tp 8, vllm layout" srun 4 8 --layout vllm
together "5 torchrun tasks at tp 8, parts of 256K, one thread each" torchrun 5 8 --max-part-size 256K --threads 1

# A task killed mid-split (SIGKILL): check reports the directory partial
# (exit 3, the task's ranks missing), never complete; the task run again
# completes it, byte for byte.
rm -rf "$T/one"
"$TPSHARD" split "$T/big" --tp 8 -o "$T/one" -q 2>"$ERR" || notok "one split for the kill test"
killed=""
for attempt in 1 2 3 4 5; do
  rm -rf "$T/k"
  $TASKS torchrun 4 --kill 2 --dir "$T/k" -- "$TPSHARD" split "$T/big" --tp 8 -o "$T/k" --ranks auto -q --threads 1 \
    >"$T/.tasks" 2>"$ERR"
  grep -q '^task 2: exit -9$' "$T/.tasks" && { killed=1; break; }
done
if [ -z "$killed" ]; then
  notok "kill a task mid-split (it finished first 5 times)"; diag "$T/.tasks"
else
  grep '^task ' "$T/.tasks" | grep -v '^task 2:' | grep -v ': exit 0$' | grep -q . && { notok "the other tasks exit 0"; diag "$T/.tasks"; }
  run tps check "$T/k" --json
  if [ "$RC" = 3 ] && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["missing_ranks"] == "4,5", d' "$OUT"; then
    ok "check after a task was killed: partial (exit 3), ranks 4,5 missing"
  else
    notok "check after a task was killed: exit $RC"; diag "$OUT"; diag "$ERR"
  fi
  run tps check "$T/k"
  grep -q '^partial: ' "$OUT" && ! grep -q '^ok' "$OUT" && ok "check says partial, not ok" ||
    { notok "check's report of the killed task's directory"; diag "$OUT"; }
  expect_exit 1 "merge refuses the partial directory" -- tps merge "$T/k" -o "$T/km"
  expect_exit 3 "verify refuses the partial directory (exit 3, as check)" -- tps verify "$T/k" --source "$T/big"
  # The scheduler runs the task again.
  run env RANK=2 WORLD_SIZE=4 "$TPSHARD" split "$T/big" --tp 8 -o "$T/k" --ranks auto -q
  if [ "$RC" = 0 ] && same_as_one "$T/one" "$T/k" && tps check "$T/k" -q 2>"$ERR"; then
    ok "the killed task run again completes the directory, byte-identical to one split"
  else
    notok "the killed task run again: exit $RC"; diag "$ERR"; ls -A "$T/k" | diag
  fi
fi

# A task that renamed its rank files but was killed before it recorded them
# in the manifest: those files are not the manifest's, the ranks missing.
rm -rf "$T/p"
env RANK=0 WORLD_SIZE=2 "$TPSHARD" split "$T/big" --tp 8 -o "$T/p" --ranks auto -q 2>"$ERR"
cp "$T/one/model-rank-5-part-0.safetensors" "$T/p/"
run tps check "$T/p"
[ "$RC" = 3 ] && grep -q "4,5,6,7" "$OUT" && ok "rank files the manifest does not record count as missing" ||
  { notok "unrecorded rank files: exit $RC"; diag "$OUT"; diag "$ERR"; }
finish
