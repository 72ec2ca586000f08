"""Intra-node reduce, allreduce and broadcast of host buffers through MPI-3 shared memory.

Data moves through rings of small cells that are reused call after call, so what one rank writes is still
in cache when another reads it; a whole-message staging area of many MiB would make every byte travel
through main memory twice more. The vector is cut into chunks of one cell; chunk c belongs to local rank
c % L (L ranks on the node) and L consecutive chunks form a group. For group g:

1. every rank copies its part of the other ranks' chunks into its input cells (ring slot g % DEPTH) and
   publishes COPIED = g + 1;
2. the owner of each chunk reduces it from all L inputs (its own straight from its private buffer) in one
   fused pass, into a result cell or the reader's buffer, and publishes REDUCED = g + 1;
3. the ranks that need the result (the target of a Reduce, everyone in an Allreduce) copy it out of the
   result cells and publish DRAINED = g + 1.

A cell is written again DEPTH groups later, once its readers have moved past it, so ranks run at most
DEPTH groups apart and the three steps of neighbouring groups overlap. A broadcast streams the source's
buffer through its result cells the same way. Two variants do less work in all: a two-rank Reduce
whose other rank copies its input in lets the target combine every chunk itself (no step 3), and an
Allreduce whose receive buffers all live in shared memory has the owners write every rank's buffer.

Inputs are combined in local-rank order, so for a fixed topology the result is bitwise reproducible.
On a node without alloc windows the same steps run compiled (`compiled.py`) for the ops and dtypes numba
computes; this module's `_Reduction` runs everything else.
Buffers from `alloc` live in shared memory already: peers read such a send buffer in place (its owner
skips the copy-in) and owners reduce straight into a Reduce target's such receive buffer (the target
skips the copy-out).

Counters hold `seq << 32 | progress`, with `seq` counting node collectives, so a stale value from an
earlier call can never satisfy a wait in a later one. Before touching shared memory a call waits until
every local rank has finished the previous call (a lazy barrier: nobody waits at the end of a call).
"""
import collections
import functools

import numpy
from mpi4py import MPI

from collectives.intranode import compiled
from collectives.intranode.wait import wait_until
from kernels.reduce import reduce_into

# Control fields per local rank.
(COPIED, REDUCED, DRAINED, FINISHED,
 SEND_WIN, SEND_OFF, RECV_WIN, RECV_OFF, SEND_LINE_OFF, RECV_LINE_OFF) = range(10)
_FIELDS = 16  # padded to 128 bytes per rank so ranks do not share cache lines
_SHIFT = 32
DEPTH = 4  # groups a rank may run ahead of the slowest reader of its cells
_RESULT_CELLS = 2 * DEPTH  # a reduce uses DEPTH of them, a broadcast streams through all
_LINE = 64  # cell sizes are a multiple of a cache line, and cells have a line of room to shift in
_NOT_SHARED = -1


def _address(array):
    return MPI.buffer(array).address  # a fifth of the cost of __array_interface__, on the per-call path


def _line_offset(array):
    return 0 if array is None else _address(array) % _LINE


