"""Eltwise layer (Caffe's "Eltwise"): element-wise SUM (with coefficients), PROD or MAX of its bottoms."""
import numpy

from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls.layer import Layer
from scaffe.proto import caffe_pb2

PROD = caffe_pb2.EltwiseParameter.PROD
SUM = caffe_pb2.EltwiseParameter.SUM
MAX = caffe_pb2.EltwiseParameter.MAX


@register
class EltwiseLayer(Layer):
    type = "Eltwise"
    capture_refusal_reason = None
    min_num_bottom = 2
    exact_num_top = 1

    def setup(self, bottom, top):
        ep = self.param.eltwise_param
        self.op = ep.operation
        if len(ep.coeff) and self.op != SUM:
            raise ValueError(f"layer {self.name!r}: coefficients are only for the SUM operation")
        if len(ep.coeff) not in (0, len(bottom)):
            raise ValueError(f"layer {self.name!r}: give one coeff per bottom ({len(bottom)}), got {len(ep.coeff)}")
        self.coeffs = [float(c) for c in ep.coeff] if len(ep.coeff) else [1.0] * len(bottom)
        self.stable_prod_grad = bool(ep.stable_prod_grad)

    def reshape(self, bottom, top):
        for b in bottom[1:]:
            if b.shape != bottom[0].shape:
                raise ValueError(f"layer {self.name!r}: all bottoms must have the same shape, "
                                 f"got {bottom[0].shape} and {b.shape}")
        if any(top[0] is b for b in bottom):
            raise ValueError(f"layer {self.name!r}: Eltwise cannot run in place")
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        y = top[0].data
        t = y.dtype.type
        if self.op == SUM:
            acc = bottom[0].data * t(self.coeffs[0])
            for b, c in zip(bottom[1:], self.coeffs[1:]):
                acc += b.data if c == 1 else b.data * t(c)
            y[...] = acc
        elif self.op == PROD:
            acc = bottom[0].data * bottom[1].data
            for b in bottom[2:]:
                acc *= b.data
            y[...] = acc
        else:
            # Caffe's tie rule: between the first two bottoms the second wins a tie; later bottoms must be
            # strictly larger to take over.
            first, second = bottom[0].data, bottom[1].data
            mask = xp.where(first > second, 0, 1).astype(numpy.int32)
            acc = xp.where(first > second, first, second)
            for i, b in enumerate(bottom[2:], start=2):
                better = b.data > acc
                mask = xp.where(better, numpy.int32(i), mask)  # not mask[better] = i: a host sync on cupy
                acc = xp.where(better, b.data, acc)
            self.mask = mask
            y[...] = acc

    def backward(self, top, propagate_down, bottom):
        dy = top[0].diff
        t = dy.dtype.type
        for i, b in enumerate(bottom):
            if not propagate_down[i]:
                continue
            if self.op == SUM:
                c = self.coeffs[i]
                if c == 1:
                    if b.diff is not dy:
                        b.diff[...] = dy
                else:
                    b.diff[...] = dy * t(c)
            elif self.op == PROD:
                if self.stable_prod_grad:
                    others = None
                    for j, o in enumerate(bottom):
                        if j != i:
                            others = o.data.copy() if others is None else others * o.data
                    b.diff[...] = dy * others
                else:
                    b.diff[...] = dy * top[0].data / b.data
            else:
                b.diff[...] = dy * (self.mask == i)
