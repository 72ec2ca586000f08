"""cupy.cublas for the stand-in: gemm and gemv, one launch each, computed by numpy in the kernel's type as
out = alpha * op(a) @ op(b) + beta * out (a GEMV: op(a) @ x), with cupy's argument checks."""
import numpy

from cupy import _stand_in
from cupy._core import ndarray, refuse_cublas_under_capture

_OPS = {"N": False, "T": True, 0: False, 1: True}


def _operand(array, trans, name):
    if not isinstance(array, ndarray):
        raise TypeError(f"cupy.cublas: {name} must be a cupy.ndarray, not {type(array)}")
    return array._array.T if _OPS[trans] else array._array


def _combine(product, out, alpha, beta):
    t = out.dtype.type
    result = product if alpha == 1 else t(alpha) * product
    if beta != 0:
        result = (out._array if beta == 1 else t(beta) * out._array) + result
    out._array[...] = result
    return out


def gemm(transa, transb, a, b, out=None, alpha=1.0, beta=0.0):
    if a.ndim != 2 or b.ndim != 2 or a.dtype != b.dtype:
        raise AssertionError("cupy.cublas.gemm takes two 2-D arrays of one dtype")
    refuse_cublas_under_capture()
    _stand_in.launch()
    product = numpy.matmul(_operand(a, transa, "a"), _operand(b, transb, "b"))
    if out is None:
        return ndarray._from_host_storage(product if alpha == 1 else a.dtype.type(alpha) * product)
    if out.shape != product.shape or out.dtype != a.dtype:
        raise AssertionError(f"cupy.cublas.gemm: out is {out.shape} {out.dtype}, the product {product.shape}")
    return _combine(product, out, alpha, beta)


def gemv(transa, alpha, a, x, beta, y):
    if a.ndim != 2 or x.ndim != 1 or y.ndim != 1 or not a.dtype == x.dtype == y.dtype:
        raise AssertionError("cupy.cublas.gemv takes a 2-D array and two vectors of one dtype")
    refuse_cublas_under_capture()
    _stand_in.launch()
    product = numpy.matmul(_operand(a, transa, "a"), _operand(x, "N", "x"))
    if y.shape != product.shape:
        raise AssertionError(f"cupy.cublas.gemv: y is {y.shape}, the product {product.shape}")
    _combine(product, y, alpha, beta)
