"""ELU layer (Caffe's "ELU"): x for x > 0, alpha * (exp(x) - 1) otherwise."""
from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls.neuron import NeuronLayer


@register
class ELULayer(NeuronLayer):
    type = "ELU"
    capture_refusal_reason = None

    def setup(self, bottom, top):
        self.alpha = float(self.param.elu_param.alpha)

    def compute(self, x, y):
        xp = get_array_module(x)
        a = x.dtype.type(self.alpha)
        y[...] = xp.where(x > 0, x, a * xp.expm1(xp.minimum(x, 0)))

    def gradient(self, x, y, dy, dx):
        xp = get_array_module(x)
        dx[...] = dy * xp.where(x > 0, x.dtype.type(1), y + x.dtype.type(self.alpha))
