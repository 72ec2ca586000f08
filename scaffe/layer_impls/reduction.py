"""Reduction layer (Caffe's "Reduction"): SUM, ASUM, SUMSQ or MEAN over all axes from `axis` on, times coeff."""
from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import canonical_axis, count
from scaffe.layer_impls.layer import Layer
from scaffe.proto import caffe_pb2

_OPS = caffe_pb2.ReductionParameter


@register
class ReductionLayer(Layer):
    type = "Reduction"
    capture_refusal_reason = None
    exact_num_bottom = 1
    exact_num_top = 1

    def setup(self, bottom, top):
        rp = self.param.reduction_param
        self.op, self.coeff = rp.operation, float(rp.coeff)
        if self.op not in (_OPS.SUM, _OPS.ASUM, _OPS.SUMSQ, _OPS.MEAN):
            raise ValueError(f"layer {self.name!r}: unknown reduction operation {self.op}")

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        self.axis = canonical_axis(self.param.reduction_param.axis, len(shape), self)
        self.num, self.dim = count(shape, 0, self.axis), count(shape, self.axis)
        top[0].reshape(shape[:self.axis])

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        x = bottom[0].data.reshape(self.num, self.dim)
        if self.op == _OPS.ASUM:
            x = xp.abs(x)
        elif self.op == _OPS.SUMSQ:
            x = x * x
        scale = self.coeff / self.dim if self.op == _OPS.MEAN else self.coeff
        top[0].data.reshape(self.num)[...] = x.sum(axis=1, dtype=x.dtype) * x.dtype.type(scale)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(bottom[0].data)
        t = bottom[0].data.dtype.type
        dy = top[0].diff.reshape(self.num, 1)
        x = bottom[0].data.reshape(self.num, self.dim)
        dx = bottom[0].diff.reshape(self.num, self.dim)
        if self.op == _OPS.SUM:
            dx[...] = dy * t(self.coeff)
        elif self.op == _OPS.MEAN:
            dx[...] = dy * t(self.coeff / self.dim)
        elif self.op == _OPS.ASUM:
            dx[...] = dy * t(self.coeff) * xp.sign(x)
        else:
            dx[...] = dy * t(2 * self.coeff) * x
