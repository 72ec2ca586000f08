"""SGD with momentum, Caffe's SGDSolver: h = momentum * h + lr * lr_mult * g; step = h."""
import numpy

from scaffe.solvers import register
from scaffe.solvers.solver import Solver


@register
class SGDSolver(Solver):
    type = "SGD"

    def compute_update_value(self, param_id, rate):
        blob = self.net.learnable_params[param_id]
        history = self.history[param_id]
        history *= numpy.float32(self.param.momentum)
        history += self.local_rate(param_id, rate) * blob.diff
        blob.diff[...] = history
