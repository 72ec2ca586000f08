"""The no-overlap baseline: mpi4py's own Allreduce of every gradient after the whole backward.

What a data-parallel Caffe without co-design does, to measure the other schedules against: all
ranks start equal (the root's parameters are broadcast once, before the first iteration or test),
backward runs to the end with no communication, then each gradient is summed by a plain
`MPI.Intracomm.Allreduce` (MPI's own algorithm, not scaffe's collectives), one blob after the other
in the order backward completed them (as a trainer on mpi4py would write it), and
every rank applies the same update. The ranks' stop/snapshot requests follow in one more small
Allreduce. The calls are reported to `collectives.events`, so the timeline and the stall inspector
see them like the others.
"""
import numpy
from mpi4py import MPI

from collectives import events
from scaffe import timeline
from scaffe.parallel.base import Schedule
from scaffe.solvers.signals import requests_from_flags


class NativeSchedule(Schedule):
    def __init__(self, solver, comm):
        super().__init__(solver, comm)
        self.native = MPI.Intracomm(comm)  # the same communicator, with mpi4py's methods
        self.names = {text: events.Name(text, None) for text in ("Bcast", "Allreduce")}
        self._ready = []  # (learnable id, layer index) in the order backward completed their gradients

    def on_start(self):
        self.passes = 0
        self._ready = []
        self.sync_once()

    def broadcast_parameters(self):
        """Every rank takes the root's parameters, by MPI's own Bcast."""
        for layer_id, data in self.parameters_by_layer():
            with events.labelled(("parameters", (layer_id,))):
                events.reported(events.with_label(self.names["Bcast"]), data.nbytes, self.native.Bcast, data, self.root)

    def grads_ready(self, layer_id):
        """Nothing moves during backward (the point of this baseline); the order is kept."""
        if self.last_pass():
            self._ready.extend((pid, layer_id) for pid in self.net.grads_ready_at(layer_id))

    def on_gradients_ready(self):
        flags = numpy.array(self.local_flags(), numpy.int32)  # the ranks' stop/snapshot requests, summed last
        with timeline.waiting("gradients"):
            for pid, layer_id in self._ready:
                diff = self.buffer(self.params[pid].diff)
                with events.labelled(("gradients", (layer_id,))):
                    events.reported(events.with_label(self.names["Allreduce"]), diff.nbytes, self.native.Allreduce,
                                    MPI.IN_PLACE, diff, MPI.SUM)
            events.reported(self.names["Allreduce"], flags.nbytes, self.native.Allreduce, MPI.IN_PLACE, flags, MPI.SUM)
        self.agreed = requests_from_flags(flags)
        scale = numpy.float32(1.0 / self.size)
        for blob in self.params:
            blob.diff *= scale
