"""Sigmoid layer (Caffe's "Sigmoid"): 1 / (1 + exp(-x)), computed as 0.5 tanh(0.5 x) + 0.5 like Caffe."""
from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls.neuron import NeuronLayer


def sigmoid(x, out=None):
    """Overflow-free logistic function (tanh form); `out` may alias x."""
    xp = get_array_module(x)
    half = x.dtype.type(0.5)
    out = xp.multiply(x, half, out=out)
    xp.tanh(out, out=out)
    out *= half
    out += half
    return out


@register
class SigmoidLayer(NeuronLayer):
    type = "Sigmoid"
    capture_refusal_reason = None
    needs_input = False

    def compute(self, x, y):
        sigmoid(x, out=y)

    def gradient(self, x, y, dy, dx):
        dx[...] = dy * y * (1 - y)
