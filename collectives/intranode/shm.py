"""Intra-node reduce and broadcast of host buffers through MPI-3 shared-memory windows.

Layout: one small control window (counters per local rank) that never moves, and one grow-only data
window holding an input slot per local rank plus a result area. A reduce over L local ranks:

1. every rank copies its contribution into its slot, chunk by chunk, in rounds (round r = chunk r of
   every slice), publishing a counter after each round;
2. local rank j reduces slice j (1/L of the vector) from all L inputs with one fused K-input pass, a
   chunk as soon as every rank has published it, so reducing overlaps the others' copying;
3. the rank that needs the result (the target) copies the finished slices out as they are published.

Inputs are combined in local-rank order, so for a fixed topology the result is bitwise reproducible.
A rank's own input is read straight from its private buffer, never copied; buffers from `alloc` live in
shared memory already, so their owners skip the copy-in and the target skips the copy-out.

Counters hold `seq << 32 | progress` (progress counted in chunks), with `seq` counting node collectives, so a stale value from an
earlier call can never satisfy a wait in a later one. Before touching shared memory a call waits until
every local rank has finished the previous call (a lazy barrier: nobody waits at the end of a call).
"""
import numpy
from mpi4py import MPI

from collectives.intranode.wait import wait_until
from kernels.reduce import reduce_into

# Control fields per local rank.
COPIED, REDUCED, FINISHED, SEND_WIN, SEND_OFF, RECV_WIN, RECV_OFF, READY = range(8)
_FIELDS = 16  # padded to 128 bytes per rank so ranks do not share cache lines
_SHIFT = 32
_MIN_CAPACITY = 1 << 20
_NOT_SHARED = -1


def _address(array):
    return array.__array_interface__["data"][0]


