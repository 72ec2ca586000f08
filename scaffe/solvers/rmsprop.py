"""RMSProp, Caffe's RMSPropSolver: h = d * h + (1 - d) * g^2; step = lr * lr_mult * g / (sqrt(h) + delta).

AdaGrad's step on a decaying average of the squared gradients instead of their sum.
"""
import numpy

from scaffe.solvers import register
from scaffe.solvers.adagrad import AdaGradSolver
from scaffe.solvers.solver import SolverError


@register
class RMSPropSolver(AdaGradSolver):
    type = "RMSProp"
    update_kernel = "scaffe_rmsprop_update"  # kernels/cuda_sources.py

    def fused_scalars(self, rate):
        return (self.param.rms_decay, self.param.delta)

    def check_settings(self, param):
        if param.momentum != 0:
            raise SolverError("RMSProp does not use momentum (got momentum "
                              f"{param.momentum:g}); set rms_decay instead and leave momentum out")
        if not 0 <= param.rms_decay <= 1:
            raise SolverError(f"rms_decay must be in [0, 1], got {param.rms_decay:g}")

    def accumulate(self, history, grad):
        decay = numpy.float32(self.param.rms_decay)
        history *= decay
        history += (numpy.float32(1) - decay) * (grad * grad)
