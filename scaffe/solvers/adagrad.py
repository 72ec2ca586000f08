"""AdaGrad, Caffe's AdaGradSolver: h += g^2; step = lr * lr_mult * g / (sqrt(h) + delta)."""
import numpy

from scaffe.solvers import register
from scaffe.solvers.sgd import SGDSolver
from scaffe.solvers.solver import SolverError


@register
class AdaGradSolver(SGDSolver):
    type = "AdaGrad"

    def __init__(self, param, **kwargs):
        if param.momentum != 0:
            raise SolverError(f"AdaGrad does not use momentum (got momentum {param.momentum:g}); leave it out")
        super().__init__(param, **kwargs)

    def compute_update_value(self, param_id, rate):
        blob = self.net.learnable_params[param_id]
        history = self.history[param_id]
        xp = blob.xp
        history += blob.diff * blob.diff
        blob.diff[...] = self.local_rate(param_id, rate) * (blob.diff / (xp.sqrt(history) + numpy.float32(self.param.delta)))