class SharedWindows:
    """The control window, the data window (slots + result area) and the windows made by `alloc`."""

    def __init__(self, node_comm):
        self.node_comm = node_comm
        self.local_rank = node_comm.Get_rank()
        self.local_size = node_comm.Get_size()
        # One block on local rank 0 holds every rank's counters, so a wait reads one column.
        ctrl_bytes = _FIELDS * 8 * self.local_size if self.local_rank == 0 else 0
        self._ctrl_win = MPI.Win.Allocate_shared(ctrl_bytes, 8, comm=node_comm)
        self._ctrl_win.Lock_all()
        mem, _ = self._ctrl_win.Shared_query(0)
        self.ctrl = numpy.frombuffer(mem, dtype=numpy.int64, count=_FIELDS * self.local_size).reshape(
            self.local_size, _FIELDS)
        self.ctrl[self.local_rank, :] = 0
        self._data_win = None
        self.capacity = 0
        self.slots = []
        self.result = None
        self.seq = 0
        self._alloc_wins = []  # (window, [segment uint8 array per local rank])
        node_comm.Barrier()

    # -- memory -------------------------------------------------------------------------------------
    def ensure_capacity(self, nbytes):
        """Grow the data window to hold `nbytes` per slot. Collective over the node (same nbytes everywhere)."""
        if nbytes <= self.capacity and self._data_win is not None:
            return
        capacity = max(_MIN_CAPACITY, 1 << (int(nbytes) - 1).bit_length())
        self._wait_all(FINISHED, self.seq)  # nobody may still read the old window
        if self._data_win is not None:
            self._data_win.Free()
        # Each rank allocates its own slot, so first touch places it near that rank; rank 0 adds the result area.
        size = capacity * (2 if self.local_rank == 0 else 1)
        # Data windows are only read and written with plain loads and stores, never RMA calls, so they
        # need no access epoch; a Lock_all here could wait on ranks that are polling shared counters.
        self._data_win = MPI.Win.Allocate_shared(size, 1, comm=self.node_comm)
        segments = [numpy.frombuffer(self._data_win.Shared_query(k)[0], dtype=numpy.uint8)
                    for k in range(self.local_size)]
        self.slots = [seg[:capacity] for seg in segments]
        self.result = segments[0][capacity:2 * capacity]
        self.capacity = capacity

    def alloc(self, shape, dtype):
        """A numpy array in node-shared memory (collective over the node); reduces on it skip a copy."""
        dtype = numpy.dtype(dtype)
        nbytes = int(numpy.prod(shape, dtype=numpy.int64)) * dtype.itemsize
        win = MPI.Win.Allocate_shared(max(nbytes, 1), dtype.itemsize, comm=self.node_comm)
        segments = [numpy.frombuffer(win.Shared_query(k)[0], dtype=numpy.uint8)
                    for k in range(self.local_size)]
        self._alloc_wins.append((win, segments))
        return segments[self.local_rank][:nbytes].view(dtype).reshape(shape)

    def _locate(self, array):
        """(window index, byte offset) of `array` inside one of my alloc windows, or (-1, 0)."""
        if not self._alloc_wins:
            return _NOT_SHARED, 0
        start = _address(array)
        for index, (_, segments) in enumerate(self._alloc_wins):
            mine = segments[self.local_rank]
            base = _address(mine)
            if base <= start and start + array.nbytes <= base + mine.nbytes:
                return index, start - base
        return _NOT_SHARED, 0

    def _peer_array(self, rank, win_index, offset, dtype, count):
        segment = self._alloc_wins[win_index][1][rank]
        return segment[offset:offset + count * dtype.itemsize].view(dtype)

    # -- synchronisation ----------------------------------------------------------------------------
    def _publish(self, field, value):
        self._ctrl_win.Sync()  # make the data written before this counter visible first
        self.ctrl[self.local_rank, field] = value

    def _wait_all(self, field, value):
        column = self.ctrl[:, field]
        wait_until(lambda: bool((column >= value).all()))
        self._ctrl_win.Sync()

    def _wait_one(self, rank, field, value):
        ctrl = self.ctrl
        wait_until(lambda: ctrl[rank, field] >= value)
        self._ctrl_win.Sync()

    def begin(self, nbytes):
        """Start a node collective: grow memory if needed and wait until the previous one is fully done."""
        self.ensure_capacity(nbytes)
        self._wait_all(FINISHED, self.seq)
        self.seq += 1
        return self.seq << _SHIFT

    def finish(self):
        self._publish(FINISHED, self.seq)

    # -- reduce -------------------------------------------------------------------------------------
    def reduce(self, src, op, target, dst=None, chunk_bytes=1 << 20, everyone_reads=False):
        """Reduce every local rank's `src` (same length and dtype) over the node.

        target: local rank that needs the result. On the target, `dst` (if given) receives it;
        otherwise, or with `everyone_reads`, the result stays in the result area and the returned
        view of it is valid until `finish()`. With `everyone_reads` every rank returns at once with
        (view, piece, rounds, base) and must wait for each slice before reading it (see `allreduce`).
        """
        dtype, n = src.dtype, src.shape[0]
        nbytes = n * dtype.itemsize
        base = self.begin(nbytes)
        me, size = self.local_rank, self.local_size
        send_win, send_off = self._locate(src)
        recv_win, recv_off = (self._locate(dst) if (me == target and dst is not None) else (_NOT_SHARED, 0))
        # Published with the first COPIED counter: a peer reads these only after waiting on that.
        ctrl = self.ctrl[me]
        ctrl[SEND_WIN], ctrl[SEND_OFF] = send_win, send_off
        ctrl[RECV_WIN], ctrl[RECV_OFF] = recv_win, recv_off

        def peer_input(k):
            if k == me:
                return src
            if self.ctrl[k, SEND_WIN] == _NOT_SHARED:
                return self.slots[k][:nbytes].view(dtype)
            return self._peer_array(k, int(self.ctrl[k, SEND_WIN]), int(self.ctrl[k, SEND_OFF]), dtype, n)

        def output_area():
            # An empty message has no rounds, so nothing waited for the target's fields of this call:
            # they may still hold another call's window (or the initial 0). There is nothing to read anyway.
            target_win = int(self.ctrl[target, RECV_WIN]) if n else _NOT_SHARED
            if target_win == _NOT_SHARED:
                return self.result[:nbytes].view(dtype)
            return self._peer_array(target, target_win, int(self.ctrl[target, RECV_OFF]), dtype, n)

        bounds = [n * j // size for j in range(size + 1)]
        chunk = max(1, chunk_bytes // dtype.itemsize)
        rounds = max([-(-(bounds[j + 1] - bounds[j]) // chunk) for j in range(size)] + [0])

        def piece(j, r):
            lo = bounds[j] + r * chunk
            return slice(min(lo, bounds[j + 1]), min(lo + chunk, bounds[j + 1]))

        # The target writes its own slice straight into a private dst; the rest goes through shared memory.
        private_dst = me == target and dst is not None and recv_win == _NOT_SHARED and not everyone_reads
        slot = self.slots[me][:nbytes].view(dtype)
        reduced = 0
        inputs = my_out = None

        def reduce_ready(block):
            nonlocal reduced, inputs, my_out
            while reduced < rounds:
                need = base | (reduced + 1)
                if not block and not bool((self.ctrl[:, COPIED] >= need).all()):
                    return
                self._wait_all(COPIED, need)
                if inputs is None:
                    inputs = [peer_input(k) for k in range(size)]
                    my_out = dst if private_dst else output_area()
                s = piece(me, reduced)
                reduce_into(my_out[s], [a[s] for a in inputs], op)
                reduced += 1
                self._publish(REDUCED, base | reduced)

        if send_win != _NOT_SHARED:
            self._publish(COPIED, base | rounds)
        for r in range(rounds if send_win == _NOT_SHARED else 0):
            for j in range(size):
                if j != me:
                    s = piece(j, r)
                    slot[s] = src[s]
            self._publish(COPIED, base | (r + 1))
            reduce_ready(block=False)
        reduce_ready(block=True)
        if rounds == 0:  # an empty message: still say "done" for this call, or waiters never return
            self._publish(REDUCED, base)

        if everyone_reads:
            return output_area(), piece, rounds, base
        output = output_area()
        if private_dst:
            self._copy_reduced(output, dst, [j for j in range(size) if j != me], piece, rounds, base)
        elif me == target or send_win != _NOT_SHARED:
            # The target returns the node result; owners of alloc buffers must not reuse them early.
            self._wait_all(REDUCED, base | rounds)
        return output

    def _copy_reduced(self, output, dst, owners, piece, rounds, base):
        """Copy each owner's reduced slice from `output` to `dst`, a chunk as soon as it is published."""
        for j in owners:
            for r in range(rounds):
                self._wait_one(j, REDUCED, base | (r + 1))
                s = piece(j, r)
                dst[s] = output[s]

    def allreduce(self, src, dst, op, chunk_bytes=1 << 20, between_nodes=None, head=0):
        """Reduce over the node, optionally combine across nodes on the head, and give everyone the result.

        between_nodes(result_view) runs on the head only, after the node reduce, and must leave the
        global result in result_view; the other ranks wait for it.
        """
        output, piece, rounds, base = self.reduce(src, op, target=head, chunk_bytes=chunk_bytes,
                                                  everyone_reads=True)
        me, size = self.local_rank, self.local_size
        if between_nodes is None:
            # Start with my own slice: it is ready first.
            self._copy_reduced(output, dst, [(me + k) % size for k in range(size)], piece, rounds, base)
        else:
            if me == head:
                self._wait_all(REDUCED, base | rounds)
                between_nodes(output)
                self._publish(READY, base | 1)
            else:
                self._wait_one(head, READY, base | 1)
            dst[:] = output
        self.finish()

    # -- broadcast ----------------------------------------------------------------------------------
    def bcast(self, buf, source, chunk_bytes=1 << 20, produce=None):
        """Copy `buf` of local rank `source` into every local rank's `buf`, chunk by chunk.

        On the source, `produce(chunk, chunk_arrived)` may stand in for the plain chunk loop: it must
        fill `buf` in order, `chunk` elements at a time, calling chunk_arrived(chunks_done) after each
        (the inter-node stage does this as chunks come off the wire, so local copies start early).
        """
        dtype, n = buf.dtype, buf.shape[0]
        base = self.begin(n * dtype.itemsize)
        area = self.result[:n * dtype.itemsize].view(dtype)
        chunk = max(1, chunk_bytes // dtype.itemsize)
        chunks = -(-n // chunk)
        if self.local_rank == source:
            def chunk_arrived(done):
                s = slice((done - 1) * chunk, done * chunk)
                area[s] = buf[s]
                self._publish(READY, base | done)

            if produce is not None:
                produce(chunk, chunk_arrived)
            else:
                for c in range(chunks):
                    chunk_arrived(c + 1)
            self._publish(READY, base | chunks)
        else:
            done = 0
            while done < chunks:
                self._wait_one(source, READY, base | (done + 1))
                available = int(self.ctrl[source, READY]) - base
                s = slice(done * chunk, available * chunk)
                buf[s] = area[s]
                done = available
        self.finish()

    def free(self):
        for win, _ in self._alloc_wins:
            win.Free()
        self._alloc_wins = []
        if self._data_win is not None:
            self._data_win.Free()
            self._data_win = None
        self._ctrl_win.Unlock_all()
        self._ctrl_win.Free()
