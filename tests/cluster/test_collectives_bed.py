"""Every collective the Comm overrides, across 2 hosts x 2 ranks over TCP, against numpy, exactly.

Sizes sit one element either side of the across-nodes selection thresholds (collectives/algorithms), so
both native MPI and the hierarchical path run; every root, in-place and completion mode (blocking, Wait,
Test loop, Waitall) is crossed with them.
"""
import sys

import numpy

from collectives.algorithms import threshold
from mpi_harness import WORKERS, require_ok, run_command

DTYPE = numpy.dtype(numpy.float32)


def sizes_around_thresholds():
    """Element counts of DTYPE: a small one, and one either side of every across-nodes threshold."""
    counts = {7}
    for kind in ("reduce", "allreduce", "bcast"):
        below = threshold(kind, several_nodes=True)
        if below is not None:
            counts |= {below // DTYPE.itemsize - 1, below // DTYPE.itemsize + 1}
    return ",".join(map(str, sorted(counts)))


def test_every_collective_across_hosts(bed):
    job = run_command(bed.command(2, sys.executable, WORKERS / "space.py", "--ops", "sum,max", "--dtypes",
                                  DTYPE.name, "--sizes", sizes_around_thresholds(), "--name", "bed"), timeout=120)
    require_ok(job)
    assert "4 ranks on 2 node(s) of sizes [2, 2]" in job.stdout
