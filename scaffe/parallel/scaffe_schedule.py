"""S-Caffe's schedule: gradients flow to the root in pieces, layer by layer; new parameters flow back the same way.

Per iteration:
- backward: as soon as layer i's gradients are complete, they are cut into pieces of at most
  SCAFFE_PIECE_BYTES (scaffe.parallel.pieces; a piece under SCAFFE_MESSAGE_BYTES waits for the next
  layers' to join it in one message) and each message's Ireduce to the root starts, while
  layer i-1 computes its backward (the collectives run on their own progress thread). The root
  applies Caffe's update to a piece as soon as its sum has arrived (sum / P, then the solver's
  per-blob pipeline on those elements alone) and broadcasts the piece's new parameters at once, on a
  second communicator, so that they move the other way on the links while the later pieces and the
  layers below still reduce: a large layer's reduce, update and propagation overlap each other
  instead of following each other whole. The other ranks post the matching Ibcasts right after
  their Ireduces of layer i. The root looks for arrived sums after each layer's backward.
- Held pieces (scaffe.parallel.deferral), where a budget of bytes is set for the backward (by default
  measured where a device computes, none on the CPU): only the pieces that fit in it,
  in backward order, start during backward; the others are copied aside (the next iteration clears
  the diffs) and their reduces start when backward is over, lowest layer first, so conv1's travel
  ahead of fc6's tail. The root updates each of them during the next iteration's forward, at the
  latest before its layer's forward, with the rate and iteration of the iteration whose gradients it
  holds, and broadcasts it; every other rank's layer i forward waits for layer i's held pieces alone.
  Before anything reads the parameters between iterations (a test, a snapshot, the end of
  `Solver.step`) they all land: `on_parameters_read`.
- on_gradients_ready: the root updates and broadcasts the rest of this iteration's pieces; every rank
  waits for those reduces and broadcasts.
- The first iteration's parameters come from the root by one Ibcast per layer in forward order,
  and layer i's forward waits only for layer i's.

A solver that clips gradients (`clip_gradients`) needs their global norm: the root then updates
every piece once all reduces are in, and broadcasts each after its update (said once in the log).
Either way each blob sees exactly the
operations of the single-process update, so with P ranks of batch B this computes the step of one
rank with batch P*B on the same samples: each rank's loss is normalised by its own B, so the mean of
the P gradients is the gradient of the P*B batch.

On a GPU a piece is a slice of the solver's flat buffers, the root's update of a piece is one kernel, and every collective starts after an event on the compute stream (after the
layer's backward, or after the root's update of it, which runs on a stream of its own beside the
layers): scaffe.parallel.streams. The next iteration's layer i forward waits on the device for the event
that marks layer i's parameters.

The state, and the orders it keeps (each rank's own program order is what MPI matches collectives by):
- A piece of work is a message of scaffe.parallel.pieces; its `key` (its span in the flat buffers) is its
  identity: a held piece's gradient is staged under it, so no two messages share a staging buffer.
- `comm` carries, in this order on every rank: the flags' Ibcast (on_start), the reduces of the pieces
  that fit the budget in backward order (every rank knows the root's budget before its first piece:
  `_backward_limit`), the flags' Ireduce with the last layer's, then the held pieces' reduces, lowest
  layer first. `propagation` carries the first iteration's Ibcasts per layer, then one Ibcast per piece
  in the order of the reduces: the others post theirs right after their reduces, and the root after its
  updates, which follow the reduces' order (`_reduces`, the root's, in start order, `_updated` of them done).
- Neither order may depend on timing, only on the pieces and the budget; no rank ever blocks in starting a
  collective (scaffe.parallel.window bounds those in flight on each communicator and every wait keeps
  both moving), since the root's broadcasts wait for reduces that the others may have queued.
- A held piece of iteration t is updated (root) or received (`_incoming`, the others) before its lowest
  layer's forward in t+1, so its staging buffer is free again when t+1's backward ends and `_start_held`
  writes it; `_propagating` is empty at the end of every iteration and `_bcasts` after the first.

Stop/snapshot requests: each rank's flags go to the root in a tiny Ireduce started with the last
layer's gradient reduce; the root passes their sum on in a tiny Ibcast started first in the next
on_start, with the budget of that iteration's backward (every rank holds back the same pieces). Every rank waits for both with the other collectives and acts on the broadcast sum at
the end of that iteration, so all ranks stop after the same update, with nothing left in flight.
"""
import numpy
from mpi4py import MPI

