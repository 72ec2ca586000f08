"""The node protocol's steps in Python (protocol.py describes them), for what the compiled loop does not
compute: bitwise and logical ops, float16 and the long double types. Same cells, counters, layout and
order of inputs as `compiled.run`, so either loop reads what the other wrote.
"""
from collectives.intranode import protocol
from collectives.intranode.protocol import DEPTH, Slot
from collectives.intranode.wait import wait_until
from kernels.reduce import reduce_into


def run(windows, src, dst, op, target, base, mode):
    """One rank's part of a node call, once it has published COPIED = base with its buffers' facts.

    `src`: this rank's n-vector (alike on every rank); `dst`: where its result goes (None on a Reduce's
    other ranks; an allgather passes its buffer as both); `target`: a Reduce's local target, -1 when every
    rank reads the result; `base`: seq << 32; `mode`: one of protocol.MODES.
    """
    steps = _Steps(windows, src, dst, op, target, base, mode)
    while steps.pending():
        step = steps.ready_step()
        if step is None:
            wait_until(lambda: steps.ready_step() is not None)
        else:
            step()
    if steps.in_place[steps.me] is not None:  # peers read my send buffer in place: mine again once done
        windows.wait_ranks(steps.peers, Slot.REDUCED, base | steps.groups)


class _Steps:
    """Where one rank stands in a node call: which groups it has copied in, reduced and drained."""

    def __init__(self, w, src, dst, op, target, base, mode):
        self.w, self.src, self.dst, self.op, self.base = w, src, dst, op, base
        me, size = self.me, self.size = w.local_rank, w.local_size
        self.dtype, n = src.dtype, src.shape[0]
        self.starts = protocol.starts(n, size, src.itemsize, target if mode == "gather" else -1).tolist()
        self.per_cell = max(1, w.cell_bytes // src.itemsize)
        self.groups = max(-(-(b - a) // self.per_cell) for a, b in zip(self.starts, self.starts[1:]))
        hands_out, self.ready = protocol.MODES[mode]
        self.peers = [k for k in range(size) if k != me]
        self.reader = target < 0 or target == me
        self.other_readers = [k for k in self.peers if hands_out and (target < 0 or k == target)]
        w.wait_ranks(self.peers, Slot.COPIED, base)  # their buffers' facts are readable
        self.send_shift = [w.field(k, Slot.SEND_LINE_OFF) for k in range(size)]
        self.result_shift = [w.field(k if target < 0 else target, Slot.RECV_LINE_OFF) for k in range(size)]
        self.in_place = [None if self.ready else w.send_buffer(k, self.dtype, n) for k in range(size)]
        self.copied = self.groups if self.ready or self.in_place[me] is not None else 0
        if self.in_place[me] is not None:
            w.publish(Slot.COPIED, base | self.copied)
        self.reduced = 0
        self.drained = 0 if self.reader and hands_out else self.groups

    def pending(self):
        groups = self.groups
        return self.copied < groups or self.reduced < groups or self.drained < groups

    def piece(self, j, g):
        """(lo, hi): chunk g of local rank j's range."""
        lo = self.starts[j] + g * self.per_cell
        return lo, min(self.starts[j + 1], lo + self.per_cell)

    def ready_step(self):
        """The step that can run now, in the compiled loop's order of preference; None if none can."""
        w, base, groups = self.w, self.base, self.groups
        copied, reduced, drained = self.copied, self.reduced, self.drained
        can_copy = copied < groups and (copied < DEPTH or w.reached(self.peers, Slot.REDUCED,
                                                                    base | (copied - DEPTH + 1)))
        if can_copy and copied <= reduced:  # peers' reduces wait on my copies: feed them first
            return self.copy_in
        if drained < groups and w.reached(self.peers, Slot.REDUCED, base | (drained + 1)):
            return self.drain
        if reduced < groups and (self.ready or w.reached(self.peers, Slot.COPIED, base | (reduced + 1))) and (
                reduced < DEPTH or w.reached(self.other_readers, Slot.DRAINED, base | (reduced - DEPTH + 1))):
            return self.reduce_mine
        return self.copy_in if can_copy else None

    def copy_in(self):
        """My pieces of the group's chunks, into my input cells."""
        w, g = self.w, self.copied
        ring, slot = w.input_rings[self.me], g % DEPTH
        for j in self.peers:
            lo, hi = self.piece(j, g)
            if lo < hi:
                w.cell(ring, slot * self.size + j, self.dtype, hi - lo, self.send_shift[self.me])[:] = self.src[lo:hi]
        self.copied += 1
        w.publish(Slot.COPIED, self.base | self.copied)

    def reduce_mine(self):
        """My piece of the group from every rank's input, into my result cell and dst."""
        w, g, me = self.w, self.reduced, self.me
        w.fence()  # what the owners wrote before the counters seen since is visible
        lo, hi = self.piece(me, g)
        if lo < hi:
            cell = (w.cell(w.result_rings[me], g % DEPTH, self.dtype, hi - lo, self.result_shift[me])
                    if self.other_readers else None)
            if self.ready:  # my range of dst is final already: only hand it out
                if cell is not None:
                    cell[:] = self.dst[lo:hi]
            else:
                out = self.dst[lo:hi] if self.reader else cell
                reduce_into(out, [self.input_of(k, g, lo, hi) for k in range(self.size)], self.op)
                if self.reader and cell is not None:
                    cell[:] = out
        self.reduced += 1
        w.publish(Slot.REDUCED, self.base | self.reduced)

    def input_of(self, k, g, lo, hi):
        if k == self.me:
            return self.src[lo:hi]
        if self.in_place[k] is not None:
            return self.in_place[k][lo:hi]
        w = self.w
        return w.cell(w.input_rings[k], (g % DEPTH) * self.size + self.me, self.dtype, hi - lo, self.send_shift[k])

    def drain(self):
        """The other owners' results of the group, into my dst."""
        w, g = self.w, self.drained
        w.fence()  # what the owners wrote before the counters seen since is visible
        for j in self.peers:
            lo, hi = self.piece(j, g)
            if lo < hi:
                self.dst[lo:hi] = w.cell(w.result_rings[j], g % DEPTH, self.dtype, hi - lo, self.result_shift[j])
        self.drained += 1
        w.publish(Slot.DRAINED, self.base | self.drained)
