"""Max and average 2-D pooling, forward and backward, with Caffe's window and output-size rules.

Window rules (Caffe's PoolingLayer): output (py, px) covers rows [py*sh - ph, py*sh - ph + kh).
MAX clips the window to the image and keeps the index of the first largest value in row-major order
(strict `>`), so ties go to the earliest element, as in Caffe. AVE divides by the window clipped to
the *padded* image (padded cells count as zeros), then sums over the window clipped to the image.

CPU kernels are numba-compiled; large calls run in parallel over (image, channel) planes, so that
backward's scatter never races; the GPU twins in kernels/_pooling_gpu.py take cupy arrays and have the same signatures.
"""
import math

import numpy
from numba import njit, prange

from kernels._threads import parallel_parts

from kernels.backend import get_array_module

__all__ = ["pooled_size", "max_pool_forward", "max_pool_backward", "ave_pool_forward", "ave_pool_backward"]


def pooled_size(size, kernel, pad, stride, ceil_mode=True):
    """Caffe's pooled length along one axis: ceil (default) or floor rounding; with padding the last
    window must start inside the image (or its left padding), else it is dropped."""
    span = size + 2 * pad - kernel
    if ceil_mode:
        out = int(math.ceil(span / stride)) + 1
    else:
        out = span // stride + 1
    if pad > 0 and (out - 1) * stride >= size + pad:
        out -= 1
    return out


@njit(cache=True)
def _max_forward_cpu(x, height, width, kh, kw, ph, pw, sh, sw, oh, ow, top, mask, first, last):
    plane_in = height * width
    plane_out = oh * ow
    for pl in range(first, last):
        src = pl * plane_in
        dst = pl * plane_out
        for py in range(oh):
            hs = py * sh - ph
            he = min(hs + kh, height)
            hs = max(hs, 0)
            for px in range(ow):
                ws = px * sw - pw
                we = min(ws + kw, width)
                ws = max(ws, 0)
                best = -numpy.inf
                arg = -1
                for h in range(hs, he):
                    row = src + h * width
                    for w in range(ws, we):
                        v = x[row + w]
                        if v > best:
                            best = v
                            arg = h * width + w
                top[dst + py * ow + px] = best
                mask[dst + py * ow + px] = arg


@njit(cache=True)
def _max_backward_cpu(dtop, mask, plane_in, plane_out, dx, first, last):
    for pl in range(first, last):
        src = pl * plane_out
        dst = pl * plane_in
        for q in range(dst, dst + plane_in):
            dx[q] = 0
        for q in range(src, src + plane_out):
            arg = mask[q]
            if arg >= 0:
                dx[dst + arg] += dtop[q]


@njit(cache=True)
def _ave_forward_cpu(x, height, width, kh, kw, ph, pw, sh, sw, oh, ow, top, first, last):
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
                we = min(ws + kw, width + pw)
                pool_size = (he - hs) * (we - ws)
                acc = x[src] * 0
                for h in range(max(hs, 0), min(he, height)):
                    row = src + h * width
                    for w in range(max(ws, 0), min(we, width)):
                        acc += x[row + w]
                top[dst + py * ow + px] = acc / pool_size


@njit(cache=True)
def _ave_backward_cpu(dtop, height, width, kh, kw, ph, pw, sh, sw, oh, ow, dx, first, last):
    plane_in = height * width
    plane_out = oh * ow
    for pl in range(first, last):
        src = pl * plane_out
        dst = pl * plane_in
        for q in range(dst, dst + plane_in):
            dx[q] = 0
        for py in range(oh):
            hs = py * sh - ph
            he = min(hs + kh, height + ph)
            for px in range(ow):
                ws = px * sw - pw
                we = min(ws + kw, width + pw)
                g = dtop[src + py * ow + px] / ((he - hs) * (we - ws))
                for h in range(max(hs, 0), min(he, height)):
                    row = dst + h * width
                    for w in range(max(ws, 0), min(we, width)):
                        dx[row + w] += g


# Parallel versions: each thread takes one contiguous share of the planes; small calls stay serial.
@njit(cache=True, parallel=True)
def _max_forward_parallel(x, planes, height, width, kh, kw, ph, pw, sh, sw, oh, ow, top, mask, parts):
    for p in prange(parts):
        _max_forward_cpu(x, height, width, kh, kw, ph, pw, sh, sw, oh, ow, top, mask,
                         planes * p // parts, planes * (p + 1) // parts)


@njit(cache=True, parallel=True)
def _max_backward_parallel(dtop, mask, planes, plane_in, plane_out, dx, parts):
    for p in prange(parts):
        _max_backward_cpu(dtop, mask, plane_in, plane_out, dx, planes * p // parts, planes * (p + 1) // parts)


@njit(cache=True, parallel=True)
def _ave_forward_parallel(x, planes, height, width, kh, kw, ph, pw, sh, sw, oh, ow, top, parts):
    for p in prange(parts):
        _ave_forward_cpu(x, height, width, kh, kw, ph, pw, sh, sw, oh, ow, top,
                         planes * p // parts, planes * (p + 1) // parts)


@njit(cache=True, parallel=True)
def _ave_backward_parallel(dtop, planes, height, width, kh, kw, ph, pw, sh, sw, oh, ow, dx, parts):
    for p in prange(parts):
        _ave_backward_cpu(dtop, height, width, kh, kw, ph, pw, sh, sw, oh, ow, dx,
                          planes * p // parts, planes * (p + 1) // parts)


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
        planes = n_img * channels
        args = (x.reshape(-1), height, width, kh, kw, ph, pw, sh, sw, oh, ow, _flat(top, "top"), _flat(mask, "mask"))
        parts = parallel_parts(x.size, planes)
        if parts == 1:
            _max_forward_cpu(*args, 0, planes)
        else:
            _max_forward_parallel(args[0], planes, *args[1:], parts)
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
        planes = n_img * channels
        plane_out = dtop.shape[2] * dtop.shape[3]
        parts = parallel_parts(dx.size, planes)
        if parts == 1:
            _max_backward_cpu(dtop.reshape(-1), _flat(mask, "mask"), height * width, plane_out, _flat(dx, "dx"),
                              0, planes)
        else:
            _max_backward_parallel(dtop.reshape(-1), _flat(mask, "mask"), planes, height * width, plane_out,
                                   _flat(dx, "dx"), parts)
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
        planes = n_img * channels
        parts = parallel_parts(x.size, planes)
        if parts == 1:
            _ave_forward_cpu(x.reshape(-1), height, width, kh, kw, ph, pw, sh, sw, oh, ow, _flat(top, "top"),
                             0, planes)
        else:
            _ave_forward_parallel(x.reshape(-1), planes, height, width, kh, kw, ph, pw, sh, sw, oh, ow,
                                  _flat(top, "top"), parts)
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
        planes = n_img * channels
        parts = parallel_parts(dx.size, planes)
        if parts == 1:
            _ave_backward_cpu(dtop.reshape(-1), height, width, kh, kw, ph, pw, sh, sw, oh, ow, _flat(dx, "dx"),
                              0, planes)
        else:
            _ave_backward_parallel(dtop.reshape(-1), planes, height, width, kh, kw, ph, pw, sh, sw, oh, ow,
                                   _flat(dx, "dx"), parts)
    else:
        from kernels import _pooling_gpu
        _pooling_gpu.ave_backward(dtop, kh, kw, ph, pw, sh, sw, dx)
    return dx
