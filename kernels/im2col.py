"""im2col / col2im for 2-D convolution: image patches laid out as columns so a convolution becomes one GEMM.

Layout. `x` is (N, C, H, W); the column buffer is (C*kh*kw, N, oh*ow): row `c*kh*kw + i*kw + j`
(Caffe's row order) holds, for every image and every output position, the input pixel that kernel tap
(i, j) of channel c sees. Putting the batch *inside* the row (rather than one buffer per image, as Caffe
does) lets the convolution run as a single large GEMM over the whole batch, which is what keeps a
2-core BLAS busy: weights (M, K) @ col (K, N*P).

CPU kernels are numba-compiled; large calls run in parallel over rows (im2col) or over (image, channel)
planes (col2im), so no two threads ever write the same element. The GPU twins take cupy arrays and are
compiled once by cupy and cached; `im2col` / `col2im` pick the twin from the array module.
"""
import numpy
from numba import njit, prange

from kernels._threads import parallel_parts

from kernels.backend import get_array_module

__all__ = ["conv_output_size", "im2col", "col2im"]


def conv_output_size(size, kernel, pad, stride, dilation=1):
    """Caffe's convolution output length along one axis (floor rounding)."""
    extent = dilation * (kernel - 1) + 1
    return (size + 2 * pad - extent) // stride + 1


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


# Both kernels work on flat (raveled) arrays with explicit offsets: with 4-d indexing numba recomputes
# strides in the innermost loop, and the innermost runs here are short (one output row), so that
# overhead was a third of the time.
@njit(cache=True)
def _im2col_rows(x, n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, col, first, last):
    taps = kh * kw
    positions = oh * ow
    plane = height * width
    for row in range(first, last):
        c = row // taps
        ti = (row // kw) % kh * dh - ph
        tj = row % kw * dw - pw
        ylo, yhi = _valid_range(ti, sh, height, oh)
        xlo, xhi = _valid_range(tj, sw, width, ow)
        nx = xhi - xlo
        side_bands = xlo > 0 or xhi < ow
        for n in range(n_img):
            dst = (row * n_img + n) * positions
            # Zeros only where the tap reads padding: whole output rows above/below, bands left/right.
            for q in range(dst, dst + ylo * ow):
                col[q] = 0
            for q in range(dst + yhi * ow, dst + positions):
                col[q] = 0
            if side_bands:
                for oy in range(ylo, yhi):
                    d = dst + oy * ow
                    for q in range(d, d + xlo):
                        col[q] = 0
                    for q in range(d + xhi, d + ow):
                        col[q] = 0
            d0 = dst + xlo
            s0 = (n * channels + c) * plane + ti * width + tj + xlo * sw
            # The unit-stride case gets its own loop so LLVM sees a plain contiguous copy.
            if sw == 1:
                for oy in range(ylo, yhi):
                    d = d0 + oy * ow
                    s = s0 + oy * sh * width
                    for q in range(nx):
                        col[d + q] = x[s + q]
            else:
                for oy in range(ylo, yhi):
                    d = d0 + oy * ow
                    s = s0 + oy * sh * width
                    for q in range(nx):
                        col[d + q] = x[s + q * sw]


@njit(cache=True)
def _col2im_planes(col, n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, dx, first, last):
    positions = oh * ow
    plane = height * width
    for pl in range(first, last):
        n = pl // channels
        c = pl % channels
        base = pl * plane
        for q in range(base, base + plane):
            dx[q] = 0
        for i in range(kh):
            ti = i * dh - ph
            ylo, yhi = _valid_range(ti, sh, height, oh)
            for j in range(kw):
                tj = j * dw - pw
                xlo, xhi = _valid_range(tj, sw, width, ow)
                nx = xhi - xlo
                s0 = (((c * kh + i) * kw + j) * n_img + n) * positions + xlo
                d0 = base + ti * width + tj + xlo * sw
                if sw == 1:
                    for oy in range(ylo, yhi):
                        d = d0 + oy * sh * width
                        s = s0 + oy * ow
                        for q in range(nx):
                            dx[d + q] += col[s + q]
                else:
                    for oy in range(ylo, yhi):
                        d = d0 + oy * sh * width
                        s = s0 + oy * ow
                        for q in range(nx):
                            dx[d + q * sw] += col[s + q]


# The parallel versions hand each thread one contiguous share of rows (im2col) or planes (col2im);
# small calls stay serial, since waking the thread pool costs more than they do.
@njit(cache=True, parallel=True)
def _im2col_parallel(x, n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, col, parts):
    rows = channels * kh * kw
    for p in prange(parts):
        _im2col_rows(x, n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, col,
                     rows * p // parts, rows * (p + 1) // parts)


@njit(cache=True, parallel=True)
def _col2im_parallel(col, n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, dx, parts):
    planes = n_img * channels
    for p in prange(parts):
        _col2im_planes(col, n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, dx,
                       planes * p // parts, planes * (p + 1) // parts)


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
        parts = parallel_parts(out.size, shape[0])
        if parts == 1:
            _im2col_rows(*args, 0, shape[0])
        else:
            _im2col_parallel(*args, parts)
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
        parts = parallel_parts(col.size, n_img * channels)
        if parts == 1:
            _col2im_planes(*args, 0, n_img * channels)
        else:
            _col2im_parallel(*args, parts)
    else:
        from kernels import _im2col_gpu
        _im2col_gpu.col2im(xp.ascontiguousarray(col), kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, out)
    return out
