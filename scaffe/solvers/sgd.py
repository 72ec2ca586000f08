"""SGD with momentum, Caffe's SGDSolver: the update pipeline every solver shares, and its history.

ApplyUpdate follows Caffe's exactly, because users compare loss curves and saved weights with
Caffe's: learning rate -> clip by global L2 norm -> per blob: divide by iter_size, weight decay
(L2 or L1, times decay_mult), the solver's own update value (with lr_mult) -> data -= diff.
SGD's update value: h = momentum * h + lr * lr_mult * g; step = h. The other solvers (one file
each) subclass this one and replace only `compute_update_value`, and, for flat buffers, `update_kernel`
(the same step as one kernel over flat buffers, scaffe.solvers.fused) and `fused_scalars`.

The learnable blobs and the history live in flat buffers (scaffe.solvers.flat), where a step is one
kernel over them (scaffe.solvers.fused: one launch for all blobs on a GPU, one pass per blob on the
CPU) that computes what the pipeline computes; without flat buffers (learnable blobs of mixed types)
each blob goes through the pipeline in turn.
"""
import math

import numpy

from scaffe import io as sio
from scaffe.io import to_host
from scaffe.log import fmt, get_logger
from scaffe.proto import caffe_pb2
from scaffe.solvers import register
from scaffe.solvers.flat import FlatParams
from scaffe.solvers.fused import fused_step
from scaffe.solvers.lr_policy import learning_rate
from scaffe.solvers.solver import Solver, SolverError

log = get_logger(__name__)

ALL = slice(None)  # every element of a blob: the `part` of a whole-blob step


def solver_state(iteration, learned_net, current_step, history):
    """The SolverState a binary .solverstate holds: iteration, weights file, lr policy step, host `history` arrays."""
    state = caffe_pb2.SolverState(iter=iteration, learned_net=learned_net, current_step=current_step)
    for h in history:
        sio.array_to_blobproto(h, blob=state.history.add())
    return state


def _flat_part(array, part):
    """Elements `part` (a slice) of blob-shaped `array` as a flat view: in-place updates write through."""
    return array.reshape(-1)[part]


