"""Dropout layer (Caffe's "Dropout"): in TRAIN keeps each value with probability 1 - ratio and scales
it by 1 / (1 - ratio), so TEST is the identity."""
import numpy

from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import layer_rng
from scaffe.layer_impls.neuron import NeuronLayer
from scaffe.proto import caffe_pb2


@register
class DropoutLayer(NeuronLayer):
    type = "Dropout"
    needs_input = False

    def capture_refusal(self):
        if self.phase == caffe_pb2.TRAIN and not self.random_state():
            return "its random generator keeps no state on the device for a graph to advance"
        return None

    def random_state(self):
        """cupy's Generator keeps its bit generator's state on the device (`_state`), and each draw's kernel
        advances it there, so a graph that replays the draw draws a new mask."""
        state = getattr(getattr(getattr(self, "device_rng", None), "bit_generator", None), "_state", None)
        return [] if state is None else [state]

    def setup(self, bottom, top):
        self.ratio = float(self.param.dropout_param.dropout_ratio)
        if not 0.0 <= self.ratio < 1.0:
            raise ValueError(f"layer {self.name!r}: dropout_ratio must be in [0, 1), got {self.ratio}")
        self.scale = 1.0 / (1.0 - self.ratio)

    def compute(self, x, y):
        if self.phase != caffe_pb2.TRAIN:
            if y is not x:
                y[...] = x
            return
        xp = get_array_module(x)
        if xp is numpy:
            keep = layer_rng(self).uniform(0.0, 1.0, size=x.shape) >= self.ratio
        else:
            keep = self._device_rng(xp).random(x.shape, dtype=x.dtype) >= x.dtype.type(self.ratio)
        # The mask already carries the 1/(1-ratio) factor, so backward is one multiply.
        self.mask = keep.astype(x.dtype)
        self.mask *= x.dtype.type(self.scale)
        xp.multiply(x, self.mask, out=y)

    def _device_rng(self, xp):
        """A generator on the device, so masks are drawn where they are used instead of being drawn on
        the host and copied up; seeded once from the layer's random source, so seeding still decides it."""
        if getattr(self, "device_rng", None) is None:
            source = layer_rng(self)
            draw = source.randint if hasattr(source, "randint") else source.integers
            self.device_rng = xp.random.default_rng(int(draw(0, 2**31 - 1)))
        return self.device_rng

    def gradient(self, x, y, dy, dx):
        if self.phase != caffe_pb2.TRAIN:
            if dx is not dy:
                dx[...] = dy
            return
        get_array_module(dy).multiply(dy, self.mask, out=dx)
