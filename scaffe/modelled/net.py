"""A training net whose compute is modelled: every layer's forward and backward is a wait of the time its
profile gives (scaffe.modelled.profile), leaving the CPU free as a GPU does, while its learnable blobs,
their gradients and the solver's history are real and full size, and the schedules, pieces, collectives
and hooks are the real ones. No activation is allocated and no compute kernel imported.

The device is modelled as one stream: `clock` is when the work queued so far ends. A layer starts when the
layer before it has ended, or later when the host waited longer than SLACK_S for its parameters (a real
dependency, not the host's own overhead, which a GPU's queue hides). The solver's updates have a stream of
their own, as on a GPU (scaffe.parallel.streams): one after the other, beside the layers
(scaffe.modelled.solver).

Every value is known in advance (scaffe.modelled.values): each backward writes its blobs' gradients as
determined by rank, iteration and blob; before each forward, the layer's parameters must be those of the
last update, on every rank. A wrong, missing or stale value stops the run with one line (ModelCheckError).
"""
import time

import numpy

from scaffe.blob import Blob
from scaffe.modelled import values
from scaffe.modelled.profile import ComputeProfile, time_dilation
from scaffe.modelled.shapes import DATA_TYPES, layer_models

SLACK_S = 0.002  # a hook that took longer than this waited for something: the device would have waited too
POLL_S = 0.0002  # how often a wait gives the idle hooks a turn, in modelled (undilated) seconds


class ModelledLayer:
    """What the trainer reads of a layer: its name and type (data layers take their shard here too)."""

    def __init__(self, name, type_):
        self.name, self.type = name, type_


class ModelledNet:
    xp = numpy
    tape = None  # no CUDA graphs: a CPU net (scaffe.capture)
    output_blob_ids = ()  # no outputs to display: the loss is a constant

    def __init__(self, net_param, spec, data_shape=None, history_sets=1):
        self.name = net_param.name
        self.models = layer_models(net_param, data_shape)
        self.layers = [ModelledLayer(m.name, m.type) for m in self.models]
        self.learnable_params, self.params_lr, self.params_weight_decay = [], [], []
        self.owned = []   # layer index -> its learnable ids
        self.owner = []   # learnable id -> layer name
        for model in self.models:
            ids = []
            for shape, lr, decay in model.params:
                ids.append(len(self.learnable_params))
                self.learnable_params.append(Blob(shape))
                self.params_lr.append(lr)
                self.params_weight_decay.append(decay)
                self.owner.append(model.name)
            self.owned.append(ids)
        self.batch_size = next((int(shape[0]) for m in self.models if m.type in DATA_TYPES
                                for shape in m.tops.values() if shape), 1)
        elements = sum(blob.count for blob in self.learnable_params)
        self.profile = ComputeProfile(spec, self.models, self.batch_size, history_sets)
        self.iteration_s = self.profile.iteration_seconds(self.models, elements)
        self.poll_s = POLL_S * time_dilation()
        self.param_needed_hooks, self.grads_ready_hooks, self.layer_timed_hooks = [], [], []
        self.idle_hooks = []  # called while the modelled device computes (a schedule's look at arrived sums)
        self.rank, self.size = 0, 1   # this rank and the ranks, set by scaffe.modelled.solver.modelled_solver
        self.iteration = 0            # the solver's, at the start of each forward
        self.passes = 0               # of this iteration, for the gradients' accumulation
        self.clock = 0.0
        self.update_clock = 0.0  # when the update stream's work queued so far ends

    # ------------------------------------------------------------ what Net offers the solver and schedules

    def add_hooks(self, on_param_needed=None, on_grads_ready=None, on_layer_timed=None):
        for hooks, hook in ((self.param_needed_hooks, on_param_needed), (self.grads_ready_hooks, on_grads_ready),
                            (self.layer_timed_hooks, on_layer_timed)):
            if hook is not None:
                hooks.append(hook)

    def params_needed_at(self, layer_id):
        return list(self.owned[layer_id])

    def grads_ready_at(self, layer_id):
        return list(self.owned[layer_id])

    @staticmethod
    def run_step(owner, work, *args):
        work(*args)

    def _share_weights(self):
        """No shared parameters in a modelled net (scaffe.modelled.shapes refuses them)."""

    def clear_param_diffs(self):
        self.passes = 0  # the first backward writes the gradients, the later passes add theirs

    def update(self):
        raise RuntimeError("a modelled net's parameters are updated by its solver, piece by piece")

    def check_deferred_errors(self):
        """Nothing is deferred on the host."""

    def close(self):
        """No data readers to stop."""

    def forward(self):
        loss = 0.0
        for layer_id in range(len(self.models)):
            self._forward_layer(layer_id)
        return loss

    def forward_backward(self):
        loss = self.forward()
        self.backward()
        return loss

    # ------------------------------------------------------------ the modelled device

    def _forward_layer(self, layer_id):
        name = self.models[layer_id].name
        asked = time.perf_counter()
        for hook in self.param_needed_hooks:
            hook(layer_id)
        waited = time.perf_counter()
        if waited - asked > SLACK_S:
            self.clock = max(self.clock, waited)
        for pid in self.owned[layer_id]:
            values.check_parameters(self, pid, self.iteration - 1)
        self.wait(self.profile.forward.get(name, 0.0))

    def backward(self):
        for layer_id in range(len(self.models) - 1, -1, -1):
            for pid in self.owned[layer_id]:
                values.write_gradient(self, pid, self.iteration, self.passes)
            self.wait(self.profile.backward.get(self.models[layer_id].name, 0.0))
            for hook in self.grads_ready_hooks:
                hook(layer_id)
        self.passes += 1

    def start_iteration(self, iteration):
        """The solver's iteration `iteration` begins: the device is idle at the latest now."""
        self.iteration = iteration
        self.clock = max(self.clock, time.perf_counter())

    def wait_update(self, seconds):
        """The solver's update of a piece on the update stream: queued behind the updates before it, not behind
        the layers the compute stream holds; the host waits for it (it is short)."""
        self.update_clock = max(self.update_clock, time.perf_counter()) + seconds
        left = self.update_clock - time.perf_counter()
        if left > 0:
            time.sleep(left)

    def wait(self, seconds):
        """Queue `seconds` of device work and wait until the device is done with it, calling the idle hooks
        every POLL_S (dilated) meanwhile: on a GPU the host thread runs ahead of the device and reaches the
        schedule's next look at arrived sums while the device computes."""
        self.clock = max(self.clock, time.perf_counter() - SLACK_S) + seconds
        while True:
            left = self.clock - time.perf_counter()
            if left <= 0:
                return
            time.sleep(min(left, self.poll_s))
            for hook in self.idle_hooks:
                hook()
