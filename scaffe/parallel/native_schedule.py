"""The no-overlap baseline: mpi4py's own Allreduce of every gradient after the whole backward.

What a data-parallel Caffe without co-design does, to measure the other schedules against: all
ranks start equal (the root's parameters are broadcast once, at the first iteration), backward runs
to the end with no communication, then each gradient is summed by a plain `MPI.Intracomm.Allreduce`
(MPI's own algorithm, not scaffe's collectives), one blob after the other in the order backward
completed them (the scaffe schedule's messages, without the overlap), and every rank applies the
same update. The calls are reported to `collectives.events`, so the timeline and the stall
inspector see them like the others.
"""
import numpy
from mpi4py import MPI

from collectives import events
from scaffe import timeline
from scaffe.parallel.base import Schedule


class NativeSchedule(Schedule):
    def __init__(self, solver, comm):
        super().__init__(solver, comm)
        self.native = MPI.Intracomm(comm)  # the same communicator, with mpi4py's methods
        self._synced = False
        self._ready = []  # learnable ids in the order backward completed their gradients

    def on_start(self):
        self.passes = 0
        self._ready = []
        if not self._synced:
            for blob in self.params:
                data = self.buffer(blob.data)
                events.reported("Bcast", data.nbytes, self.native.Bcast, data, self.root)
            self._synced = True

    def grads_ready(self, layer_id):
        """Nothing moves during backward (the point of this baseline); the order is kept."""
        if self.last_pass():
            self._ready.extend(self.net.grads_ready_at(layer_id))

    def on_gradients_ready(self):
        with timeline.waiting("gradients"):
            for pid in self._ready:
                diff = self.buffer(self.params[pid].diff)
                events.reported("Allreduce", diff.nbytes, self.native.Allreduce, MPI.IN_PLACE, diff, MPI.SUM)
        scale = numpy.float32(1.0 / self.size)
        for blob in self.params:
            blob.diff *= scale
