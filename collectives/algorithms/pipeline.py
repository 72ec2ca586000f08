"""Chunked, pipelined reduce and broadcast along any tree of ranks, over point-to-point messages.

The tree shape (binomial, chain) comes from the caller; this module moves the chunks. While chunk c is
being reduced, chunk c+1 from every child is already in flight, and the reduced chunk c is sent to the
parent without waiting for it to arrive. Each rank combines its own chunk first, then its children's
in the order given, so the summation order is fixed by the shape alone.
"""
import numpy

from collectives.waiting import wait, wait_all
from kernels.reduce import reduce_into

_TAG = 7301


def chunk_slices(n, chunk):
    return [slice(lo, min(n, lo + chunk)) for lo in range(0, n, chunk)]


class ScratchPool:
    """Grow-only receive and send buffers reused across calls (allocation is slower than the copy)."""

    def __init__(self):
        self._store = {}

    def get(self, key, nbytes, dtype):
        buf = self._store.get(key)
        if buf is None or buf.nbytes < nbytes:
            buf = numpy.empty(max(nbytes, 64), dtype=numpy.uint8)
            self._store[key] = buf
        return buf[:nbytes].view(dtype)


def reduce(comm, own, out, op, parent, children, chunk, scratch):
    """Reduce `own` of every rank of the tree; the rank with parent None gets the result in `out`.

    own/out are 1-D arrays of one dtype (out may be own). parent is a rank or None; children a list.
    """
    dtype = own.dtype
    pieces = chunk_slices(own.shape[0], chunk)
    if not children:
        _reduce_leaf(comm, own, out, parent, pieces)
        return
    depth = 2  # double buffering: chunk c+1 lands while chunk c is reduced
    inbox = [[scratch.get(("in", i, d), chunk * dtype.itemsize, dtype) for d in range(depth)]
             for i in range(len(children))]
    outbox = [scratch.get(("out", d), chunk * dtype.itemsize, dtype) for d in range(depth)]
    recvs = {}
    sends = [None] * depth

    def post(c):
        if c < len(pieces):
            width = pieces[c].stop - pieces[c].start
            recvs[c] = [comm.Irecv(inbox[i][c % depth][:width], child, _TAG)
                        for i, child in enumerate(children)]

    for c in range(min(depth, len(pieces))):
        post(c)
    for c, s in enumerate(pieces):
        width = s.stop - s.start
        wait_all(recvs.pop(c))
        if parent is None:
            target = out[s]
        else:
            if sends[c % depth] is not None:
                wait(sends[c % depth])
            target = outbox[c % depth][:width]
        reduce_into(target, [own[s]] + [inbox[i][c % depth][:width] for i in range(len(children))], op)
        post(c + depth)
        if parent is not None:
            sends[c % depth] = comm.Isend(target, parent, _TAG)
    wait_all([r for r in sends if r is not None])


def _reduce_leaf(comm, own, out, parent, pieces):
    """A rank without children sends its own chunks up, or (a tree of one) copies them to out."""
    if parent is not None:
        wait_all([comm.Isend(own[s], parent, _TAG) for s in pieces])
    elif out is not own:
        out[:] = own


def bcast(comm, buf, parent, children, chunk, on_chunk=None):
    """Broadcast `buf` from the rank with parent None down the tree, forwarding each chunk on arrival.

    on_chunk(chunks_done) is called after each chunk has arrived (the shared-memory stage publishes it).
    """
    pieces = chunk_slices(buf.shape[0], chunk)
    sends = []
    if parent is None:
        for c, s in enumerate(pieces):
            sends.extend(comm.Isend(buf[s], child, _TAG) for child in children)
            if on_chunk is not None:
                on_chunk(c + 1)
    else:
        recvs = [comm.Irecv(buf[s], parent, _TAG) for s in pieces]
        for c, s in enumerate(pieces):
            wait(recvs[c])
            sends.extend(comm.Isend(buf[s], child, _TAG) for child in children)
            if on_chunk is not None:
                on_chunk(c + 1)
    wait_all(sends)
