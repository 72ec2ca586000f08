"""S-Caffe's schedule: parameters flow from the root layer by layer, gradients flow back layer by layer.

Per iteration:
- on_start: the root's parameters are broadcast with one nonblocking Ibcast per layer, all started
  up front in forward order; layer i's forward waits only for layer i's parameters.
- backward: as soon as layer i's gradients are complete, their Ireduce to the root starts, while
  layer i-1 computes its backward (the collectives run on their own progress thread).
- on_gradients_ready: wait for the reduces; the root averages (sum / P) and applies Caffe's update;
  the other ranks skip the update, since the next broadcast overwrites their parameters.

With P ranks of batch B this computes exactly the step of one rank with batch P*B on the same
samples: each rank's loss is normalised by its own B, so the mean of the P gradients is the
gradient of the P*B batch.

Stop/snapshot requests: each rank's flags go to the root in a tiny Ireduce started with the last
layer's gradient reduce; the root passes their sum on in a tiny Ibcast started first in the next
on_start. Every rank waits for both with the other collectives and acts on the broadcast sum at
the end of that iteration, so all ranks stop after the same update, with nothing left in flight.
"""
import numpy
from mpi4py import MPI

from collectives import events

from scaffe.parallel.base import Schedule
from scaffe.solvers.signals import requests_from_flags


class SCaffeSchedule(Schedule):
    def __init__(self, solver, comm):
        super().__init__(solver, comm)
        self._bcasts = {}   # learnable id -> request
        self._reduces = []
        self._flags_up = numpy.zeros(self.flag_count, numpy.int32)    # this rank's, summed on the root
        self._flags_down = numpy.zeros(self.flag_count, numpy.int32)  # the root's sum of the last iteration
        self._announce = None
        if self.rank != self.root:
            solver.apply_update = self._follow_update

    def on_start(self):
        self.passes = 0
        self._reduces = []
        self._bcasts = {}
        self._announce_requests()
        for layer_id in range(len(self.net.layers)):
            with events.labelled(("parameters", (layer_id,))):
                for pid in self.net.params_needed_at(layer_id):
                    self._bcasts[pid] = self.comm.Ibcast(self.buffer(self.params[pid].data), root=self.root)

    def param_needed(self, layer_id):
        requests = [self._bcasts.pop(pid) for pid in self.net.params_needed_at(layer_id) if pid in self._bcasts]
        self.wait_all(requests, "parameters", layer_id)

    def grads_ready(self, layer_id):
        if not self.last_pass():
            return
        with events.labelled(("gradients", (layer_id,))):
            for pid in self.net.grads_ready_at(layer_id):
                diff = self.buffer(self.params[pid].diff)
                if self.rank == self.root:
                    self._reduces.append(self.comm.Ireduce(MPI.IN_PLACE, diff, op=MPI.SUM, root=self.root))
                else:
                    self._reduces.append(self.comm.Ireduce(diff, None, op=MPI.SUM, root=self.root))
        if layer_id == self.final_grads_layer:
            self._gather_requests()

    def on_test_start(self):
        self.broadcast_parameters()  # the others skipped the root's last update

    def on_gradients_ready(self):
        if self.final_grads_layer is None:  # a net without gradients still agrees on requests
            self._gather_requests()
        self.wait_all(list(self._bcasts.values()), "parameters")  # parameters no forward asked for
        self.wait_all(self._reduces + [self._announce], "gradients")
        self._reduces = []
        self.agreed = requests_from_flags(self._flags_down)
        if self.rank == self.root:
            scale = numpy.float32(1.0 / self.size)
            for blob in self.params:
                blob.diff *= scale

    def _announce_requests(self):
        # The root's _flags_up holds last iteration's sum (Ireduce in place); sent before it is reused.
        if self.rank == self.root:
            self._flags_down[:] = self._flags_up
        self._announce = self.comm.Ibcast(self._flags_down, root=self.root)

    def _gather_requests(self):
        self._flags_up[:] = self.local_flags()
        send = MPI.IN_PLACE if self.rank == self.root else self._flags_up
        recv = self._flags_up if self.rank == self.root else None
        self._reduces.append(self.comm.Ireduce(send, recv, op=MPI.SUM, root=self.root))

    def _follow_update(self):
        """A non-root rank's update: the root's new parameters arrive with the next broadcast."""
        self.solver.last_rate = self.solver.get_learning_rate()
        self.solver.iter += 1
