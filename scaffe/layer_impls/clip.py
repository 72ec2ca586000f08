"""Clip layer (Caffe's "Clip"): min(max(x, min), max); the gradient passes where min <= x <= max."""
from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls.neuron import NeuronLayer


@register
class ClipLayer(NeuronLayer):
    type = "Clip"
    capture_refusal_reason = None

    def setup(self, bottom, top):
        cp = self.param.clip_param
        if not (cp.HasField("min") and cp.HasField("max")):
            raise ValueError(f"layer {self.name!r}: clip_param needs both min and max")
        if cp.min > cp.max:
            raise ValueError(f"layer {self.name!r}: clip_param min ({cp.min}) is above max ({cp.max})")
        self.lo, self.hi = float(cp.min), float(cp.max)

    def compute(self, x, y):
        t = x.dtype.type
        get_array_module(x).clip(x, t(self.lo), t(self.hi), out=y)

    def gradient(self, x, y, dy, dx):
        t = x.dtype.type
        dx[...] = dy * ((x >= t(self.lo)) & (x <= t(self.hi)))
