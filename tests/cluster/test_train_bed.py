"""Data-parallel training across 2 hosts x 2 ranks (TCP between the hosts): the same weights as one rank
with 4 times the batch, `scaffe train` as a user runs it, and a killed rank that ends the job."""
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy
import pytest

from cluster_jobs import ONE_THREAD, REPO, lenet_solver
from mpi_harness import MPIEXEC, OPEN_MPI, require_ok, run_command
from perf.cluster_sim import MODELLED

TRAIN_WORKER = REPO / "tests" / "scaffe" / "workers" / "train_lenet.py"
ITERATIONS, BATCH, RANKS = 4, 16, 4


@pytest.fixture(scope="module")
def one_rank_weights(mnist, tmp_path_factory):
    """One rank with RANKS times the batch: what every data-parallel run below must reach."""
    out = tmp_path_factory.mktemp("one_rank") / "weights.npz"
    require_ok(run_command([sys.executable, TRAIN_WORKER, "scaffe", ITERATIONS, RANKS * BATCH, out],
                           env=ONE_THREAD, timeout=240), marker=None)
    return numpy.load(out)


def assert_same_weights(got, expected):
    # The S-Caffe schedule's root also reports how many held pieces it updated during a forward.
    assert [name for name in got.files if name != "held_updates_in_forward"] == expected.files
    for name in expected.files:
        scale = max(1.0, float(numpy.abs(expected[name]).max()))
        numpy.testing.assert_allclose(got[name], expected[name], rtol=1e-4, atol=1e-5 * scale)


@pytest.mark.parametrize("schedule", ["scaffe", "allreduce"])
def test_two_hosts_equal_one_rank_big_batch(bed, one_rank_weights, tmp_path, schedule):
    out = tmp_path / "weights.npz"
    require_ok(run_command(bed.command(2, sys.executable, TRAIN_WORKER, schedule, ITERATIONS, BATCH, out),
                           env=ONE_THREAD, timeout=240), marker=None)
    assert_same_weights(numpy.load(out), one_rank_weights)


@pytest.mark.skipif(OPEN_MPI, reason="the one-host launch line is MPICH's")
def test_simulated_nodes_equal_one_rank_big_batch(one_rank_weights, tmp_path):
    """The same check on one host cut into nodes of 2 ranks (SCAFFE_RANKS_PER_NODE): no root needed."""
    out = tmp_path / "weights.npz"
    require_ok(run_command([MPIEXEC, "-n", RANKS, sys.executable, TRAIN_WORKER, "scaffe", ITERATIONS, BATCH, out],
                           env=dict(ONE_THREAD, SCAFFE_RANKS_PER_NODE=2), timeout=240), marker=None)
    assert_same_weights(numpy.load(out), one_rank_weights)


def test_scaffe_train_on_two_hosts(bed, mnist, tmp_path):
    """What a user runs: `scaffe train` on 2 hosts x 2 ranks learns, tests and snapshots."""
    iterations = 40
    solver = lenet_solver(tmp_path, test_interval=iterations)
    job = require_ok(run_command(bed.command(2, sys.executable, "-m", "scaffe", "train", f"--solver={solver}",
                                             f"--iterations={iterations}"), env=ONE_THREAD, timeout=300),
                     marker=None)
    log = job.stdout + job.stderr
    assert "Optimization Done." in log, log[-3000:]
    assert "Data-parallel training on 4 ranks" in log and "2 node(s)" in log, log[-3000:]
    accuracy = [float(line.rsplit("=", 1)[1]) for line in log.splitlines() if "Test net output #0: accuracy" in line]
    assert len(accuracy) == 2 and accuracy[-1] >= 0.8, log[-3000:]
    assert (tmp_path / f"lenet_iter_{iterations}.caffemodel").exists()


def test_modelled_training_on_two_hosts_launched_as_mpirun_rsh(bed, mnist, tmp_path):
    """`jobs/mpirun_rsh.sh -np 4 -hostfile F VAR=VALUE ... scaffe train --compute-profile=k80` on 2 hosts x 2
    ranks (hydra's mpiexec in mpirun_rsh's place, through the bed's launcher), held messages and napping
    waits: every reduced sum and propagated parameter checked for 8 iterations; the root's `Modelled:` line."""
    solver = lenet_solver(tmp_path, test_interval=500)
    state = Path("/run/scaffe-bed") / bed.name
    hostfile = tmp_path / "hosts"
    hostfile.write_text("".join(f"{line.split()[0]}:2\n" for line in (state / "hosts").read_text().splitlines()))
    settings = ["SCAFFE_WAIT=nap", "SCAFFE_TIME_DILATION=2", "SCAFFE_PIECE_BYTES=60000", "SCAFFE_MESSAGE_BYTES=120000",
                "SCAFFE_BACKWARD_BYTES=100000"]
    hydra = dict(ONE_THREAD, HYDRA_LAUNCHER="ssh", HYDRA_LAUNCHER_EXEC=str(state / "launch"),
                 HYDRA_IFACE=f"{bed.name}br", MPIEXEC=str(MPIEXEC))
    job = require_ok(run_command(["bash", str(REPO / "jobs" / "mpirun_rsh.sh"), "-np", "4", "-hostfile", str(hostfile),
                                  *settings, sys.executable, "-m", "scaffe", "train", f"--solver={solver}",
                                  "--iterations=8", "--compute-profile=k80"], env=hydra, timeout=120),
                     marker=None)
    log = job.stdout + job.stderr
    assert "Compute modelled from the k80 model" in log and "Optimization Done." in log, log[-3000:]
    assert "4 ranks on 2 node(s)" in log, log[-3000:]
    modelled = MODELLED.search(log)  # what perf/cluster_sim.py reads of it
    assert modelled is not None and modelled.group(5) == "2", log[-3000:]
    assert 0 < float(modelled.group(6)) < float(modelled.group(7)), log[-3000:]  # one rank's, all ranks' memory


def test_killed_rank_on_second_host_ends_job(bed, mnist, tmp_path):
    solver = lenet_solver(tmp_path, test_interval=100000)
    log_path = tmp_path / "job.log"
    with open(log_path, "w") as log:
        job = subprocess.Popen(bed.command(2, sys.executable, "-m", "scaffe", "train", f"--solver={solver}",
                                           "--iterations=100000"),
                               stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True,
                               env=dict(os.environ, **ONE_THREAD))
    try:
        deadline = time.monotonic() + 180
        while "Iteration 0, lr" not in log_path.read_text():  # the ranks are in the training loop
            assert job.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "training did not start:\n" + log_path.read_text()[-3000:]
            time.sleep(0.2)
        victims = bed.ranks(2)
        assert len(victims) == 2, f"ranks on host 2: {victims}"
        killed_at = time.monotonic()
        subprocess.run(["kill", "-KILL", str(victims[-1])], check=True)
        try:
            returncode = job.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the job still runs 30 s after SIGKILL of one rank:\n" + log_path.read_text()[-3000:])
        deadline = time.monotonic() + 10  # the launcher may return while the other ranks are still exiting
        while (left := [pid for host in (1, 2) for pid in bed.ranks(host)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert returncode != 0 and not left, (returncode, left, log_path.read_text()[-3000:])
        print(f"job ended {time.monotonic() - killed_at:.1f} s after the kill, exit code {returncode}")
    finally:
        if job.poll() is None:
            job.kill()
        bed.cluster("kill")
