"""The node protocol's steps compiled with numba (`_steps.run`), for the ops and dtypes of
`collectives.ops.compiled`: the interpreted loop's cells, counters and order of inputs, at a fraction of
the cost per step.

The owner's reduce reads its inputs and writes its receive buffer and its result cell in one pass (two
inputs; more go through an accumulator that stays in L1), where copying into an accumulator, adding,
and copying out would take four passes over memory. Only `run` imports numba (through `_steps`), on the
first call of this loop: the import takes a noticeable fraction of a second, which a job of small
messages should not pay.

The loop moves bytes and is compiled once; only the reduce of a block (`_steps.reducer`) is compiled for each
dtype. Both take numba seconds, and every local rank meets them at the same call: the first rank of the host
compiles each into numba's cache under a lock, and the others load it from there (`_once`) instead of each
compiling it at once on cores they share.
"""
import fcntl
import hashlib
import os
import tempfile
from pathlib import Path

from mpi4py import MPI

from collectives.ops import COMPILED_OPS
from collectives.intranode import protocol

_OP_CODES = {name: code for code, name in enumerate(COMPILED_OPS)}


def run(windows, src, dst, op, target, base, mode):
    """One rank's part of a node call (`interpreted.run`'s arguments), once it has published COPIED = base."""
    from collectives.intranode import _steps
    reduce = _REDUCERS.get(src.dtype)
    if reduce is None:
        reduce = _REDUCERS[src.dtype] = _once(_steps.__file__, f"reducer {src.dtype.str}",
                                              lambda: _steps.reducer(src.dtype).address)
    item = src.itemsize
    starts = protocol.starts(src.shape[0], windows.local_size, item, target if mode == "gather" else -1)
    hands_out, ready = protocol.MODES[mode]
    args = (windows.description, windows.input_ring_addresses, windows.result_ring_addresses, windows.alloc_bases,
            starts, MPI.buffer(src).address, 0 if dst is None else MPI.buffer(dst).address, item, target,
            max(1, windows.compiled_chunk_bytes // item), base, _OP_CODES[op], hands_out, ready, reduce)
    if not _steps.run.overloads:
        import numba
        signature = tuple(numba.typeof(arg) for arg in args)
        _once(_steps.__file__, repr(signature), lambda: _steps.run.compile(signature))
    _steps.run(*args)


_REDUCERS = {}  # dtype -> the address of its compiled reduce (_steps.reducer)


def _once(source, what, make):
    """make()'s result, where make has numba compile `what` (code defined in file `source`) or load it from
    numba's cache: the first process of this host to meet it compiles it under a lock and the others load
    what it wrote; a marker says it is in the cache, so that later processes load it without the lock."""
    stat = os.stat(source)
    key = repr((source, stat.st_mtime_ns, stat.st_size, what))
    try:
        folder = Path(tempfile.gettempdir()) / f"scaffe-compiled-{os.getuid()}"
        marker = folder / hashlib.sha1(key.encode()).hexdigest()
        if not marker.exists():
            folder.mkdir(exist_ok=True)
            with open(folder / "lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when its holder dies
                make()
                marker.touch()
    except OSError:  # no folder to share (read-only, full): each process compiles or loads for itself
        pass
    return make()  # loads what the lock's holder wrote; nothing to do after its own compile
