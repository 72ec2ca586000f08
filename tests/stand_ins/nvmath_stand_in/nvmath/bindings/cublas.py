"""nvmath.bindings.cublas for the tests: the calls kernels.blas makes, with nvmath's signatures, on the cupy
stand-in's device arrays (host memory behind their pointers). Matrices are column-major with a leading
dimension, as in cuBLAS; alpha and beta are read through host pointers when called (CUBLAS_POINTER_MODE_HOST);
a call runs on the handle's stream, which must be the current one, so that a capture records it."""
import ctypes
import itertools

import numpy

from cupy import _stand_in, cuda

_handles = {}  # handle -> {"stream": pointer, "workspace": (pointer, bytes)}
_numbers = itertools.count(1)


class cuBLASError(Exception):  # noqa: N801 - nvmath's name
    pass


def get_property(kind):
    return 13


def create():
    handle = next(_numbers)
    _handles[handle] = {"stream": 0, "workspace": None}
    return handle


def destroy(handle):
    _check(handle)
    del _handles[handle]


def set_workspace(handle, workspace, size):
    _check(handle)
    _handles[handle]["workspace"] = (workspace, size)


def set_stream(handle, stream):
    _check(handle)
    _handles[handle]["stream"] = stream


def _check(handle):
    if handle not in _handles:
        raise cuBLASError("CUBLAS_STATUS_NOT_INITIALIZED")


def _scalar(pointer, dtype):
    return numpy.frombuffer((ctypes.c_char * numpy.dtype(dtype).itemsize).from_address(pointer), dtype)[0]


def _matrix(pointer, dtype, rows, cols, ld):
    """The column-major rows x cols matrix at `pointer` with leading dimension `ld`, as a numpy view."""
    if ld < max(1, rows):
        raise cuBLASError(f"CUBLAS_STATUS_INVALID_VALUE: leading dimension {ld} < {rows} rows")
    item = numpy.dtype(dtype).itemsize
    size = (ld * (cols - 1) + rows) * item if rows and cols else 0
    memory = (ctypes.c_char * size).from_address(pointer)
    return numpy.ndarray((rows, cols), dtype, buffer=memory, strides=(item, ld * item))


def _gemm(dtype, handle, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    _check(handle)
    if _handles[handle]["stream"] != cuda.get_current_stream().ptr:
        raise AssertionError("nvmath stand-in: the handle's stream is not the current stream")
    alpha, beta = _scalar(alpha, dtype), _scalar(beta, dtype)
    first = _matrix(a, dtype, *((m, k) if transa == 0 else (k, m)), lda)
    second = _matrix(b, dtype, *((k, n) if transb == 0 else (n, k)), ldb)
    result = _matrix(c, dtype, m, n, ldc)
    first, second = (first if transa == 0 else first.T), (second if transb == 0 else second.T)

    def compute():
        total = alpha * (first @ second)
        result[...] = total if beta == 0 else total + beta * result  # beta 0: C is not read, as in cuBLAS
    _stand_in.run(compute)


def sgemm(*args):
    _gemm(numpy.float32, *args)


def dgemm(*args):
    _gemm(numpy.float64, *args)
