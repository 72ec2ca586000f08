"""Reshape layer (Caffe's "Reshape"): new shape for axes [axis, axis + num_axes); dim 0 copies, -1 infers."""
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import count
from scaffe.layer_impls.layer import Layer


@register
class ReshapeLayer(Layer):
    type = "Reshape"
    capture_refusal_reason = None
    exact_num_bottom = 1
    exact_num_top = 1

    def setup(self, bottom, top):
        dims = [int(d) for d in self.param.reshape_param.shape.dim]
        if dims.count(-1) > 1:
            raise ValueError(f"layer {self.name!r}: at most one dim may be -1")
        if any(d < -1 for d in dims):
            raise ValueError(f"layer {self.name!r}: dims must be -1, 0 or positive, got {dims}")
        self.dims = dims

    def reshape(self, bottom, top):
        if top[0] is bottom[0]:
            raise ValueError(f"layer {self.name!r}: Reshape cannot run in place")
        shape = bottom[0].shape
        start, end = self._replaced_axes(shape)
        new_shape = list(shape[:start]) + self._middle_dims(shape, start) + list(shape[end:])
        if -1 in new_shape:
            new_shape[new_shape.index(-1)] = self._inferred_dim(new_shape, bottom[0].count)
        if count(new_shape) != bottom[0].count:
            raise ValueError(f"layer {self.name!r}: shape {new_shape} does not hold the input's "
                             f"{bottom[0].count} values")
        top[0].reshape(new_shape)

    def _replaced_axes(self, shape):
        """[start, end) of the input axes that reshape_param's dims replace."""
        rp = self.param.reshape_param
        ndim = len(shape)
        start = rp.axis + ndim + 1 if rp.axis < 0 else rp.axis
        if not 0 <= start <= ndim:
            raise ValueError(f"layer {self.name!r}: axis {rp.axis} out of range for shape {shape}")
        if rp.num_axes < -1:
            raise ValueError(f"layer {self.name!r}: num_axes must be >= -1")
        end = ndim if rp.num_axes == -1 else start + rp.num_axes
        if end > ndim:
            raise ValueError(f"layer {self.name!r}: axis + num_axes exceeds the input's {ndim} axes")
        return start, end

    def _middle_dims(self, shape, start):
        """The new dims, with each 0 replaced by the input's size along that axis."""
        middle = []
        for i, d in enumerate(self.dims):
            if d == 0 and start + i >= len(shape):
                raise ValueError(f"layer {self.name!r}: dim {i} is 0 but the input has no axis {start + i}")
            middle.append(shape[start + i] if d == 0 else d)
        return middle

    def _inferred_dim(self, new_shape, total):
        known = count([d for d in new_shape if d != -1])
        if known == 0 or total % known:
            raise ValueError(f"layer {self.name!r}: cannot infer the -1 dim of {new_shape} from {total} values")
        return total // known

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data.reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff.reshape(bottom[0].shape)
