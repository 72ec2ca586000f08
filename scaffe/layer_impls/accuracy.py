"""Accuracy layer (Caffe's "Accuracy"): the fraction of labels among the top_k scores.

Caffe's rule, kept exactly: a sample is correct when fewer than top_k *other* classes score >= the
true class, so ties count against the true class. An optional second top gives per-class accuracy.
"""
import numpy

from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import canonical_axis, count
from scaffe.layer_impls.layer import Layer
from scaffe.layer_impls.softmax_loss import gather_labels


@register
class AccuracyLayer(Layer):
    type = "Accuracy"
    exact_num_bottom = 2
    min_num_top = 1
    max_num_top = 2

    def setup(self, bottom, top):
        ap = self.param.accuracy_param
        self.top_k = int(ap.top_k)
        self.ignore_label = int(ap.ignore_label) if ap.HasField("ignore_label") else None

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        self.axis = canonical_axis(self.param.accuracy_param.axis, len(shape), self)
        self.dims = (count(shape, 0, self.axis), shape[self.axis], count(shape, self.axis + 1))
        if self.top_k > self.dims[1]:
            raise ValueError(f"layer {self.name!r}: top_k {self.top_k} exceeds the {self.dims[1]} classes")
        if self.dims[0] * self.dims[2] != bottom[1].count:
            raise ValueError(f"layer {self.name!r}: {bottom[1].count} labels for {self.dims[0] * self.dims[2]} "
                             f"predictions")
        top[0].reshape(())
        if len(top) > 1:
            top[1].reshape((self.dims[1],))

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        outer, channels, inner = self.dims
        scores = bottom[0].data.reshape(self.dims)
        labels, valid = gather_labels(self, bottom[1], outer, channels, inner, self.ignore_label)
        safe = xp.where(valid, labels, 0)
        true_score = xp.take_along_axis(scores, safe[:, None, :], axis=1)
        # The true class always scores >= itself; subtract it.
        better = (scores >= true_score).sum(axis=1) - 1
        correct = (better < self.top_k) & valid
        # 0 when no label counts; computed where the data is, so the host does not wait for it
        top[0].data[...] = correct.sum() / xp.maximum(valid.sum(), 1)
        if len(top) > 1:
            seen = numpy.bincount(numpy.asarray(safe[valid].get() if xp is not numpy else safe[valid]),
                                  minlength=channels)
            hits = numpy.bincount(numpy.asarray(safe[correct].get() if xp is not numpy else safe[correct]),
                                  minlength=channels)
            per_class = numpy.where(seen > 0, hits / numpy.maximum(seen, 1), 0.0)
            top[1].data[...] = xp.asarray(per_class, dtype=top[1].dtype)

    def backward(self, top, propagate_down, bottom):
        if any(propagate_down):
            raise NotImplementedError(f"layer {self.name!r}: Accuracy has no gradient (as in Caffe)")
