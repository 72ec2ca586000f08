"""ReLU layer (Caffe's "ReLU"): max(x, 0) + negative_slope * min(x, 0). On a GPU the plain ReLU's gradient
is one kernel (kernels/cuda_sources.py, scaffe_relu_backward)."""
import numpy

from kernels.backend import get_array_module
from kernels.cuda_sources import ELEMENTWISE, launch_elementwise
from scaffe.layer_impls import register
from scaffe.layer_impls.neuron import NeuronLayer


@register
class ReLULayer(NeuronLayer):
    type = "ReLU"
    capture_refusal_reason = None
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
        if (self.negative_slope == 0 and xp is not numpy and dy.dtype in ELEMENTWISE["scaffe_relu_backward"]
                and all(a.flags.c_contiguous and a.dtype == dy.dtype for a in (y, dx))):
            launch_elementwise("scaffe_relu_backward", dy.dtype, dx.size, y, dy, dx)
            return
        positive = y > 0
        if self.negative_slope == 0:
            xp.multiply(dy, positive, out=dx)
        else:
            slope = dy.dtype.type(self.negative_slope)
            xp.multiply(dy, xp.where(positive, dy.dtype.type(1), slope), out=dx)
