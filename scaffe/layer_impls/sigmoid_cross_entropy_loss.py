"""SigmoidCrossEntropyLoss layer (Caffe's "SigmoidCrossEntropyLoss"): binary cross-entropy on logits.

Computed in Caffe's overflow-free form; by default divided by the batch size only (BATCH_SIZE), unlike
the other losses. Targets equal to `ignore_label` are skipped.
"""
import numpy

from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import LossLayer, count, loss_scale, normalization_mode, normalizer
from scaffe.layer_impls.layer import Layer
from scaffe.layer_impls.sigmoid import sigmoid
from scaffe.proto import caffe_pb2


@register
class SigmoidCrossEntropyLossLayer(LossLayer, Layer):
    type = "SigmoidCrossEntropyLoss"
    capture_refusal_reason = None
    exact_num_bottom = 2
    exact_num_top = 1

    def setup(self, bottom, top):
        lp = self.param.loss_param
        self.ignore_label = int(lp.ignore_label) if lp.HasField("ignore_label") else None
        self.normalization = normalization_mode(self, default=caffe_pb2.LossParameter.BATCH_SIZE)

    def reshape(self, bottom, top):
        self.reshape_loss(bottom, top)
        if bottom[0].count != bottom[1].count:
            raise ValueError(f"layer {self.name!r}: inputs and targets must have the same count, got "
                             f"{bottom[0].shape} and {bottom[1].shape}")

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        x = bottom[0].data
        target = bottom[1].data.reshape(x.shape)
        positive = (x >= 0).astype(x.dtype)
        losses = x * (target - positive) - xp.log1p(xp.exp(x - 2 * x * positive))
        if self.ignore_label is None:
            self.valid = None
            valid_count = None
        else:
            self.valid = target != self.ignore_label
            losses = losses * self.valid
            valid_count = self.valid.sum()
        outer = x.shape[0]
        self.norm = normalizer(self.normalization, outer, count(x.shape, 1), valid_count)
        top[0].data[...] = -losses.sum(dtype=numpy.float64) / self.norm

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise ValueError(f"layer {self.name!r}: SigmoidCrossEntropyLoss cannot backpropagate to the targets")
        if not propagate_down[0]:
            return
        x = bottom[0].data
        dx = bottom[0].diff
        sigmoid(x, out=dx)
        dx -= bottom[1].data.reshape(x.shape)
        if self.valid is not None:
            dx *= self.valid
        dx *= (loss_scale(top[0]) / self.norm).astype(dx.dtype)