@functools.lru_cache(maxsize=64)
def _layout(n, per_cell, size, gatherer):
    """For each group, the (owner, lo, hi, input cell) of its pieces that are not empty.

    Chunk c of `per_cell` elements belongs to local rank c % size; with a `gatherer` (>= 0) that rank
    owns every chunk and a group is one piece, its cells side by side. Kept across calls: a training
    loop reduces the same sizes every step.
    """
    groups = []
    for g in range(-(-n // (size * per_cell))):
        if gatherer >= 0:
            lo = g * size * per_cell
            groups.append(((gatherer, lo, min(n, lo + size * per_cell), (g % DEPTH) * size),))
            continue
        starts = [((g * size + j) * per_cell, j) for j in range(size)]
        groups.append(tuple((j, lo, min(n, lo + per_cell), (g % DEPTH) * size + j) for lo, j in starts if lo < n))
    return tuple(groups)


class SharedWindows:
    """The control window, each rank's input and result cells, and the windows made by `alloc`."""

    def __init__(self, node_comm, cell_bytes):
        self.node_comm = node_comm
        self.local_rank = node_comm.Get_rank()
        self.local_size = node_comm.Get_size()
        # One block on local rank 0 holds every rank's counters, so a wait reads one column.
        ctrl_bytes = _FIELDS * 8 * self.local_size if self.local_rank == 0 else 0
        self._ctrl_win = MPI.Win.Allocate_shared(ctrl_bytes, 8, comm=node_comm)
        self._ctrl_win.Lock_all()
        mem, _ = self._ctrl_win.Shared_query(0)
        # Row k (_FIELDS int64s) holds local rank k's fields, read and written through a flat memoryview:
        # plain Python ints, at half the cost of numpy scalar indexing and comparison.
        self.flags = memoryview(mem).cast("B").cast("q")[:_FIELDS * self.local_size]
        self._mine = _FIELDS * self.local_rank
        for field in range(_FIELDS):
            self.set_field(field, 0)
        self.cell_bytes = max(_LINE, cell_bytes // _LINE * _LINE)
        self._stride = self.cell_bytes + _LINE
        # Each rank allocates its own cells, so first touch places them near the rank that writes them.
        # The cells are only read and written with plain loads and stores, never RMA calls, so they need
        # no access epoch; a Lock_all here could wait on ranks that are polling shared counters.
        inputs_bytes = DEPTH * self.local_size * self._stride  # a cell per (ring slot, owner)
        self._cells_win = MPI.Win.Allocate_shared(inputs_bytes + _RESULT_CELLS * self._stride, 1, comm=node_comm)
        segments = [numpy.frombuffer(self._cells_win.Shared_query(k)[0], dtype=numpy.uint8)
                    for k in range(self.local_size)]
        self.inputs = [seg[:inputs_bytes] for seg in segments]
        self.results = [seg[inputs_bytes:] for seg in segments]
        # What the compiled loop needs to find the counters and cells (see compiled.run).
        self.step_windows = numpy.array(
            [MPI.buffer(mem).address, self._stride, self.local_size, _FIELDS, DEPTH,
             COPIED, REDUCED, DRAINED, SEND_LINE_OFF, RECV_LINE_OFF]
            + [_address(ring) for ring in self.inputs + self.results], dtype=numpy.int64)
        self.seq = 0
        self._alloc_wins = []  # (window, [segment uint8 array per local rank])
        node_comm.Barrier()

    # -- memory -------------------------------------------------------------------------------------
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
        if array is None or not self._alloc_wins:
            return _NOT_SHARED, 0
        start = _address(array)
        for index, (_, segments) in enumerate(self._alloc_wins):
            mine = segments[self.local_rank]
            base = _address(mine)
            if base <= start and start + array.nbytes <= base + mine.nbytes:
                return index, start - base
        return _NOT_SHARED, 0

    def _peer_array(self, rank, win_field, off_field, dtype, count):
        """The alloc array local rank `rank` published in its (win_field, off_field), or None."""
        win_index = self.field(rank, win_field)
        if win_index == _NOT_SHARED:
            return None
        offset = self.field(rank, off_field)
        return self._alloc_wins[win_index][1][rank][offset:offset + count * dtype.itemsize].view(dtype)

    def _cell(self, ring, index, dtype, count, shift):
        # glibc's memcpy on some x86 CPUs (AMD Zen measured: 1.6 against 25 GB/s for 128 KiB) crawls when
        # source and destination sit at different offsets within a cache line, and numpy's buffers
        # mostly start 16 bytes into one. So a cell starts `shift` bytes into its line: the offset of the
        # user buffer it is copied to or from.
        start = index * self._stride + shift
        return ring[start:start + count * dtype.itemsize].view(dtype)

    # -- synchronisation ----------------------------------------------------------------------------
    def field(self, rank, field):
        return self.flags[_FIELDS * rank + field]

    def set_field(self, field, value):
        """Set one of my fields that peers read only after a later _publish."""
        self.flags[self._mine + field] = value

    def _publish(self, field, value):
        self._ctrl_win.Sync()  # make the data written before this counter visible first
        self.flags[self._mine + field] = value

    def _reached(self, ranks, field, value):
        flags = self.flags
        for k in ranks:
            if flags[_FIELDS * k + field] < value:
                return False
        return True

    def _wait_all(self, ranks, field, value):
        wait_until(lambda: self._reached(ranks, field, value))
        self._ctrl_win.Sync()

    def begin(self):
        """Start a node collective: wait until every local rank is done with the previous one."""
        self._wait_all(range(self.local_size), FINISHED, self.seq)
        self.seq += 1
        return self.seq << _SHIFT

    def finish(self):
        self._publish(FINISHED, self.seq)

    # -- reduce -------------------------------------------------------------------------------------
    def reduce(self, src, dst, op, target):
        """Reduce every local rank's `src` (same length and dtype) into `dst` on local rank `target`.

        `dst` may be `src` (in place) and is ignored on the other ranks.
        """
        self._reduce(src, dst if self.local_rank == target else None, op, readers=[target])

    def allreduce(self, src, dst, op, across=None):
        """Reduce every local rank's `src` into every local rank's `dst` (which may be `src`).

        across=(column communicator, MPI op): every node runs this call on the same vector layout, and
        each chunk's owner also allreduces its chunk with the owners of that chunk on the other nodes
        (nonblocking, so its cells keep moving), which makes this an allreduce over all of them.
        """
        self._reduce(src, dst, op, readers=list(range(self.local_size)), across=across)

    def _reduce(self, src, dst, op, readers, across=None):
        # A two-rank Reduce has its target combine every chunk, as _Reduction does for plain buffers.
        gather = len(readers) == 1 and self.local_size == 2
        if across is None and self.compiled_applies(op, src.dtype):
            target = readers[0] if len(readers) == 1 else -1
            self._run_compiled(src, dst, op, target, "gather" if gather else "reduce")
        else:
            _Reduction(self, src, dst, op, readers, across).run()
            self.finish()

    def compiled_applies(self, op, dtype):
        """Whether node calls on (op, dtype) run the compiled loop. Only without alloc windows (collective,
        so on no rank of the node): then every buffer is plain, and every rank decides alike alone."""
        return not self._alloc_wins and compiled.handles(op, dtype)

    def reduce_scatter(self, src, dst, op):
        """Reduce every local rank's `src` into my `owned_range` of my `dst`; the rest of `dst` is untouched.
        Only where compiled_applies."""
        self._run_compiled(src, dst, op, -1, "reduce_scatter")

    def allgather(self, buf):
        """Copy each local rank's `owned_range` of its `buf` into every local rank's `buf`.
        Only where compiled_applies (any op)."""
        self._run_compiled(buf, buf, "sum", -1, "allgather")

    def owned_range(self, n, dtype):
        """(lo, hi): the elements of an n-vector whose reduce-scatter result lands on this local rank."""
        item = numpy.dtype(dtype).itemsize
        return tuple(compiled.range_start(j, n, self.local_size, item) for j in (self.local_rank, self.local_rank + 1))

    def _run_compiled(self, src, dst, op, target, mode):
        base = self.begin()
        source = _address(src)
        self.set_field(SEND_LINE_OFF, source % _LINE)
        self.set_field(RECV_LINE_OFF, _line_offset(dst))
        self._publish(COPIED, base)  # the offsets are readable
        compiled.run(self, src, source, dst, op, target, base, mode)
        self.finish()

    # -- broadcast ----------------------------------------------------------------------------------
    def bcast(self, buf, source, produce=None):
        """Copy `buf` of local rank `source` into every local rank's `buf`, a cell at a time.

        On the source, `produce(arrived)` may stand in for a ready buffer: it must fill `buf` from the
        front, calling arrived(count) whenever the first `count` elements are in (the inter-node stage does
        this as chunks come off the wire, so the local copies start early).
        """
        base = self.begin()
        me, size = self.local_rank, self.local_size
        dtype, n = buf.dtype, buf.shape[0]
        per_cell = self.cell_bytes // dtype.itemsize
        chunks = -(-n // per_cell)
        ring = self.results[source]
        cells = _RESULT_CELLS
        readers = [k for k in range(size) if k != source]
        if me == source:
            shift = _line_offset(buf)
            self.set_field(SEND_LINE_OFF, shift)  # travels with the first COPIED counter
            sent = 0

            def arrived(count):
                nonlocal sent
                while sent < chunks and min(n, (sent + 1) * per_cell) <= count:
                    if sent >= cells:
                        self._wait_all(readers, DRAINED, base | (sent - cells + 1))
                    lo, hi = sent * per_cell, min(n, (sent + 1) * per_cell)
                    self._cell(ring, sent % cells, dtype, hi - lo, shift)[:] = buf[lo:hi]
                    sent += 1
                    self._publish(COPIED, base | sent)

            if produce is None:
                arrived(n)
            else:
                produce(arrived)
                arrived(n)
        else:
            done = 0
            while done < chunks:
                self._wait_all([source], COPIED, base | (done + 1))
                shift = self.field(source, SEND_LINE_OFF)
                available = self.field(source, COPIED) - base
                while done < available:
                    lo, hi = done * per_cell, min(n, (done + 1) * per_cell)
                    buf[lo:hi] = self._cell(ring, done % cells, dtype, hi - lo, shift)
                    done += 1
                self._publish(DRAINED, base | done)
        self.finish()

    def free(self):
        for win, _ in self._alloc_wins:
            win.Free()
        self._alloc_wins = []
        self._cells_win.Free()
        self._ctrl_win.Unlock_all()
        self._ctrl_win.Free()


class _Reduction:
    """One node reduce on one rank: which pieces it copies in, reduces and copies out, and in what order."""

    def __init__(self, windows, src, dst, op, readers, across=None):
        w = self.w = windows
        self.across = across  # (column communicator, MPI op): my chunks are reduced across nodes too
        self.pending = collections.deque()  # (group, results, requests) of the chunks being reduced across
        self.base = w.begin()
        self.src, self.dst, self.op, self.readers = src, dst, op, readers
        me, size = self.me, self.size = w.local_rank, w.local_size
        self.dtype, self.n = src.dtype, src.shape[0]
        self.per_cell = w.cell_bytes // self.dtype.itemsize
        self.peers = [k for k in range(size) if k != me]
        self.other_readers = [k for k in readers if k != me]
        self.only_reader = readers == [me]
        self.send_win, send_off = w._locate(src)
        recv_win, recv_off = w._locate(dst)
        for field, value in ((SEND_WIN, self.send_win), (SEND_OFF, send_off), (RECV_WIN, recv_win),
                             (RECV_OFF, recv_off), (SEND_LINE_OFF, _line_offset(src)),
                             (RECV_LINE_OFF, _line_offset(dst))):
            w.set_field(field, value)
        w._publish(COPIED, self.base)  # my fields are readable: peers read them only after this
        # A two-rank Reduce whose other rank must copy its input in anyway does least work when the
        # target combines every chunk itself: nothing is copied out and the copy-in overlaps the
        # reduce. With the input in shared memory, splitting wins: nothing was copied in
        # (perf/RESULTS.md, "The compiled node loop").
        self.gather = False
        if len(readers) == 1 and size == 2:
            if self.only_reader:
                w._wait_all(self.peers, COPIED, self.base)
                self.gather = w.field(self.peers[0], SEND_WIN) == _NOT_SHARED
            else:
                self.gather = self.send_win == _NOT_SHARED
        self.layout = _layout(self.n, self.per_cell, size, readers[0] if self.gather else -1)
        self.groups = len(self.layout)
        self.in_place_inputs = {}  # peer -> its send buffer in shared memory, read in place
        # The other readers' receive buffers, when all readers' live in shared memory: owners then
        # write results there themselves and no result cell is used. Known once peers' fields are.
        self.direct = None
        self.looked = False
        # The owners write my receive buffer: a Reduce target's in shared memory, or (once known) all.
        self.written_for_me = self.only_reader and recv_win != _NOT_SHARED
        groups = self.groups
        self.copied = 0 if self.send_win == _NOT_SHARED else groups
        if self.send_win != _NOT_SHARED:
            w._publish(COPIED, self.base | groups)  # everything is readable in place already
        self.reduced = 0
        if self.gather and not self.only_reader:
            self.reduced = groups  # the target reduces everything
            w._publish(REDUCED, self.base | groups)
        self.drained = 0 if dst is not None and not self.written_for_me and not self.gather else groups

    def result_shift(self, j):
        # Result cells line up with the buffer they are copied to: the target's, or in an
        # allreduce the owner's own (numpy buffers of all ranks are usually aligned alike).
        readers = self.readers
        return self.w.field(readers[0] if len(readers) == 1 else j, RECV_LINE_OFF)

    def look_at_peers(self):
        """Read the peers' fields; call once every peer has published a counter of this call."""
        w, dtype, n = self.w, self.dtype, self.n
        self.looked = True
        for k in self.peers:
            shared = w._peer_array(k, SEND_WIN, SEND_OFF, dtype, n)
            if shared is not None:
                self.in_place_inputs[k] = shared
        areas = {k: w._peer_array(k, RECV_WIN, RECV_OFF, dtype, n) for k in self.other_readers}
        mine_shared = self.dst is None or w.field(self.me, RECV_WIN) != _NOT_SHARED
        if areas and all(a is not None for a in areas.values()) and mine_shared:
            self.direct = areas
            self.written_for_me = self.written_for_me or self.dst is not None

    def input_of(self, k, lo, hi, cell):
        if k == self.me:
            return self.src[lo:hi]
        if k in self.in_place_inputs:
            return self.in_place_inputs[k][lo:hi]
        w = self.w
        return w._cell(w.inputs[k], cell, self.dtype, hi - lo, w.field(k, SEND_LINE_OFF))

    # -- the three steps ----------------------------------------------------------------------------
    def copy_ready(self, g):
        return g < DEPTH or self.w._reached(self.peers, REDUCED, self.base | (g - DEPTH + 1))

    def copy_in(self, g):
        w = self.w
        ring, shift = w.inputs[self.me], w.field(self.me, SEND_LINE_OFF)
        for j, lo, hi, cell in self.layout[g]:
            if j != self.me:
                w._cell(ring, cell, self.dtype, hi - lo, shift)[:] = self.src[lo:hi]
        w._publish(COPIED, self.base | (g + 1))

    def reduce_ready(self, g):
        w = self.w
        if not w._reached(self.peers, COPIED, self.base | (g + 1)):
            return False
        return (self.direct is not None or g < DEPTH
                or w._reached(self.other_readers, DRAINED, self.base | (g - DEPTH + 1)))

    def reduce_mine(self, g):
        w, dst = self.w, self.dst
        if not self.looked:
            self.look_at_peers()
        results = []  # (where my chunk's result is, where else it must be copied), per piece I own
        for j, lo, hi, cell in self.layout[g]:
            if j != self.me:
                continue
            inputs = [self.input_of(k, lo, hi, cell) for k in range(self.size)]
            if self.direct is None and not self.only_reader:
                out = w._cell(w.results[self.me], g % DEPTH, self.dtype, hi - lo, self.result_shift(self.me))
                copies = [dst[lo:hi]] if dst is not None else []
            else:
                copies = [self.direct[k][lo:hi] for k in self.other_readers] if self.direct is not None else []
                out = dst[lo:hi] if dst is not None else copies.pop(0)
            reduce_into(out, inputs, self.op)
            results.append((out, copies))
        if self.across is None:
            self.complete(g, results)
        else:
            # The same chunks on the other nodes, combined in place while this rank goes on with its cells.
            column, op = self.across
            self.pending.append((g, results, [column.Iallreduce(MPI.IN_PLACE, out, op) for out, _ in results]))

    def complete(self, g, results):
        for out, copies in results:
            for area in copies:
                area[:] = out
        self.w._publish(REDUCED, self.base | (g + 1))

    def drain_ready(self, g):
        return self.w._reached(self.peers, REDUCED, self.base | (g + 1))

    def drain(self, g):
        w = self.w
        for j, lo, hi, _ in self.layout[g]:
            if j != self.me:
                self.dst[lo:hi] = w._cell(w.results[j], g % DEPTH, self.dtype, hi - lo, self.result_shift(j))
        w._publish(DRAINED, self.base | (g + 1))

    # -- driving them -------------------------------------------------------------------------------
    def ready_step(self):
        """The step that can run now, draining first so that cells free up soonest; None if none can."""
        groups = self.groups
        if self.pending and MPI.Request.Testall(self.pending[0][2]):
            return self.complete_next
        if self.drained < groups and self.drain_ready(self.drained):
            return self.drain_next
        if self.reduced < groups and self.reduce_ready(self.reduced):
            return self.reduce_next
        if self.copied < groups and self.copy_ready(self.copied):
            return self.copy_next
        return None

    def drain_next(self):
        self.w._ctrl_win.Sync()
        if not self.looked:
            self.look_at_peers()
        if self.written_for_me:
            self.drained = self.groups
        else:
            self.drain(self.drained)
            self.drained += 1

    def reduce_next(self):
        self.w._ctrl_win.Sync()
        self.reduce_mine(self.reduced)
        self.reduced += 1

    def complete_next(self):
        g, results, _ = self.pending.popleft()
        self.complete(g, results)

    def copy_next(self):
        self.copy_in(self.copied)
        self.copied += 1

    def run(self):
        groups = self.groups
        while self.copied < groups or self.reduced < groups or self.drained < groups or self.pending:
            step = self.ready_step()
            if step is None:
                wait_until(lambda: self.ready_step() is not None)
            else:
                step()
        if self.send_win != _NOT_SHARED or self.written_for_me:
            # Peers read my send buffer or write my receive buffer in place: done only when they are.
            self.w._wait_all(self.peers, REDUCED, self.base | groups)
