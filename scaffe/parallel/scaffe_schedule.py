"""S-Caffe's schedule: gradients flow to the root in pieces, layer by layer; new parameters flow back the same way.

Per iteration:
- backward: as soon as layer i's gradients are complete, they are cut into pieces of at most
  SCAFFE_PIECE_BYTES (scaffe.parallel.pieces) and each piece's Ireduce to the root starts, while
  layer i-1 computes its backward (the collectives run on their own progress thread). The root
  applies Caffe's update to a piece as soon as its sum has arrived (sum / P, then the solver's
  per-blob pipeline on those elements alone) and broadcasts the piece's new parameters at once, on a
  second communicator, so that they move the other way on the links while the later pieces and the
  layers below still reduce: a large layer's reduce, update and propagation overlap each other
  instead of following each other whole. The other ranks post the matching Ibcasts right after
  their Ireduces of layer i. The root looks for arrived sums after each layer's backward.
- on_gradients_ready: the root updates and broadcasts what is left; every rank waits for its
  reduces and broadcasts, so each iteration ends with the same parameters everywhere.
- The first iteration's parameters come from the root by one Ibcast per layer in forward order,
  and layer i's forward waits only for layer i's.

A solver that clips gradients (`clip_gradients`) needs their global norm: the root then updates
every piece once all reduces are in, and broadcasts each after its update (said once in the log).
Either way each blob sees exactly the
operations of the single-process update, so with P ranks of batch B this computes the step of one
rank with batch P*B on the same samples: each rank's loss is normalised by its own B, so the mean of
the P gradients is the gradient of the P*B batch.

On a GPU a piece is a slice of the solver's flat buffers, the root's update of a piece is one kernel, and every collective starts after an event on the compute stream (after the
layer's backward, or after the root's update of it): scaffe.parallel.streams. The next iteration's
layer i forward waits on the device for the event that marks layer i's parameters.

Stop/snapshot requests: each rank's flags go to the root in a tiny Ireduce started with the last
layer's gradient reduce; the root passes their sum on in a tiny Ibcast started first in the next
on_start. Every rank waits for both with the other collectives and acts on the broadcast sum at
the end of that iteration, so all ranks stop after the same update, with nothing left in flight.
"""
import numpy
from mpi4py import MPI

from scaffe import timeline
from scaffe.parallel.base import Schedule
from scaffe.parallel.pieces import layer_pieces, piece_bytes, updates_by_piece
from scaffe.solvers.signals import requests_from_flags


