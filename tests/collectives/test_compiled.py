"""The compiled node loop: its choice of ops and dtypes, the owner ranges it cuts, and (in workers) that
plain-buffer calls take it and give numpy's exact results on one node and across simulated nodes."""
import os
import subprocess
import sys

import numpy
import pytest

from collectives import ops
from collectives.intranode import protocol
from mpi_harness import run_ok


def test_handles_the_arithmetic_ops_on_numeric_dtypes():
    assert ops.compiled("sum", numpy.float32) and ops.compiled("prod", numpy.complex128)
    assert ops.compiled("min", numpy.uint8) and ops.compiled("max", numpy.int64)
    assert not ops.compiled("max", numpy.complex64)  # MPI defines no order on complex numbers
    assert not ops.compiled("sum", numpy.float16)  # numba cannot compute float16 on the CPU
    assert not ops.compiled("band", numpy.int32) and not ops.compiled("land", numpy.int32)
    assert not ops.compiled("sum", numpy.bool_)


@pytest.mark.parametrize("item", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("size", [1, 2, 3, 4, 7, 8])
def test_owner_ranges_cover_the_vector_on_line_boundaries(size, item):
    line = max(1, 64 // item)
    for n in (0, 1, 5, 63, 64, 1000, 4097, 100003):
        starts = [protocol.range_start(j, n, size, item) for j in range(size + 1)]
        assert starts[0] == 0 and starts[-1] == n
        assert all(a <= b for a, b in zip(starts, starts[1:]))
        assert all(s % line == 0 for s in starts[:-1])
        lengths = [b - a for a, b in zip(starts, starts[1:])]
        assert max(lengths) - min(lengths) <= 2 * line  # each end rounded down by less than a line


@pytest.mark.parametrize("ranks,per_node,cell", [(2, None, None), (3, None, 2048), (4, 2, None), (6, 3, 2048)])
def test_plain_buffers_take_the_compiled_loop(ranks, per_node, cell):
    env = {"SCAFFE_REDUCE_ALGO": "hierarchical", "SCAFFE_RANKS_PER_NODE": per_node, "SCAFFE_SHM_CHUNK_BYTES": cell}
    run_ok(ranks, "compiled_path.py", env=env, timeout=300)  # the first run compiles every dtype it uses



TINY = """
from numba import njit


@njit(cache=True)
def twice(x):
    return 2 * x
"""
LOAD = """
import sys
sys.path.insert(0, sys.argv[1])
from numba import float64
from collectives.intranode.compiled import _once
import tiny
from tiny import twice
_once(tiny.__file__, "twice(float64)", lambda: twice.compile((float64,)))
assert twice(1.5) == 3.0
print(sum(twice.stats.cache_misses.values()), sum(twice.stats.cache_hits.values()))
"""


def test_processes_of_a_host_that_meet_new_code_at_once_compile_it_once(tmp_path):
    """As every local rank meets the node loop, or a dtype's reduce, at the same call: one process compiles it
    into numba's cache, the rest wait and load it from there; a process after them loads it without waiting."""
    (tmp_path / "tiny.py").write_text(TINY)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "numba"), TMPDIR=str(tmp_path))  # fresh cache, markers
    command = [sys.executable, "-c", LOAD, str(tmp_path)]
    at_once = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True) for _ in range(3)]
    counts = [process.communicate(timeout=120)[0].split() for process in at_once]
    assert all(process.returncode == 0 for process in at_once)
    assert sorted(counts) == [["0", "1"], ["0", "1"], ["1", "0"]], counts  # (compiled, loaded) by each
    later = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert later.stdout.split() == ["0", "1"], later.stderr
