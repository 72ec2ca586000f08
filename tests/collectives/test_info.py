"""`python -m collectives.info` under mpiexec: topology, GPUs, CUDA-awareness and the algorithm table."""
import os
import subprocess
import sys

from mpi_harness import MPIEXEC, OPEN_MPI, REPO


def _run(command, **env):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SCAFFE_")}
    full_env.update(env)
    return subprocess.run(command, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=60)


def _info(ranks, **env):
    done = _run([MPIEXEC, "-n", str(ranks)] + (["--oversubscribe"] if OPEN_MPI else []) + [
        sys.executable, "-m", "collectives.info"], **env)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_info_lists_every_rank_and_the_table():
    out = _info(3, SCAFFE_RANKS_PER_NODE="2")
    assert "3 ranks on 2 node(s) of sizes [2, 1]" in out
    for rank, local in [(0, 0), (1, 1), (2, 0)]:
        assert f"rank {rank}: host " in out and f"local rank {local}" in out
    assert "CUDA-aware MPI: " in out
    assert "67108864 B: reduce hierarchical, allreduce hierarchical, bcast hierarchical" in out
    assert "4 B: reduce native" in out and "65536 B: reduce native, allreduce native, bcast native" in out
    # On one node MPICH's one-copy broadcast stays; across nodes ours crosses each link once.
    assert "67108864 B: reduce hierarchical, allreduce hierarchical, bcast native" in _info(2)


def test_info_honours_overrides():
    out = _info(2, SCAFFE_CUDA_AWARE="1", SCAFFE_GPU="3", SCAFFE_REDUCE_ALGO="tree")
    assert "CUDA-aware MPI: yes (SCAFFE_CUDA_AWARE)" in out
    assert "67108864 B: reduce tree, allreduce tree, bcast tree" in out


def test_cuda_aware_means_one_thing_to_info_and_the_benchmarks():
    """SCAFFE_CUDA_AWARE=0|1 replaces the detection for `collectives.info` and for perf/osu.py's
    `--impl native -d cuda`; any other value is refused by both rather than ignored by one."""
    native_on_device = [sys.executable, "-c", "import perf.osu; perf.osu.parse_args('', "
                                              "['-d', 'cuda', '--impl', 'native'])"]
    for value, answer in (("1", "yes"), ("0", "no")):
        assert f"CUDA-aware MPI: {answer} (SCAFFE_CUDA_AWARE)" in _info(1, SCAFFE_CUDA_AWARE=value)
        osu = _run(native_on_device, SCAFFE_CUDA_AWARE=value)
        assert osu.returncode == (0 if answer == "yes" else 2), osu.stderr
    for command in ([sys.executable, "-m", "collectives.info"], native_on_device):
        done = _run(command, SCAFFE_CUDA_AWARE="yes")
        assert done.returncode != 0
        assert "ValueError: SCAFFE_CUDA_AWARE must be 0 or 1, got 'yes'" in done.stderr, done.stderr
