"""Embed layer (Caffe's "Embed"): looks up rows of a (input_dim, num_output) table by integer index."""
import numpy

from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import filled_blob, param_grad_wanted
from scaffe.layer_impls.layer import Layer


@register
class EmbedLayer(Layer):
    type = "Embed"
    exact_num_bottom = 1
    exact_num_top = 1

    def setup(self, bottom, top):
        ep = self.param.embed_param
        self.num_output, self.input_dim = int(ep.num_output), int(ep.input_dim)
        if self.num_output <= 0 or self.input_dim <= 0:
            raise ValueError(f"layer {self.name!r}: num_output and input_dim must be positive")
        self.bias_term = bool(ep.bias_term)
        self.blobs = [filled_blob(self, (self.input_dim, self.num_output), bottom[0], ep.weight_filler)]
        if self.bias_term:
            self.blobs.append(filled_blob(self, (self.num_output,), bottom[0], ep.bias_filler))

    def allow_force_backward(self, bottom_index):
        return False

    def reshape(self, bottom, top):
        top[0].reshape(bottom[0].shape + (self.num_output,))

    def forward(self, bottom, top):
        values = bottom[0].data.reshape(-1)
        index = values.astype(numpy.int64)
        if bool((index != values).any()) or bool(((index < 0) | (index >= self.input_dim)).any()):
            raise ValueError(f"layer {self.name!r}: inputs must be integers in 0..{self.input_dim - 1}")
        self.index = index
        out = top[0].data.reshape(-1, self.num_output)
        out[...] = self.blobs[0].data[index]
        if self.bias_term:
            out += self.blobs[1].data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise ValueError(f"layer {self.name!r}: Embed cannot backpropagate to its (integer) input")
        dy = top[0].diff.reshape(-1, self.num_output)
        if param_grad_wanted(self, 0):
            xp = get_array_module(dy)
            xp.add.at(self.blobs[0].diff, self.index, dy)
        if self.bias_term and param_grad_wanted(self, 1):
            self.blobs[1].diff += dy.sum(axis=0, dtype=dy.dtype)
