"""Power layer (Caffe's "Power"): (shift + scale * x) ^ power."""
from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls.neuron import NeuronLayer


@register
class PowerLayer(NeuronLayer):
    type = "Power"
    capture_refusal_reason = None

    def setup(self, bottom, top):
        pp = self.param.power_param
        self.power, self.scale, self.shift = float(pp.power), float(pp.scale), float(pp.shift)

    def compute(self, x, y):
        xp = get_array_module(x)
        t = x.dtype.type
        if self.power == 0:
            y[...] = 1
        elif self.power == 1:
            y[...] = t(self.scale) * x + t(self.shift)
        else:
            xp.power(t(self.scale) * x + t(self.shift), t(self.power), out=y)

    def gradient(self, x, y, dy, dx):
        xp = get_array_module(x)
        t = x.dtype.type
        diff_scale = self.power * self.scale
        if diff_scale == 0 or self.power == 1:
            xp.multiply(dy, t(diff_scale), out=dx)
        elif self.power == 2:
            dx[...] = dy * (t(diff_scale * self.scale) * x + t(diff_scale * self.shift))
        else:
            dx[...] = dy * t(diff_scale) * xp.power(t(self.scale) * x + t(self.shift), t(self.power - 1))
