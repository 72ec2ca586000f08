"""HingeLoss layer (Caffe's "HingeLoss"): one-vs-all hinge, L1 (default) or squared (L2), divided by N."""
import numpy

from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import LossLayer, loss_scale
from scaffe.layer_impls.layer import Layer
from scaffe.layer_impls.softmax_loss import gather_labels
from scaffe.proto import caffe_pb2


@register
class HingeLossLayer(LossLayer, Layer):
    type = "HingeLoss"
    capture_refusal_reason = None
    exact_num_bottom = 2
    exact_num_top = 1

    def setup(self, bottom, top):
        self.norm = self.param.hinge_loss_param.norm

    def reshape(self, bottom, top):
        self.reshape_loss(bottom, top)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        num = bottom[0].shape[0]
        x = bottom[0].data.reshape(num, -1)
        self.labels, _ = gather_labels(self, bottom[1], num, x.shape[1], 1, None)
        # Targets are +1 for the label's class and -1 elsewhere; margins = max(0, 1 - t x).
        self.sign = xp.ones_like(x)
        xp.put_along_axis(self.sign, self.labels, x.dtype.type(-1), axis=1)
        self.margin = xp.maximum(0, 1 + self.sign * x)
        if self.norm == caffe_pb2.HingeLossParameter.L2:
            loss = (self.margin * self.margin).sum(dtype=numpy.float64)
        else:
            loss = self.margin.sum(dtype=numpy.float64)
        top[0].data[...] = loss / num

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise ValueError(f"layer {self.name!r}: HingeLoss cannot backpropagate to the labels")
        if not propagate_down[0]:
            return
        xp = get_array_module(self.margin)
        num = bottom[0].shape[0]
        scale = loss_scale(top[0]) / num
        if self.norm == caffe_pb2.HingeLossParameter.L2:
            grad = self.sign * self.margin * (2 * scale).astype(self.margin.dtype)
        else:
            grad = self.sign * xp.sign(self.margin) * scale.astype(self.margin.dtype)
        bottom[0].diff.reshape(num, -1)[...] = grad