@register
class SGDSolver(Solver):
    type = "SGD"
    # How many history blobs per learnable blob the solverstate holds (Adam, AdaDelta: 2).
    history_sets = 1
    update_kernel = "scaffe_sgd_update"  # kernels/cuda_sources.py

    def __init__(self, param, **kwargs):
        super().__init__(param, **kwargs)
        self.flat = FlatParams(self.net, self.history_sets) if FlatParams.fits(self.net) else None
        if self.flat is not None:
            self.history = self.flat.history_views()
        else:
            self.history = [blob.xp.zeros(blob.shape, dtype=blob.dtype)
                            for _ in range(self.history_sets) for blob in self.net.learnable_params]
        self._rate = None  # this update's rate, once asked for
        self.update_iter = None  # the iteration whose gradients update_elements applies, while it runs

    def fused_scalars(self, rate):
        """The solver's own scalars of `update_kernel`, in the order of its parameters."""
        return (self.param.momentum,)

    # ------------------------------------------------------------ the update pipeline

    def get_learning_rate(self):
        """This update's rate (Caffe's GetLearningRate), computed once per update: a schedule that
        updates blobs before apply_update asks for it first ("multistep" counts each computation)."""
        if self._rate is None:
            self._rate, self.current_step = learning_rate(self.param, self.iter, self.current_step)
        return self._rate

    def apply_update(self):
        """SGDSolver::ApplyUpdate: lr, clipping, then normalize/regularize/update each blob. With
        `applies_update` False a schedule has updated the blobs: only the rate is accounted for."""
        rate = self.account_rate()
        if not self.applies_update:
            return
        self.clip_gradients()
        self.update_parameters(rate)

    def account_rate(self):
        """This update's rate, taken: kept as `last_rate` and logged on display iterations (a captured
        iteration's graph has applied it already)."""
        rate = self.get_learning_rate()
        self.last_rate, self._rate = rate, None
        if self.root_solver and self._display_due():
            log.info("Iteration %d, lr = %s", self.iter, fmt(rate))
        return rate

    def update_parameters(self, rate, scalars_on_device=None):
        """Every learnable blob updated from its gradient (after clipping), at `rate`."""
        if self.flat is not None:
            self.update_elements([(param_id, 0, blob.count) for param_id, blob in enumerate(self.net.learnable_params)],
                                 rate, scalars_on_device=scalars_on_device)
            return
        for param_id in range(len(self.net.learnable_params)):
            self.compute_step(param_id, rate)
        self.net.update()

    def update_elements(self, segments, rate, grad_scale=1.0, iteration=None, scalars_on_device=None):
        """Elements start:stop of learnable blob param_id, for each (param_id, start, stop) of `segments`
        (a schedule's piece of a layer): gradients times `grad_scale` (a schedule's 1/P), then the per-blob
        pipeline on those elements alone and data -= diff, fused where the solver keeps flat buffers; on a
        GPU the segments must follow each other there: one kernel over their span. `iteration`: the one whose gradients these are, where
        a schedule finishes its update after `iter` moved on (Adam's bias correction counts it).
        `scalars_on_device`: the float32 device array a captured graph's kernel reads fused_arguments from."""
        self.update_iter = self.iter if iteration is None else iteration
        try:
            self._update_elements(segments, rate, grad_scale, scalars_on_device)
        finally:
            self.update_iter = None

    def _update_elements(self, segments, rate, grad_scale, scalars_on_device):
        if self.flat is None:
            for param_id, start, stop in segments:
                part = slice(start, stop)
                diff = self.diff_of(param_id, part)
                if grad_scale != 1.0:
                    diff *= numpy.float32(grad_scale)
                self.compute_step(param_id, rate, part)
                data = self.data_of(param_id, part)
                data -= diff
            return
        rate, scale, weight_decay, own = self.fused_arguments(rate, grad_scale)
        fused_step(self.update_kernel, self.flat, segments, rate, scale, weight_decay, self._l1_regularization(),
                   own, scalars_on_device)

    def fused_arguments(self, rate, grad_scale=1.0):
        """The float scalars of `update_kernel` for this update: rate, grad_scale (a schedule's 1/P and
        iter_size's), weight_decay and the solver's own."""
        scale = numpy.float32(grad_scale) * numpy.float32(1.0 / self.param.iter_size)
        return rate, scale, self.param.weight_decay, self.fused_scalars(rate)

    def clear_param_diffs(self):
        if self.flat is None:
            super().clear_param_diffs()
        else:
            self.flat.diff.fill(0)

    def _l1_regularization(self):
        kind = self.param.regularization_type
        if kind not in ("L1", "L2") and self.param.weight_decay:
            raise SolverError(f"{self._where()}unknown regularization_type {kind!r}; use L2 or L1")
        return kind == "L1"

    def compute_step(self, param_id, rate, part=ALL):
        """The per-blob part of ApplyUpdate: leaves in blob `param_id`'s diff (its elements `part`, a slice
        of the flattened blob) what to subtract. Every step is elementwise, so a part is updated as the
        whole blob would update it."""
        self.normalize(param_id, part)
        self.regularize(param_id, part)
        self.compute_update_value(param_id, rate, part)

    def diff_of(self, param_id, part=ALL):
        """Learnable blob `param_id`'s gradient, elements `part`, as a flat view."""
        return _flat_part(self.net.learnable_params[param_id].diff, part)

    def data_of(self, param_id, part=ALL):
        """Learnable blob `param_id`'s parameters, elements `part`, as a flat view."""
        return _flat_part(self.net.learnable_params[param_id].data, part)

    def clip_gradients(self):
        clip = float(numpy.float32(self.param.clip_gradients))
        if clip < 0:
            return
        if self.flat is not None and self.net.xp is not numpy:
            self._clip_on_device(clip)
            return
        sumsq = 0.0
        for blob in self.net.learnable_params:
            d = blob.diff
            sumsq += float((d.astype(numpy.float64) ** 2).sum()) if isinstance(d, numpy.ndarray) else float((d * d).sum())
        l2norm = math.sqrt(sumsq)
        if l2norm > clip:
            scale = numpy.float32(clip / l2norm)
            self._log_clipping(l2norm, clip, scale)
            for blob in self.net.learnable_params:
                blob.diff *= scale

    def _clip_on_device(self, clip):
        """Clipping decided on the device: the host reads the norm (and logs Caffe's line) only on display
        iterations, where it waits for the device anyway."""
        xp, diff = self.net.xp, self.flat.diff
        l2norm = xp.sqrt((diff.astype(numpy.float64) ** 2).sum())
        scale = xp.where(l2norm > clip, clip / l2norm, 1.0).astype(numpy.float32)
        diff *= scale
        if self.root_solver and self._display_due() and float(l2norm) > clip:
            self._log_clipping(float(l2norm), clip, numpy.float32(float(scale)))

    @staticmethod
    def _log_clipping(l2norm, clip, scale):
        log.info("Gradient clipping: scaling down gradients (L2 norm %s > %s) by scale factor %s",
                 fmt(numpy.float32(l2norm)), fmt(clip), fmt(scale))

    def normalize(self, param_id, part=ALL):
        if self.param.iter_size != 1:
            diff = self.diff_of(param_id, part)
            diff *= numpy.float32(1.0 / self.param.iter_size)

    def regularize(self, param_id, part=ALL):
        local_decay = numpy.float32(self.param.weight_decay) * numpy.float32(self.net.params_weight_decay[param_id])
        if not local_decay:
            return
        kind = self.param.regularization_type
        diff, data = self.diff_of(param_id, part), self.data_of(param_id, part)
        if kind == "L2":
            diff += local_decay * data
        elif kind == "L1":
            diff += local_decay * self.net.xp.sign(data)
        else:
            raise SolverError(f"{self._where()}unknown regularization_type {kind!r}; use L2 or L1")

    def histories(self, param_id, part=ALL):
        """Blob `param_id`'s history blobs, one from each set (the solverstate holds set after set), elements
        `part` of each as a flat view."""
        n = len(self.net.learnable_params)
        return [_flat_part(self.history[k * n + param_id], part) for k in range(self.history_sets)]

    def local_rate(self, param_id, rate):
        return numpy.float32(rate) * numpy.float32(self.net.params_lr[param_id])

    def compute_update_value(self, param_id, rate, part=ALL):
        """Turns blob `param_id`'s gradient (in diff), elements `part`, into the step to subtract (left in diff)."""
        diff = self.diff_of(param_id, part)
        [history] = self.histories(param_id, part)
        history *= numpy.float32(self.param.momentum)
        history += self.local_rate(param_id, rate) * diff
        diff[...] = history

    # ------------------------------------------------------------ the history in the solverstate

    def snapshot_solver_state(self, model_filename):
        history = [to_host(h) for h in self.history]
        if self.param.snapshot_format == caffe_pb2.SolverParameter.HDF5:
            filename = self.snapshot_filename(".solverstate.h5")
            log.info("Snapshotting solver state to HDF5 file %s", filename)
            sio.write_hdf5_solverstate(filename, self.iter, model_filename, self.current_step, history)
        else:
            state = solver_state(self.iter, model_filename, self.current_step, history)
            filename = self.snapshot_filename(".solverstate")
            log.info("Snapshotting solver state to binary proto file %s", filename)
            sio.write_solverstate(state, filename)
        return filename

    def restore_solver_state(self, state, state_file):
        self.current_step = int(state.current_step)
        if len(state.history) != len(self.history):
            raise SolverError(f"{state_file}: holds {len(state.history)} history blobs, the {self.type} solver for "
                              f"this net needs {len(self.history)}: incorrect length of history blobs")
        log.info("SGDSolver: restoring history")
        for i, stored in enumerate(state.history):
            target = self.history[i]
            try:
                values = sio.blobproto_to_array(stored, shape=target.shape)
            except ValueError as e:
                raise SolverError(f"{state_file}: history blob {i}: {e}") from None
            sio.warn_non_finite(values, f"{state_file}: history blob {i}")
            if isinstance(target, numpy.ndarray):
                target[...] = values
            else:
                import cupy
                target[...] = cupy.asarray(values)
