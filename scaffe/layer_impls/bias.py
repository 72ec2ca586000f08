"""Bias layer (Caffe's "Bias"): adds a learned blob, or a second bottom, broadcast over the other axes.

The added blob B covers axes [axis, axis + B.num_axes) of the input; everything before is "outer" and
everything after "inner", so the operation is y[o, d, i] = x[o, d, i] + B[d]. Scale uses the same views.
"""
from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import canonical_axis, count, filled_blob, param_grad_wanted
from scaffe.layer_impls.layer import Layer


def broadcast_axes(layer, bottom_shape, operand_shape, axis):
    """(outer, dim, inner) for an operand of `operand_shape` laid over `bottom_shape` from `axis`."""
    axis = 0 if len(operand_shape) == 0 else canonical_axis(axis, len(bottom_shape), layer)
    end = axis + len(operand_shape)
    if tuple(bottom_shape[axis:end]) != tuple(operand_shape):
        raise ValueError(f"layer {layer.name!r}: shape {tuple(operand_shape)} does not match axes {axis}..{end - 1} "
                         f"of the input shape {tuple(bottom_shape)}")
    return count(bottom_shape, 0, axis), count(operand_shape), count(bottom_shape, end)


def operand_blob_shape(layer, bottom_shape, axis, num_axes):
    """The learned blob's shape: axes [axis, axis + num_axes) of the input (num_axes -1: to the end)."""
    axis = canonical_axis(axis, len(bottom_shape), layer)
    if num_axes < -1:
        raise ValueError(f"layer {layer.name!r}: num_axes must be non-negative or -1, got {num_axes}")
    end = len(bottom_shape) if num_axes == -1 else axis + num_axes
    if end > len(bottom_shape):
        raise ValueError(f"layer {layer.name!r}: axis {axis} + num_axes {num_axes} exceeds the input's "
                         f"{len(bottom_shape)} axes")
    return tuple(bottom_shape[axis:end])


def reduce_to_operand(a3):
    """Sum of an (outer, dim, inner) array over outer and inner."""
    return a3.sum(axis=(0, 2), dtype=a3.dtype)


@register
class BiasLayer(Layer):
    type = "Bias"
    capture_refusal_reason = None
    min_num_bottom = 1
    max_num_bottom = 2
    exact_num_top = 1

    def setup(self, bottom, top):
        bp = self.param.bias_param
        if len(bottom) == 1:
            shape = operand_blob_shape(self, bottom[0].shape, bp.axis, bp.num_axes)
            self.blobs = [filled_blob(self, shape, bottom[0], bp.filler if bp.HasField("filler") else None)]

    def _operand(self, bottom):
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        b = self._operand(bottom)
        self.dims = broadcast_axes(self, bottom[0].shape, b.shape, self.param.bias_param.axis)
        if top[0] is not bottom[0]:
            top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        outer, dim, inner = self.dims
        b = self._operand(bottom).data.reshape(1, dim, 1)
        xp.add(bottom[0].data.reshape(outer, dim, inner), b, out=top[0].data.reshape(outer, dim, inner))

    def backward(self, top, propagate_down, bottom):
        dy = top[0].diff.reshape(self.dims)
        if propagate_down[0] and bottom[0] is not top[0]:
            bottom[0].diff[...] = top[0].diff
        if len(bottom) > 1:
            if propagate_down[1]:
                bottom[1].diff[...] = reduce_to_operand(dy).reshape(bottom[1].shape)
        elif param_grad_wanted(self, 0):
            self.blobs[0].diff += reduce_to_operand(dy).reshape(self.blobs[0].shape)
