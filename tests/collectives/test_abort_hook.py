"""The first `collectives.Comm` installs the abort hook: a program that never calls `install_abort_hook`
still ends when one rank dies, its own hooks still run, and SCAFFE_ABORT_ON_ERROR=0 leaves the hooks alone."""
import os
import re
import time

import pytest

from collectives.settings import switch
from mpi_harness import launch, run_ok

ABORT_WITHIN_S = 10


@pytest.mark.parametrize("mode", ["uncaught", "own-hooks-main", "own-hooks-thread"])
def test_uncaught_exception_ends_the_job(mode):
    job = launch(3, "abort_hook.py", mode, timeout=60, env={"SCAFFE_RANKS_PER_NODE": 2})
    ended = time.time()
    assert not job.timed_out, "the job hung after one rank failed\n" + job.report()
    assert job.returncode != 0, "the job exited 0 after one rank failed\n" + job.report()
    failing_at = re.search(r"FAILING AT ([0-9.]+)", job.stdout)
    assert failing_at, job.report()
    # Timed from the failure, not from the launch: starting Python on a loaded machine is not the hook's.
    assert ended - float(failing_at.group(1)) < ABORT_WITHIN_S, job.report()
    assert "the job went on" not in job.stderr, job.report()
    assert "[rank 1] uncaught exception, aborting the job" in job.stderr, job.report()
    segments = re.search(r"SEGMENTS (.*)", job.stdout).group(1).split()
    assert segments and not any(map(os.path.exists, segments)), job.report()  # MPI_Abort would leave them
    if mode == "own-hooks-main":
        assert "OWN SYS HOOK saw RuntimeError: deliberate failure on rank 1 (main thread)" in job.stderr, job.report()
    if mode == "own-hooks-thread":
        assert "OWN THREAD HOOK saw RuntimeError: deliberate failure on rank 1 (own thread)" in job.stderr, \
            job.report()


def test_opt_out_leaves_the_hooks_alone():
    run_ok(2, "abort_hook.py", "opt-out", env={"SCAFFE_ABORT_ON_ERROR": 0}, timeout=60)


@pytest.mark.parametrize("value,expected", [("", True), ("1", True), (" 0 ", False)])
def test_switch_reads(value, expected, monkeypatch):
    monkeypatch.setenv("SCAFFE_ABORT_ON_ERROR", value)
    assert switch("SCAFFE_ABORT_ON_ERROR", True) is expected


@pytest.mark.parametrize("value", ["yes", "2", "off"])
def test_switch_rejects(value, monkeypatch):
    monkeypatch.setenv("SCAFFE_ABORT_ON_ERROR", value)
    with pytest.raises(ValueError, match="SCAFFE_ABORT_ON_ERROR must be 0 or 1"):
        switch("SCAFFE_ABORT_ON_ERROR", True)
