"""Intra-node reduce, allreduce and broadcast of host buffers through MPI-3 shared memory.

Data moves through rings of small cells that are reused call after call, so what one rank writes is still
in cache when another reads it; a whole-message staging area of many MiB would make every byte travel
through main memory twice more. protocol.py describes the steps; `compiled.run` takes them for the ops
and dtypes numba computes (`collectives.ops.compiled`), `interpreted.run` for the rest. Buffers from
`alloc` live in shared memory already: peers read such a send buffer in place, and its owner skips the
copy-in. Before touching shared memory a call waits until every local rank has finished the previous
call (a lazy barrier: nobody waits at the end of a call).
"""
import numpy
from mpi4py import MPI

from collectives import ops, settings
from collectives.intranode import compiled, interpreted
from collectives.intranode.compiled import address
from collectives.intranode.counters import CounterBlock
from collectives.intranode.protocol import DESCRIPTION, DEPTH, LINE, NOT_SHARED, RESULT_CELLS, Slot, range_start
from collectives.intranode.wait import COMPILED_SPINS, NAP_US, longest_nap_us

_SHIFT = 32  # counters hold seq << _SHIFT | progress


def _line_offset(array):
    return 0 if array is None else address(array) % LINE


def _chunk(nbytes):
    return max(LINE, nbytes // LINE * LINE)


class SharedWindows(CounterBlock):
    """The control block (a row of Slot words per local rank), each rank's input and result cells, and the
    windows made by `alloc`."""

    def __init__(self, node_comm):
        super().__init__(node_comm, numpy.dtype((numpy.int64, (Slot.PER_RANK,))))
        self.node_comm = node_comm
        self.compiled_calls = 0  # node calls this rank ran on the compiled loop (what tests look for)
        self.compiled_chunk_bytes = _chunk(settings.shm_chunk_bytes(self.local_size, compiled=True))
        # The cells hold the larger chunk: the interpreted loop's and the broadcast's, by default.
        self.cell_bytes = max(self.compiled_chunk_bytes,
                              _chunk(settings.shm_chunk_bytes(self.local_size, compiled=False)))
        self._stride = self.cell_bytes + LINE
        # Each rank allocates its own cells, so first touch places them near the rank that writes them.
        # The cells are only read and written with plain loads and stores, never RMA calls, so they need
        # no access epoch; a Lock_all here could wait on ranks that are polling shared counters.
        inputs_bytes = DEPTH * self.local_size * self._stride  # a cell per (ring slot, owner)
        self._cells_win = MPI.Win.Allocate_shared(inputs_bytes + RESULT_CELLS * self._stride, 1, comm=node_comm)
        segments = [numpy.frombuffer(self._cells_win.Shared_query(k)[0], dtype=numpy.uint8)
                    for k in range(self.local_size)]
        self.input_rings = [seg[:inputs_bytes] for seg in segments]
        self.result_rings = [seg[inputs_bytes:] for seg in segments]
        self.input_ring_addresses = numpy.array([address(r) for r in self.input_rings], dtype=numpy.int64)
        self.result_ring_addresses = numpy.array([address(r) for r in self.result_rings], dtype=numpy.int64)
        described = dict(
            control=self.address, slots_per_rank=self.row_words, copied=Slot.COPIED,
            reduced=Slot.REDUCED, drained=Slot.DRAINED, send_line_off=Slot.SEND_LINE_OFF,
            recv_line_off=Slot.RECV_LINE_OFF, send_win=Slot.SEND_WIN, send_off=Slot.SEND_OFF,
            local_rank=self.local_rank, local_size=self.local_size, cell_stride=self._stride, depth=DEPTH,
            spins=COMPILED_SPINS, yields=self.yields, nap_us=NAP_US, longest_nap_us=longest_nap_us())
        self.description = numpy.array([tuple(described[name] for name in DESCRIPTION.names)], DESCRIPTION)
        self.scratch = compiled.scratch(self.local_size)
        self.seq = 0
        self._alloc_wins = []  # (window, [segment uint8 array per local rank])
        self.alloc_bases = numpy.zeros((0, self.local_size), dtype=numpy.int64)  # [window, rank]: its address
        self._tables = []  # every alloc_bases made: a node call on another thread may still read the one before
        self._keep_loop_tables()
        node_comm.Barrier()

    def _keep_loop_tables(self):
        # The addresses of what the compiled loop reads besides the call's buffers, in its arguments' order
        # (compiled.run): they change only with `alloc`, and each costs a call to find.
        self._tables.append(self.alloc_bases)  # a few words each
        self.loop_tables = (address(self.description), address(self.input_ring_addresses),
                            address(self.result_ring_addresses), address(self.alloc_bases),
                            self.alloc_bases.shape[0], address(self.scratch))

    # -- memory -------------------------------------------------------------------------------------
    def alloc(self, shape, dtype):
        """A numpy array in node-shared memory (collective over the node); peers read it in place."""
        dtype = numpy.dtype(dtype)
        nbytes = int(numpy.prod(shape, dtype=numpy.int64)) * dtype.itemsize
        win = MPI.Win.Allocate_shared(max(nbytes, 1), dtype.itemsize, comm=self.node_comm)
        segments = [numpy.frombuffer(win.Shared_query(k)[0], dtype=numpy.uint8)
                    for k in range(self.local_size)]
        self._alloc_wins.append((win, segments))
        bases = [[address(seg) for seg in segs] for _, segs in self._alloc_wins]
        self.alloc_bases = numpy.array(bases, dtype=numpy.int64)
        self._keep_loop_tables()
        return segments[self.local_rank][:nbytes].view(dtype).reshape(shape)

    def locate(self, array):
        """(window index, byte offset) of `array` inside one of my alloc windows, or (NOT_SHARED, 0)."""
        if array is None or not self._alloc_wins:
            return NOT_SHARED, 0
        start = address(array)
        for index, (_, segments) in enumerate(self._alloc_wins):
            mine = segments[self.local_rank]
            base = address(mine)
            if base <= start and start + array.nbytes <= base + mine.nbytes:
                return index, start - base
        return NOT_SHARED, 0

    def send_buffer(self, rank, dtype, count):
        """Local rank `rank`'s send buffer of this call where it lies in an alloc window, or None."""
        win_index = self.field(rank, Slot.SEND_WIN)
        if win_index == NOT_SHARED:
            return None
        offset = self.field(rank, Slot.SEND_OFF)
        return self._alloc_wins[win_index][1][rank][offset:offset + count * dtype.itemsize].view(dtype)

    def cell(self, ring, index, dtype, count, shift):
        """Cell `index` of `ring` as `count` elements of `dtype`, starting `shift` bytes into its line."""
        # glibc's memcpy on some x86 CPUs crawls when source and destination sit at different offsets
        # within a cache line (perf/RESULTS.md), and numpy's buffers mostly start 16 bytes into one. So a
        # cell starts at the offset of the user buffer it is copied to or from.
        start = index * self._stride + shift
        return ring[start:start + count * dtype.itemsize].view(dtype)

    # -- synchronisation (the counters' own protocol is CounterBlock's) ------------------------------
    def begin(self):
        """Start a node collective: wait until every local rank is done with the previous one."""
        self.wait_all(Slot.FINISHED, self.seq)
        self.seq += 1
        return self.seq << _SHIFT

    def finish(self):
        self.publish(Slot.FINISHED, self.seq)

    # -- reductions ---------------------------------------------------------------------------------
    def reduce(self, src, dst, op, target):
        """Reduce every local rank's `src` (same length and dtype) into `dst` on local rank `target`.

        `dst` may be `src` (in place) and is ignored on the other ranks. On two ranks the target combines
        every chunk itself: nothing is copied out, and the copy-in overlaps the reduce.
        """
        mode = "gather" if self.local_size == 2 else "reduce"
        self._node_call(src, dst if self.local_rank == target else None, op, target, mode)

    def allreduce(self, src, dst, op):
        """Reduce every local rank's `src` into every local rank's `dst` (which may be `src`)."""
        self._node_call(src, dst, op, -1, "reduce")

    def reduce_scatter(self, src, dst, op):
        """Reduce every local rank's `src` into my `owned_range` of my `dst`; the rest of `dst` is untouched."""
        self._node_call(src, dst, op, -1, "reduce_scatter")

    def allgather(self, buf):
        """Copy each local rank's `owned_range` of its `buf` into every local rank's `buf`."""
        self._node_call(buf, buf, "sum", -1, "allgather")

    def owned_range(self, n, dtype):
        """(lo, hi): the elements of an n-vector whose reduce-scatter result lands on this local rank."""
        item = numpy.dtype(dtype).itemsize
        return tuple(range_start(j, n, self.local_size, item) for j in (self.local_rank, self.local_rank + 1))

    def compiled_applies(self, op, dtype):
        """Whether node calls on (op, dtype) run the compiled loop."""
        return ops.compiled(op, dtype)

    def _node_call(self, src, dst, op, target, mode):
        base = self.begin()
        send_win, send_off = self.locate(src)
        self.set_field(Slot.SEND_LINE_OFF, address(src) % LINE)
        self.set_field(Slot.RECV_LINE_OFF, _line_offset(dst))
        self.set_field(Slot.SEND_WIN, send_win)
        self.set_field(Slot.SEND_OFF, send_off)
        self.publish(Slot.COPIED, base)  # my slots are readable
        if ops.compiled(op, src.dtype):
            self.compiled_calls += 1
            compiled.run(self, src, dst, op, target, base, mode)
        else:
            interpreted.run(self, src, dst, op, target, base, mode)
        self.finish()

    # -- broadcast ----------------------------------------------------------------------------------
    def bcast(self, buf, source, produce=None):
        """Copy `buf` of local rank `source` into every local rank's `buf`, a cell at a time.

        On the source, `produce(arrived)` may stand in for a ready buffer: it must fill `buf` from the
        front, calling arrived(count) whenever the first `count` elements are in (the inter-node stage does
        this as chunks come off the wire, so the local copies start early).
        """
        if self.local_size == 1:  # no one here to copy it to
            if produce is not None:
                produce(lambda count: None)
            return
        base = self.begin()
        per_cell = self.cell_bytes // buf.dtype.itemsize
        if self.local_rank == source:
            self._stream_out(buf, base, per_cell, produce)
        else:
            self._stream_in(buf, base, per_cell, source)
        self.finish()

    def _stream_out(self, buf, base, per_cell, produce):
        n, ring = buf.shape[0], self.result_rings[self.local_rank]
        chunks = -(-n // per_cell)
        readers = [k for k in range(self.local_size) if k != self.local_rank]
        shift = _line_offset(buf)
        self.set_field(Slot.SEND_LINE_OFF, shift)  # travels with the first COPIED counter
        sent = 0

        def arrived(count):
            nonlocal sent
            while sent < chunks and min(n, (sent + 1) * per_cell) <= count:
                if sent >= RESULT_CELLS:
                    self.wait_ranks(readers, Slot.DRAINED, base | (sent - RESULT_CELLS + 1))
                lo, hi = sent * per_cell, min(n, (sent + 1) * per_cell)
                self.cell(ring, sent % RESULT_CELLS, buf.dtype, hi - lo, shift)[:] = buf[lo:hi]
                sent += 1
                self.publish(Slot.COPIED, base | sent)

        if produce is not None:
            produce(arrived)
        arrived(n)

    def _stream_in(self, buf, base, per_cell, source):
        n, ring = buf.shape[0], self.result_rings[source]
        chunks = -(-n // per_cell)
        done = 0
        while done < chunks:
            self.wait_ranks([source], Slot.COPIED, base | (done + 1))
            shift = self.field(source, Slot.SEND_LINE_OFF)
            available = self.field(source, Slot.COPIED) - base
            while done < available:
                lo, hi = done * per_cell, min(n, (done + 1) * per_cell)
                buf[lo:hi] = self.cell(ring, done % RESULT_CELLS, buf.dtype, hi - lo, shift)
                done += 1
            self.publish(Slot.DRAINED, base | done)

    def free(self):
        for win, _ in self._alloc_wins:
            win.Free()
        self._alloc_wins = []
        self._cells_win.Free()
        super().free()
