"""RMSProp, Caffe's RMSPropSolver: h = d * h + (1 - d) * g^2; step = lr * lr_mult * g / (sqrt(h) + delta)."""
import numpy

from scaffe.solvers import register
from scaffe.solvers.fused import FusedUpdate
from scaffe.solvers.sgd import SGDSolver
from scaffe.solvers.solver import SolverError


@register
class RMSPropSolver(SGDSolver):
    type = "RMSProp"
    fused_update = FusedUpdate("scaffe_rmsprop_update", ("rms_decay", "delta"), 1, """
    h0 = (T)rms_decay * h0 + ((T)1 - (T)rms_decay) * (g * g);
    const T step = local_rate * (g / (sqrt(h0) + (T)delta));
""")

    def fused_scalars(self, rate):
        return (self.param.rms_decay, self.param.delta)

    def __init__(self, param, **kwargs):
        if param.momentum != 0:
            raise SolverError("RMSProp does not use momentum (got momentum "
                              f"{param.momentum:g}); set rms_decay instead and leave momentum out")
        if not 0 <= param.rms_decay <= 1:
            raise SolverError(f"rms_decay must be in [0, 1], got {param.rms_decay:g}")
        super().__init__(param, **kwargs)

    def compute_update_value(self, param_id, rate):
        blob = self.net.learnable_params[param_id]
        history = self.history[param_id]
        xp = blob.xp
        decay = numpy.float32(self.param.rms_decay)
        history *= decay
        history += (numpy.float32(1) - decay) * (blob.diff * blob.diff)
        blob.diff[...] = self.local_rate(param_id, rate) * (blob.diff / (xp.sqrt(history) + numpy.float32(self.param.delta)))
