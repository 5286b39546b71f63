#!/bin/sh
# The recipes in examples/ run as written:
#  - the GitHub Actions workflow's `run:` steps, in order, from the file
#    (tests/cli/gha.py), with its variables unset (dtensor), with the vllm
#    layout, and at a TP size the model refuses (the gate fails the job with
#    tpshard's reason and nothing is split);
#  - the Slurm array script, as N concurrent tasks with the variables Slurm
#    sets (tests/cli/tasks.py), then the check script; a task killed
#    mid-split leaves the check failing with "partial" until it runs again;
#    submit.sh against a stand-in sbatch that records what it is asked;
#  - the launcher script under torchrun's and mpirun's variables.
. "$TOP/tests/cli/lib.sh"
L="$TOP/testdata/conformance/llama-tp4-uneven-vocab/model"
EX="$TOP/examples"
TASKS="python3 $TOP/tests/cli/tasks.py"
unset RANK WORLD_SIZE OMPI_COMM_WORLD_RANK OMPI_COMM_WORLD_SIZE PMI_RANK PMI_SIZE SLURM_PROCID SLURM_NTASKS \
  SLURM_ARRAY_TASK_ID SLURM_ARRAY_TASK_COUNT SLURM_ARRAY_TASK_MIN SLURM_ARRAY_TASK_STEP

# keep_json FILE STATUS ARGS...: hands a report the recipes wrote (by
# `tpshard ARGS... --json`, which exited STATUS) to the schema test, as `tps`
# does for the runs it makes.
keep_json() {
  f=$1 st=$2; shift 2
  [ -n "${TPS_JSON_DIR:-}" ] && [ -s "$f" ] || return 0
  mkdir -p "$TPS_JSON_DIR" && k=$(mktemp "$TPS_JSON_DIR/t_recipes.XXXXXX") || return 0
  cp "$f" "$k" && printf '%s\n' "$@" --json >"$k.args" && echo "$st" >"$k.rc"
}
# same_as_one REF DIR: DIR holds REF's files (and the tasks' lock), each byte-identical.
same_as_one() {
  (cd "$1" && ls -A) >"$T/.la"; (cd "$2" && ls -A | grep -vx '.tpshard.lock') >"$T/.lb"
  cmp -s "$T/.la" "$T/.lb" || { echo "#   files differ:"; diff "$T/.la" "$T/.lb" | head -n 8 | sed 's/^/#   /'; return 1; }
  for f in $(cat "$T/.la"); do cmp -s "$1/$f" "$2/$f" || { echo "#   $f differs"; return 1; }; done
}

# ---------------------------------------------------------------- the workflow
WF="$EX/github-actions/tpshard-deploy.yml"
# PyYAML: Debian's python3-yaml, else the test venv (made here when missing:
# the cli tests run before the py group would make it).
PY=""
why=""
python3 -c 'import yaml' 2>/dev/null && PY=python3
if [ -z "$PY" ] && [ "${TPS_OFFLINE:-0}" != 1 ]; then
  why=$(sh "$TOP/tests/py/venv.sh" 2>&1) && PY="$TOP/build/venv/bin/python"
fi
# workflow NAME VARS...: runs the workflow's steps in a fresh workspace (what
# actions/checkout and the build step leave: the tree's testdata and ./tpshard).
workflow() {
  name=$1; shift
  rm -rf "$T/ws" && mkdir -p "$T/ws" && ln -s "$TPSHARD" "$T/ws/tpshard" && ln -s "$TOP/testdata" "$T/ws/testdata"
  RC=0
  "$PY" "$TOP/tests/cli/gha.py" "$WF" deploy "$T/ws" --skip deps,build "$@" >"$OUT" 2>"$ERR" || RC=$?
}
if [ -z "$PY" ]; then
  if [ "${TPS_OFFLINE:-0}" = 1 ]; then
    echo "skip - the workflow's steps: no PyYAML (python3-yaml) and TPS_OFFLINE=1 (the venv would have it)"
  else
    notok "the workflow's steps: no Python with PyYAML: $(echo "$why" | tail -n 1) (apt-get install python3-yaml, or run once with network)"
  fi
else
  workflow default
  R="$T/ws/deploy/reports"
  if [ "$RC" = 0 ] && [ -f "$T/ws/deploy/shards/tpshard.json" ] && [ -f "$R/verify.json" ] &&
     grep -q '^## Install the build dependencies (deps): skipped here' "$OUT" &&
     grep -q '^## Build tpshard (build): skipped here' "$OUT"; then
    ok "workflow: its steps run as written, gate to verify, default layout"
  else
    notok "workflow: default run (exit $RC)"; diag "$OUT"; diag "$ERR"
  fi
  python3 -c '
