"""`_Reduction`'s step loop for plain buffers, compiled with numba: same cells and counters, inputs
combined in the same local-rank order, a fraction of the cost per step.

Interpreted, a step (copy a chunk in, reduce one, drain one) costs 10-15 us of Python around its data
movement, and a node call about 70 us before any data moves; compiled, a step costs well under a
microsecond and a call about 35 us. The owner's reduce also writes its result cell and its own receive
buffer in one pass instead of copying one into the other. Allreduce, best of 5 alternating rounds
(compiled / interpreted / MPICH, us): 2 ranks 1 MiB 226 / 284 / 353, 4 MiB 963 / 1293 / 1581, 16 MiB
4157 / 4544 / 7670; 4 ranks on 2 cores 4 MiB 1975 / 2952 / 3791.

Here each local rank owns one contiguous range of the vector (on cache-line boundaries), cut in pieces
of one cell: the same chunk-per-cell pipeline as the interpreted loop, but a reduce-scatter leaves each
owner one range that a single MPI call can combine across nodes (`hierarchical.allreduce`).

Waits spin briefly and then give the core away (sched_yield), as `wait.py` explains. Only `run` imports
numba (through `_steps`), on a node call's first use of this path: the import costs about 0.3 s, which a
job of small messages should not pay.
"""
import numpy

# The ops this loop computes: those defined for every numeric dtype numba handles (bitwise and logical ops,
# and float16, which numba cannot compute on the CPU, stay on the interpreted path).
OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3}
MODES = {"reduce": 0, "reduce_scatter": 1, "allgather": 2, "gather": 3}  # see _steps.run
# A two-rank Reduce gathers compiled below this many bytes and interpreted from it. OSU ratios native/scaffe,
# compiled against interpreted: 64 KiB 1.50-1.53 against 0.46-0.78, 512 KiB 5.6-7.7 against 6.5-9.1, 1 MiB
# 6.4-6.6 against 7.8-9.4, 8-64 MiB 5.4-6.5 against 9.0-11.0 (why the compiled gather falls behind on
# large messages is not known yet).
GATHER_BELOW = 1 << 20
CELL_BYTES = 128 << 10  # the largest cell it uses (64 and 256 KiB measured the same within noise)


def handles(op, dtype):
    """Whether the compiled loop computes `op` on elements of `dtype`."""
    dtype = numpy.dtype(dtype)
    if op not in OPS or dtype.kind not in "iufc" or dtype == numpy.float16:
        return False
    return dtype.kind != "c" or op in ("sum", "prod")


def range_start(j, n, size, item):
    """First element of local rank j's range of an n-vector (n for j = size): the ranges are as even as
    cache-line boundaries allow, so cells can keep the buffers' alignment."""
    from collectives.intranode._steps import range_start as compiled_range_start
    return compiled_range_start(j, n, size, item)


def run(windows, src, dst, op, target, base, mode="reduce"):
    """One rank's part of a node call over `windows`' counters and cells, once it has published
    COPIED = `base` (seq << 32) with its buffers' line offsets. `mode` is one of MODES; `target` is a
    Reduce's local target, -1 when every rank reads the result; an allgather passes its buffer as both."""
    from collectives.intranode._steps import run as compiled_run
    per_cell = max(1, min(windows.cell_bytes, CELL_BYTES) // src.dtype.itemsize)
    # A Reduce's other ranks have no dst: an empty writable one, since src may be read-only.
    dst = numpy.empty(0, src.dtype) if dst is None else dst
    compiled_run(windows.step_windows, src, dst, windows.local_rank, target, per_cell, base, OPS[op],
                 MODES[mode])
