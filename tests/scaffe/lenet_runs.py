"""Runs of workers/train_lenet.py: several cases in one launch, and launches side by side."""
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("workers") / "train_lenet.py"
MPIEXEC = Path(sys.executable).with_name("mpiexec")


def case_args(cases):
    """train_lenet.py's words for `cases` ((schedule, solver settings) pairs): the first schedule, then after
    the iterations, batch and output file go the rest (the first case's settings, `+ schedule settings`...)."""
    args = []
    for k, (schedule, settings) in enumerate(cases):
        args += (["+"] if k else []) + [schedule] + settings
    return args


def case_file(out, k):
    """Where train_lenet.py saves case k's weights when told `out`: out.npz, out.1.npz, ..."""
    return Path(str(out).replace(".npz", f".{k}.npz" if k else ".npz"))


def side_by_side(jobs, timeout=240):
    """Run every (ranks, python arguments, env) job at once, each of which must succeed: the one-rank reference
    beside the P-rank job, which alone would leave a core idle. Returns their CompletedProcesses."""
    started = []
    for ranks, args, env in jobs:
        full_env = dict(os.environ, OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1", **(env or {}))
        cmd = ([str(MPIEXEC), "-n", str(ranks)] if ranks > 1 else []) + [sys.executable] + args
        started.append(subprocess.Popen(cmd, cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, start_new_session=True))
    try:
        outputs = [process.communicate(timeout=timeout) for process in started]
    finally:
        for process in started:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    for process, (stdout, stderr) in zip(started, outputs):
        assert process.returncode == 0, f"{' '.join(process.args)} failed:\n{stdout[-3000:]}\n{stderr[-3000:]}"
    return [subprocess.CompletedProcess(process.args, process.returncode, *output)
            for process, output in zip(started, outputs)]