from scaffe import timeline
from scaffe.parallel.base import Schedule
from scaffe.parallel.deferral import UNLIMITED, Budget, backward_bytes
from scaffe.parallel.pieces import Messages, layer_pieces, message_bytes, piece_bytes, updates_by_piece
from scaffe.solvers.signals import requests_from_flags


class SCaffeSchedule(Schedule):
    def __init__(self, solver, comm):
        super().__init__(solver, comm)
        self.propagation = self.duplicate()  # parameters travel beside the gradient reduces, not behind them
        for lane in (self.comm, self.propagation):  # gradients to the root while parameters leave it
            lane.two_way = True  # collectives.Comm: the node heads take chains in turn
        self.piece_bytes = piece_bytes()
        self._messages = Messages(solver, message_bytes())
        self._per_piece = updates_by_piece(solver, self.rank)  # clipping needs every gradient first
        # Held pieces finish after the iteration: not with clipping (every sum first) nor snapshot_diff
        # (the snapshot would show their diff cleared).
        holds = self._per_piece and not solver.param.snapshot_diff
        self._budget = Budget(backward_bytes(self.on_device), holds, self.order) if self.rank == self.root else None
        self._bcasts = {}      # layer index -> requests, for the first forward only
        self._propagating = []  # (layers, request) of the parameter broadcasts to finish this iteration
        # The root's work, in reduce order: (piece, staging buffer or None, (rate, iteration) of the
        # update or None for this iteration's, request); the first `_updated` are done. A piece here is
        # a message: one or several (scaffe.parallel.pieces.Messages); its first layer's forward needs it.
        self._reduces = []
        self._updated = 0
        self._sending = []     # another rank's reduces of this backward: waited for (MPI frees them) at its end
        self._held = []        # pieces whose reduce starts after backward
        self._incoming = {}    # layer index -> requests of held pieces that the next forward waits for
        self._staging = {}     # piece key -> where a held piece's gradient waits
        self._sent = 0         # bytes of gradients reduced during this backward
        self._limit = None     # this backward's budget, once the root's has arrived
        self.held_updates_in_forward = 0  # the root's updates of held pieces made during a forward
        self._flags_up = numpy.zeros(self.flag_count, numpy.int32)    # this rank's, summed on the root
        # The root's sum of the last iteration's flags, then the budget of this iteration's backward.
        self._flags_down = numpy.zeros(self.flag_count + 1, numpy.int64)
        self._announce = self._flags_reduce = None
        solver.applies_update = False  # the root updates blob by blob below, the others receive it
        solver.holds_history = self.rank == self.root

    def on_start(self):
        self.passes = 0
        del self._reduces[:self._updated]  # what is left: held pieces of the last iteration
        self._updated, self._propagating, self._sent, self._limit = 0, [], 0, None
        self.order.updates_after(self.order.mark())  # a held piece's update writes the gradients just cleared
        self._announce_requests()
        if self.synced:
            return
        ready = self.order.mark()  # the root's initial parameters, as the compute stream left them
        for layer_id, data in self.parameters_by_layer():
            self._bcasts.setdefault(layer_id, []).append(self.start(
                self.propagation, lambda stream, data=data: self.propagation.Ibcast(data, root=self.root, stream=stream), after=ready,
                label=("parameters", (layer_id,))))
        self.synced = True

    def param_needed(self, layer_id):
        requests = self._bcasts.pop(layer_id, None)
        if requests:
            self.wait_all(requests, "parameters", layer_id)
            self.order.parameters_arrived(layer_id)
        if self.rank == self.root:
            self._update_held(layer_id)
        else:
            requests = self._incoming.pop(layer_id, None)
            if requests:
                self.wait_all(requests, "parameters", layer_id)
                self.order.parameters_arrived(layer_id)
        self.order.parameters_needed(layer_id)

    def grads_ready(self, layer_id):
        if not self.last_pass():
            return
        if self._limit is None:
            self._limit = self._backward_limit()
        pieces = self._messages.add(layer_pieces(self.solver, self.net.grads_ready_at(layer_id), self.piece_bytes,
                                                 layer_id), last=layer_id == self.final_grads_layer)
        now = []
        for piece in pieces:
            if self._limit == UNLIMITED or self._sent + piece.diff.nbytes <= self._limit:
                self._sent += piece.diff.nbytes
                now.append(piece)
            else:
                self._held.append(piece)
        computed = self.order.mark() if now else None  # their gradients, and their parameters are free
        started = [self._reduce(piece, piece.diff, computed) for piece in now]
        if self.rank != self.root:
            self._sending += started
            for piece in now:
                self._propagate(piece, computed)
        elif self._per_piece:
            self._update_arrived(wait=False)
        if layer_id == self.final_grads_layer:
            self._gather_requests()

    def progress(self):
        if self.rank == self.root and self._per_piece:
            self._update_arrived(wait=False)

    def on_gradients_ready(self):
        if self.final_grads_layer is None:  # a net without gradients still agrees on requests
            self._gather_requests()
        self.wait_all([request for requests in self._bcasts.values() for request in requests],
                      "parameters")  # parameters no forward asked for
        self._bcasts = {}
        finishing = len(self._reduces)  # this iteration's reduces that finish now; held ones start below
        if self.rank == self.root:
            self._budget.backward_done()
            kept_up = self._per_piece and self._updated == finishing
            held = sum(piece.diff.nbytes for piece in self._held)
        self._start_held()
        if self.rank == self.root:
            if not self._per_piece:
                self.wait_all([entry[-1] for entry in self._reduces], "gradients")
                self._average([entry[0] for entry in self._reduces])
                self.solver.get_learning_rate()  # before clipping, as in the solver's own update
                self.solver.clip_gradients()
                self.order.updates_after(self.order.mark())
            self._update_arrived(wait=True, until=finishing)
            self._budget.measure(self._sent, self._sent + held, kept_up)
        self.wait_all([entry[-1] for entry in self._reduces[:finishing]] + self._sending
                      + [self._flags_reduce, self._announce], "gradients")
        self._sending = []
        self._finish_propagation()
        self.order.updates_done()  # the next iteration clears the gradients they read
        self.agreed = requests_from_flags(self._flags_down[:self.flag_count])

    def on_parameters_read(self):
        """Every held piece reduced, updated and in place on every rank."""
        if self.rank == self.root:
            self._update_arrived(wait=True)
        else:
            for layer_id in sorted(self._incoming):
                self.wait_all(self._incoming.pop(layer_id), "parameters", layer_id)
                self.order.parameters_arrived(layer_id)
        self._finish_propagation()
        self.order.updates_done()

    def _finish_propagation(self):
        self.wait_all([request for _, request in self._propagating], "parameters")
        if self.rank != self.root:
            for layer_id in dict.fromkeys(layer_id for layers, _ in self._propagating for layer_id in layers):
                self.order.parameters_arrived(layer_id)
        self._propagating = []

    # ------------------------------------------------------------ pieces held back until after backward

    def _backward_limit(self):
        """This backward's budget, from the root (each rank must hold back the same pieces)."""
        if self.rank != self.root:
            self.wait_all([self._announce], "gradients")
        return int(self._flags_down[self.flag_count])

    def _start_held(self):
        """Reduce the held pieces, lowest layer first, from copies: the next iteration clears the diffs."""
        held = sorted(self._held, key=lambda piece: piece.layers[0])  # stable: a layer's pieces stay in order
        self._held = []
        for piece in held:
            staged = self._staging.get(piece.key)
            if staged is None:
                staged = self._staging[piece.key] = self.xp.empty_like(piece.diff)
            staged[...] = piece.diff
        copied = self.order.mark() if held else None
        step = (self.solver.get_learning_rate(), self.solver.iter) if self.rank == self.root and held else None
        for piece in held:
            request = self._reduce(piece, self._staging[piece.key], copied, step)
            if self.rank != self.root:
                bcast = self.start(
                    self.propagation, lambda stream, piece=piece: self.propagation.Ibcast(piece.data, root=self.root, stream=stream),
                    after=copied, label=piece.label("parameters"))
                self._incoming.setdefault(piece.layers[0], []).extend([request, bcast])

    def _update_held(self, layer_id):
        """The root, before layer `layer_id`'s forward: its held pieces updated (waiting for their sums);
        others that have arrived too."""
        done = self._updated
        self._update_arrived(wait=False)
        last = [k for k in range(self._updated, len(self._reduces)) if self._reduces[k][0].layers[0] == layer_id]
        if last:
            self._update_arrived(wait=True, until=last[-1] + 1)
        self.held_updates_in_forward += self._updated - done

    # ------------------------------------------------------------ the root's update, piece by piece

    def _reduce(self, piece, buffer, after, step=None):
        """Start the reduce of `buffer` (piece `piece`'s gradient) to the root once event `after` completed."""
        if self.rank == self.root:
            work = lambda stream: self.comm.Ireduce(  # noqa: E731
                MPI.IN_PLACE, buffer, op=MPI.SUM, root=self.root, stream=stream)
        else:
            work = lambda stream: self.comm.Ireduce(buffer, None, op=MPI.SUM, root=self.root,  # noqa: E731
                                                    stream=stream)
        request = self.start(self.comm, work, after=after, label=piece.label("gradients"))
        if self.rank == self.root:
            self._budget.started()
            self._reduces.append((piece, None if buffer is piece.diff else buffer, step, request))
        return request

    def _update_arrived(self, wait, until=None):
        """Update and broadcast, in reduce order, the pieces whose sums have arrived (with `wait`, all up to
        entry `until`, or all)."""
        entries = self._reduces if until is None else self._reduces[:until]
        for piece, staged, step, _ in self.arrived(entries, self._updated, wait):
            self._updated += 1
            if step is None and staged is None:  # sent during this backward: the budget measures the wire
                self._budget.arrived(piece.diff.nbytes)
            rate, iteration = step if step is not None else (self.solver.get_learning_rate(), None)
            with timeline.updating(), self.order.updating():
                if staged is not None:
                    piece.diff[...] = staged
                # Averaged here, or all at once before clipping.
                self.solver.update_elements(piece.segments, rate, 1.0 / self.size if self._per_piece else 1.0,
                                            iteration)
                if staged is not None:
                    piece.diff.fill(0)  # the diffs were (or will be) cleared for the next passes
            self._propagate(piece, self.order.updated(piece.layers))

    def _average(self, pieces):
        scale = numpy.float32(1.0 / self.size)
        for piece in pieces:
            piece.diff *= scale

    def _propagate(self, piece, after):
        """Broadcast the parameters of `piece` once event `after` has completed."""
        request = self.start(
            self.propagation, lambda stream: self.propagation.Ibcast(piece.data, root=self.root, stream=stream), after=after,
            label=piece.label("parameters"))
        self._propagating.append((piece.layers, request))

    # ------------------------------------------------------------ stop/snapshot requests

    def _announce_requests(self):
        # The root's _flags_up holds last iteration's sum (Ireduce in place); sent before it is reused.
        if self.rank == self.root:
            self._flags_down[:self.flag_count] = self._flags_up
            self._flags_down[self.flag_count] = self._budget.value
        self._announce = self.start(self.comm, lambda _: self.comm.Ibcast(self._flags_down, root=self.root))  # host flags

    def _gather_requests(self):
        self._flags_up[:] = self.local_flags()
        send = MPI.IN_PLACE if self.rank == self.root else self._flags_up
        recv = self._flags_up if self.rank == self.root else None
        self._flags_reduce = self.start(self.comm, lambda _: self.comm.Ireduce(send, recv, op=MPI.SUM, root=self.root))
