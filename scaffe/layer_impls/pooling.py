"""Pooling layer (Caffe's "Pooling"): MAX and AVE, global pooling, ceil or floor output rounding.

MAX may have a second top, which receives the argmax mask as floats (Caffe's behaviour). STOCHASTIC
pooling is not supported. `Pooler` is also used by the SPP layer.
"""
import numpy

from kernels.backend import get_array_module
from kernels.geometry import pooled_size
from kernels.pooling import ave_pool_backward, ave_pool_forward, max_pool_backward, max_pool_forward
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import pair_field
from scaffe.layer_impls.layer import Layer
from scaffe.proto import caffe_pb2

MAX = caffe_pb2.PoolingParameter.MAX
AVE = caffe_pb2.PoolingParameter.AVE
STOCHASTIC = caffe_pb2.PoolingParameter.STOCHASTIC


class Pooler:
    """One pooling geometry with its argmax buffer, for (N, C, H, W) inputs."""

    def __init__(self, method, kernel, pad, stride, ceil_mode=True):
        if method not in (MAX, AVE):
            raise ValueError("only MAX and AVE pooling are supported (STOCHASTIC is not)")
        if any(p and p >= k for p, k in zip(pad, kernel)):
            raise ValueError(f"pooling pad {pad} must be smaller than the kernel {kernel}")
        self.method, self.kernel, self.pad, self.stride, self.ceil_mode = method, kernel, pad, stride, ceil_mode
        self.mask = None

    def out_size(self, height, width):
        return (pooled_size(height, self.kernel[0], self.pad[0], self.stride[0], self.ceil_mode),
                pooled_size(width, self.kernel[1], self.pad[1], self.stride[1], self.ceil_mode))

    def forward(self, x, y):
        if self.method == MAX:
            xp = get_array_module(x)
            if self.mask is None or self.mask.shape != y.shape or get_array_module(self.mask) is not xp:
                self.mask = xp.empty(y.shape, dtype=numpy.int32)
            max_pool_forward(x, self.kernel, self.pad, self.stride, y.shape[2:], top=y, mask=self.mask)
        else:
            ave_pool_forward(x, self.kernel, self.pad, self.stride, y.shape[2:], top=y)

    def backward(self, dy, dx):
        if self.method == MAX:
            max_pool_backward(dy, self.mask, self.kernel, self.pad, self.stride, dx.shape, dx=dx)
        else:
            ave_pool_backward(dy, self.kernel, self.pad, self.stride, dx.shape, dx=dx)


@register
class PoolingLayer(Layer):
    type = "Pooling"
    capture_refusal_reason = None
    exact_num_bottom = 1
    min_num_top = 1
    max_num_top = 2

    def setup(self, bottom, top):
        pp = self.param.pooling_param
        where = f"layer {self.name!r}"
        self.global_pooling = pp.global_pooling
        _check_kernel_fields(pp, where)
        kernel = pair_field(pp, "kernel_size", "kernel_h", "kernel_w")
        pad = pair_field(pp, "pad", "pad_h", "pad_w")
        stride = pair_field(pp, "stride", "stride_h", "stride_w")
        _check_window(pp.global_pooling, kernel, pad, stride, where)
        if pp.pool == STOCHASTIC:
            raise ValueError(f"{where}: STOCHASTIC pooling is not supported")
        if len(top) > 1 and pp.pool != MAX:
            raise ValueError(f"{where}: only MAX pooling has a second (mask) top")
        self.pooler = Pooler(pp.pool, kernel, pad, stride, pp.round_mode == caffe_pb2.PoolingParameter.CEIL)

    def reshape(self, bottom, top):
        if len(bottom[0].shape) != 4:
            raise ValueError(f"layer {self.name!r}: Pooling needs 4-d (N, C, H, W) input, got {bottom[0].shape}")
        n_img, channels, height, width = bottom[0].shape
        if self.global_pooling:
            self.pooler.kernel = (height, width)
        out = self.pooler.out_size(height, width)
        for t in top:
            t.reshape((n_img, channels) + out)

    def forward(self, bottom, top):
        self.pooler.forward(bottom[0].data, top[0].data)
        if len(top) > 1:
            top[1].data[...] = self.pooler.mask

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self.pooler.backward(top[0].diff, bottom[0].diff)


def _check_kernel_fields(pp, where):
    """The kernel size is given exactly one way (none with global_pooling), as Caffe requires."""
    given_hw = pp.HasField("kernel_h") or pp.HasField("kernel_w")
    if pp.global_pooling:
        if pp.HasField("kernel_size") or given_hw:
            raise ValueError(f"{where}: with global_pooling the kernel size cannot be given")
    elif pp.HasField("kernel_size") == given_hw:
        raise ValueError(f"{where}: give either kernel_size or kernel_h and kernel_w")
    elif pp.HasField("kernel_h") != pp.HasField("kernel_w"):
        raise ValueError(f"{where}: kernel_h and kernel_w must be given together")


def _check_window(global_pooling, kernel, pad, stride, where):
    if global_pooling:
        if pad != (0, 0) or stride != (1, 1):
            raise ValueError(f"{where}: with global_pooling pad must be 0 and stride 1")
    elif min(kernel) <= 0:
        raise ValueError(f"{where}: kernel size must be positive")
    if min(stride) <= 0:
        raise ValueError(f"{where}: stride must be positive")
    if (pad[0] or pad[1]) and not (pad[0] < kernel[0] and pad[1] < kernel[1]):
        raise ValueError(f"{where}: pad must be smaller than the kernel")
