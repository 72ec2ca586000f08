"""Local response normalization (Caffe's LRN), across channels and within a channel, forward and backward.

Both modes compute y = x * scale^-beta with scale = const + alpha/m * (sum of x^2 over a zero-padded
window of m cells): ACROSS_CHANNELS uses `size` neighbouring channels, const = k, m = size;
WITHIN_CHANNEL uses a size x size spatial window, const = 1, m = size^2 (Caffe builds it from AVE
pooling with pad (size-1)/2, whose divisor is always size^2 there, and a Power layer, so `k` is unused).
The backward pass is the same formula in both modes because the windows are symmetric (Caffe only
accepts odd sizes):
    dx = dy * scale^-beta - (2 alpha beta / m) * x * window_sum(dy * y / scale).

Written with array-module operations only (shifted slices, no cumulative sums, so float32 keeps its
precision), the same code runs on numpy and on cupy. On cupy, ACROSS_CHANNELS (every LRN of AlexNet,
CaffeNet and GoogLeNet) takes one fused kernel each way instead (kernels/cuda_sources.py: the same sums in
the same order, without the array routines' fifteen launches and whole-tensor temporaries).
"""
import numpy

from kernels.backend import get_array_module
from kernels.cuda_sources import launch_elementwise

__all__ = ["lrn_forward", "lrn_backward", "ACROSS_CHANNELS", "WITHIN_CHANNEL"]

ACROSS_CHANNELS = 0
WITHIN_CHANNEL = 1


def _check_size(size):
    if size % 2 != 1:
        raise ValueError(f"LRN local_size must be odd, got {size}")


def _channel_window_sum(a, size):
    """Sum over channels c - (size-1)/2 .. c + (size-1)/2 of a (N, C, ...), zero outside."""
    xp = get_array_module(a)
    pre_pad = (size - 1) // 2
    channels = a.shape[1]
    padded = xp.zeros((a.shape[0], channels + size - 1) + a.shape[2:], dtype=a.dtype)
    padded[:, pre_pad:pre_pad + channels] = a
    # Summing in Caffe's order (first window channel first) keeps float32 results closest to Caffe's.
    out = padded[:, 0:channels].copy()
    for j in range(1, size):
        out += padded[:, j:j + channels]
    return out


def _spatial_window_sum(a, size):
    """Sum over a size x size window centred on each cell of a (N, C, H, W), zero outside."""
    xp = get_array_module(a)
    pad = (size - 1) // 2
    n_img, channels, height, width = a.shape
    padded = xp.zeros((n_img, channels, height + 2 * pad, width + 2 * pad), dtype=a.dtype)
    padded[:, :, pad:pad + height, pad:pad + width] = a
    rows = padded[:, :, 0:height, :].copy()
    for i in range(1, size):
        rows += padded[:, :, i:i + height, :]
    out = rows[:, :, :, 0:width].copy()
    for j in range(1, size):
        out += rows[:, :, :, j:j + width]
    return out


def _window(region, size):
    if region == ACROSS_CHANNELS:
        return _channel_window_sum, size
    if region == WITHIN_CHANNEL:
        return _spatial_window_sum, size * size
    raise ValueError(f"unknown LRN norm_region {region!r}")


def _fused(x, region):
    """Whether the fused GPU kernels take `x`: a C-contiguous float cupy array, normalized across channels."""
    return (region == ACROSS_CHANNELS and get_array_module(x) is not numpy and x.flags.c_contiguous
            and x.dtype in (numpy.float32, numpy.float64))


def _pixels(x):
    """(the fused kernels' threads, one per image and pixel; the pixels of a channel) of x (N, C, ...)."""
    inner = x.size // max(x.shape[0] * x.shape[1], 1)
    return x.shape[0] * inner, inner


def lrn_forward(x, size, alpha, beta, k, region=ACROSS_CHANNELS, y=None):
    """Returns (y, scale) for x (N, C, H, W); keep `scale` for backward. `y` is written into when given."""
    _check_size(size)
    if _fused(x, region) and (y is None or y.flags.c_contiguous):
        xp = get_array_module(x)
        y = xp.empty_like(x) if y is None else y
        scale = xp.empty_like(x)
        threads, inner = _pixels(x)
        launch_elementwise("scaffe_lrn_forward", x.dtype, threads, x, x.shape[1], inner, size, alpha / size, k, beta,
                           scale, y)
        return y, scale
    window_sum, cells = _window(region, size)
    const = k if region == ACROSS_CHANNELS else 1.0
    scale = window_sum(x * x, size)
    scale *= x.dtype.type(alpha / cells)
    scale += x.dtype.type(const)
    xp = get_array_module(x)
    if y is None:
        y = xp.power(scale, x.dtype.type(-beta))
    else:
        xp.power(scale, x.dtype.type(-beta), out=y)
    y *= x
    return y, scale


def lrn_backward(x, y, scale, dy, size, alpha, beta, region=ACROSS_CHANNELS, dx=None):
    """Gradient with respect to x given dy; written into `dx` (overwritten) when given."""
    _check_size(size)
    xp = get_array_module(x)
    if _fused(x, region) and (dx is None or dx.flags.c_contiguous):
        dx = xp.empty_like(x) if dx is None else dx
        threads, inner = _pixels(x)
        launch_elementwise("scaffe_lrn_backward", x.dtype, threads, x, y, scale, dy, x.shape[1], inner, size,
                           2.0 * alpha * beta / size, beta, dx)
        return dx
    window_sum, cells = _window(region, size)
    ratio = window_sum(dy * y / scale, size)
    ratio *= x
    ratio *= x.dtype.type(2.0 * alpha * beta / cells)
    direct = xp.power(scale, x.dtype.type(-beta))
    direct *= dy
    if dx is None:
        return direct - ratio
    xp.subtract(direct, ratio, out=dx)
    return dx
