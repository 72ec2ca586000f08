"""ReLU layer (Caffe's "ReLU"): max(x, 0) + negative_slope * min(x, 0)."""
from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls.neuron import NeuronLayer


@register
class ReLULayer(NeuronLayer):
    type = "ReLU"
    # The sign of y equals the sign of x for slope >= 0, so backward can read the (in-place) output,
    # as Caffe's does; no copy of the input is needed.
    needs_input = False

    def setup(self, bottom, top):
        self.negative_slope = float(self.param.relu_param.negative_slope)

    def compute(self, x, y):
        xp = get_array_module(x)
        if self.negative_slope == 0:
            xp.maximum(x, 0, out=y)
        else:
            slope = x.dtype.type(self.negative_slope)
            xp.add(xp.maximum(x, 0), slope * xp.minimum(x, 0), out=y)

    def gradient(self, x, y, dy, dx):
        xp = get_array_module(dy)
        positive = y > 0
        if self.negative_slope == 0:
            xp.multiply(dy, positive, out=dx)
        else:
            slope = dy.dtype.type(self.negative_slope)
            xp.multiply(dy, xp.where(positive, dy.dtype.type(1), slope), out=dx)
