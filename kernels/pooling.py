"""Max and average 2-D pooling, forward and backward, with Caffe's window and output-size rules.

Window rules (Caffe's PoolingLayer): output (py, px) covers rows [py*sh - ph, py*sh - ph + kh).
MAX clips the window to the image and keeps the index of the first largest value in row-major order
(strict `>`), so ties go to the earliest element, as in Caffe. AVE divides by the window clipped to
the *padded* image (padded cells count as zeros), then sums over the window clipped to the image.

CPU kernels are numba-compiled (nogil) and split over threads by (image, channel) planes, so that
backward's scatter never races. 2x2 and 3x3 windows (LeNet, cifar10, AlexNet, GoogLeNet) get kernels
with the window size compiled in: windows that lie inside the image then run fully unrolled, about 3x
faster than loops with run-time bounds. Arrays are indexed with unsigned integers, which spares
numba's negative-index wraparound check in the inner loops (see im2col.py). The GPU twins in
kernels/_pooling_gpu.py take cupy arrays and have the same signatures.
"""
import functools

import numpy
from numba import njit, uint64

from kernels._threads import run_split
from kernels.backend import get_array_module

__all__ = ["max_pool_forward", "max_pool_backward", "ave_pool_forward", "ave_pool_backward"]

# Window sizes that get a specialized kernel (the ones common nets use); any other size, e.g. a global
# window, shares one generic kernel instead of compiling one per input size.
SPECIALIZED_WINDOWS = ((2, 2), (3, 3))


# Windows that the image edge cuts: their bounds are clipped at run time. These helpers are inlined into
# the kernels at numba's IR level; the windows inside the image (the hot path, unrolled when the size is
# compiled in) are written out in the kernels themselves.
@njit(cache=True, inline="always")
def _max_clipped(x, src, height, width, hs, ws, kh, kw):
    """(largest value, its flat index in the plane) of a clipped window; ties go to the first, as in Caffe."""
    best = -numpy.inf
    arg = -1
    for h in range(max(hs, 0), min(hs + kh, height)):
        for w in range(max(ws, 0), min(ws + kw, width)):
            v = x[uint64(src + h * width + w)]
            if v > best:
                best = v
                arg = h * width + w
    return best, arg


@njit(cache=True, inline="always")
def _sum_clipped(x, src, height, width, hs, ws, he, we):
    acc = 0.0
    for h in range(max(hs, 0), min(he, height)):
        for w in range(max(ws, 0), min(we, width)):
            acc += x[uint64(src + h * width + w)]
    return acc


@njit(cache=True, inline="always")
def _spread_clipped(dx, dst, height, width, hs, ws, he, we, g):
    for h in range(max(hs, 0), min(he, height)):
        for w in range(max(ws, 0), min(we, width)):
            dx[uint64(dst + h * width + w)] += g


# Each factory compiles its kernel for one window size: fixed_kh/kw > 0 compile the size in (numba
# treats closure variables as constants), 0 reads it from the arguments. Cached: one kernel per size.
@functools.cache
def _max_forward_kernel(fixed_kh, fixed_kw):
    @njit(cache=True, nogil=True)
    def max_forward(x, height, width, kh, kw, ph, pw, sh, sw, oh, ow, top, mask, first, last):
        if fixed_kh > 0:
            kh = fixed_kh
            kw = fixed_kw
        plane_in = height * width
        plane_out = oh * ow
        for pl in range(first, last):
            src = pl * plane_in
            dst = pl * plane_out
            for py in range(oh):
                hs = py * sh - ph
                for px in range(ow):
                    ws = px * sw - pw
                    if hs >= 0 and ws >= 0 and hs + kh <= height and ws + kw <= width:
                        arg = hs * width + ws
                        best = x[uint64(src + arg)]
                        for i in range(kh):
                            row = (hs + i) * width + ws
                            at = uint64(src + row)
                            for j in range(kw):
                                v = x[at + uint64(j)]
                                if v > best:
                                    best = v
                                    arg = row + j
                    else:
                        best, arg = _max_clipped(x, src, height, width, hs, ws, kh, kw)
                    out = uint64(dst + py * ow + px)
                    top[out] = best
                    mask[out] = arg

    return max_forward


