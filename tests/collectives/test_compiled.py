"""The compiled node loop: its choice of ops and dtypes, the owner ranges it cuts, and (in workers) that
plain-buffer calls take it and give numpy's exact results on one node and across simulated nodes."""

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


def test_two_communicators_threads_keep_each_others_tables_alive():
    """A loop's per-size table stays alive while it runs, though another thread's calls push it out of the
    cache (cut to one entry in the worker): before, the long calls' results came out wrong."""
    run_ok(2, "host_threads.py", env={"SCAFFE_REDUCE_ALGO": "hierarchical"}, timeout=120)
