"""Max and average 2-D pooling, forward and backward, with Caffe's window and output-size rules.

Window rules (Caffe's PoolingLayer): output (py, px) covers rows [py*sh - ph, py*sh - ph + kh).
MAX clips the window to the image and keeps the index of the first largest value in row-major order
(strict `>`), so ties go to the earliest element, as in Caffe. AVE divides by the window clipped to
the *padded* image (padded cells count as zeros), then sums over the window clipped to the image.

CPU kernels (kernels/_pooling_cpu.py) are compiled by numba once and loaded without it (kernels.native),
and split over threads by (image, channel) planes, so that backward's scatter never races. 2x2 and 3x3
windows (LeNet, cifar10, AlexNet, GoogLeNet) get kernels with the window size compiled in: windows that
lie inside the image then run fully unrolled, about 3x faster than loops with run-time bounds. Arrays are
indexed with unsigned integers, which spares numba's negative-index wraparound check in the inner loops
(see _im2col_cpu.py). The GPU twins in kernels/_pooling_gpu.py take cupy arrays and have the same
signatures.
"""
import numpy

from kernels import native
from kernels._threads import run_split
from kernels.backend import get_array_module

__all__ = ["max_pool_forward", "max_pool_backward", "ave_pool_forward", "ave_pool_backward"]

_CPU = "kernels._pooling_cpu"

# Window sizes that get a specialized kernel (the ones common nets use); any other size, e.g. a global
# window, shares one generic kernel instead of compiling one per input size.
SPECIALIZED_WINDOWS = ((2, 2), (3, 3))


def _fixed_window(kh, kw):
    """The window size a kernel compiles in: the size itself if specialized, else (0, 0) (generic)."""
    return (kh, kw) if (kh, kw) in SPECIALIZED_WINDOWS else (0, 0)


def _pair(v):
    return (int(v[0]), int(v[1])) if isinstance(v, (tuple, list)) else (int(v), int(v))


def max_pool_forward(x, kernel, pad, stride, out_size, top=None, mask=None):
    """MAX pooling of x (N, C, H, W) to (N, C, oh, ow) = out_size; returns (top, mask).

    mask (int32, same shape as top) holds each maximum's flat index h*W + w inside its plane,
    which is all backward needs (and what Caffe's second top reports).
    """
    kh, kw = _pair(kernel)
    ph, pw = _pair(pad)
    sh, sw = _pair(stride)
    oh, ow = _pair(out_size)
    n_img, channels, height, width = x.shape
    xp = get_array_module(x)
    shape = (n_img, channels, oh, ow)
    top = xp.empty(shape, dtype=x.dtype) if top is None else top
    mask = xp.empty(shape, dtype=numpy.int32) if mask is None else mask
    x = xp.ascontiguousarray(x)
    if xp is numpy:
        args = (x.ctypes.data, x.size, height, width, kh, kw, ph, pw, sh, sw, oh, ow,
                native.address(top, x.dtype, "pooling: top"), native.address(mask, numpy.int32, "pooling: mask"),
                top.size)
        run_split(native.load(_CPU, "max_forward", x.dtype, *_fixed_window(kh, kw)), args, n_img * channels, x.size)
    else:
        from kernels import _pooling_gpu
        _pooling_gpu.max_forward(x, kh, kw, ph, pw, sh, sw, oh, ow, top, mask)
    return top, mask


def max_pool_backward(dtop, mask, kernel, pad, stride, image_shape, dx=None):
    """Routes each output gradient to its maximum; dx (N, C, H, W) is overwritten.

    The CPU kernel needs only the mask; the geometry lets the GPU twin gather instead of scatter.
    """
    xp = get_array_module(dtop)
    dx = xp.empty(tuple(image_shape), dtype=dtop.dtype) if dx is None else dx
    n_img, channels, height, width = image_shape
    dtop = xp.ascontiguousarray(dtop)
    if xp is numpy:
        if mask.shape != dtop.shape:
            raise ValueError(f"pooling: mask has shape {mask.shape}, the gradient {dtop.shape}")
        args = (dtop.ctypes.data, native.address(mask, numpy.int32, "pooling: mask"), dtop.size, height * width,
                dtop.shape[2] * dtop.shape[3], native.address(dx, dtop.dtype, "pooling: dx"), dx.size)
        run_split(native.load(_CPU, "max_backward", dtop.dtype), args, n_img * channels, dx.size)
    else:
        from kernels import _pooling_gpu
        kh, kw = _pair(kernel)
        ph, pw = _pair(pad)
        sh, sw = _pair(stride)
        _pooling_gpu.max_backward(dtop, mask, kh, kw, ph, pw, sh, sw, dx)
    return dx


def ave_pool_forward(x, kernel, pad, stride, out_size, top=None):
    """AVE pooling of x (N, C, H, W) to (N, C, oh, ow) = out_size with Caffe's divisor rule."""
    kh, kw = _pair(kernel)
    ph, pw = _pair(pad)
    sh, sw = _pair(stride)
    oh, ow = _pair(out_size)
    n_img, channels, height, width = x.shape
    xp = get_array_module(x)
    top = xp.empty((n_img, channels, oh, ow), dtype=x.dtype) if top is None else top
    x = xp.ascontiguousarray(x)
    if xp is numpy:
        args = (x.ctypes.data, x.size, height, width, kh, kw, ph, pw, sh, sw, oh, ow,
                native.address(top, x.dtype, "pooling: top"), top.size)
        run_split(native.load(_CPU, "ave_forward", x.dtype, *_fixed_window(kh, kw)), args, n_img * channels, x.size)
    else:
        from kernels import _pooling_gpu
        _pooling_gpu.ave_forward(x, kh, kw, ph, pw, sh, sw, oh, ow, top)
    return top


def ave_pool_backward(dtop, kernel, pad, stride, image_shape, dx=None):
    """Spreads each output gradient evenly over its window (same divisor as forward); dx is overwritten."""
    kh, kw = _pair(kernel)
    ph, pw = _pair(pad)
    sh, sw = _pair(stride)
    n_img, channels, height, width = image_shape
    oh, ow = dtop.shape[2], dtop.shape[3]
    xp = get_array_module(dtop)
    dx = xp.empty(tuple(image_shape), dtype=dtop.dtype) if dx is None else dx
    dtop = xp.ascontiguousarray(dtop)
    if xp is numpy:
        args = (dtop.ctypes.data, dtop.size, height, width, kh, kw, ph, pw, sh, sw, oh, ow,
                native.address(dx, dtop.dtype, "pooling: dx"), dx.size)
        run_split(native.load(_CPU, "ave_backward", dtop.dtype, *_fixed_window(kh, kw)), args, n_img * channels,
                  dx.size)
    else:
        from kernels import _pooling_gpu
        _pooling_gpu.ave_backward(dtop, kh, kw, ph, pw, sh, sw, dx)
    return dx


def native_calls():
    """What `python -m kernels.native` compiles ahead: every kernel and window, in float32 and float64."""
    windows = (*SPECIALIZED_WINDOWS, (0, 0))
    return [(_CPU, factory, (dtype, *window)) for dtype in native.FLOATS
            for factory in ("max_forward", "ave_forward", "ave_backward") for window in windows] + [
        (_CPU, "max_backward", (dtype,)) for dtype in native.FLOATS]
