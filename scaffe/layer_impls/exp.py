"""Exp layer (Caffe's "Exp"): base ^ (shift + scale * x); base -1 means e."""
import math

from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls.neuron import NeuronLayer


@register
class ExpLayer(NeuronLayer):
    type = "Exp"
    capture_refusal_reason = None
    needs_input = False

    def setup(self, bottom, top):
        ep = self.param.exp_param
        base = float(ep.base)
        if base != -1 and base <= 0:
            raise ValueError(f"layer {self.name!r}: base must be strictly positive (or -1 for e), got {base}")
        log_base = 1.0 if base == -1 else math.log(base)
        self.inner_scale = log_base * float(ep.scale)
        self.outer_scale = 1.0 if ep.shift == 0 else (math.exp(ep.shift) if base == -1 else base ** ep.shift)

    def compute(self, x, y):
        xp = get_array_module(x)
        t = x.dtype.type
        xp.exp(x * t(self.inner_scale), out=y)
        if self.outer_scale != 1:
            y *= t(self.outer_scale)

    def gradient(self, x, y, dy, dx):
        dx[...] = dy * y * dy.dtype.type(self.inner_scale)
