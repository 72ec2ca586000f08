"""Swish layer (Caffe's "Swish"): x * sigmoid(beta * x)."""
from scaffe.layer_impls import register
from scaffe.layer_impls.neuron import NeuronLayer
from scaffe.layer_impls.sigmoid import sigmoid


@register
class SwishLayer(NeuronLayer):
    type = "Swish"
    capture_refusal_reason = None
    needs_input = False

    def setup(self, bottom, top):
        self.beta = float(self.param.swish_param.beta)

    def compute(self, x, y):
        self.sig = sigmoid(x * x.dtype.type(self.beta))
        y[...] = x * self.sig

    def gradient(self, x, y, dy, dx):
        by = y * y.dtype.type(self.beta)
        dx[...] = dy * (by + self.sig * (1 - by))
