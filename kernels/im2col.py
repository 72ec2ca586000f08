"""im2col / col2im for 2-D convolution: image patches laid out as columns so a convolution becomes one GEMM.

Layout. `x` is (N, C, H, W); the column buffer is (C*kh*kw, N, oh*ow): row `c*kh*kw + i*kw + j`
(Caffe's row order) holds, for every image and every output position, the input pixel that kernel tap
(i, j) of channel c sees. Putting the batch *inside* the row (rather than one buffer per image, as Caffe
does) lets the convolution run as a single large GEMM over the whole batch, which is what keeps a
2-core BLAS busy: weights (M, K) @ col (K, N*P).

CPU kernels (kernels/_im2col_cpu.py) are compiled by numba once and loaded without it (kernels.native);
large calls are split over threads by rows (im2col) or by (image, channel) planes (col2im), so no two
threads ever write the same element. The GPU twins (kernels/_im2col_gpu.py) take cupy arrays and are
compiled once by cupy and cached; `im2col` / `col2im` pick the twin from the array module.
"""
import numpy

from kernels import native
from kernels._threads import run_split
from kernels.backend import get_array_module
from kernels.geometry import conv_output_size

__all__ = ["im2col", "col2im"]

_CPU = "kernels._im2col_cpu"


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
        x = numpy.ascontiguousarray(x, dtype=out.dtype)
        args = (x.ctypes.data, x.size, n_img, channels, x.shape[2], x.shape[3], kh, kw, ph, pw, sh, sw, dh, dw, oh,
                ow, out.ctypes.data, out.size)
        # Threads take shares of rows, so no two write the same column entries.
        run_split(native.load(_CPU, "im2col_rows", out.dtype), args, shape[0], out.size)
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
        col = numpy.ascontiguousarray(col, dtype=out.dtype)
        args = (col.ctypes.data, col.size, n_img, channels, image_shape[2], image_shape[3], kh, kw, ph, pw, sh, sw,
                dh, dw, oh, ow, out.ctypes.data, out.size)
        # Threads take shares of (image, channel) planes: each plane's sums stay in one thread.
        run_split(native.load(_CPU, "col2im_planes", out.dtype), args, n_img * channels, col.size)
    else:
        from kernels import _im2col_gpu
        _im2col_gpu.col2im(xp.ascontiguousarray(col), kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, out)
    return out


def native_calls():
    """What `python -m kernels.native` compiles ahead."""
    return [(_CPU, factory, (dtype,)) for factory in ("im2col_rows", "col2im_planes") for dtype in native.FLOATS]
