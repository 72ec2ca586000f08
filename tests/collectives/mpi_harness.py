"""Runs an MPI worker script under `mpiexec -n N` in a subprocess, with a timeout: a hang is a failure.

The mpiexec is the one next to the running Python (the project's virtualenv, MPICH's wheel). The job
runs in its own process group, which is killed as a whole on timeout, so no rank outlives its test.
"""
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

WORKERS = Path(__file__).resolve().parent / "workers"
REPO = Path(__file__).resolve().parents[2]
# Variables that change what the collectives do; a test sets the ones it means and inherits none.
_OWN_VARIABLES = ("SCAFFE_", "MPI4PY_RC_")


def find_mpiexec():
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        pytest.skip("no mpiexec next to the Python interpreter or on PATH", allow_module_level=True)
    return found


def _is_open_mpi(mpiexec):
    try:
        banner = subprocess.run([mpiexec, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in banner or "OpenRTE" in banner


MPIEXEC = find_mpiexec()
OPEN_MPI = _is_open_mpi(MPIEXEC)


@dataclass
class Job:
    command: list
    env_shown: dict
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    timed_out: bool

    def report(self):
        settings = " ".join(f"{k}={v}" for k, v in sorted(self.env_shown.items()))
        status = f"TIMED OUT after {self.seconds:.0f} s" if self.timed_out else f"exit code {self.returncode}"
        return (f"{settings} {' '.join(self.command)}\n{status}\n"
                f"--- stdout ---\n{self.stdout[-6000:]}\n--- stderr ---\n{self.stderr[-12000:]}")


def launch(ranks, script, *args, env=None, timeout=60):
    """Run workers/<script> on `ranks` ranks; returns the finished Job (never raises on failure)."""
    command = [MPIEXEC, "-n", str(ranks)]
    launcher_env = {}
    if OPEN_MPI:
        command.append("--oversubscribe")
        launcher_env = dict(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                            OMPI_MCA_rmaps_base_oversubscribe="1")
    command += [sys.executable, str(WORKERS / script), *map(str, args)]
    return run_command(command, env=env, timeout=timeout, launcher_env=launcher_env)


def run_command(command, env=None, timeout=60, launcher_env=None):
    """Run `command` (a launcher and what it starts) in its own process group with `env` on top of ours,
    less the variables that change what the collectives do; returns the finished Job."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(_OWN_VARIABLES)}
    full_env.update(launcher_env or {})
    # The table's picks, not the measured ones (plans.Trial), unless a test asks: the tests check what each
    # algorithm computes, and some compare bytes from run to run.
    full_env["SCAFFE_CHOICE"] = "table"
    shown = {k: str(v) for k, v in (env or {}).items() if v is not None}
    full_env.update(shown)
    full_env["PYTHONUNBUFFERED"] = "1"
    # The worker prints where each rank is stuck a little before we kill it.
    full_env["SCAFFE_TEST_WATCHDOG_S"] = str(max(1.0, timeout - 3))
    command = [str(part) for part in command]
    started = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=full_env, cwd=REPO, start_new_session=True)
    timed_out = False
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        stdout, stderr = process.communicate()
    shown_command = [Path(command[0]).name] + command[1:]
    return Job(shown_command, shown, process.returncode, stdout, stderr, time.monotonic() - started, timed_out)


def settings_of(per_node, algo, **extra):
    """A worker's --settings value (worker_util.each_setting): one pass on a communicator made under this
    topology, algorithm and any other collectives setting (None unsets a variable of the launch)."""
    values = dict(SCAFFE_RANKS_PER_NODE=per_node, SCAFFE_REDUCE_ALGO=algo, **extra)
    return ",".join(f"{name}={'' if value is None else value}" for name, value in values.items())


def settings_words(topologies):
    """A worker's --settings words for each (SCAFFE_RANKS_PER_NODE, SCAFFE_REDUCE_ALGO) of `topologies`."""
    return [word for per_node, algo in topologies for word in ("--settings", settings_of(per_node, algo))]


def run_ok(ranks, script, *args, env=None, timeout=60, passes=None):
    """Run a worker that must succeed, and finish `passes` passes (WORKER-OK lines) where it runs several;
    fails the test with its output otherwise."""
    job = require_ok(launch(ranks, script, *args, env=env, timeout=timeout))
    finished = job.stdout.count("WORKER-OK")
    if passes is not None and finished != passes:
        pytest.fail(f"{finished} of {passes} passes finished\n" + job.report(), pytrace=False)
    return job


def require_ok(job, marker="WORKER-OK"):
    """`job`, which must have ended well (with the `marker` line of a worker, unless None); fails the test
    with its output otherwise."""
    if job.timed_out or job.returncode != 0 or (marker is not None and marker not in job.stdout):
        pytest.fail(job.report(), pytrace=False)
    return job
