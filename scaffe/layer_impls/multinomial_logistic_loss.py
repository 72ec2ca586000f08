"""MultinomialLogisticLoss layer (Caffe's "MultinomialLogisticLoss"): -log p[label] on probabilities, / N."""
import numpy

from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import LossLayer, loss_scale
from scaffe.layer_impls.layer import Layer
from scaffe.layer_impls.softmax_loss import gather_labels

# Caffe's kLOG_THRESHOLD: probabilities are clamped here before the log.
LOG_THRESHOLD = 1e-20


@register
class MultinomialLogisticLossLayer(LossLayer, Layer):
    type = "MultinomialLogisticLoss"
    capture_refusal_reason = None
    exact_num_bottom = 2
    exact_num_top = 1

    def reshape(self, bottom, top):
        self.reshape_loss(bottom, top)
        if bottom[1].count != bottom[0].shape[0]:
            raise ValueError(f"layer {self.name!r}: needs one label per item, got {bottom[1].shape} for "
                             f"{bottom[0].shape}")

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        num = bottom[0].shape[0]
        prob = bottom[0].data.reshape(num, -1)
        self.labels, _ = gather_labels(self, bottom[1], num, prob.shape[1], 1, None)
        picked = xp.take_along_axis(prob, self.labels, axis=1)
        self.picked = xp.maximum(picked, picked.dtype.type(LOG_THRESHOLD))
        top[0].data[...] = -xp.log(self.picked).sum(dtype=numpy.float64) / num

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise ValueError(f"layer {self.name!r}: MultinomialLogisticLoss cannot backpropagate to the labels")
        if not propagate_down[0]:
            return
        xp = get_array_module(self.picked)
        num = bottom[0].shape[0]
        dx = bottom[0].diff.reshape(num, -1)
        dx[...] = 0
        scale = (-loss_scale(top[0]) / num).astype(dx.dtype)
        xp.put_along_axis(dx, self.labels, scale / self.picked, axis=1)
