"""S-Caffe's schedule: gradients flow to the root layer by layer, new parameters flow back layer by layer.

Per iteration:
- backward: as soon as layer i's gradients are complete, their Ireduce to the root starts, while
  layer i-1 computes its backward (the collectives run on their own progress thread). The root
  applies Caffe's update to layer i as soon as its reduce has arrived (sum / P, then the solver's
  per-blob pipeline) and broadcasts layer i's new parameters at once, on a second communicator, so
  that the broadcast moves the other way on the links while the reduces of the layers below go on.
  The other ranks post the matching Ibcast right after their Ireduce of layer i.
- on_gradients_ready: the root updates and broadcasts what is left; every rank waits for its
  reduces and broadcasts, so each iteration ends with the same parameters everywhere.
- The first iteration's parameters come from the root by one Ibcast per layer in forward order,
  and layer i's forward waits only for layer i's.

A solver that clips gradients (`clip_gradients`) needs their global norm: the root then updates
every layer once all reduces are in, and broadcasts after it. Either way each blob sees exactly the
operations of the single-process update, so with P ranks of batch B this computes the step of one
rank with batch P*B on the same samples: each rank's loss is normalised by its own B, so the mean of
the P gradients is the gradient of the P*B batch.

On a GPU a layer's blobs travel as one slice of the solver's flat buffers, the root's update of a
layer is one kernel, and every collective starts after an event on the compute stream (after the
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
from scaffe.solvers.signals import requests_from_flags


class SCaffeSchedule(Schedule):
    def __init__(self, solver, comm):
        super().__init__(solver, comm)
        self.propagation = comm.Dup()  # parameters travel beside the gradient reduces, not behind them
        self._per_layer = solver.param.clip_gradients < 0  # clipping needs every gradient first
        self._bcasts = {}      # layer index -> requests, for the first forward only
        self._propagating = []  # (layer index, request) of this iteration's parameter broadcasts
        self._reduces = []     # (learnable ids, layer index, request) of this iteration's gradient reduces
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
        for layer_id, _, data in self.parameters_by_layer():
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
        pids = self.net.grads_ready_at(layer_id)
        computed = self.order.mark() if pids else None  # layer_id's gradients, and its parameters are free
        for part_pids, diff in self.layer_parts(pids, "diff"):
            if self.rank == self.root:
                work = lambda stream, diff=diff: self.comm.Ireduce(MPI.IN_PLACE, diff, op=MPI.SUM,  # noqa: E731
                                                                   root=self.root, stream=stream)
            else:
                work = lambda stream, diff=diff: self.comm.Ireduce(diff, None, op=MPI.SUM,  # noqa: E731
                                                                   root=self.root, stream=stream)
            request = self.order.start(work, after=computed, label=("gradients", (layer_id,)))
            self._reduces.append((part_pids, layer_id, request))
        if self.rank != self.root:
            self._propagate(layer_id, pids, computed)
        elif self._per_layer:
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
            if not self._per_layer:
                self.wait_all([request for _, _, request in self._reduces], "gradients")
                self._average([pid for pids, _, _ in self._reduces for pid in pids])
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

    # ------------------------------------------------------------ the root's update, layer by layer

    def _update_arrived(self, wait):
        """Update and broadcast, in reduce order, the blobs whose sums have arrived (all, with `wait`)."""
        while self._updated < len(self._reduces):
            pids, layer_id, request = self._reduces[self._updated]
            if wait:
                self.wait_all([request], "gradients")
            elif not request.Test():
                return
            self._updated += 1
            with timeline.updating():
                # Averaged here, or all at once before clipping.
                self.solver.update_params(pids, self.solver.get_learning_rate(),
                                          1.0 / self.size if self._per_layer else 1.0)
            self._propagate(layer_id, pids, self.order.mark())

    def _average(self, pids):
        scale = numpy.float32(1.0 / self.size)
        for pid in pids:
            self.params[pid].diff *= scale

    def _propagate(self, layer_id, pids, after):
        """Broadcast the parameters of `pids` (of layer `layer_id`) once event `after` has completed."""
        for _, data in self.layer_parts(pids, "data"):
            request = self.order.start(lambda stream, data=data: self.propagation.Ibcast(data, root=self.root,
                                                                                         stream=stream),
                                       after=after, label=("parameters", (layer_id,)))
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
