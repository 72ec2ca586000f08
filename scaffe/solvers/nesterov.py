"""Nesterov's accelerated gradient, Caffe's NesterovSolver: step = (1 + m) * h_new - m * h_old."""
import numpy

from scaffe.solvers import register
from scaffe.solvers.fused import FusedUpdate
from scaffe.solvers.sgd import SGDSolver


@register
class NesterovSolver(SGDSolver):
    type = "Nesterov"
    fused_update = FusedUpdate("scaffe_nesterov_update", ("momentum",), 1, """
    const T previous = h0;
    h0 = (T)momentum * h0 + local_rate * g;
    const T step = ((T)1 + (T)momentum) * h0 - (T)momentum * previous;
""")

    def compute_update_value(self, param_id, rate):
        blob = self.net.learnable_params[param_id]
        history = self.history[param_id]
        momentum = numpy.float32(self.param.momentum)
        previous = history.copy()
        history *= momentum
        history += self.local_rate(param_id, rate) * blob.diff
        # Step back by the old momentum, then over-step along the new one.
        blob.diff[...] = (numpy.float32(1) + momentum) * history - momentum * previous
