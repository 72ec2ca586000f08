"""ContrastiveLoss layer (Caffe's "ContrastiveLoss"): pulls similar pairs together, pushes dissimilar
pairs at least `margin` apart; bottoms are a, b (N, C, 1, 1) and the similarity label (N)."""
import numpy

from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import LossLayer, loss_scale
from scaffe.layer_impls.layer import Layer


@register
class ContrastiveLossLayer(LossLayer, Layer):
    type = "ContrastiveLoss"
    capture_refusal_reason = None
    exact_num_bottom = 3
    exact_num_top = 1

    def setup(self, bottom, top):
        p = self.param.contrastive_loss_param
        self.margin, self.legacy = float(p.margin), bool(p.legacy_version)

    def allow_force_backward(self, bottom_index):
        return bottom_index != 2

    def reshape(self, bottom, top):
        self.reshape_loss(bottom, top)
        if bottom[0].shape != bottom[1].shape or bottom[2].count != bottom[0].shape[0]:
            raise ValueError(f"layer {self.name!r}: needs two inputs of one shape and one label per pair, got "
                             f"{bottom[0].shape}, {bottom[1].shape}, {bottom[2].shape}")

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        num = bottom[0].shape[0]
        self.diff = (bottom[0].data - bottom[1].data).reshape(num, -1)
        self.dist_sq = (self.diff * self.diff).sum(axis=1)
        self.similar = bottom[2].data.reshape(num).astype(numpy.int64) != 0
        if self.legacy:
            dissimilar = xp.maximum(self.margin - self.dist_sq, 0)
        else:
            dissimilar = xp.maximum(self.margin - xp.sqrt(self.dist_sq), 0) ** 2
        loss = xp.where(self.similar, self.dist_sq, dissimilar).sum(dtype=numpy.float64)
        top[0].data[...] = loss / num / 2.0

    def backward(self, top, propagate_down, bottom):
        xp = get_array_module(self.diff)
        num = bottom[0].shape[0]
        t = self.diff.dtype.type
        for i, sign in ((0, 1.0), (1, -1.0)):
            if not propagate_down[i]:
                continue
            alpha = (sign * loss_scale(top[0]) / num).astype(t)
            if self.legacy:
                pushed = self.margin - self.dist_sq > 0
                dissimilar = -alpha * self.diff * pushed[:, None]
            else:
                dist = xp.sqrt(self.dist_sq)
                mdist = self.margin - dist
                # Caffe adds 1e-4 to the distance so coinciding points do not divide by zero.
                beta = -alpha * mdist / (dist + t(1e-4))
                dissimilar = (beta * (mdist > 0))[:, None] * self.diff
            grad = xp.where(self.similar[:, None], alpha * self.diff, dissimilar)
            bottom[i].diff[...] = grad.reshape(bottom[i].shape)
        if propagate_down[2]:
            raise ValueError(f"layer {self.name!r}: ContrastiveLoss cannot backpropagate to the labels")