@functools.cache
def _ave_forward_kernel(fixed_kh, fixed_kw):
    @njit(cache=True, nogil=True)
    def ave_forward(x, height, width, kh, kw, ph, pw, sh, sw, oh, ow, top, first, last):
        if fixed_kh > 0:
            kh = fixed_kh
            kw = fixed_kw
        plane_in = height * width
        plane_out = oh * ow
        for pl in range(first, last):
            src = pl * plane_in
            dst = pl * plane_out
            for py in range(oh):
                hs = py * sh - ph
                he = min(hs + kh, height + ph)
                for px in range(ow):
                    ws = px * sw - pw
                    if hs >= 0 and ws >= 0 and hs + kh <= height and ws + kw <= width:
                        acc = 0.0
                        for i in range(kh):
                            at = uint64(src + (hs + i) * width + ws)
                            for j in range(kw):
                                acc += x[at + uint64(j)]
                        top[uint64(dst + py * ow + px)] = acc / (kh * kw)
                    else:
                        we = min(ws + kw, width + pw)
                        acc = _sum_clipped(x, src, height, width, hs, ws, he, we)
                        top[uint64(dst + py * ow + px)] = acc / ((he - hs) * (we - ws))

    return ave_forward


@functools.cache
def _ave_backward_kernel(fixed_kh, fixed_kw):
    @njit(cache=True, nogil=True)
    def ave_backward(dtop, height, width, kh, kw, ph, pw, sh, sw, oh, ow, dx, first, last):
        if fixed_kh > 0:
            kh = fixed_kh
            kw = fixed_kw
        plane_in = height * width
        plane_out = oh * ow
        for pl in range(first, last):
            src = pl * plane_out
            dst = pl * plane_in
            for q in range(dst, dst + plane_in):
                dx[uint64(q)] = 0
            for py in range(oh):
                hs = py * sh - ph
                he = min(hs + kh, height + ph)
                for px in range(ow):
                    ws = px * sw - pw
                    if hs >= 0 and ws >= 0 and hs + kh <= height and ws + kw <= width:
                        g = dtop[uint64(src + py * ow + px)] / (kh * kw)
                        for i in range(kh):
                            at = uint64(dst + (hs + i) * width + ws)
                            for j in range(kw):
                                dx[at + uint64(j)] += g
                    else:
                        we = min(ws + kw, width + pw)
                        g = dtop[uint64(src + py * ow + px)] / ((he - hs) * (we - ws))
                        _spread_clipped(dx, dst, height, width, hs, ws, he, we, g)

    return ave_backward


def _fixed_window(kh, kw):
    """The window size a kernel compiles in: the size itself if specialized, else (0, 0) (generic)."""
    return (kh, kw) if (kh, kw) in SPECIALIZED_WINDOWS else (0, 0)


@njit(cache=True, nogil=True)
def _max_backward_cpu(dtop, mask, plane_in, plane_out, dx, first, last):
    for pl in range(first, last):
        src = pl * plane_out
        dst = pl * plane_in
        for q in range(dst, dst + plane_in):
            dx[uint64(q)] = 0
        for q in range(src, src + plane_out):
            arg = mask[uint64(q)]
            if arg >= 0:
                dx[uint64(dst + arg)] += dtop[uint64(q)]


def _pair(v):
    return (int(v[0]), int(v[1])) if isinstance(v, (tuple, list)) else (int(v), int(v))


def _flat(a, what):
    if not a.flags.c_contiguous:
        raise ValueError(f"pooling: {what} must be C-contiguous")
    return a.reshape(-1)


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
        args = (x.reshape(-1), height, width, kh, kw, ph, pw, sh, sw, oh, ow, _flat(top, "top"), _flat(mask, "mask"))
        run_split(_max_forward_kernel(*_fixed_window(kh, kw)), args, n_img * channels, x.size)
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
        args = (dtop.reshape(-1), _flat(mask, "mask"), height * width, dtop.shape[2] * dtop.shape[3], _flat(dx, "dx"))
        run_split(_max_backward_cpu, args, n_img * channels, dx.size)
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
        args = (x.reshape(-1), height, width, kh, kw, ph, pw, sh, sw, oh, ow, _flat(top, "top"))
        run_split(_ave_forward_kernel(*_fixed_window(kh, kw)), args, n_img * channels, x.size)
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
        args = (dtop.reshape(-1), height, width, kh, kw, ph, pw, sh, sw, oh, ow, _flat(dx, "dx"))
        run_split(_ave_backward_kernel(*_fixed_window(kh, kw)), args, n_img * channels, dx.size)
    else:
        from kernels import _pooling_gpu
        _pooling_gpu.ave_backward(dtop, kh, kw, ph, pw, sh, sw, dx)
    return dx
