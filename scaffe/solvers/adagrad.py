"""AdaGrad, Caffe's AdaGradSolver: h += g^2; step = lr * lr_mult * g / (sqrt(h) + delta)."""
import numpy

from scaffe.solvers import register
from scaffe.solvers.fused import FusedUpdate
from scaffe.solvers.sgd import SGDSolver
from scaffe.solvers.solver import SolverError


@register
class AdaGradSolver(SGDSolver):
    type = "AdaGrad"
    fused_update = FusedUpdate("scaffe_adagrad_update", ("delta",), 1, """
    h0 += g * g;
    const T step = local_rate * (g / (sqrt(h0) + (T)delta));
""")

    def fused_scalars(self, rate):
        return (self.param.delta,)

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