import json, sys
r = sys.argv[1]
s = json.load(open(r + "/split.json")); c = json.load(open(r + "/check.json")); v = json.load(open(r + "/verify.json"))
assert s["layout"] == "dtensor" and s["tp"] == 4 and s["ranks_written"] == 4, s
assert c["missing_ranks"] == "" and v["ok"] and v["source"], (c, v)' "$R" 2>"$T/.py" &&
    ok "workflow: dtensor at tp 4, checked and verified, reports kept" || { notok "workflow: reports"; diag "$T/.py"; }
  grep -q '^## Upload the directory (.*): would upload tpshard-dtensor-tp4: deploy/shards$' "$OUT" &&
    grep -q 'would upload tpshard-manifest: deploy/shards/tpshard.json, deploy/reports' "$OUT" &&
    ok "workflow: the artifacts are the directory, the manifest and the reports" ||
    { notok "workflow: artifacts"; diag "$OUT"; }
  keep_json "$R/plan.json" 0 plan "$L" --tp 4 --layout dtensor
  keep_json "$R/split.json" 0 split "$L" --tp 4 --layout dtensor -o shards
  keep_json "$R/check.json" 0 check shards
  keep_json "$R/verify.json" 0 verify shards --source "$L"

  workflow vllm --var TPSHARD_LAYOUT=vllm
  [ "$RC" = 0 ] && python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["layout"] == "vllm" and d["target"].startswith("vllm")' \
    "$T/ws/deploy/reports/split.json" && grep -q 'tpshard-vllm-tp4' "$OUT" &&
    ok "workflow: TPSHARD_LAYOUT=vllm splits for vLLM" || { notok "workflow: vllm (exit $RC)"; diag "$OUT"; diag "$ERR"; }
  keep_json "$T/ws/deploy/reports/verify.json" 0 verify shards --source "$L"

  workflow refused --var TPSHARD_TP=8
  if [ "$RC" = 1 ] && grep -q '^step gate failed' "$OUT" &&
     grep -q '^::error title=tpshard refuses .* at tp 8 (dtensor)::num_key_value_heads % tp == 0' "$OUT" &&
     grep -q '^## Split (split): not run' "$OUT" && [ ! -e "$T/ws/deploy/shards" ] &&
     grep -q 'would upload tpshard-manifest' "$OUT"; then
    ok "workflow: TPSHARD_TP=8 fails the job at the gate with tpshard's reason; nothing split, the plan report kept"
  else
    notok "workflow: the gate at tp 8 (exit $RC)"; diag "$OUT"; diag "$ERR"
  fi
  keep_json "$T/ws/deploy/reports/plan.json" 1 plan "$L" --tp 8 --layout dtensor

  workflow vllm-tp8 --var TPSHARD_TP=8 --var TPSHARD_LAYOUT=vllm
  [ "$RC" = 0 ] && ok "workflow: vllm at tp 8 (KV heads replicated) passes where dtensor is refused" ||
    { notok "workflow: vllm at tp 8 (exit $RC)"; diag "$OUT"; diag "$ERR"; }
fi

# ---------------------------------------------------------------- Slurm
gen llama "$T/big" --hidden 256 --heads 8 --kv-heads 8 --inter 704 --vocab 4200 --layers 2 --seed 5 >/dev/null
export MODEL="$T/big" TP=8 TPSHARD
"$TPSHARD" split "$MODEL" --tp 8 -o "$T/one" -q 2>"$ERR" || { notok "one split"; diag "$ERR"; }
SD="$T/slurm" # the shared output directory (OUT of the scripts)
for n in 3 8 12; do
  rm -rf "$SD"
  OUT="$SD" $TASKS slurm-array "$n" -- bash "$EX/slurm/split.sbatch" >"$T/.tasks" 2>"$ERR"
  st=0; OUT="$SD" bash "$EX/slurm/check.sbatch" >"$T/.check" 2>>"$ERR" || st=$?
  if ! grep '^task ' "$T/.tasks" | grep -v ': exit 0$' | grep -q . && [ "$st" = 0 ] && grep -q '^ok: ' "$T/.check" &&
     same_as_one "$T/one" "$SD"; then
    ok "slurm: split.sbatch as $n array tasks at tp 8, then check.sbatch: complete, byte-identical to one split"
  else
    notok "slurm: $n array tasks (check exit $st)"; diag "$T/.tasks"; diag "$T/.check"; diag "$ERR"
  fi
