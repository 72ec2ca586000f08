"""The node protocol's steps compiled with numba (`_steps.run`), for the ops and dtypes of
`collectives.ops.compiled`: the interpreted loop's cells, counters and order of inputs, at a fraction of
the cost per step.

The owner's reduce reads its inputs and writes its receive buffer and its result cell in one pass (two
inputs; more go through an accumulator that stays in L1), where copying into an accumulator, adding,
and copying out would take four passes over memory. Only `run` imports numba (through `_steps`), on the
first call of this loop: the import takes a noticeable fraction of a second, which a job of small
messages should not pay.

A dtype's loop takes numba seconds to compile, and every local rank meets a dtype at the same call: the
first rank of the host to meet it compiles it into numba's cache under a lock, and the others load it from
there (`_loaded`) instead of each compiling it at once on cores they share.
"""
import fcntl
import hashlib
import os
import tempfile
from pathlib import Path

import numpy
from mpi4py import MPI

from collectives.ops import COMPILED_OPS
from collectives.intranode import protocol

_OP_CODES = {name: code for code, name in enumerate(COMPILED_OPS)}


def run(windows, src, dst, op, target, base, mode):
    """One rank's part of a node call (`interpreted.run`'s arguments), once it has published COPIED = base."""
    from collectives.intranode._steps import run as compiled_run
    item = src.itemsize
    starts = protocol.starts(src.shape[0], windows.local_size, item, target if mode == "gather" else -1)
    hands_out, ready = protocol.MODES[mode]
    dst = numpy.empty(0, src.dtype) if dst is None else dst  # a Reduce's other ranks have none
    # src travels by address, so read-only and writable send buffers share one compiled signature.
    args = (windows.description, windows.input_ring_addresses, windows.result_ring_addresses, windows.alloc_bases,
            starts, MPI.buffer(src).address, dst, target, max(1, windows.compiled_chunk_bytes // item), base,
            _OP_CODES[op], hands_out, ready)
    if dst.dtype not in _LOADED:
        _loaded(compiled_run, args)
        _LOADED.add(dst.dtype)
    compiled_run(*args)


_LOADED = set()  # the dtypes whose loop this process holds


def _loaded(dispatcher, args):
    """Give `dispatcher` its machine code for `args`' types, compiled by one process of this host at a time;
    a marker says it is in numba's cache, so that later processes load it without waiting for the lock."""
    import numba
    signature = tuple(numba.typeof(arg) for arg in args)
    source = os.stat(dispatcher.py_func.__code__.co_filename)
    key = repr((dispatcher.py_func.__code__.co_filename, source.st_mtime_ns, source.st_size, signature))
    try:
        folder = Path(tempfile.gettempdir()) / f"scaffe-compiled-{os.getuid()}"
        marker = folder / hashlib.sha1(key.encode()).hexdigest()
        if not marker.exists():
            folder.mkdir(exist_ok=True)
            with open(folder / "lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when its holder dies
                dispatcher.compile(signature)
                marker.touch()
    except OSError:  # no folder to share (read-only, full): each process compiles or loads for itself
        pass
    dispatcher.compile(signature)  # loads what the lock's holder wrote; nothing to do after its own compile
