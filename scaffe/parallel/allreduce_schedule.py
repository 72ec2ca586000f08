"""The allreduce schedule: every rank updates; gradients are fused into buckets and allreduced.

Parameters are broadcast from the root once, at the first iteration, so all ranks start equal and
stay equal (same summed gradient, same update). During backward, finished gradients are cut into
pieces (scaffe.parallel.pieces) and packed into the current bucket; a bucket of SCAFFE_PIECE_BYTES or
more is allreduced at once (nonblocking) while backward goes on. Few large messages beat many small
ones: each collective pays a latency, and large ones take the shared-memory path; pieces keep a large
layer from making one bucket that completes only when all of it has crossed the link. As soon as a
bucket's sum is in, every rank updates its pieces (sum / P, then the solver's per-blob pipeline on
those elements alone), so the update of the large layers overlaps the allreduce of the later buckets
instead of following the last one. The ranks look for arrived buckets after each layer's backward.
A solver that clips gradients (`clip_gradients`) needs their global norm: it then updates the whole
model after the last bucket, as a single process does (said once in the log).

Stop/snapshot requests ride in the last bucket: each rank appends one 0/1 flag per effect, and the
summed flags (exact in any float type) tell every rank, after the same Waitall, what any rank asked.

On a GPU the buckets are device buffers of the gradients' own array module, packed on the compute
stream; each bucket's Iallreduce starts once an event after its packing has completed (see
scaffe.parallel.streams). The flags then travel in a small host Iallreduce of their own, after the
last bucket: reading them from a device bucket would make the host wait for the device.
"""
import numpy
from mpi4py import MPI

from scaffe import timeline
from scaffe.parallel.base import Schedule
from scaffe.parallel.pieces import layer_pieces, piece_bytes, updates_by_piece
from scaffe.solvers.signals import requests_from_flags


class AllreduceSchedule(Schedule):
    def __init__(self, solver, comm):
        super().__init__(solver, comm)
        self.bucket_bytes = piece_bytes()  # also the largest piece of a layer: a large one fills buckets alone
        self._by_piece = updates_by_piece(solver, self.rank)
        solver.applies_update = not self._by_piece  # else each bucket's pieces are updated below
        self._buckets = []       # [(flat buffer, [(piece, start, stop)], request)]
        self._finished = 0       # how many of them are unpacked (and updated)
        self._pending = []       # pieces waiting to be packed into the next bucket
        self._pending_bytes = 0
        self._pending_layers = []  # the layers whose backward gave them (what the timeline shows)
        self._storage = {}       # bucket index -> flat buffer, grown once and reused
        self._flags = None       # the final bucket's request flags (host flags on a GPU), once launched
        self._flags_request = None  # on a GPU: the Iallreduce of the host flags

    def on_start(self):
        self.passes = 0
        self._buckets, self._finished = [], 0
        self._pending, self._pending_bytes, self._pending_layers = [], 0, []
        self._flags = self._flags_request = None
        self.sync_once()

    def grads_ready(self, layer_id):
        if not self.last_pass():
            return
        pieces = layer_pieces(self.solver, self.net.grads_ready_at(layer_id), self.bucket_bytes)
        for k, piece in enumerate(pieces):
            self._pending.append(piece)
            self._pending_bytes += piece.diff.nbytes
            self._pending_layers.append(layer_id)
            final = layer_id == self.final_grads_layer and k == len(pieces) - 1  # the flags go with it
            if self._pending_bytes >= self.bucket_bytes or final:
                self._launch(final)
        self._finish_arrived(wait=False)

    def _launch(self, final=False):
        xp = self.xp
        dtype = self._pending[0].diff.dtype if self._pending else numpy.float32
        count = sum(piece.diff.size for piece in self._pending)
        flags_inside = final and xp is numpy
        flat = self._bucket_buffer(len(self._buckets), count + (self.flag_count if flags_inside else 0), dtype)
        layout, start = [], 0
        for piece in self._pending:
            flat[start:start + piece.diff.size] = piece.diff
            layout.append((piece, start, start + piece.diff.size))
            start += piece.diff.size
        if flags_inside:
            self._flags = flat[count:]
            self._flags[:] = self.local_flags()
        label = ("gradients", tuple(dict.fromkeys(self._pending_layers))) if self._pending else None
        request = self.order.start(lambda stream: self.comm.Iallreduce(MPI.IN_PLACE, flat, op=MPI.SUM, stream=stream),
                                   after=self.order.mark(), label=label)
        self._buckets.append((flat, layout, request))
        self._pending, self._pending_bytes, self._pending_layers = [], 0, []
        if final and not flags_inside:
            self._flags = numpy.array(self.local_flags(), numpy.int32)
            self._flags_request = self.order.start(  # host flags: nothing to order after
                lambda _: self.comm.Iallreduce(MPI.IN_PLACE, self._flags, op=MPI.SUM))

    def _bucket_buffer(self, index, count, dtype):
        """Bucket `index`'s buffer, grown when too small and kept: host buckets live in the communicator's
        shared memory where it offers it, device buckets are of the gradients' own array module."""
        buf = self._storage.get(index)
        if buf is None or buf.size < count or buf.dtype != dtype:
            alloc = getattr(self.comm, "alloc", None) if self.xp is numpy else None
            buf = alloc((count,), dtype) if alloc is not None else self.xp.empty(count, dtype)
            self._storage[index] = buf
        return buf[:count]

    def on_gradients_ready(self):
        if self._flags is None:  # a net without gradients still agrees on requests
            self._launch(final=True)
        self._finish_arrived(wait=True)
        self.wait_all([self._flags_request], "gradients")
        self.agreed = requests_from_flags(self._flags)
        self._buckets = []

    def _finish_arrived(self, wait):
        """Unpack, in launch order, the buckets whose sums have arrived (all, with `wait`): sum / P into the
        gradients, then, piece by piece, the solver's update of those elements."""
        scale = numpy.float32(1.0 / self.size)
        for flat, layout, _ in self.arrived(self._buckets, self._finished, wait):
            self._finished += 1
            with timeline.updating():
                for piece, start, stop in layout:
                    self.xp.multiply(flat[start:stop], scale, out=piece.diff)
                    if self._by_piece:
                        self.solver.update_elements(piece.segments, self.solver.get_learning_rate())
