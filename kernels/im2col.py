"""im2col / col2im for 2-D convolution: image patches laid out as columns so a convolution becomes one GEMM.

Layout. `x` is (N, C, H, W); the column buffer is (C*kh*kw, N, oh*ow): row `c*kh*kw + i*kw + j`
(Caffe's row order) holds, for every image and every output position, the input pixel that kernel tap
(i, j) of channel c sees. Putting the batch *inside* the row (rather than one buffer per image, as Caffe
does) lets the convolution run as a single large GEMM over the whole batch, which is what keeps a
2-core BLAS busy: weights (M, K) @ col (K, N*P).

CPU kernels are numba-compiled (nogil); large calls are split over threads by rows (im2col) or by
(image, channel) planes (col2im), so no two threads ever write the same element. The GPU twins
(kernels/_im2col_gpu.py) take cupy arrays and are compiled once by cupy and cached; `im2col` /
`col2im` pick the twin from the array module.
"""
import numpy
from numba import njit, uint64

from kernels._threads import run_split
from kernels.backend import get_array_module
from kernels.geometry import conv_output_size

__all__ = ["im2col", "col2im"]


@njit(cache=True, inline="always")
def _valid_range(tap_offset, stride, in_size, out_size):
    """Output positions o with 0 <= o*stride + tap_offset < in_size, as [lo, hi)."""
    lo = 0 if tap_offset >= 0 else (-tap_offset + stride - 1) // stride
    hi = (in_size - tap_offset + stride - 1) // stride if in_size - tap_offset > 0 else 0
    if hi > out_size:
        hi = out_size
    if lo > hi:
        lo = hi
    return lo, hi


# Both kernels work on flat (raveled) arrays with explicit offsets, and index them with unsigned
# integers: numba wraps negative signed indices around, and that check in the innermost loop kept
# LLVM from vectorizing the copies (unsigned indices made im2col 2.5-3x faster). Offsets are cast to
# uint64 only once they are known to be non-negative; uint64 must not meet int64 in arithmetic (numba
# would promote the pair to float64).
@njit(cache=True, inline="always")
def _zero_padding(col, dst, positions, ow, ylo, yhi, xlo, xhi, side_bands):
    """Zeros only where the tap reads padding: whole output rows above/below, bands left/right."""
    for q in range(dst, dst + ylo * ow):
        col[uint64(q)] = 0
    for q in range(dst + yhi * ow, dst + positions):
        col[uint64(q)] = 0
    if side_bands:
        for oy in range(ylo, yhi):
            d = dst + oy * ow
            for q in range(d, d + xlo):
                col[uint64(q)] = 0
            for q in range(d + xhi, d + ow):
                col[uint64(q)] = 0


@njit(cache=True, inline="always")
def _copy_window(x, col, s0, d0, ylo, yhi, nx, sh, sw, ustride, width, ow):
    """Copies the pixels a tap sees into its output rows (inlined into the kernel at numba's IR level)."""
    # The unit-stride case gets its own loop so LLVM sees a plain contiguous copy.
    if sw == 1:
        for oy in range(ylo, yhi):
            d = uint64(d0 + oy * ow)
            s = uint64(s0 + oy * sh * width)
            for q in range(nx):
                col[d + q] = x[s + q]
    else:
        for oy in range(ylo, yhi):
            d = uint64(d0 + oy * ow)
            s = uint64(s0 + oy * sh * width)
            for q in range(nx):
                col[d + q] = x[s + q * ustride]


