"""BNLL layer (Caffe's "BNLL", binomial normal log likelihood): log(1 + exp(x)), computed without overflow."""
from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls.neuron import NeuronLayer

# Caffe clamps the exponent in backward at this value so exp() cannot overflow.
BNLL_THRESHOLD = 50.0


@register
class BNLLLayer(NeuronLayer):
    type = "BNLL"
    capture_refusal_reason = None

    def compute(self, x, y):
        xp = get_array_module(x)
        # x + log(1 + exp(-x)) for x > 0 and log(1 + exp(x)) otherwise: both branches are log1p(exp(-|x|)) + max(x, 0).
        y[...] = xp.log1p(xp.exp(-xp.abs(x))) + xp.maximum(x, 0)

    def gradient(self, x, y, dy, dx):
        xp = get_array_module(x)
        e = xp.exp(xp.minimum(x, x.dtype.type(BNLL_THRESHOLD)))
        dx[...] = dy * e / (e + 1)
