"""Softmax layer (Caffe's "Softmax") along one axis; `softmax` is shared with the softmax losses."""
from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import canonical_axis, count
from scaffe.layer_impls.layer import Layer


def softmax(x3, out=None):
    """Softmax over axis 1 of an (outer, channels, inner) array, max-subtracted like Caffe."""
    xp = get_array_module(x3)
    out = xp.subtract(x3, x3.max(axis=1, keepdims=True), out=out)
    xp.exp(out, out=out)
    out /= out.sum(axis=1, keepdims=True, dtype=out.dtype)
    return out


@register
class SoftmaxLayer(Layer):
    type = "Softmax"
    capture_refusal_reason = None
    exact_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        self.axis = canonical_axis(self.param.softmax_param.axis, len(shape), self)
        self.dims = (count(shape, 0, self.axis), shape[self.axis], count(shape, self.axis + 1))
        if top[0] is not bottom[0]:
            top[0].reshape(shape)

    def forward(self, bottom, top):
        softmax(bottom[0].data.reshape(self.dims), out=top[0].data.reshape(self.dims))

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        y = top[0].data.reshape(self.dims)
        dy = top[0].diff.reshape(self.dims)
        dot = (dy * y).sum(axis=1, keepdims=True, dtype=dy.dtype)
        bottom[0].diff.reshape(self.dims)[...] = (dy - dot) * y