@njit(cache=True, nogil=True)
def _im2col_rows(x, n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, col, first, last):
    taps = kh * kw
    positions = oh * ow
    plane = height * width
    ustride = uint64(sw)
    for row in range(first, last):
        c = row // taps
        ti = (row // kw) % kh * dh - ph
        tj = row % kw * dw - pw
        ylo, yhi = _valid_range(ti, sh, height, oh)
        xlo, xhi = _valid_range(tj, sw, width, ow)
        nx = uint64(xhi - xlo)
        side_bands = xlo > 0 or xhi < ow
        for n in range(n_img):
            dst = (row * n_img + n) * positions
            _zero_padding(col, dst, positions, ow, ylo, yhi, xlo, xhi, side_bands)
            s0 = (n * channels + c) * plane + ti * width + tj + xlo * sw
            _copy_window(x, col, s0, dst + xlo, ylo, yhi, nx, sh, sw, ustride, width, ow)


@njit(cache=True, nogil=True)
def _col2im_planes(col, n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, dx, first, last):
    positions = oh * ow
    plane = height * width
    ustride = uint64(sw)
    for pl in range(first, last):
        n = pl // channels
        c = pl % channels
        base = pl * plane
        for q in range(base, base + plane):
            dx[uint64(q)] = 0
        for i in range(kh):
            ti = i * dh - ph
            ylo, yhi = _valid_range(ti, sh, height, oh)
            for j in range(kw):
                tj = j * dw - pw
                xlo, xhi = _valid_range(tj, sw, width, ow)
                nx = uint64(xhi - xlo)
                s0 = (((c * kh + i) * kw + j) * n_img + n) * positions + xlo
                d0 = base + ti * width + tj + xlo * sw
                if sw == 1:
                    for oy in range(ylo, yhi):
                        d = uint64(d0 + oy * sh * width)
                        s = uint64(s0 + oy * ow)
                        for q in range(nx):
                            dx[d + q] += col[s + q]
                else:
                    for oy in range(ylo, yhi):
                        d = uint64(d0 + oy * sh * width)
                        s = uint64(s0 + oy * ow)
                        for q in range(nx):
                            dx[d + q * ustride] += col[s + q]


def _pair(v):
    return (int(v[0]), int(v[1])) if isinstance(v, (tuple, list)) else (int(v), int(v))


def _geometry(image_shape, kernel, pad, stride, dilation):
    kh, kw = _pair(kernel)
    ph, pw = _pair(pad)
    sh, sw = _pair(stride)
    dh, dw = _pair(dilation)
    height, width = image_shape[2], image_shape[3]
    oh = conv_output_size(height, kh, ph, sh, dh)
    ow = conv_output_size(width, kw, pw, sw, dw)
    if oh <= 0 or ow <= 0:
        raise ValueError(f"convolution of a {height}x{width} image with kernel {kh}x{kw}, pad {ph},{pw}, "
                         f"dilation {dh},{dw} has no output positions")
    return kh, kw, ph, pw, sh, sw, dh, dw, oh, ow


def im2col(x, kernel, pad=0, stride=1, dilation=1, out=None):
    """Patches of `x` (N, C, H, W) as columns: returns (C*kh*kw, N, oh*ow), written into `out` if given.

    kernel, pad, stride, dilation: an int or an (h, w) pair.
    """
    kh, kw, ph, pw, sh, sw, dh, dw, oh, ow = _geometry(x.shape, kernel, pad, stride, dilation)
    n_img, channels = x.shape[0], x.shape[1]
    shape = (channels * kh * kw, n_img, oh * ow)
    xp = get_array_module(x)
    if out is None:
        out = xp.empty(shape, dtype=x.dtype)
    elif out.shape != shape:
        raise ValueError(f"im2col: out has shape {out.shape}, expected {shape}")
    if xp is numpy:
        if not out.flags.c_contiguous:
            raise ValueError("im2col: out must be C-contiguous")
        x = numpy.ascontiguousarray(x)
        args = (x.reshape(-1), n_img, channels, x.shape[2], x.shape[3], kh, kw, ph, pw, sh, sw, dh, dw, oh, ow,
                out.reshape(-1))
        # Threads take shares of rows, so no two write the same column entries.
        run_split(_im2col_rows, args, shape[0], out.size)
    else:
        from kernels import _im2col_gpu
        _im2col_gpu.im2col(xp.ascontiguousarray(x), kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, out)
    return out


def col2im(col, image_shape, kernel, pad=0, stride=1, dilation=1, out=None):
    """Sums columns (C*kh*kw, N, oh*ow) back into an image (N, C, H, W); `out` is overwritten, not added to."""
    kh, kw, ph, pw, sh, sw, dh, dw, oh, ow = _geometry(image_shape, kernel, pad, stride, dilation)
    n_img, channels = image_shape[0], image_shape[1]
    expected = (channels * kh * kw, n_img, oh * ow)
    if tuple(col.shape) != expected:
        raise ValueError(f"col2im: columns have shape {tuple(col.shape)}, expected {expected}")
    xp = get_array_module(col)
    if out is None:
        out = xp.empty(tuple(image_shape), dtype=col.dtype)
    if xp is numpy:
        if not out.flags.c_contiguous:
            raise ValueError("col2im: out must be C-contiguous")
        args = (numpy.ascontiguousarray(col).reshape(-1), n_img, channels, image_shape[2], image_shape[3],
                kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, out.reshape(-1))
        # Threads take shares of (image, channel) planes: each plane's sums stay in one thread.
        run_split(_col2im_planes, args, n_img * channels, col.size)
    else:
        from kernels import _im2col_gpu
        _im2col_gpu.col2im(xp.ascontiguousarray(col), kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, out)
    return out
