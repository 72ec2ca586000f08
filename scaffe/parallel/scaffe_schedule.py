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

Stop/snapshot requests: each rank's flags go to the root in a tiny Ireduce started with the last
layer's gradient reduce; the root passes their sum on in a tiny Ibcast started first in the next
on_start. Every rank waits for both with the other collectives and acts on the broadcast sum at
the end of that iteration, so all ranks stop after the same update, with nothing left in flight.
"""
import numpy
from mpi4py import MPI

from collectives import events
from scaffe import timeline
from scaffe.parallel.base import Schedule
from scaffe.solvers.signals import requests_from_flags


class SCaffeSchedule(Schedule):
    def __init__(self, solver, comm):
        super().__init__(solver, comm)
        self.propagation = comm.Dup()  # parameters travel beside the gradient reduces, not behind them
        self._per_layer = solver.param.clip_gradients < 0  # clipping needs every gradient first
        self._bcasts = {}      # learnable id -> request, for the first forward only
        self._propagating = []  # this iteration's parameter broadcasts
        self._reduces = []     # (learnable id, layer index, request) of this iteration's gradient reduces
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
        for layer_id, pid, data in self.parameters_by_layer():
            with events.labelled(("parameters", (layer_id,))):
                self._bcasts[pid] = self.propagation.Ibcast(data, root=self.root)
        self.synced = True

    def param_needed(self, layer_id):
        requests = [self._bcasts.pop(pid) for pid in self.net.params_needed_at(layer_id) if pid in self._bcasts]
        self.wait_all(requests, "parameters", layer_id)

    def grads_ready(self, layer_id):
        if not self.last_pass():
            return
        pids = self.net.grads_ready_at(layer_id)
        with events.labelled(("gradients", (layer_id,))):
            for pid in pids:
                diff = self.buffer(self.params[pid].diff)
                if self.rank == self.root:
                    request = self.comm.Ireduce(MPI.IN_PLACE, diff, op=MPI.SUM, root=self.root)
                else:
                    request = self.comm.Ireduce(diff, None, op=MPI.SUM, root=self.root)
                self._reduces.append((pid, layer_id, request))
        if self.rank != self.root:
            self._propagate(layer_id, pids)
        elif self._per_layer:
            self._update_arrived(wait=False)
        if layer_id == self.final_grads_layer:
            self._gather_requests()

    def on_gradients_ready(self):
        if self.final_grads_layer is None:  # a net without gradients still agrees on requests
            self._gather_requests()
        self.wait_all(list(self._bcasts.values()), "parameters")  # parameters no forward asked for
        self._bcasts = {}
        if self.rank == self.root:
            if not self._per_layer:
                self.wait_all([request for _, _, request in self._reduces], "gradients")
                self._average([pid for pid, _, _ in self._reduces])
                self.solver.get_learning_rate()  # before clipping, as in the solver's own update
                self.solver.clip_gradients()
            self._update_arrived(wait=True)
        self.wait_all([request for _, _, request in self._reduces] + [self._flags_reduce, self._announce],
                      "gradients")
        self.wait_all(self._propagating, "parameters")
        self.agreed = requests_from_flags(self._flags_down)

    # ------------------------------------------------------------ the root's update, blob by blob

    def _update_arrived(self, wait):
        """Update and broadcast, in reduce order, the blobs whose sums have arrived (all, with `wait`)."""
        while self._updated < len(self._reduces):
            pid, layer_id, request = self._reduces[self._updated]
            if wait:
                self.wait_all([request], "gradients")
            elif not request.Test():
                return
            self._updated += 1
            with timeline.updating():
                if self._per_layer:  # else every blob was averaged and clipped before
                    self._average([pid])
                blob = self.params[pid]
                self.solver.compute_step(pid, self.solver.get_learning_rate())
                blob.data -= blob.diff
            self._propagate(layer_id, [pid])

    def _average(self, pids):
        scale = numpy.float32(1.0 / self.size)
        for pid in pids:
            self.params[pid].diff *= scale

    def _propagate(self, layer_id, pids):
        with events.labelled(("parameters", (layer_id,))):
            for pid in pids:
                self._propagating.append(self.propagation.Ibcast(self.buffer(self.params[pid].data), root=self.root))

    # ------------------------------------------------------------ stop/snapshot requests

    def _announce_requests(self):
        # The root's _flags_up holds last iteration's sum (Ireduce in place); sent before it is reused.
        if self.rank == self.root:
            self._flags_down[:] = self._flags_up
        self._announce = self.comm.Ibcast(self._flags_down, root=self.root)

    def _gather_requests(self):
        self._flags_up[:] = self.local_flags()
        send = MPI.IN_PLACE if self.rank == self.root else self._flags_up
        recv = self._flags_up if self.rank == self.root else None
        self._flags_reduce = self.comm.Ireduce(send, recv, op=MPI.SUM, root=self.root)
