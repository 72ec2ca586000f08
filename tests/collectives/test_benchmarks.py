"""The OSU-style benchmarks run, validate their results (-c) and print OSU's format, on host and device
buffers (the CUDA simulator's without a GPU: the timings there mean nothing, the results do)."""
import os
import subprocess
import sys

import pytest

from mpi_harness import MPIEXEC, OPEN_MPI, REPO


def run_benchmark(ranks, module, *args, **settings):
    """`mpiexec -n ranks python -m perf.module args` with only the given SCAFFE_* settings."""
    command = [MPIEXEC, "-n", str(ranks)] + (["--oversubscribe"] if OPEN_MPI else []) + [
        sys.executable, "-m", f"perf.{module}", *args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCAFFE_")}
    env.update({k: str(v) for k, v in settings.items()})
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("bench", ["osu_reduce", "osu_allreduce", "osu_bcast"])
def test_benchmark_validates_and_prints_osu_format(bench, device):
    done = run_benchmark(2, bench, "-d", device, "-m", "4:65536", "-i", "4", "-x", "1", "-c", "-f")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("# OSU MPI") and lines[2].startswith("# Size")
    baseline = "staged" if device == "cuda" else "native"
    assert f"Ratio({baseline}/scaffe)" in lines[2] and "Min Latency(us)" in lines[2]
    rows = [line.split() for line in lines[3:]]
    assert [int(r[0]) for r in rows] == [4 << k for k in range(15)]
    assert all(len(r) == 9 and float(r[-1]) > 0 for r in rows)  # size, 2 x (avg, min, max), iterations, ratio


@pytest.mark.parametrize("bench", ["osu_reduce", "osu_allreduce", "osu_bcast"])
def test_nonblocking_forms_validate_each_request_waited_for(bench):
    done = run_benchmark(2, bench, "--nonblocking", "-m", "4:262144", "-i", "4", "-x", "1", "-c")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    kind = bench.split("_")[1]
    assert lines[0].startswith(f"# OSU MPI I{kind} Latency Test"), lines[0]
    assert [int(line.split()[0]) for line in lines[3:]] == [4 << k for k in range(17)]


def run_stages(ranks, per_node):
    return run_benchmark(ranks, "allreduce_stages", "-m", "65536:131072", "-i", "2", "-r", "2",
                         SCAFFE_RANKS_PER_NODE=per_node)


def test_allreduce_stages_times_every_stage():
    done = run_stages(4, 2)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line and not line.startswith("#")]
    stages = ["native", "chained", "rs", "column", "ag", "rs+column+ag"]
    assert [(int(r[0]), r[1]) for r in rows] == [(size, s) for size in (65536, 131072) for s in stages]
    assert all(len(r) == 5 and float(r[2]) > 0 and float(r[4]) > 0 for r in rows)


def test_allreduce_stages_needs_several_nodes():
    done = run_stages(2, 2)
    assert done.returncode != 0 and "needs several nodes of one size" in done.stderr


def test_link_rate_reports_the_exchange_and_the_rate():
    done = run_benchmark(2, "link_rate", "-m", "1048576", "-i", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    header, rate = done.stdout.splitlines()
    assert header.startswith("# 1048576 bytes each way between ranks 0 and 1") and "2 exchanges" in header
    mb_per_s, gbit = float(rate.split()[0]), float(rate.split()[-2])
    assert mb_per_s > 0 and abs(gbit - mb_per_s * 8 / 1000) < 0.01 * gbit + 0.002


def test_a_repeated_device_call_makes_few_python_calls():
    """perf/device_overhead.py on the stand-in device: a repeated Reduce, Allreduce and Bcast on the same
    device buffers costs the root at most 60 Python function calls in the collectives' own code (issue 22;
    about 1,000 before the direct path kept a plan per repeated call). Counts, not times: deterministic."""
    done = run_benchmark(2, "device_overhead", "--calls", "5", "--count", "256")
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split()[0]: float(line.split("python_calls=")[1]) for line in done.stdout.splitlines()}
    assert set(rows) == {"Reduce", "Allreduce", "Bcast"}, done.stdout
    assert all(calls <= 60 for calls in rows.values()), done.stdout


def test_tree_traffic_times_each_kind_against_the_link():
    """perf/tree_traffic.py on two simulated nodes: a line for reduces, broadcasts, both, and MPI's own both."""
    done = run_benchmark(2, "tree_traffic", "--rate-kbit", "1000000", "--piece-bytes", "65536", "--pieces", "4",
                         "--rounds", "1", SCAFFE_RANKS_PER_NODE=1)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split("  ") for line in done.stdout.splitlines()]
    assert [row[0].strip() for row in rows] == ["reduces", "bcasts", "both", "native both"], done.stdout
    assert all(float(line.split("efficiency")[1]) > 0 for line in done.stdout.splitlines())
