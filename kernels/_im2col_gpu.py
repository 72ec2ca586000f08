"""GPU twins of kernels.im2col for cupy arrays: one thread per output element, compiled once by cupy.

Imported only when a cupy array reaches kernels.im2col, so CPU-only machines never import cupy.
Same layout as the CPU kernels: columns are (C*kh*kw, N, oh*ow). The CUDA C lives in
kernels/cuda_sources.py, where CI compiles it for sm_80 and sm_90.
"""
from kernels.cuda_sources import launch_elementwise


def im2col(x, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, col):
    n_img, channels, height, width = x.shape
    launch_elementwise("scaffe_im2col", x.dtype, col.size, x,
                       n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, col)


def col2im(col, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, dx):
    n_img, channels, height, width = dx.shape
    launch_elementwise("scaffe_col2im", col.dtype, dx.size, col,
                       n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, dx)
