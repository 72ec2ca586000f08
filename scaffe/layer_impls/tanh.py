"""TanH layer (Caffe's "TanH")."""
from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls.neuron import NeuronLayer


@register
class TanHLayer(NeuronLayer):
    type = "TanH"
    capture_refusal_reason = None
    needs_input = False

    def compute(self, x, y):
        get_array_module(x).tanh(x, out=y)

    def gradient(self, x, y, dy, dx):
        dx[...] = dy * (1 - y * y)
