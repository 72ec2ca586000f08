"""Signals as Caffe and batch schedulers expect, whether sent to the launcher or to one rank: SIGINT and
SIGHUP act by --sigint_effect/--sighup_effect on every rank at the same iteration, SIGTERM snapshots
and stops, the job exits 0, and the root alone writes each snapshot atomically with the usual mode."""
import os
import re
import signal
import stat
import time

import pytest

from scaffe import io as sio
from scaffe.solvers.signals import SignalHandler, as_requests, request_flags, requests_from_flags
from training_job import OPEN_MPI, Job, write_tiny_solver

SCHEDULES = ("scaffe", "allreduce")


def snapshots(folder):
    """Iterations of the snapshots in `folder`, checking each has its model and its state."""
    models = sorted(int(re.fullmatch(r"tiny_iter_(\d+)\.caffemodel", p.name).group(1))
                    for p in folder.glob("tiny_iter_*.caffemodel"))
    states = sorted(int(re.fullmatch(r"tiny_iter_(\d+)\.solverstate", p.name).group(1))
                    for p in folder.glob("tiny_iter_*.solverstate"))
    assert models == states, (models, states)
    assert not list(folder.glob(".*.tmp")), "a temporary snapshot file was left behind"
    return models


def usual_mode():
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


@pytest.mark.parametrize("schedule,rank,when", [("scaffe", 1, r"\] Iteration 3 \("),
                                                ("allreduce", 1, r"\] Iteration 3 \("),
                                                ("native", 1, r"\] Iteration 3 \("),
                                                ("scaffe", 0, r"\] Iteration 10, Testing net")])
def test_sigint_to_one_rank_stops_every_rank_after_one_snapshot(tmp_path, schedule, rank, when):
    """To a non-root rank while training, or to the root while the ranks test: the ranks stop together
    at the next iteration (the root alone breaking off its test would leave the others waiting)."""
    solver = write_tiny_solver(tmp_path, extra="test_iter: 400\ntest_interval: 10\ntest_initialization: false")
    with Job(2, ["train", f"--solver={solver}", f"--schedule={schedule}"]) as job:
        job.wait_for(when)
        job.signal_rank(rank, signal.SIGINT)
        sent = time.monotonic()
        assert job.finish(60) == 0, job.log[-3000:]
        assert time.monotonic() - sent < 10, job.log[-3000:]
    assert "Optimization stopped early." in job.log and "Test interrupted." not in job.log
    [iteration] = snapshots(tmp_path)
    assert iteration > 3 and job.log.count("Snapshotting to binary proto file") == 1
    for path in tmp_path.glob("tiny_iter_*"):
        assert stat.S_IMODE(path.stat().st_mode) == usual_mode(), path


@pytest.mark.parametrize("ranks,schedule", [(1, "scaffe"), (2, "scaffe"), (2, "allreduce")])
def test_sighup_snapshots_and_goes_on_then_sigterm_to_the_launcher_snapshots_and_stops(tmp_path, ranks, schedule):
    """SIGHUP to the last rank (with one process: UCX must not take it); then SIGTERM, which hydra's
    mpiexec forwards to every rank, stops even with --sigint_effect=none. (Open MPI's mpirun kills the
    ranks 0.25 s after its SIGTERM, too soon for a snapshot, as the README says: there the test sends
    SIGTERM to every rank, as Slurm's scancel does.)"""
    solver = write_tiny_solver(tmp_path)
    args = ["train", f"--solver={solver}", f"--schedule={schedule}", "--sigint_effect=none"]
    with Job(ranks, args) as job:
        job.wait_for(r"\] Iteration 3 \(")
        job.signal_rank(ranks - 1, signal.SIGHUP)
        index, found = job.wait_for(r"Snapshotting solver state to binary proto file \S*tiny_iter_(\d+)\.solverstate",
                                    timeout=60)
        first = int(found.group(1))
        job.wait_for(rf"\] Iteration {first + 3} \(", timeout=60, start=index)  # training went on
        if OPEN_MPI and ranks > 1:
            for rank in range(ranks):
                job.signal_rank(rank, signal.SIGTERM)
        else:
            job.signal_launcher(signal.SIGTERM)
        sent = time.monotonic()
        assert job.finish(60) == 0, job.log[-3000:]
        assert time.monotonic() - sent < 10, job.log[-3000:]
    assert "Optimization stopped early." in job.log
    iterations = snapshots(tmp_path)
    assert iterations[0] == first and len(iterations) == 2 and iterations[1] > first + 3, iterations
    assert "UCX  DEBUG" not in job.log


def test_signal_handler_requests(tmp_path):
    handler = SignalHandler("none", "stop")
    try:
        assert handler.action() == frozenset()
        os.kill(os.getpid(), signal.SIGINT)  # effect none: nothing requested
        os.kill(os.getpid(), signal.SIGHUP)
        assert handler.action() == {"stop"}
        os.kill(os.getpid(), signal.SIGTERM)  # whatever the effects: snapshot and stop
        assert handler.action() == {"stop", "snapshot"} and handler.action() == frozenset()
    finally:
        handler.restore()
    assert as_requests("none") == frozenset() and as_requests("snapshot") == {"snapshot"}
    assert request_flags({"snapshot"}) == [0, 1]
    assert requests_from_flags([0, 3]) == {"snapshot"} and requests_from_flags([2, 0]) == {"stop"}
    with pytest.raises(ValueError, match="must be one of"):
        as_requests("pause")


def test_atomic_writes_get_the_usual_file_mode(tmp_path):
    old = os.umask(0o022)
    try:
        sio.atomic_write_bytes(tmp_path / "a.bin", b"x")
        os.umask(0o027)
        sio.atomic_write_bytes(tmp_path / "b.bin", b"y")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.bin").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "b.bin").stat().st_mode) == 0o640
