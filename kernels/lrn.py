"""Local response normalization (Caffe's LRN), across channels and within a channel, forward and backward.

Both modes compute y = x * scale^-beta with scale = const + alpha/m * (sum of x^2 over a zero-padded
window of m cells): ACROSS_CHANNELS uses `size` neighbouring channels, const = k, m = size;
WITHIN_CHANNEL uses a size x size spatial window, const = 1, m = size^2 (Caffe builds it from AVE
pooling with pad (size-1)/2, whose divisor is always size^2 there, and a Power layer, so `k` is unused).
The backward pass is the same formula in both modes because the windows are symmetric (Caffe only
accepts odd sizes):
    dx = dy * scale^-beta - (2 alpha beta / m) * x * window_sum(dy * y / scale).

Written with array-module operations only (shifted slices, no cumulative sums, so float32 keeps its
precision), the same code runs on numpy and, unchanged, on cupy: the GPU twin is this module.
"""
from kernels.backend import get_array_module

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


def lrn_forward(x, size, alpha, beta, k, region=ACROSS_CHANNELS):
    """Returns (y, scale) for x (N, C, H, W); keep `scale` for backward."""
    _check_size(size)
    window_sum, cells = _window(region, size)
    const = k if region == ACROSS_CHANNELS else 1.0
    scale = window_sum(x * x, size)
    scale *= x.dtype.type(alpha / cells)
    scale += x.dtype.type(const)
    xp = get_array_module(x)
    y = xp.power(scale, x.dtype.type(-beta))
    y *= x
    return y, scale


def lrn_backward(x, y, scale, dy, size, alpha, beta, region=ACROSS_CHANNELS, dx=None):
    """Gradient with respect to x given dy; written into `dx` (overwritten) when given."""
    _check_size(size)
    window_sum, cells = _window(region, size)
    xp = get_array_module(x)
    ratio = window_sum(dy * y / scale, size)
    ratio *= x
    ratio *= x.dtype.type(2.0 * alpha * beta / cells)
    direct = xp.power(scale, x.dtype.type(-beta))
    direct *= dy
    if dx is None:
        return direct - ratio
    xp.subtract(direct, ratio, out=dx)
    return dx
