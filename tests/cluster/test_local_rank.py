"""The local rank, read from whichever launcher started the process before MPI starts, and the GPU it picks."""
import sys

import pytest

from cluster_jobs import LOCAL_RANK_WORKER, local_ranks
from mpi_harness import OPEN_MPI, launch, require_ok, run_command
from collectives.settings import gpu_for
from scaffe.parallel.launch import LOCAL_RANK_VARIABLES, launcher_local_rank


@pytest.mark.parametrize("variable", LOCAL_RANK_VARIABLES)
def test_each_launchers_variable(variable):
    assert launcher_local_rank({variable: "3"}) == 3


def test_no_launcher():
    assert launcher_local_rank({"PMI_RANK": "2", "PMI_SIZE": "4"}) is None


def test_a_launcher_wins_over_slurm_batch_step():
    """mpiexec in an sbatch script inherits SLURM_LOCALID=0 from the batch step; its own variable counts."""
    assert launcher_local_rank({"SLURM_LOCALID": "0", "MPI_LOCALRANKID": "1"}) == 1
    assert launcher_local_rank({"SLURM_LOCALID": "0", "MV2_COMM_WORLD_LOCAL_RANK": "2"}) == 2


def test_damaged_variable_is_named():
    with pytest.raises(ValueError, match="OMPI_COMM_WORLD_LOCAL_RANK='x'"):
        launcher_local_rank({"OMPI_COMM_WORLD_LOCAL_RANK": "x"})


def test_device_round_robin(monkeypatch):
    monkeypatch.delenv("SCAFFE_GPU", raising=False)
    assert [gpu_for(r, [0, 1, 2], 3) for r in range(5)] == [0, 1, 2, 0, 1]
    assert [gpu_for(r, [3, 1], 4) for r in range(3)] == [3, 1, 3]


def test_scaffe_gpu_is_every_ranks_device(monkeypatch):
    monkeypatch.setenv("SCAFFE_GPU", "1")
    assert [gpu_for(r, [0, 1, 2], 3) for r in range(4)] == [1, 1, 1, 1]
    with pytest.raises(ValueError, match=r"SCAFFE_GPU=1 is not among the GPUs this process may use \(\[0, 2\]\)"):
        gpu_for(0, [0, 2], 3)


@pytest.mark.skipif(OPEN_MPI, reason="checks MPICH's hydra, the wheel's mpiexec")
def test_hydra_on_one_host():
    job = require_ok(launch(3, LOCAL_RANK_WORKER, timeout=60))
    assert local_ranks(job) == [[[0, 0], [1, 1], [2, 2]]]


def test_hydra_on_two_hosts(bed):
    """2 ranks on each of 2 hosts: local ranks 0 and 1 on each, the same as MPI's shared-memory split."""
    job = require_ok(run_command(bed.command(2, sys.executable, LOCAL_RANK_WORKER),
                                 timeout=60))
    assert local_ranks(job) == [[[0, 0], [1, 1]], [[0, 0], [1, 1]]]


@pytest.mark.gpu
def test_rank_takes_gpu_of_its_local_rank(monkeypatch):
    """`solver_mode: GPU` under a launcher: local rank r drives device r % GPUs, not the solver's device_id."""
    import cupy

    from scaffe.cli import _select_device
    count = cupy.cuda.runtime.getDeviceCount()
    for local in range(3):
        monkeypatch.setenv("MPI_LOCALRANKID", str(local))
        assert _select_device("", solver_mode_gpu=True, device_id=0) is cupy
        assert cupy.cuda.Device().id == local % count
        # --gpu says otherwise: the listed device, whatever the local rank.
        _select_device(str(count - 1))
        assert cupy.cuda.Device().id == count - 1
