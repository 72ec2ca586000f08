"""Silence layer (Caffe's "Silence"): consumes blobs so they are not net outputs; gradient zero."""
from scaffe.layer_impls import register
from scaffe.layer_impls.layer import Layer


@register
class SilenceLayer(Layer):
    type = "Silence"
    capture_refusal_reason = None
    min_num_bottom = 1
    exact_num_top = 0

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        pass

    def backward(self, top, propagate_down, bottom):
        for i, b in enumerate(bottom):
            if propagate_down[i]:
                b.diff[...] = 0
