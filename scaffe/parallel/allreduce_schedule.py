"""The allreduce schedule: every rank updates; gradients are fused into buckets and allreduced.

Parameters are broadcast from the root once, at the first iteration, so all ranks start equal and
stay equal (same summed gradient, same update). During backward, finished gradients are cut into
pieces of at most SCAFFE_PIECE_BYTES (scaffe.parallel.pieces) and packed into the current bucket; a
bucket of SCAFFE_MESSAGE_BYTES or more is allreduced at once (nonblocking) while backward goes on, so
that a small net's top layers travel during the backward of its lower ones. Buckets take turns on
SCAFFE_ALLREDUCE_LANES duplicates of the communicator (bucket k on lane k mod L, on every rank alike), so that
one bucket crosses the link while the next is reduced inside the nodes: on one lane the link waits for each
bucket's node stages. Few large messages beat
many small ones: each collective pays a latency, and large ones take the shared-memory path; pieces keep a large
layer from making one bucket that completes only when all of it has crossed the link. As soon as a
bucket's sum is in, every rank updates its pieces (sum / P, then the solver's per-blob pipeline on
those elements alone), so the update of the large layers overlaps the allreduce of the later buckets
instead of following the last one. The ranks look for arrived buckets after each layer's backward.

Held pieces (scaffe.parallel.deferral, as in the S-Caffe schedule), where a budget of bytes is set for the backward
(by default measured where a device computes, none on the CPU): only the pieces that fit in it, in backward order,
go into buckets during backward; the others are packed when backward is over, lowest layer first, so conv1's sum
travels ahead of fc6's tail, and every rank updates each of those buckets during the next iteration's forward,
before the forward of the lowest layer it holds, with the rate and iteration of the iteration whose gradients it
holds. So is, with a budget, every bucket of the backward still in flight when it ends, before the forward of its
lowest layer: the iteration does not wait for the link's backlog, and conv1's held bucket does not queue behind it
(the held buckets and the flags have a lane of their own, `closing`). Rank 0's budget reaches the others with the
flags (each rank adds 0), so all hold back the same pieces. Before anything reads the parameters between
iterations (a test, a snapshot, the end of `Solver.step`) they all land: `on_parameters_read`.

A solver that clips gradients (`clip_gradients`) needs their global norm: it then updates the whole
model after the last bucket, as a single process does (said once in the log), and holds nothing back.

Stop/snapshot requests travel in a small host Iallreduce on the closing lane, posted as backward starts and waited
for when it ends: one 0/1 flag per effect from each rank, whose sums tell every rank what any rank asked.

On a GPU the buckets are device buffers of the gradients' own array module, packed on the compute
stream; each bucket's Iallreduce starts once an event after its packing has completed, and its update runs
on the update stream, which the next forward of its layers waits for (see scaffe.parallel.streams). The flags and the budget stay
on the host: reading them from a device bucket would make the host wait for the device.
"""
import numpy
from mpi4py import MPI

from collectives.settings import positive_int
from scaffe import timeline
from scaffe.parallel.base import Schedule
from scaffe.parallel.deferral import UNLIMITED, Budget, backward_bytes
from scaffe.parallel.pieces import layer_pieces, message_bytes, piece_bytes, updates_by_piece
from scaffe.solvers.signals import requests_from_flags


# One lane idled the link through each bucket's node stages and its waits' naps; two took most of what four did
# (perf/RESULTS.md, "The window's stop, MPI's Ibcast under naps, buckets on two lanes").
LANES = 2
# The held buckets grow from this share of a bucket, doubling: the next forward then waits for conv1's sum alone,
# not for a bucket of the layers above it too, and each later one crosses the link while the layers below it run
# (perf/RESULTS.md, "Nothing but the flags at the end of backward").
FIRST_HELD_SHARE = 32


def allreduce_lanes():
    """SCAFFE_ALLREDUCE_LANES: the communicators the allreduce schedule's buckets take turns on (default 2)."""
    return positive_int("SCAFFE_ALLREDUCE_LANES", LANES)


class Bucket:
    """A flat buffer of packed pieces: `layout` (piece, start, stop), its Iallreduce `request`, and for a
    held one `step`, the (rate, iteration) of its update."""
    __slots__ = ("flat", "layout", "request", "step")

    def __init__(self, flat, layout, request, step=None):
        self.flat, self.layout, self.request, self.step = flat, layout, request, step

    def first_layer(self):
        return min(piece.layers[0] for piece, _, _ in self.layout)


