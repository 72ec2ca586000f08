"""AdaDelta, Caffe's AdaDeltaSolver: RMS of past updates over RMS of past gradients, times lr * lr_mult.

History holds the squared-gradient averages for every learnable blob, then the squared-update
averages, as in Caffe's solverstate; `momentum` is the decay of both.
"""
import numpy

from scaffe.solvers import register
from scaffe.solvers.sgd import ALL, SGDSolver


@register
class AdaDeltaSolver(SGDSolver):
    type = "AdaDelta"
    history_sets = 2
    update_kernel = "scaffe_adadelta_update"  # kernels/cuda_sources.py

    def fused_scalars(self, rate):
        return (self.param.momentum, self.param.delta)

    def compute_update_value(self, param_id, rate, part=ALL):
        diff = self.diff_of(param_id, part)
        grad_history, update_history = self.histories(param_id, part)
        xp = self.net.xp
        momentum = numpy.float32(self.param.momentum)
        delta = numpy.float32(self.param.delta)
        one = numpy.float32(1)
        grad_history *= momentum
        grad_history += (one - momentum) * (diff * diff)
        # Both running averages get delta so neither the ratio nor its first steps are degenerate.
        scale = xp.sqrt((update_history + delta) / (grad_history + delta))
        diff *= scale
        update_history *= momentum
        update_history += (one - momentum) * (diff * diff)
        diff *= self.local_rate(param_id, rate)
