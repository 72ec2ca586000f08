"""The node protocol both step loops speak: the control block's slots, the cells, and the vector's layout.

Every local rank has a row of int64 slots in one control block (a CounterBlock, counters.py): counters
that hold `seq << 32 | progress` (`seq` counts node collectives, so a stale value from an earlier call
never satisfies a wait in a later one) and the facts about its buffers that peers read once it has
published COPIED = seq << 32.

Local rank j owns one contiguous range of the vector (`range_start`), cut in chunks of one cell; group g
is chunk g of every range, and for group g:

1. every rank copies its part of the other ranks' chunks into its input cells (ring slot g % DEPTH) and
   publishes COPIED = g + 1 (a send buffer from `alloc` is read in place instead);
2. the owner of each chunk reduces it from all inputs, in local-rank order (so for a fixed topology the
   result is bitwise reproducible), into its receive buffer and the result cell that the other readers
   copy from, and publishes REDUCED = g + 1;
3. the ranks that need the result copy the other owners' chunks out and publish DRAINED = g + 1.

A cell is written again DEPTH groups later, once its readers have moved past it, so ranks run at most
DEPTH groups apart and the steps of neighbouring groups overlap. The owned ranges are what a single MPI
call per range can combine across nodes (`hierarchical.allreduce`).
"""
import functools

import numpy

DEPTH = 4  # groups a rank may run ahead of the slowest reader of its cells
RESULT_CELLS = 2 * DEPTH  # a reduce uses DEPTH of them, a broadcast streams through all
LINE = 64  # cells are a multiple of a cache line, with a line of room to shift in
NOT_SHARED = -1  # SEND_WIN of a send buffer outside the alloc windows


class Slot:
    """The int64 slots of one local rank's row in the control block."""
    COPIED, REDUCED, DRAINED, FINISHED = 0, 1, 2, 3  # counters
    SEND_LINE_OFF, RECV_LINE_OFF = 4, 5  # the buffers' offsets in their cache line: cells are shifted to match
    SEND_WIN, SEND_OFF = 6, 7  # the send buffer's alloc window (or NOT_SHARED) and byte offset in it
    PER_RANK = 16  # padded to 128 bytes so ranks do not share cache lines


# What the compiled loop reads to find its way (SharedWindows.description): numba cannot import this
# module's names into its cached code, so they travel as the fields of one record.
DESCRIPTION = numpy.dtype([
    ("control", numpy.int64),  # address of the control block
    ("slots_per_rank", numpy.int64), ("copied", numpy.int64), ("reduced", numpy.int64),
    ("drained", numpy.int64), ("send_line_off", numpy.int64), ("recv_line_off", numpy.int64),
    ("send_win", numpy.int64), ("send_off", numpy.int64),
    ("local_rank", numpy.int64), ("local_size", numpy.int64),
    ("cell_stride", numpy.int64), ("depth", numpy.int64),
    ("spins", numpy.int64), ("yields", numpy.int64), ("nap_us", numpy.int64),  # wait.py's policy
    ("longest_nap_us", numpy.int64),
])

# What a node call does: (whether owners hand their results to other ranks through result cells, whether
# every rank's range of dst holds its result already).
MODES = {
    "reduce": (True, False),  # an Allreduce, or a Reduce to a target
    "reduce_scatter": (False, False),  # each owner's range of the result, into its own dst only
    "allgather": (True, True),  # each owner's range of its dst, to every rank's dst
    "gather": (False, False),  # a Reduce whose target owns the whole vector: the others only copy in
}


def range_start(j, n, size, item):
    """First element of local rank j's range of an n-vector (n for j = size): the ranges are as even as
    cache-line boundaries allow, so cells can keep the buffers' alignment."""
    if j >= size:
        return n
    line = max(1, LINE // item)
    return min(n, (j * n // size) // line * line)


@functools.lru_cache(maxsize=64)
def starts(n, size, item, owner=-1):
    """Every local rank's first element, and n: the owned ranges, or all n to `owner` when it is >= 0.
    Kept across calls: a training loop reduces the same sizes every step."""
    if owner >= 0:
        return numpy.array([0 if j <= owner else n for j in range(size + 1)], dtype=numpy.int64)
    return numpy.array([range_start(j, n, size, item) for j in range(size + 1)], dtype=numpy.int64)
