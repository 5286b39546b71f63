#!/bin/sh
# Splits MODEL over TP ranks with TASKS Slurm array tasks writing into OUT,
# then checks OUT once they have all finished:
#
#   MODEL=/models/Llama-3.1-70B OUT=/shared/llama70b-tp8 TP=8 TASKS=4 sh submit.sh
#
# TASKS defaults to TP (one rank per task), or TP x PP with PP pipeline stages
# (LAYOUT=vllm PP=2 TASKS=2: one stage, one node's files, a task). Extra sbatch options (partition,
# account) go in SBATCH_PARTITION, SBATCH_ACCOUNT and the like, which sbatch
# reads from the environment.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
: "${MODEL:?set MODEL}" "${OUT:?set OUT}" "${TP:?set TP}"
tasks=${TASKS:-$((TP * ${PP:-1}))}
split=$(sbatch --parsable --export=ALL --array="0-$((tasks - 1))" "$here/split.sbatch")
check=$(sbatch --parsable --export=ALL --dependency="afterany:${split%%;*}" "$here/check.sbatch")
echo "split: job array ${split%%;*} ($tasks tasks), check: job ${check%%;*}"
