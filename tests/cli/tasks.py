"""Runs a command as N concurrent tasks of a launcher, on this machine: the
scheduler replaced by the environment variables it would set.

  tasks.py LAUNCHER N [--kill K --dir DIR] -- COMMAND...

LAUNCHER: slurm-array (SLURM_ARRAY_TASK_ID/COUNT/MIN/MAX/STEP and
SLURM_ARRAY_JOB_ID, and SLURM_PROCID=0 SLURM_NTASKS=1 as a batch step has
them), srun (SLURM_PROCID/SLURM_NTASKS), torchrun (RANK/WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR/PORT), mpirun (OMPI_COMM_WORLD_RANK/SIZE,
OMPI_COMM_WORLD_LOCAL_RANK). Every task starts at once, in its own process
group. With --kill K, task K's group gets SIGKILL as soon as a temporary rank
file of one of its processes appears in DIR (the task is then mid-split).

The tasks' standard output goes to standard error. Prints "task I: exit S" per task (S -9 for the killed one; "task K: finished
before it could be killed" when it was too quick) and exits 0.
"""
import os
import signal
import subprocess
import sys
import time


def env_for(launcher, i, n):
    e = {}
    if launcher == "slurm-array":
        e.update(SLURM_ARRAY_JOB_ID="4242", SLURM_ARRAY_TASK_ID=str(i), SLURM_ARRAY_TASK_COUNT=str(n),
                 SLURM_ARRAY_TASK_MIN="0", SLURM_ARRAY_TASK_MAX=str(n - 1), SLURM_ARRAY_TASK_STEP="1",
                 SLURM_JOB_ID=str(4243 + i), SLURM_PROCID="0", SLURM_NTASKS="1", SLURM_CPUS_PER_TASK="2")
    elif launcher == "srun":
        e.update(SLURM_JOB_ID="4242", SLURM_PROCID=str(i), SLURM_NTASKS=str(n), SLURM_LOCALID=str(i))
    elif launcher == "torchrun":
        e.update(RANK=str(i), WORLD_SIZE=str(n), LOCAL_RANK=str(i), LOCAL_WORLD_SIZE=str(n),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    elif launcher == "mpirun":
        e.update(OMPI_COMM_WORLD_RANK=str(i), OMPI_COMM_WORLD_SIZE=str(n), OMPI_COMM_WORLD_LOCAL_RANK=str(i))
    else:
        raise SystemExit(f"tasks.py: unknown launcher {launcher}")
    return e


def group_pids(pgid):
    """The processes of a process group (Linux /proc)."""
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if os.getpgid(int(p)) == pgid:
                    out.append(int(p))
            except OSError:
                pass
    return out


def main(argv):
    if "--" not in argv or len(argv) < 3:
        print(__doc__)
        return 2
    cmd = argv[argv.index("--") + 1:]
    opts = argv[:argv.index("--")]
    launcher, n = opts[0], int(opts[1])
    kill = int(opts[opts.index("--kill") + 1]) if "--kill" in opts else -1
    d = opts[opts.index("--dir") + 1] if "--dir" in opts else None
    # No launcher variables of the caller's own may leak into the tasks.
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "OMPI_", "PMI_")) and k not in ("RANK", "WORLD_SIZE")}
    procs = []
    for i in range(n):
        # The tasks' output goes to standard error: standard output is this script's report.
        procs.append(subprocess.Popen(cmd, env={**base, **env_for(launcher, i, n)}, start_new_session=True,
                                      stdout=sys.stderr.fileno()))
    if kill >= 0:
        victim = procs[kill]
        deadline = time.monotonic() + 60
        caught = False
        while victim.poll() is None and time.monotonic() < deadline and not caught:
            pids = {str(p) for p in group_pids(victim.pid)}
            try:
                names = os.listdir(d)
            except OSError:
                names = []
            if any(x.startswith(".model-rank-") and x.rsplit(".", 1)[-1] in pids for x in names):
                os.killpg(victim.pid, signal.SIGKILL)
                caught = True
            else:
                time.sleep(0.0005)
        if not caught:
            print(f"task {kill}: finished before it could be killed")
    for i, p in enumerate(procs):
        print(f"task {i}: exit {p.wait()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
