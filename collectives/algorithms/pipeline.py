"""Chunked, pipelined reduce and broadcast along trees of ranks, over point-to-point messages.

The tree shapes (binomial, chain, chains in turn) come from the caller; this module moves the chunks. Chunk c
goes along routes[c % len(routes)]: each such turn is a pipeline of its own, with its own tag and buffers, and
a rank moves whichever turn's next chunk is ready, so a turn whose chunks come late holds up no other (waiting
in chunk order, a rank at the end of one turn and the head of the next makes the turns take turns). Along one
turn, while chunk k is being reduced, chunk k+1 from every child is already in flight, and the reduced chunk k
is sent to the parent without waiting for it to arrive. Each rank combines its own chunk first, then its
children's in the order given, so the summation order is fixed by the shapes alone.
"""
import numpy

from collectives.waiting import wait_all, wait_any
from kernels.reduce import reduce_into

_TAG = 7301  # turn t's reduce: _TAG + 2 t; its broadcast: one more
_DEPTH = 2  # double buffering along a turn: chunk k+1 lands while chunk k is reduced


def chunk_slices(n, chunk):
    return [slice(lo, min(n, lo + chunk)) for lo in range(0, n, chunk)]


def chunk_width(piece):
    """The elements of a chunk_slices slice."""
    return piece.stop - piece.start


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


def reduce(comm, own, out, op, routes, chunk, scratch):
    """Reduce `own` of every rank of the trees; their root gets the result in `out`.

    own/out are 1-D arrays of one dtype (out may be own). routes: this rank's (parent, children) in each tree
    the chunks take in turn (one tree: a list of one); the root is the root of every one, its parent None.
    """
    pieces = chunk_slices(own.shape[0], chunk)
    turns = [_ReduceTurn(comm, own, out, op, route, pieces[t::len(routes)], t, chunk, scratch)
             for t, route in enumerate(routes)]
    while True:
        moved = False
        for turn in turns:
            while turn.ready():
                turn.step()
                moved = True
        pending = [request for turn in turns for request in turn.pending()]
        if not pending:
            break
        if not moved:
            wait_any(pending)
    wait_all([request for turn in turns for request in turn.sent])


class _ReduceTurn:
    """One turn's chunks of a reduce, in order along its tree: its receives posted _DEPTH ahead into its own
    slots, each reduced chunk sent up from its own slot once the send of the chunk _DEPTH before has left it."""

    def __init__(self, comm, own, out, op, route, pieces, t, chunk, scratch):
        self.comm, self.own, self.out, self.op, self.pieces = comm, own, out, op, pieces
        self.parent, self.children = route
        self.tag = _TAG + 2 * t
        nbytes, dtype = chunk * own.dtype.itemsize, own.dtype
        self.inbox = [[scratch.get(("in", t, i, d), nbytes, dtype) for d in range(_DEPTH)]
                      for i in range(len(self.children))]
        self.outbox = [scratch.get(("out", t, d), nbytes, dtype) for d in range(_DEPTH)]
        self.next = 0  # the chunk (of this turn's) to reduce next
        self.recvs = {}
        self.sent = []  # chunk k's send up, where there is a parent
        for k in range(_DEPTH):
            self._post(k)

    def _post(self, k):
        if k < len(self.pieces) and self.children:
            width, d = chunk_width(self.pieces[k]), k % _DEPTH
            self.recvs[k] = [self.comm.Irecv(self.inbox[i][d][:width], child, self.tag)
                             for i, child in enumerate(self.children)]

    def _needs(self):
        """What chunk `next` waits for: its children's parts, and the send that last used its slot."""
        k = self.next
        if k >= len(self.pieces):
            return []
        slot_used = self.children and self.parent is not None and k >= _DEPTH
        return self.recvs.get(k, []) + ([self.sent[k - _DEPTH]] if slot_used else [])

    def ready(self):
        return self.next < len(self.pieces) and all(request.Test() for request in self._needs())

    def pending(self):
        return [request for request in self._needs() if request]

    def step(self):
        k = self.next
        s = self.pieces[k]
        self.recvs.pop(k, None)
        if not self.children:  # this turn's leaf: its own part goes up as it is, or (a tree of one) to out
            target = self.own[s]
            if self.parent is None and self.out is not self.own:
                self.out[s] = self.own[s]
        else:
            d, width = k % _DEPTH, chunk_width(s)
            target = self.out[s] if self.parent is None else self.outbox[d][:width]
            reduce_into(target, [self.own[s]] + [self.inbox[i][d][:width] for i in range(len(self.children))],
                        self.op)
        self._post(k + _DEPTH)
        if self.parent is not None:
            self.sent.append(self.comm.Isend(target, self.parent, self.tag))
        self.next += 1


def bcast(comm, buf, routes, chunk, on_chunk=None):
    """Broadcast `buf` from the root down the trees of `routes` (as in `reduce`): the root sends every chunk at
    once, every other rank forwards each as it arrives. A turn's chunks come in order along one path, the turns'
    each at its own pace, so each turn has its own tag and its chunks are forwarded as they come: waiting for
    them in chunk order would hold a turn's chunk that has arrived behind another's still on its way.

    on_chunk(chunks_done) is called as the run of chunks arrived from the first grows (the shared-memory stage
    publishes them).
    """
    chunks = [buf[s] for s in chunk_slices(buf.shape[0], chunk)]
    turns = len(routes)
    tags = [_TAG + 1 + 2 * t for t in range(turns)]
    sends = []

    def send(c):
        sends.extend(comm.Isend(chunks[c], child, tags[c % turns]) for child in routes[c % turns][1])

    if routes[0][0] is None:
        for c in range(len(chunks)):
            send(c)
        if on_chunk is not None and chunks:
            on_chunk(len(chunks))
    else:
        recvs = [comm.Irecv(chunk, routes[c % turns][0], tags[c % turns]) for c, chunk in enumerate(chunks)]
        arrived = [False] * len(chunks)
        done = 0
        next_of_turn = list(range(min(turns, len(chunks))))
        while next_of_turn:
            wait_any([recvs[c] for c in next_of_turn])
            for i, c in enumerate(next_of_turn):
                if recvs[c].Test():
                    send(c)
                    arrived[c] = True
                    next_of_turn[i] = c + turns
            next_of_turn = [c for c in next_of_turn if c < len(chunks)]
            if on_chunk is not None and arrived[done]:
                while done < len(chunks) and arrived[done]:
                    done += 1
                on_chunk(done)
    wait_all(sends)
