"""AdaGrad, Caffe's AdaGradSolver: h += g^2; step = lr * lr_mult * g / (sqrt(h) + delta)."""
import numpy

from scaffe.solvers import register
from scaffe.solvers.sgd import ALL, SGDSolver
from scaffe.solvers.solver import SolverError


@register
class AdaGradSolver(SGDSolver):
    type = "AdaGrad"
    update_kernel = "scaffe_adagrad_update"  # kernels/cuda_sources.py

    def fused_scalars(self, rate):
        return (self.param.delta,)

    def __init__(self, param, **kwargs):
        self.check_settings(param)
        super().__init__(param, **kwargs)

    def check_settings(self, param):
        if param.momentum != 0:
            raise SolverError(f"AdaGrad does not use momentum (got momentum {param.momentum:g}); leave it out")

    def compute_update_value(self, param_id, rate, part=ALL):
        diff = self.diff_of(param_id, part)
        [history] = self.histories(param_id, part)
        self.accumulate(history, diff)
        rate = self.local_rate(param_id, rate)
        diff[...] = rate * (diff / (self.net.xp.sqrt(history) + numpy.float32(self.param.delta)))

    def accumulate(self, history, grad):
        """Folds the squared gradient into the history: AdaGrad sums them all."""
        history += grad * grad
