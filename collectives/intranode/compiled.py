"""`_Reduction`'s step loop for plain buffers, compiled with numba: same cells, counters and order of
combination, a fraction of the cost per step.

Interpreted, a step (copy a chunk in, reduce one, drain one) costs 10-15 us of Python around the data
movement, which forces cells of 512 KiB; at that size a chunk and its inputs spill the 1 MiB L2 cache, so
each byte crosses the memory system once more. Compiled, a step costs well under a microsecond, cells of
128 KiB stay in L2, and the owner's reduce writes its result cell and its own receive buffer in one pass.
Waits spin briefly and then give the core away (sched_yield), as `wait.py` explains.

Only the module-level wrappers import numba, and only when a node call first takes this path: importing
it costs about 0.3 s, which a small job should not pay.
"""
import numpy

# The ops this loop computes: those defined for every numeric dtype numba handles (bitwise and logical ops,
# and float16, which numba cannot compute on the CPU, stay on the interpreted path).
OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3}
MODES = {"reduce": 0, "reduce_scatter": 1, "allgather": 2}  # see _steps.run
CELL_BYTES = 128 << 10  # the largest cell it uses (measured: 64 KiB and 256 KiB ran slower at 1-16 MiB)
SPINS = 64  # checks before the first sched_yield: about a microsecond compiled
YIELDS = 2000  # then 20 us naps, like wait.py
NAP_US = 20


def handles(op, dtype):
    """Whether the compiled loop computes `op` on elements of `dtype`."""
    dtype = numpy.dtype(dtype)
    if op not in OPS or dtype.kind not in "iufc" or dtype == numpy.float16:
        return False
    return dtype.kind != "c" or op in ("sum", "prod")


def range_start(j, n, size, item):
    """First element of local rank j's range of an n-vector (n for j = size): the ranges are as even as
    cache-line boundaries allow, so cells can keep the buffers' alignment. Compiled too, by _steps."""
    if j >= size:
        return n
    line = max(1, 64 // item)
    return min(n, (j * n // size) // line * line)


def run(windows, src, dst, op, target, base, mode="reduce"):
    """One rank's part of a node call over `windows`' counters and cells, once it has published
    COPIED = `base` (seq << 32) with its buffers' line offsets. `mode` is one of MODES; `target` is a
    Reduce's local target, -1 when every rank reads the result; an allgather reads `dst` only."""
    from collectives.intranode._steps import run as compiled_run
    if mode == "allgather":
        src = dst
    per_cell = max(1, min(windows.cell_bytes, CELL_BYTES) // src.dtype.itemsize)
    # A Reduce's other ranks have no dst: an empty writable one, since src may be read-only.
    dst = numpy.empty(0, src.dtype) if dst is None else dst
    compiled_run(windows.step_windows, src, dst, windows.local_rank, target, per_cell, base, OPS.get(op, 0),
                 MODES[mode])
