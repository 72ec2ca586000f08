"""ArgMax layer (Caffe's "ArgMax"): indices (and optionally values) of the top_k largest entries.

Without `axis` each item's values are flattened and the top is (N, 1, top_k), or (N, 2, top_k) with
out_max_val (indices then values); with `axis` that axis becomes top_k long. Equal values rank the
larger index first, as Caffe's sort of (value, index) pairs does. It has no gradient.
"""
import numpy

from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import canonical_axis, count
from scaffe.layer_impls.layer import Layer


@register
class ArgMaxLayer(Layer):
    type = "ArgMax"
    exact_num_bottom = 1
    exact_num_top = 1

    def setup(self, bottom, top):
        ap = self.param.argmax_param
        self.out_max_val = bool(ap.out_max_val)
        self.top_k = int(ap.top_k)
        self.axis = canonical_axis(ap.axis, len(bottom[0].shape), self) if ap.HasField("axis") else None
        if self.top_k < 1:
            raise ValueError(f"layer {self.name!r}: top_k must be at least 1")

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if self.axis is None:
            if self.top_k > count(shape, 1):
                raise ValueError(f"layer {self.name!r}: top_k {self.top_k} exceeds the {count(shape, 1)} "
                                 f"values per item")
            out = [1] * max(len(shape), 3)
            out[0] = shape[0]
            out[1] = 2 if self.out_max_val else 1
            out[2] = self.top_k
        else:
            if self.top_k > shape[self.axis]:
                raise ValueError(f"layer {self.name!r}: top_k {self.top_k} exceeds axis {self.axis}'s size")
            out = list(shape)
            out[self.axis] = self.top_k
        top[0].reshape(out)

    def _top_k(self, rows):
        """(indices, values) of the top_k per row of a 2-d numpy array."""
        index = numpy.broadcast_to(numpy.arange(rows.shape[1]), rows.shape)
        order = numpy.lexsort((-index, -rows), axis=-1)[:, :self.top_k]
        return order, numpy.take_along_axis(rows, order, axis=1)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        data = bottom[0].data if xp is numpy else bottom[0].data.get()
        if self.axis is None:
            idx, vals = self._top_k(data.reshape(data.shape[0], -1).astype(numpy.float64))
            out = numpy.stack([idx, vals], axis=1) if self.out_max_val else idx[:, None, :]
        else:
            moved = numpy.moveaxis(data, self.axis, -1)
            idx, vals = self._top_k(moved.reshape(-1, moved.shape[-1]).astype(numpy.float64))
            picked = vals if self.out_max_val else idx
            out = numpy.moveaxis(picked.reshape(moved.shape[:-1] + (self.top_k,)), -1, self.axis)
        top[0].data[...] = xp.asarray(out.reshape(top[0].shape), dtype=top[0].dtype)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            raise NotImplementedError(f"layer {self.name!r}: ArgMax has no gradient (as in Caffe)")
