"""AbsVal layer (Caffe's "AbsVal"): |x|, gradient sign(x) (0 at 0)."""
from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls.neuron import NeuronLayer


@register
class AbsValLayer(NeuronLayer):
    type = "AbsVal"
    capture_refusal_reason = None

    def compute(self, x, y):
        get_array_module(x).abs(x, out=y)

    def gradient(self, x, y, dy, dx):
        xp = get_array_module(x)
        xp.multiply(dy, xp.sign(x), out=dx)
