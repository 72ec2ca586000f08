"""Slice layer (Caffe's "Slice"): cuts its bottom along one axis at slice points (or into equal parts)."""
from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import axis_or_legacy_dim
from scaffe.layer_impls.layer import Layer


@register
class SliceLayer(Layer):
    type = "Slice"
    capture_refusal_reason = None
    exact_num_bottom = 1
    min_num_top = 1

    def setup(self, bottom, top):
        sp = self.param.slice_param
        self.points = [int(p) for p in sp.slice_point]
        if self.points and len(self.points) != len(top) - 1:
            raise ValueError(f"layer {self.name!r}: {len(top)} tops need {len(top) - 1} slice points, "
                             f"got {len(self.points)}")

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        self.axis = axis_or_legacy_dim(self.param.slice_param, "slice_dim", len(shape), self)
        total = shape[self.axis]
        if self.points:
            bounds = [0] + self.points + [total]
            if any(b1 <= b0 for b0, b1 in zip(bounds, bounds[1:])):
                raise ValueError(f"layer {self.name!r}: slice points {self.points} must increase strictly "
                                 f"inside 0..{total}")
        else:
            if total % len(top):
                raise ValueError(f"layer {self.name!r}: axis {self.axis} of size {total} does not split evenly "
                                 f"into {len(top)} tops")
            step = total // len(top)
            bounds = list(range(0, total + 1, step))
        self.bounds = bounds
        self.ndim = len(shape)
        for t, (b0, b1) in zip(top, zip(bounds, bounds[1:])):
            t.reshape(shape[:self.axis] + (b1 - b0,) + shape[self.axis + 1:])

    def _index(self, k):
        index = [slice(None)] * self.ndim
        index[self.axis] = slice(self.bounds[k], self.bounds[k + 1])
        return tuple(index)

    def forward(self, bottom, top):
        for k, t in enumerate(top):
            t.data[...] = bottom[0].data[self._index(k)]

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        if len(top) == 1:
            bottom[0].diff[...] = top[0].diff
            return
        xp = get_array_module(top[0].diff)
        xp.concatenate([t.diff for t in top], axis=self.axis, out=bottom[0].diff)
