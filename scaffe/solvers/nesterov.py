"""Nesterov's accelerated gradient, Caffe's NesterovSolver: step = (1 + m) * h_new - m * h_old."""
import numpy

from scaffe.solvers import register
from scaffe.solvers.sgd import ALL, SGDSolver


@register
class NesterovSolver(SGDSolver):
    type = "Nesterov"
    update_kernel = "scaffe_nesterov_update"  # kernels/cuda_sources.py

    def compute_update_value(self, param_id, rate, part=ALL):
        diff = self.diff_of(param_id, part)
        [history] = self.histories(param_id, part)
        momentum = numpy.float32(self.param.momentum)
        previous = history.copy()
        history *= momentum
        history += self.local_rate(param_id, rate) * diff
        # Step back by the old momentum, then over-step along the new one.
        diff[...] = (numpy.float32(1) + momentum) * history - momentum * previous
