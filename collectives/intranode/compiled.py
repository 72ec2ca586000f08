"""`_Reduction`'s step loop for plain buffers, compiled with numba: same cells and counters, inputs
combined in the same local-rank order, a fraction of the cost per step.

Interpreted, each step pays microseconds of Python around its data movement; compiled, a fraction of
one (perf/RESULTS.md has the measurements).

The owner's reduce reads its inputs and writes its receive buffer and its result cell in one pass (two
inputs; more go through an accumulator that stays in L1), where copying into an accumulator, adding,
and copying out took four passes over memory.

Here each local rank owns one contiguous range of the vector (on cache-line boundaries), cut in pieces
of one cell: the same chunk-per-cell pipeline as the interpreted loop, but a reduce-scatter leaves each
owner one range that a single MPI call can combine across nodes (`hierarchical.allreduce`).

Waits spin briefly and then give the core away (sched_yield), as `wait.py` explains. Only `run` imports
numba (through `_steps`), on a node call's first use of this path: the import costs about 0.3 s, which a
job of small messages should not pay.
"""
import numpy

# The ops this loop computes: those defined for every numeric dtype numba handles (bitwise and logical ops,
# and float16 and the long double types, which numba cannot compute on, stay on the interpreted path).
OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3}
MODES = {"reduce": 0, "reduce_scatter": 1, "allgather": 2, "gather": 3}  # see _steps.run
# The cell it fills: 128 KiB on 2 local ranks, 64 KiB from 4 (at most the windows' own cells). Alternating
# medians of the loop alone, us, by cell size 32 / 64 / 128 / 256 KiB: 2 ranks 1 MiB 124 / 115 / 112 / 112,
# 4 MiB 512 / 472 / 466 / 520; 4 ranks on 2 cores 2 MiB 1055 / 1052 / 1121 / 1222, 4 MiB 2182 / 2152 /
# 2384 / 2613.
CELL_BYTES = 256 << 10  # over the number of local ranks,
SMALLEST_CELL = 64 << 10  # but not below this


_WIDEST = {"i": 8, "u": 8, "f": 8, "c": 16}  # bytes per element numba computes on: not long double


def handles(op, dtype):
    """Whether the compiled loop computes `op` on elements of `dtype`."""
    dtype = numpy.dtype(dtype)
    if op not in OPS or dtype.kind not in "iufc" or dtype == numpy.float16 or dtype.itemsize > _WIDEST[dtype.kind]:
        return False
    return dtype.kind != "c" or op in ("sum", "prod")


def range_start(j, n, size, item):
    """First element of local rank j's range of an n-vector (n for j = size): the ranges are as even as
    cache-line boundaries allow, so cells can keep the buffers' alignment."""
    from collectives.intranode._steps import range_start as compiled_range_start
    return compiled_range_start(j, n, size, item)


def run(windows, src, source, dst, op, target, base, mode="reduce"):
    """One rank's part of a node call over `windows`' counters and cells, once it has published
    COPIED = `base` (seq << 32) with its buffers' line offsets. `source` is src's address; `mode` is one
    of MODES; `target` is a Reduce's local target, -1 when every rank reads the result; an allgather
    passes its buffer as both."""
    from collectives.intranode._steps import run as compiled_run
    cell = min(windows.cell_bytes, max(SMALLEST_CELL, CELL_BYTES // windows.local_size))
    per_cell = max(1, cell // src.dtype.itemsize)
    dst = numpy.empty(0, src.dtype) if dst is None else dst  # a Reduce's other ranks have none
    # src travels by address, so read-only and writable send buffers share one compiled signature.
    compiled_run(windows.step_windows, source, src.shape[0], dst, windows.local_rank, target, per_cell, base,
                 OPS[op], MODES[mode])
