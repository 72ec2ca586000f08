"""Flatten layer (Caffe's "Flatten"): merges axes axis..end_axis into one; values are unchanged."""
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import canonical_axis, count
from scaffe.layer_impls.layer import Layer


@register
class FlattenLayer(Layer):
    type = "Flatten"
    capture_refusal_reason = None
    exact_num_bottom = 1
    exact_num_top = 1

    def reshape(self, bottom, top):
        if top[0] is bottom[0]:
            raise ValueError(f"layer {self.name!r}: Flatten cannot run in place")
        fp = self.param.flatten_param
        shape = bottom[0].shape
        start = canonical_axis(fp.axis, len(shape), self)
        end = canonical_axis(fp.end_axis, len(shape), self)
        top[0].reshape(shape[:start] + (count(shape, start, end + 1),) + shape[end + 1:])

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data.reshape(top[0].shape)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff.reshape(bottom[0].shape)
