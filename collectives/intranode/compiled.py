"""The node protocol's steps compiled with numba (`_steps.run`), for the ops and dtypes of
`collectives.ops.compiled`: the interpreted loop's cells, counters and order of inputs, at a fraction of
the cost per step.

The owner's reduce reads its inputs and writes its receive buffer and its result cell in one pass (two
inputs; more go through an accumulator that stays in L1), where copying into an accumulator, adding,
and copying out would take four passes over memory.

The loop moves bytes and is compiled once; only the reduce of a block (`_steps.reducer`) is compiled for each
dtype. Both are compiled once per host and loaded without numba (`kernels.native`): importing numba alone
takes a noticeable fraction of a second, which every rank of a job would pay at its first node call.
"""
import functools

import numpy
from mpi4py import MPI

from collectives.ops import COMPILED_DTYPES, COMPILED_OPS
from collectives.intranode import protocol

_OP_CODES = {name: code for code, name in enumerate(COMPILED_OPS)}


BLOCK = 2048  # elements reduced at a time: the accumulator stays in L1
_STEPS = "collectives.intranode._steps"


def scratch(local_size):
    """What one call of the loop may write besides shared memory (a communicator's node calls take turns)."""
    return numpy.empty(6 * local_size + 2 * BLOCK, numpy.int64)  # 6 int64 per rank, BLOCK items of 16 bytes


def run(windows, src, dst, op, target, base, mode):
    """One rank's part of a node call (`interpreted.run`'s arguments), once it has published COPIED = base."""
    item = src.itemsize
    description, inputs, results, alloc_bases, alloc_windows, scratch_at = windows.loop_tables
    # `starts` is held while the loop runs: another thread's call may push it out of protocol.starts' cache.
    starts = protocol.starts(src.shape[0], windows.local_size, item, target if mode == "gather" else -1)
    hands_out, ready = protocol.MODES[mode]
    _loop()(description, inputs, results, alloc_bases, alloc_windows, address(starts), scratch_at, address(src),
            0 if dst is None else address(dst), item, target, max(1, windows.compiled_chunk_bytes // item), base,
            _OP_CODES[op], hands_out, ready, _reducer(src.dtype))


def address(array):
    """Where an array's bytes start."""
    return MPI.buffer(array).address  # a fifth of the cost of __array_interface__, on the per-call path


# kernels.native is imported at the first node call: llvmlite takes tens of ms, which a job of small messages
# (native MPI calls) need not pay.
@functools.cache
def _loop():
    from kernels import native
    return native.load(_STEPS, "loop", protocol.DESCRIPTION, BLOCK)


@functools.cache
def _reducer(dtype):
    """The address of the compiled reduce of a block of `dtype` elements."""
    from kernels import native
    return native.load(_STEPS, "reducer", dtype).address


def native_calls():
    """What `python -m kernels.native` compiles ahead: the loop and the reduce of every dtype it computes."""
    return [(_STEPS, "loop", (protocol.DESCRIPTION, BLOCK))] + [(_STEPS, "reducer", (dtype,))
                                                                 for dtype in COMPILED_DTYPES]
