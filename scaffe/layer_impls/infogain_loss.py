"""InfogainLoss layer (Caffe's "InfogainLoss"): softmax of the logits, then -sum_k H[label, k] log p_k.

H comes from infogain_loss_param.source (a binary BlobProto, read relative to the working directory
as Caffe does) or from a third bottom. Divided as loss_param.normalization says (default VALID).
"""
import numpy

from kernels.backend import get_array_module
from scaffe import io as sio
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import LossLayer, canonical_axis, count, loss_scale, normalization_mode, normalizer
from scaffe.layer_impls.layer import Layer
from scaffe.layer_impls.multinomial_logistic_loss import LOG_THRESHOLD
from scaffe.layer_impls.softmax import softmax
from scaffe.layer_impls.softmax_loss import gather_labels


@register
class InfogainLossLayer(LossLayer, Layer):
    type = "InfogainLoss"
    capture_refusal_reason = None
    min_num_bottom = 2
    max_num_bottom = 3
    min_num_top = 1
    max_num_top = 2

    def setup(self, bottom, top):
        lp = self.param.loss_param
        self.ignore_label = int(lp.ignore_label) if lp.HasField("ignore_label") else None
        self.normalization = normalization_mode(self)
        self.infogain = None
        if len(bottom) < 3:
            source = self.param.infogain_loss_param.source
            if not source:
                raise ValueError(f"layer {self.name!r}: InfogainLoss needs infogain_loss_param.source "
                                 f"or a third bottom")
            matrix = sio.read_blob_array(source)
            self.infogain = bottom[0].xp.asarray(matrix, dtype=bottom[0].dtype)

    def allow_force_backward(self, bottom_index):
        return bottom_index == 0

    def reshape(self, bottom, top):
        self.reshape_loss(bottom, top)
        shape = bottom[0].shape
        self.axis = canonical_axis(self.param.infogain_loss_param.axis, len(shape), self)
        self.dims = (count(shape, 0, self.axis), shape[self.axis], count(shape, self.axis + 1))
        if self.dims[0] * self.dims[2] != bottom[1].count:
            raise ValueError(f"layer {self.name!r}: {bottom[1].count} labels for {self.dims[0] * self.dims[2]} "
                             f"predictions")
        matrix = bottom[2].data if len(bottom) > 2 else self.infogain
        if matrix.size != self.dims[1] ** 2:
            raise ValueError(f"layer {self.name!r}: H has {matrix.size} values, expected {self.dims[1]}x{self.dims[1]}")
        if len(top) > 1:
            top[1].reshape(shape)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        outer, channels, inner = self.dims
        self.H = (bottom[2].data if len(bottom) > 2 else self.infogain).reshape(channels, channels)
        self.prob = softmax(bottom[0].data.reshape(self.dims))
        self.labels, self.valid = gather_labels(self, bottom[1], outer, channels, inner, self.ignore_label)
        rows = self.H[xp.where(self.valid, self.labels, 0)]              # (outer, inner, channels)
        self.rows = xp.moveaxis(rows, 2, 1)                              # (outer, channels, inner)
        logs = xp.log(xp.maximum(self.prob, self.prob.dtype.type(LOG_THRESHOLD)))
        per_position = (self.rows * logs).sum(axis=1) * self.valid
        self.norm = normalizer(self.normalization, outer, inner, self.valid.sum())
        top[0].data[...] = -per_position.sum(dtype=numpy.float64) / self.norm
        if len(top) > 1:
            top[1].data[...] = self.prob.reshape(top[1].shape)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise ValueError(f"layer {self.name!r}: InfogainLoss cannot backpropagate to the labels")
        if len(bottom) > 2 and propagate_down[2]:
            raise ValueError(f"layer {self.name!r}: InfogainLoss cannot backpropagate to the infogain matrix")
        if not propagate_down[0]:
            return
        dx = bottom[0].diff.reshape(self.dims)
        # d/dx_k of -sum_j H[l, j] log softmax_j = p_k * sum_j H[l, j] - H[l, k].
        dx[...] = self.prob * self.rows.sum(axis=1, keepdims=True) - self.rows
        dx *= self.valid[:, None, :]
        dx *= (loss_scale(top[0]) / self.norm).astype(dx.dtype)