done
rm -rf "$SD"
OUT="$SD" LAYOUT=vllm $TASKS slurm-array 4 -- bash "$EX/slurm/split.sbatch" >"$T/.tasks" 2>"$ERR"
st=0; OUT="$SD" bash "$EX/slurm/check.sbatch" >"$T/.check" 2>>"$ERR" || st=$?
[ "$st" = 0 ] && grep -q '"target": "vllm' "$SD/tpshard.json" &&
  ok "slurm: LAYOUT=vllm, 4 array tasks, complete" || { notok "slurm: vllm (check exit $st)"; diag "$T/.tasks"; diag "$ERR"; }

# An array task killed mid-split: check.sbatch fails, partial; the task run again completes the directory.
killed=""
for attempt in 1 2 3 4 5; do
  rm -rf "$SD"
  OUT="$SD" $TASKS slurm-array 4 --kill 1 --dir "$SD" -- bash "$EX/slurm/split.sbatch" >"$T/.tasks" 2>"$ERR"
  grep -q '^task 1: exit -9$' "$T/.tasks" && { killed=1; break; }
done
if [ -z "$killed" ]; then
  notok "slurm: kill an array task mid-split (it finished first 5 times)"; diag "$T/.tasks"
else
  st=0; OUT="$SD" bash "$EX/slurm/check.sbatch" >"$T/.check" 2>>"$ERR" || st=$?
  [ "$st" = 3 ] && grep -q '^partial: rank(s) 2,3 ' "$T/.check" &&
    ok "slurm: an array task killed mid-split: check.sbatch exits 3, partial, ranks 2,3 missing" ||
    { notok "slurm: check after a killed task: exit $st"; diag "$T/.check"; diag "$ERR"; }
  OUT="$SD" SLURM_ARRAY_TASK_ID=1 SLURM_ARRAY_TASK_COUNT=4 bash "$EX/slurm/split.sbatch" 2>"$ERR" ||
    notok "slurm: rerun task 1"
  st=0; OUT="$SD" bash "$EX/slurm/check.sbatch" >"$T/.check" 2>>"$ERR" || st=$?
  [ "$st" = 0 ] && same_as_one "$T/one" "$SD" &&
    ok "slurm: the killed task run again: complete, byte-identical to one split" ||
    { notok "slurm: after the rerun: check exit $st"; diag "$T/.check"; diag "$ERR"; }
fi

# submit.sh queues the array and, after it, the check, with a stand-in sbatch.
mkdir -p "$T/bin"
cat >"$T/bin/sbatch" <<'EOF'
#!/bin/sh
echo "$*" >>"$SBATCH_LOG"
n=$(wc -l <"$SBATCH_LOG"); echo "$((1000 + n));cluster"
EOF
chmod +x "$T/bin/sbatch"
OUT="$SD" SBATCH_LOG="$T/sbatch.log" TASKS=3 PATH="$T/bin:$PATH" sh "$EX/slurm/submit.sh" >"$T/.submit" 2>"$ERR"
if grep -q -- "--array=0-2 $EX/slurm/split.sbatch" "$T/sbatch.log" &&
   grep -q -- "--dependency=afterany:1001 $EX/slurm/check.sbatch" "$T/sbatch.log"; then
  ok "slurm: submit.sh queues 3 array tasks, then the check after all of them"
else
  notok "slurm: submit.sh"; diag "$T/sbatch.log"; diag "$T/.submit"; diag "$ERR"
fi

# ---------------------------------------------------------------- torchrun / mpirun
for launcher in torchrun mpirun; do
  LD="$T/$launcher"
  OUT="$LD" THREADS=1 $TASKS "$launcher" 5 -- "$EX/launch/split-task.sh" >"$T/.tasks" 2>"$ERR"
  st=0; "$TPSHARD" check "$LD" -q 2>>"$ERR" || st=$?
  if ! grep '^task ' "$T/.tasks" | grep -v ': exit 0$' | grep -q . && [ "$st" = 0 ] && same_as_one "$T/one" "$LD"; then
    ok "launch: split-task.sh as 5 $launcher processes at tp 8, then check: complete, byte-identical to one split"
  else
    notok "launch: $launcher (check exit $st)"; diag "$T/.tasks"; diag "$ERR"
  fi
done
finish
