"""Adam, Caffe's AdamSolver: bias correction folded into the rate, L2 weight decay added to the gradient.

m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
step = lr * lr_mult * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + delta), t = iteration + 1.
History holds every m blob, then every v blob (Caffe's solverstate order).
"""
import math

import numpy

from scaffe.solvers import register
from scaffe.solvers.sgd import ALL, SGDSolver


@register
class AdamSolver(SGDSolver):
    type = "Adam"
    history_sets = 2
    update_kernel = "scaffe_adam_update"  # kernels/cuda_sources.py

    def fused_scalars(self, rate):
        return (self.param.momentum, self.param.momentum2, self.bias_correction(), self.param.delta)

    def bias_correction(self):
        """sqrt(1 - beta2^t) / (1 - beta1^t) at t = iteration + 1, folded into the rate."""
        t = (self.iter if self.update_iter is None else self.update_iter) + 1
        return numpy.float32(math.sqrt(1.0 - float(numpy.float32(self.param.momentum2)) ** t)
                             / (1.0 - float(numpy.float32(self.param.momentum)) ** t))

    def compute_update_value(self, param_id, rate, part=ALL):
        beta1 = numpy.float32(self.param.momentum)
        beta2 = numpy.float32(self.param.momentum2)
        one = numpy.float32(1)
        correction = self.bias_correction()
        diff = self.diff_of(param_id, part)
        m, v = self.histories(param_id, part)
        xp = self.net.xp
        m *= beta1
        m += (one - beta1) * diff
        v *= beta2
        v += (one - beta2) * (diff * diff)
        diff[...] = (self.local_rate(param_id, rate) * correction) * (m / (xp.sqrt(v) + numpy.float32(self.param.delta)))
