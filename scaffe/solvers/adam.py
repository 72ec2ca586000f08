"""Adam, Caffe's AdamSolver: bias correction folded into the rate, L2 weight decay added to the gradient.

m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
step = lr * lr_mult * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + delta), t = iteration + 1.
History holds every m blob, then every v blob (Caffe's solverstate order).
"""
import math

import numpy

from scaffe.solvers import register
from scaffe.solvers.sgd import SGDSolver


@register
class AdamSolver(SGDSolver):
    type = "Adam"
    history_sets = 2

    def compute_update_value(self, param_id, rate):
        beta1 = numpy.float32(self.param.momentum)
        beta2 = numpy.float32(self.param.momentum2)
        one = numpy.float32(1)
        t = self.iter + 1
        correction = numpy.float32(math.sqrt(1.0 - float(beta2) ** t) / (1.0 - float(beta1) ** t))
        blob = self.net.learnable_params[param_id]
        m, v = self.histories(param_id)
        xp = blob.xp
        m *= beta1
        m += (one - beta1) * blob.diff
        v *= beta2
        v += (one - beta2) * (blob.diff * blob.diff)
        blob.diff[...] = (self.local_rate(param_id, rate) * correction) * (m / (xp.sqrt(v) + numpy.float32(self.param.delta)))
