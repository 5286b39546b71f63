#!/bin/sh
# What each process of a launcher runs to split a checkpoint together: its
# share of the ranks, written into one output directory (shared by every
# node). tpshard split --ranks auto reads the task from the launcher, the
# innermost first: RANK/WORLD_SIZE (torchrun), OMPI_COMM_WORLD_RANK/SIZE
# (Open MPI), PMI_RANK/PMI_SIZE (MPICH, Intel MPI), SLURM_PROCID/SLURM_NTASKS
# (srun). Launch it, then check the directory once the launcher returns:
#
#   torchrun --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \
#     --no-python examples/launch/split-task.sh
#   mpirun -np 8 -x MODEL -x OUT -x TP examples/launch/split-task.sh
#   srun -n 8 examples/launch/split-task.sh
#   tpshard check "$OUT"        # 0 complete; 3 partial: a task did not finish
#
# Environment: MODEL, OUT, TP; LAYOUT (default dtensor); THREADS (copy
# threads per process; default all cores: set it when processes share a
# node); TPSHARD (default: tpshard on PATH).
set -eu
: "${MODEL:?set MODEL to the checkpoint to split}"
: "${OUT:?set OUT to the output directory, shared by every node}"
: "${TP:?set TP to the tensor-parallel size}"
exec "${TPSHARD:-tpshard}" split "$MODEL" --tp "$TP" --layout "${LAYOUT:-dtensor}" -o "$OUT" --ranks auto \
  ${THREADS:+--threads "$THREADS"}