class SCaffeSchedule(Schedule):
    def __init__(self, solver, comm):
        super().__init__(solver, comm)
        self.propagation = comm.Dup()  # parameters travel beside the gradient reduces, not behind them
        self.piece_bytes = piece_bytes()
        self._per_piece = updates_by_piece(solver, self.rank)  # clipping needs every gradient first
        self._bcasts = {}      # layer index -> requests, for the first forward only
        self._propagating = []  # (layer index, request) of this iteration's parameter broadcasts
        self._reduces = []     # (piece, layer index, request) of this iteration's gradient reduces
        self._updated = 0      # how many of them the root has updated and broadcast
        self._flags_up = numpy.zeros(self.flag_count, numpy.int32)    # this rank's, summed on the root
        self._flags_down = numpy.zeros(self.flag_count, numpy.int32)  # the root's sum of the last iteration
        self._announce = self._flags_reduce = None
        solver.applies_update = False  # the root updates blob by blob below, the others receive it

    def on_start(self):
        self.passes = 0
        self._reduces, self._updated, self._propagating = [], 0, []
        self._announce_requests()
        if self.synced:
            return
        ready = self.order.mark()  # the root's initial parameters, as the compute stream left them
        for layer_id, data in self.parameters_by_layer():
            self._bcasts.setdefault(layer_id, []).append(self.order.start(
                lambda stream, data=data: self.propagation.Ibcast(data, root=self.root, stream=stream), after=ready,
                label=("parameters", (layer_id,))))
        self.synced = True

    def param_needed(self, layer_id):
        requests = self._bcasts.pop(layer_id, None)
        if requests:
            self.wait_all(requests, "parameters", layer_id)
            self.order.parameters_arrived(layer_id)
        self.order.parameters_needed(layer_id)

    def grads_ready(self, layer_id):
        if not self.last_pass():
            return
        pieces = layer_pieces(self.solver, self.net.grads_ready_at(layer_id), self.piece_bytes)
        computed = self.order.mark() if pieces else None  # layer_id's gradients, and its parameters are free
        for piece in pieces:
            if self.rank == self.root:
                work = lambda stream, diff=piece.diff: self.comm.Ireduce(  # noqa: E731
                    MPI.IN_PLACE, diff, op=MPI.SUM, root=self.root, stream=stream)
            else:
                work = lambda stream, diff=piece.diff: self.comm.Ireduce(  # noqa: E731
                    diff, None, op=MPI.SUM, root=self.root, stream=stream)
            request = self.order.start(work, after=computed, label=piece.label("gradients", layer_id))
            self._reduces.append((piece, layer_id, request))
        if self.rank != self.root:
            for piece in pieces:
                self._propagate(layer_id, piece, computed)
        elif self._per_piece:
            self._update_arrived(wait=False)
        if layer_id == self.final_grads_layer:
            self._gather_requests()

    def on_gradients_ready(self):
        if self.final_grads_layer is None:  # a net without gradients still agrees on requests
            self._gather_requests()
        self.wait_all([request for requests in self._bcasts.values() for request in requests],
                      "parameters")  # parameters no forward asked for
        self._bcasts = {}
        if self.rank == self.root:
            if not self._per_piece:
                self.wait_all([request for _, _, request in self._reduces], "gradients")
                self._average([piece for piece, _, _ in self._reduces])
                self.solver.get_learning_rate()  # before clipping, as in the solver's own update
                self.solver.clip_gradients()
            self._update_arrived(wait=True)
        self.wait_all([request for _, _, request in self._reduces] + [self._flags_reduce, self._announce],
                      "gradients")
        self.wait_all([request for _, request in self._propagating], "parameters")
        if self.rank != self.root:
            for layer_id in dict.fromkeys(layer_id for layer_id, _ in self._propagating):
                self.order.parameters_arrived(layer_id)
        self.agreed = requests_from_flags(self._flags_down)

    # ------------------------------------------------------------ the root's update, piece by piece

    def _update_arrived(self, wait):
        """Update and broadcast, in reduce order, the pieces whose sums have arrived (all, with `wait`)."""
        for piece, layer_id, _ in self.arrived(self._reduces, self._updated, wait):
            self._updated += 1
            with timeline.updating():
                # Averaged here, or all at once before clipping.
                self.solver.update_elements(piece.segments, self.solver.get_learning_rate(),
                                            1.0 / self.size if self._per_piece else 1.0)
            self._propagate(layer_id, piece, self.order.mark())

    def _average(self, pieces):
        scale = numpy.float32(1.0 / self.size)
        for piece in pieces:
            piece.diff *= scale

    def _propagate(self, layer_id, piece, after):
        """Broadcast the parameters of `piece` (of layer `layer_id`) once event `after` has completed."""
        request = self.order.start(
            lambda stream: self.propagation.Ibcast(piece.data, root=self.root, stream=stream), after=after,
            label=piece.label("parameters", layer_id))
        self._propagating.append((layer_id, request))

    # ------------------------------------------------------------ stop/snapshot requests

    def _announce_requests(self):
        # The root's _flags_up holds last iteration's sum (Ireduce in place); sent before it is reused.
        if self.rank == self.root:
            self._flags_down[:] = self._flags_up
        self._announce = self.order.start(lambda _: self.comm.Ibcast(self._flags_down, root=self.root))  # host flags

    def _gather_requests(self):
        self._flags_up[:] = self.local_flags()
        send = MPI.IN_PLACE if self.rank == self.root else self._flags_up
        recv = self._flags_up if self.rank == self.root else None
        self._flags_reduce = self.order.start(lambda _: self.comm.Ireduce(send, recv, op=MPI.SUM, root=self.root))
