"""EuclideanLoss layer (Caffe's "EuclideanLoss"): sum((a - b)^2) / (2 N); gradients flow into both bottoms."""
import numpy

from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import LossLayer, loss_scale
from scaffe.layer_impls.layer import Layer


@register
class EuclideanLossLayer(LossLayer, Layer):
    type = "EuclideanLoss"
    capture_refusal_reason = None
    exact_num_bottom = 2
    exact_num_top = 1

    def allow_force_backward(self, bottom_index):
        return True

    def reshape(self, bottom, top):
        self.reshape_loss(bottom, top)
        if bottom[0].count != bottom[1].count:
            raise ValueError(f"layer {self.name!r}: inputs must have the same count, got {bottom[0].shape} "
                             f"and {bottom[1].shape}")

    def forward(self, bottom, top):
        self.diff = bottom[0].data - bottom[1].data.reshape(bottom[0].shape)
        num = bottom[0].shape[0]
        top[0].data[...] = (self.diff * self.diff).sum(dtype=numpy.float64) / num / 2.0

    def backward(self, top, propagate_down, bottom):
        alpha = loss_scale(top[0]) / bottom[0].shape[0]
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                bottom[i].diff[...] = (self.diff * (sign * alpha).astype(self.diff.dtype)).reshape(bottom[i].shape)
