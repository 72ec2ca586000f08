"""SoftmaxWithLoss layer (Caffe's "SoftmaxWithLoss"): softmax then the mean negative log-likelihood.

Labels are read as integers; `ignore_label` positions give neither loss nor gradient; the divisor
follows loss_param.normalization (default VALID), or the legacy `normalize` bool. An optional second
top receives the probabilities. On a GPU (float32/float64 cupy arrays) forward and backward are three
fused kernels (kernels/_softmax_loss_gpu.py) where the array routines launch about thirty.
"""
import numpy

from kernels import _softmax_loss_gpu
from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import (DeferredLabelCheck, LossLayer, canonical_axis, count, loss_scale,
                                    normalization_mode, normalizer)
from scaffe.layer_impls.layer import Layer
from scaffe.layer_impls.softmax import softmax
from scaffe.proto import caffe_pb2

# Caffe clamps probabilities at FLT_MIN before the log, whatever the blob's dtype.
FLT_MIN = float(numpy.finfo(numpy.float32).tiny)


def gather_labels(layer, label_blob, outer, channels, inner, ignore_label):
    """Integer labels as (outer, inner), with a mask of the positions that count; bad labels are errors,
    raised at once for host labels and at the net's next check_deferred_errors() for device labels."""
    xp = get_array_module(label_blob.data)
    labels = label_blob.data.reshape(outer, inner).astype(numpy.int64)
    valid = xp.ones(labels.shape, dtype=bool) if ignore_label is None else labels != ignore_label
    bad = valid & ((labels < 0) | (labels >= channels))
    if xp is numpy:
        if bad.any():
            raise ValueError(f"layer {layer.name!r}: label {int(labels[bad][0])} is outside 0..{channels - 1}")
    else:
        check = getattr(layer, "deferred_label_check", None)
        if check is None or check.channels != channels:
            check = layer.deferred_label_check = DeferredLabelCheck(layer, channels)
        check.record(labels, bad)
    return labels, valid


@register
class SoftmaxWithLossLayer(LossLayer, Layer):
    type = "SoftmaxWithLoss"
    capture_refusal_reason = None
    exact_num_bottom = 2
    min_num_top = 1
    max_num_top = 2

    def setup(self, bottom, top):
        lp = self.param.loss_param
        self.ignore_label = int(lp.ignore_label) if lp.HasField("ignore_label") else None
        self.normalization = normalization_mode(self)
        self.fused = None  # the fused kernels' Workspace, once a GPU forward has run

    def reshape(self, bottom, top):
        self.reshape_loss(bottom, top)
        shape = bottom[0].shape
        self.axis = canonical_axis(self.param.softmax_param.axis, len(shape), self)
        self.dims = (count(shape, 0, self.axis), shape[self.axis], count(shape, self.axis + 1))
        if self.dims[0] * self.dims[2] != bottom[1].count:
            raise ValueError(f"layer {self.name!r}: {bottom[1].count} labels for {self.dims[0] * self.dims[2]} "
                             f"predictions (shape {shape}, softmax axis {self.axis})")
        if len(top) > 1:
            top[1].reshape(shape)

    def forward(self, bottom, top):
        if _softmax_loss_gpu.usable(bottom[0].data, bottom[1].data):
            self._fused_forward(bottom, top)
            return
        self.fused = None
        xp = get_array_module(bottom[0].data)
        outer, channels, inner = self.dims
        self.prob = softmax(bottom[0].data.reshape(self.dims))
        self.labels, self.valid = gather_labels(self, bottom[1], outer, channels, inner, self.ignore_label)
        picked = xp.take_along_axis(self.prob, xp.where(self.valid, self.labels, 0)[:, None, :], axis=1)[:, 0, :]
        logs = xp.log(xp.maximum(picked, picked.dtype.type(FLT_MIN)))
        self.norm = normalizer(self.normalization, outer, inner, self.valid.sum())
        top[0].data[...] = -(logs * self.valid).sum(dtype=numpy.float64) / self.norm
        if len(top) > 1:
            top[1].data[...] = self.prob.reshape(top[1].shape)

    def _fused_forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        outer, channels, inner = self.dims
        if self.fused is None:
            self.fused = _softmax_loss_gpu.Workspace(xp)
        check = getattr(self, "deferred_label_check", None)
        if check is None or check.channels != channels or check.state is not self.fused.check:
            self.deferred_label_check = DeferredLabelCheck(self, channels, state=self.fused.check)
        if getattr(self, "prob", None) is None or self.prob.shape != self.dims or self.prob.dtype != bottom[0].dtype:
            self.prob = xp.empty(self.dims, dtype=bottom[0].dtype)
        count_valid = self.normalization == caffe_pb2.LossParameter.VALID
        fixed_norm = 1.0 if count_valid else normalizer(self.normalization, outer, inner)
        _softmax_loss_gpu.forward(bottom[0].data.reshape(self.dims), bottom[1].data.reshape(-1), self.ignore_label,
                                  count_valid, fixed_norm, self.prob, top[0].data.reshape(-1), self.fused)
        if len(top) > 1:
            top[1].data[...] = self.prob.reshape(top[1].shape)

    def backward(self, top, propagate_down, bottom):
        if len(propagate_down) > 1 and propagate_down[1]:
            raise ValueError(f"layer {self.name!r}: SoftmaxWithLoss cannot backpropagate to the labels")
        if not propagate_down[0]:
            return
        if self.fused is not None:
            _softmax_loss_gpu.backward(self.prob, bottom[1].data.reshape(-1), self.ignore_label,
                                       top[0].diff.reshape(-1), self.fused, bottom[0].diff.reshape(self.dims))
            return
        xp = get_array_module(self.prob)
        dx = bottom[0].diff.reshape(self.dims)
        dx[...] = self.prob
        labels = xp.where(self.valid, self.labels, 0)[:, None, :]
        picked = xp.take_along_axis(dx, labels, axis=1)
        xp.put_along_axis(dx, labels, picked - 1, axis=1)
        dx *= self.valid[:, None, :]
        dx *= (loss_scale(top[0]) / self.norm).astype(dx.dtype)
