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
"""
import numpy
from mpi4py import MPI

from scaffe.parallel.base import Schedule


class SCaffeSchedule(Schedule):
    def __init__(self, solver, comm):
        super().__init__(solver, comm)
        self._bcasts = {}   # learnable id -> request
        self._reduces = []
        if self.rank != self.root:
            solver.apply_update = self._follow_update

    def on_start(self):
        self.passes = 0
        self._reduces = []
        self._bcasts = {}
        for layer_id in range(len(self.net.layers)):
            for pid in self.net.params_needed_at(layer_id):
                self._bcasts[pid] = self.comm.Ibcast(self.buffer(self.params[pid].data), root=self.root)

    def param_needed(self, layer_id):
        for pid in self.net.params_needed_at(layer_id):
            request = self._bcasts.pop(pid, None)
            if request is not None:
                request.Wait()

    def grads_ready(self, layer_id):
        if not self.last_pass():
            return
        for pid in self.net.grads_ready_at(layer_id):
            diff = self.buffer(self.params[pid].diff)
            if self.rank == self.root:
                self._reduces.append(self.comm.Ireduce(MPI.IN_PLACE, diff, op=MPI.SUM, root=self.root))
            else:
                self._reduces.append(self.comm.Ireduce(diff, None, op=MPI.SUM, root=self.root))

    def on_gradients_ready(self):
        MPI.Request.Waitall(list(self._bcasts.values()))  # parameters no forward asked for
        MPI.Request.Waitall(self._reduces)
        self._reduces = []
        if self.rank == self.root:
            scale = numpy.float32(1.0 / self.size)
            for blob in self.params:
                blob.diff *= scale

    def _follow_update(self):
        """A non-root rank's update: the root's new parameters arrive with the next broadcast."""
        self.solver.last_rate = self.solver.get_learning_rate()
        self.solver.iter += 1
