"""Concat layer (Caffe's "Concat"): joins its bottoms along one axis; backward hands each its slice."""
from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import axis_or_legacy_dim
from scaffe.layer_impls.layer import Layer


@register
class ConcatLayer(Layer):
    type = "Concat"
    capture_refusal_reason = None
    min_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        ndim = len(bottom[0].shape)
        self.axis = axis_or_legacy_dim(self.param.concat_param, "concat_dim", ndim, self)
        shape = list(bottom[0].shape)
        for b in bottom[1:]:
            if len(b.shape) != ndim or any(b.shape[k] != shape[k] for k in range(ndim) if k != self.axis):
                raise ValueError(f"layer {self.name!r}: bottoms {bottom[0].shape} and {b.shape} differ outside "
                                 f"the concat axis {self.axis}")
            shape[self.axis] += b.shape[self.axis]
        top[0].reshape(shape)

    def forward(self, bottom, top):
        if len(bottom) == 1:
            top[0].data[...] = bottom[0].data
            return
        xp = get_array_module(bottom[0].data)
        xp.concatenate([b.data for b in bottom], axis=self.axis, out=top[0].data)

    def backward(self, top, propagate_down, bottom):
        start = 0
        index = [slice(None)] * len(top[0].shape)
        for i, b in enumerate(bottom):
            size = b.shape[self.axis]
            if propagate_down[i]:
                index[self.axis] = slice(start, start + size)
                b.diff[...] = top[0].diff[tuple(index)]
            start += size
