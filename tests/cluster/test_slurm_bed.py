"""Slurm on the bed (jobs/cluster.sh up --slurm: slurmctld, one slurmd per host): srun starts the MPI
ranks through PMI-2, each finds its local rank in SLURM_LOCALID, and `srun -N 2 -n 4 scaffe train` trains.
Skips where Slurm is not installed or does not start."""
import sys
from pathlib import Path

import pytest

from cluster_jobs import LOCAL_RANK_WORKER, ONE_THREAD, lenet_solver, local_ranks
from mpi_harness import require_ok, run_command
from conftest import bed_of_two


@pytest.fixture(scope="module")
def slurm_bed():
    yield from bed_of_two(slurm=True)


def test_srun_local_ranks(slurm_bed):
    job = require_ok(run_command(slurm_bed.srun_command("-N", 2, "-n", 4, sys.executable, LOCAL_RANK_WORKER),
                                 timeout=90))
    assert local_ranks(job) == [[[0, 0], [1, 1]], [[0, 0], [1, 1]]]


def test_srun_scaffe_train(slurm_bed, mnist, tmp_path):
    iterations = 20
    solver = lenet_solver(tmp_path, test_interval=iterations)
    job = require_ok(run_command(slurm_bed.srun_command("-N", 2, "-n", 4, sys.executable, "-m", "scaffe", "train",
                                                        f"--solver={solver}", f"--iterations={iterations}"),
                                 env=ONE_THREAD, timeout=120), marker=None)
    log = job.stdout + job.stderr
    assert "Data-parallel training on 4 ranks" in log and "2 node(s)" in log, log[-3000:]
    assert "Optimization Done." in log and Path(tmp_path, f"lenet_iter_{iterations}.caffemodel").exists(), log[-3000:]