class AllreduceSchedule(Schedule):
    def __init__(self, solver, comm):
        super().__init__(solver, comm)
        self.piece_bytes = piece_bytes()
        self.bucket_bytes = message_bytes()  # the least a bucket holds before it goes (but the last)
        self.lanes = (comm, *(self.duplicate() for _ in range(allreduce_lanes() - 1)))  # bucket k: lane k mod L
        # What follows a backward has a lane of its own, so that it never queues behind that backward's last
        # buckets: the request flags, then the held buckets, lowest layer first.
        self.closing = self.duplicate()
        self._by_piece = updates_by_piece(solver, self.rank)
        solver.applies_update = not self._by_piece  # else each bucket's pieces are updated below
        # Held buckets are updated after the iteration: not with clipping (every sum first) nor
        # snapshot_diff (the snapshot would show their diff cleared).
        self._budget = Budget(backward_bytes(self.on_device), self._by_piece and not solver.param.snapshot_diff,
                              self.order, carried=True)
        self._limit = self._budget.value  # this backward's: rank 0's, agreed with the last iteration's flags
        # Where pieces may be held back, the buckets still in flight when backward ends are updated like held
        # ones, before their layers' next forward: the iteration ends once the flags are agreed.
        self._carries = self._budget.fixed != UNLIMITED
        self._sent = 0             # bytes of gradients packed during this backward
        self._buckets = []         # this backward's Buckets
        self._finished = 0         # how many of them are unpacked (and updated)
        self._held = []            # pieces beyond the budget, packed after backward
        self._incoming = []        # held Buckets of the last iteration, lowest layer first, not yet updated
        self._carried = []         # the last backward's Buckets in flight at its end, in launch order
        self._measured = None      # (sent, total, kept_up) of that backward, for the budget once they are in
        self._flags = self._flags_request = None  # this iteration's request flags and budget, once posted
        self._pending = []         # pieces waiting to be packed into the next bucket
        self._pending_bytes = 0
        self._storage = {}         # (kind, bucket index) -> flat buffer, grown once and reused
        self.held_updates_in_forward = 0  # held buckets updated during a forward

    def on_start(self):
        self.passes = 0
        self._buckets, self._finished, self._sent = [], 0, 0
        self._pending, self._pending_bytes = [], 0
        self._flags = self._flags_request = None
        self.order.updates_after(self.order.mark())  # a held bucket's update writes the gradients just cleared
        self.sync_once()

    def param_needed(self, layer_id):
        """Before layer `layer_id`'s forward: the held and carried buckets up to its layer are in and updated."""
        if self._carried:
            self._land_carried(layer_id)
        done = len(self._incoming)
        while self._incoming and self._incoming[0].first_layer() <= layer_id:
            self._update_held(self._incoming.pop(0))
        self.held_updates_in_forward += done - len(self._incoming)
        self.order.parameters_needed(layer_id)

    def on_parameters_read(self):
        if self._carried:
            self._land_carried(len(self.net.layers))
        while self._incoming:
            self._update_held(self._incoming.pop(0))
        self.order.updates_done()

    def grads_ready(self, layer_id):
        if not self.last_pass():
            return
        if self._carried:  # their buffers are this backward's (each carried bucket's layer had a forward since)
            self._land_carried(len(self.net.layers))
        if self._flags is None:
            self._post_flags()
        pieces = layer_pieces(self.solver, self.net.grads_ready_at(layer_id), self.piece_bytes, layer_id)
        for k, piece in enumerate(pieces):
            if self._limit == UNLIMITED or self._sent + piece.diff.nbytes <= self._limit:
                self._sent += piece.diff.nbytes
                self._pending.append(piece)
                self._pending_bytes += piece.diff.nbytes
            else:
                self._held.append(piece)
            final = layer_id == self.final_grads_layer and k == len(pieces) - 1
            if self._pending and (self._pending_bytes >= self.bucket_bytes or final):
                self._launch()
        self._finish_arrived(wait=False)

    def _launch(self, held=False):
        """Pack the pending pieces into a bucket and start its Iallreduce (a held one's on the closing lane)."""
        dtype = self._pending[0].diff.dtype
        count = sum(piece.diff.size for piece in self._pending)
        buckets = self._incoming if held else self._buckets
        lane = self.closing if held else self.lanes[len(buckets) % len(self.lanes)]
        flat = self._bucket_buffer(("held" if held else "backward", len(buckets)), count, dtype, lane)
        layout, start = [], 0
        for piece in self._pending:
            flat[start:start + piece.diff.size] = piece.diff
            layout.append((piece, start, start + piece.diff.size))
            start += piece.diff.size
        layers = tuple(dict.fromkeys(layer for piece in self._pending for layer in piece.layers))  # as filled
        if not held:
            self._budget.started()
        request = self.start(lane, lambda stream: lane.Iallreduce(MPI.IN_PLACE, flat, op=MPI.SUM, stream=stream),
                             after=self.order.mark(), label=("gradients", layers))
        buckets.append(Bucket(flat, layout, request, self._step() if held else None))
        self._pending, self._pending_bytes = [], 0

    def _step(self):
        """The (rate, iteration) a bucket updated after this iteration is updated with."""
        return self.solver.get_learning_rate(), self.solver.iter

    def _post_flags(self):
        """This rank's request flags, then rank 0's budget for the backwards to come (0 from the others), summed
        on the closing lane. Posted as backward starts, they cross the links ahead of its buckets instead of
        behind them; a request made during the backward is taken at the next one's."""
        flags = [*self.local_flags(), self._budget.value if self.rank == 0 else 0]
        self._flags = numpy.array(flags, numpy.int64)
        self._flags_request = self.start(  # host flags: nothing to order after
            self.closing, lambda _: self.closing.Iallreduce(MPI.IN_PLACE, self._flags, op=MPI.SUM))

    def _bucket_buffer(self, key, count, dtype, lane):
        """Bucket `key`'s buffer, grown when too small and kept: host buckets live in the communicator's
        shared memory where it offers it, device buckets are of the gradients' own array module."""
        buf = self._storage.get(key)
        if buf is None or buf.size < count or buf.dtype != dtype:
            alloc = getattr(lane, "alloc", None) if self.xp is numpy else None
            buf = alloc((count,), dtype) if alloc is not None else self.xp.empty(count, dtype)
            self._storage[key] = buf
        return buf[:count]

    def progress(self):
        self._finish_arrived(wait=False)
        if self._carried:
            self._land_carried(-1)

    def on_gradients_ready(self):
        if self._pending:
            self._launch()
        self._budget.backward_done()
        self._finish_arrived(wait=False)
        kept_up = self._finished == len(self._buckets)
        if self._flags is None:  # a net without gradients still agrees on requests
            self._post_flags()
        self._measured = (self._sent, self._sent + sum(piece.diff.nbytes for piece in self._held), kept_up)
        self._start_held()
        if self._carries:
            self._carried, step = self._buckets[self._finished:], self._step()
            for bucket in self._carried:
                bucket.step = step
        else:
            self._finish_arrived(wait=True)
        self._buckets, self._finished = [], 0
        if not self._carried:
            self._measure_budget()
        self.wait_all([self._flags_request], "gradients")
        self.agreed = requests_from_flags(self._flags[:self.flag_count])
        self._limit = int(self._flags[self.flag_count])
        self.order.updates_done()  # the next clear of the gradients, or the update of the whole model

    def _measure_budget(self):
        self._budget.measure(*self._measured)
        self._measured = None

    def _start_held(self):
        """Pack the held pieces, lowest layer first, into buckets of their own and start their Iallreduces: the
        first of 1/FIRST_HELD_SHARE of a bucket, each next twice as large, up to a bucket."""
        held, self._held = sorted(self._held, key=lambda piece: piece.layers[0]), []  # stable within a layer
        for piece in held:
            self._pending.append(piece)
            self._pending_bytes += piece.diff.nbytes
            doubled = (self.bucket_bytes // FIRST_HELD_SHARE) << len(self._incoming)
            if self._pending_bytes >= min(self.bucket_bytes, doubled):
                self._launch(held=True)
        if self._pending:
            self._launch(held=True)

    def _finish_arrived(self, wait):
        """Unpack, in launch order, this backward's buckets whose sums have arrived (all, with `wait`)."""
        for bucket in self.arrived([(b, b.request) for b in self._buckets], self._finished, wait):
            self._finished += 1
            if bucket[0].layout:  # as `started`: a bucket of gradients
                self._budget.arrived(bucket[0].flat.nbytes)
            self._unpack(bucket[0])

    def _land_carried(self, layer_id):
        """Unpack, in launch order, the buckets the last backward left in flight: every one up to the last that
        holds a layer at or below `layer_id` (waited for), then those arrived. Once all are in, the budget
        measures that backward."""
        carried = self._carried
        needed = max((k + 1 for k, bucket in enumerate(carried) if bucket.first_layer() <= layer_id), default=0)
        landed = 0
        for bucket in carried:
            if landed < needed:
                self.wait_all([bucket.request], "parameters", bucket.first_layer())
            elif not bucket.request.Test():
                break
            self._budget.arrived(bucket.flat.nbytes)
            self._unpack(bucket)
            landed += 1
        del carried[:landed]
        if not carried:
            self._measure_budget()

    def _update_held(self, bucket):
        self.wait_all([bucket.request], "parameters", bucket.first_layer())
        self._unpack(bucket)

    def _unpack(self, bucket):
        """sum / P into the gradients, then, piece by piece, the solver's update of those elements (a held
        bucket's with its own iteration's rate, its pieces' gradients cleared after: the next backward adds
        to them)."""
        scale = numpy.float32(1.0 / self.size)
        rate, iteration = bucket.step if bucket.step is not None else (self.solver.get_learning_rate(), None)
        with timeline.updating(), self.order.updating():
            for piece, start, stop in bucket.layout:
                self.xp.multiply(bucket.flat[start:stop], scale, out=piece.diff)
                if self._by_piece:
                    self.solver.update_elements(piece.segments, rate, iteration=iteration)
                if bucket.step is not None:
                    piece.diff.fill(0)
        self.order.updated({layer for piece, _, _ in bucket.layout for layer in piece.layers})
