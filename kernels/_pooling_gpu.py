"""GPU twins of kernels.pooling for cupy arrays, compiled once by cupy; imported only for cupy inputs.

Forward runs one thread per output; backward one thread per input element that gathers from every
window covering it, so there are no atomics and the result does not depend on scheduling. The CUDA C
lives in kernels/cuda_sources.py, where CI compiles it for sm_80 and sm_90.
"""
from kernels.cuda_sources import launch_elementwise


def max_forward(x, kh, kw, ph, pw, sh, sw, oh, ow, top, mask):
    launch_elementwise("scaffe_max_pool_forward", x.dtype, top.size, x,
                       x.shape[1], x.shape[2], x.shape[3], kh, kw, ph, pw, sh, sw, oh, ow, top, mask)


def max_backward(dtop, mask, kh, kw, ph, pw, sh, sw, dx):
    oh, ow = dtop.shape[2], dtop.shape[3]
    launch_elementwise("scaffe_max_pool_backward", dtop.dtype, dx.size, dtop, mask,
                       dx.shape[2], dx.shape[3], kh, kw, ph, pw, sh, sw, oh, ow, dx)


def ave_forward(x, kh, kw, ph, pw, sh, sw, oh, ow, top):
    launch_elementwise("scaffe_ave_pool_forward", x.dtype, top.size, x,
                       x.shape[2], x.shape[3], kh, kw, ph, pw, sh, sw, oh, ow, top)


def ave_backward(dtop, kh, kw, ph, pw, sh, sw, dx):
    oh, ow = dtop.shape[2], dtop.shape[3]
    launch_elementwise("scaffe_ave_pool_backward", dtop.dtype, dx.size, dtop,
                       dx.shape[2], dx.shape[3], kh, kw, ph, pw, sh, sw, oh, ow, dx)
