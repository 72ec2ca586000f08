"""Log layer (Caffe's "Log"): log_base(shift + scale * x); base -1 means e."""
import math

from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls.neuron import NeuronLayer


@register
class LogLayer(NeuronLayer):
    type = "Log"
    capture_refusal_reason = None

    def setup(self, bottom, top):
        lp = self.param.log_param
        base = float(lp.base)
        if base != -1 and base <= 0:
            raise ValueError(f"layer {self.name!r}: base must be strictly positive (or -1 for e), got {base}")
        self.base_scale = 1.0 if base == -1 else 1.0 / math.log(base)
        self.scale, self.shift = float(lp.scale), float(lp.shift)

    def _inner(self, x):
        t = x.dtype.type
        return x * t(self.scale) + t(self.shift)

    def compute(self, x, y):
        xp = get_array_module(x)
        xp.log(self._inner(x), out=y)
        if self.base_scale != 1:
            y *= x.dtype.type(self.base_scale)

    def gradient(self, x, y, dy, dx):
        dx[...] = dy * dy.dtype.type(self.scale * self.base_scale) / self._inner(x)
