"""`python -m collectives.info` under mpiexec: topology, GPUs, CUDA-awareness and the algorithm table."""
import os
import subprocess
import sys

from mpi_harness import MPIEXEC, OPEN_MPI, REPO


def _info(ranks, **env):
    command = [MPIEXEC, "-n", str(ranks)] + (["--oversubscribe"] if OPEN_MPI else []) + [
        sys.executable, "-m", "collectives.info"]
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SCAFFE_")}
    full_env.update(env)
    done = subprocess.run(command, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_info_lists_every_rank_and_the_table():
    out = _info(3, SCAFFE_RANKS_PER_NODE="2")
    assert "3 ranks on 2 node(s) of sizes [2, 1]" in out
    for rank, local in [(0, 0), (1, 1), (2, 0)]:
        assert f"rank {rank}: host " in out and f"local rank {local}" in out
    assert "CUDA-aware MPI: " in out
    assert "67108864 B: reduce hierarchical, allreduce hierarchical, bcast native" in out
    assert "4 B: reduce native" in out


def test_info_honours_overrides():
    out = _info(2, SCAFFE_CUDA_AWARE="1", SCAFFE_GPU="3", SCAFFE_REDUCE_ALGO="tree")
    assert "CUDA-aware MPI: yes (SCAFFE_CUDA_AWARE)" in out
    assert "67108864 B: reduce tree, allreduce tree, bcast tree" in out
