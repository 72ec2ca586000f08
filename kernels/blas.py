"""Accumulating products of the layers' backward passes: out += op(a) @ op(b), and out += the column sums of
a matrix. On the GPU each is one cuBLAS call with beta = 1 (cupy.cublas's GEMM and GEMV against a vector
of ones) where the array expressions launch a product, then an addition; on the host, numpy computes them
as those expressions do."""
import numpy

from kernels.backend import get_array_module


def add_product(out, a, b, trans_a=False, trans_b=False):
    """out += op(a) @ op(b), op transposing where asked; 2-D arrays of one dtype, `out` C-contiguous."""
    xp = get_array_module(out)
    if xp is numpy:
        out += (a.T if trans_a else a) @ (b.T if trans_b else b)
    else:
        xp.cublas.gemm("T" if trans_a else "N", "T" if trans_b else "N", a, b, out=out, beta=1.0)


def add_column_sums(out, a, ones):
    """out += a.sum(axis=0) for 2-D `a`; `ones`: a vector of a.shape[0] ones where `a` lives (the GEMV's)."""
    xp = get_array_module(out)
    if xp is numpy:
        out += a.sum(axis=0, dtype=a.dtype)
    else:
        xp.cublas.gemv("T", 1.0, a, ones, 1.0, out)
