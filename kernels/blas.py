"""The layers' matrix products: out = op(a) @ op(b), out += op(a) @ op(b), and out += the column sums of a matrix.

On the GPU each is one cuBLAS call: cupy's matmul, or cupy.cublas's GEMM and GEMV with beta = 1 where an
array expression would launch a product, then an addition. On a stream being captured into a CUDA graph
(scaffe.capture), where cupy refuses every cuBLAS call, the same GEMM goes to cuBLAS through NVIDIA's
nvmath-python bindings, on a handle of ours with a workspace of its own (`prepare_capture` makes them before
the capture: cublasCreate allocates), so that layers with GEMMs can be captured where nvmath-python is
installed (`capture_refusal` says why not). On the host numpy computes them as those expressions do.
"""
import functools
import importlib

import numpy

from kernels.backend import get_array_module

# Why GEMMs keep a layer out of a captured CUDA graph (scaffe.capture) where nvmath-python's bindings are missing.
CUBLAS_REFUSES_CAPTURE = "its GEMMs go through cupy's cuBLAS, which refuses stream capture, and nvmath-python's are missing"
# cuBLAS's workspace for captured GEMMs (NVIDIA advises one set by the user for CUDA graphs; 32 MiB on Hopper).
CAPTURE_WORKSPACE_BYTES = 32 << 20
_OP_N, _OP_T = 0, 1  # cublasOperation_t


def _op(array, trans):
    return array.T if trans else array


def product(out, a, b, trans_a=False, trans_b=False, accumulate=False):
    """out = op(a) @ op(b), or out += it with `accumulate`; op transposes where asked; 2-D arrays of one dtype,
    `out`'s rows contiguous."""
    xp = get_array_module(out)
    if xp is numpy:
        if accumulate:
            out += _op(a, trans_a) @ _op(b, trans_b)
        else:
            numpy.matmul(_op(a, trans_a), _op(b, trans_b), out=out)
    elif xp.cuda.get_current_stream().is_capturing():
        _captured_gemm(xp, out, a, b, trans_a, trans_b, accumulate)
    elif accumulate:
        _cublas_of(xp).gemm("T" if trans_a else "N", "T" if trans_b else "N", a, b, out=out, beta=1.0)
    else:
        xp.matmul(_op(a, trans_a), _op(b, trans_b), out=out)


def add_product(out, a, b, trans_a=False, trans_b=False):
    """out += op(a) @ op(b) (see `product`)."""
    product(out, a, b, trans_a, trans_b, accumulate=True)


def add_column_sums(out, a, ones):
    """out += a.sum(axis=0) for 2-D `a`; `ones`: a vector of a.shape[0] ones where `a` lives (the GEMV's)."""
    xp = get_array_module(out)
    if xp is numpy:
        out += a.sum(axis=0, dtype=a.dtype)
    elif xp.cuda.get_current_stream().is_capturing():
        _captured_gemm(xp, out.reshape(1, -1), ones.reshape(1, -1), a, False, False, True)
    else:
        _cublas_of(xp).gemv("T", 1.0, a, ones, 1.0, out)


@functools.cache
def _cublas_of(cupy):
    """`cupy`'s cublas, a submodule that `import cupy` does not load (by module: tests load a fresh cupy)."""
    return importlib.import_module(f"{cupy.__name__}.cublas")


# ---------------------------------------------------------------- GEMMs on a capturing stream

@functools.cache
def _bindings():
    """(nvmath-python's cuBLAS bindings, None), or (None, why they cannot be used)."""
    try:
        from nvmath.bindings import cublas
        cublas.get_property(0)  # loads libcublas: bindings without the library are no bindings
        return cublas, None
    except Exception as error:  # noqa: BLE001 - any failure means no capturable GEMM; capture_refusal says why
        return None, f"{CUBLAS_REFUSES_CAPTURE} ({type(error).__name__}: {error})"


def _nvmath_cublas():
    return _bindings()[0]


def capture_refusal():
    """None where GEMMs can go into a captured CUDA graph, else why not (for Layer.capture_refusal)."""
    return _bindings()[1]


def capture_ready():
    return capture_refusal() is None


_handles = {}  # device id -> (cuBLAS handle, its workspace)


def prepare_capture(xp):
    """The cuBLAS handle and workspace of the current device's captured GEMMs, made outside any capture."""
    device = xp.cuda.Device().id
    if device not in _handles and capture_ready():
        cublas = _nvmath_cublas()
        handle = cublas.create()
        workspace = xp.empty(CAPTURE_WORKSPACE_BYTES, dtype=numpy.uint8)
        cublas.set_workspace(handle, _pointer(workspace), CAPTURE_WORKSPACE_BYTES)
        _handles[device] = (handle, workspace)
    return _handles.get(device, (None,))[0]


def _pointer(array):
    return array.__cuda_array_interface__["data"][0]


def _operand(array, trans):
    """cuBLAS's (operation, leading dimension) for a row-major `array` (or a transposed view of one) that enters
    C^T = op(B)^T op(A)^T, the column-major form of row-major C = op(A) op(B)."""
    item = array.itemsize
    rows, cols = array.shape
    if array.strides[1] == item or cols == 1:  # rows contiguous: memory holds array^T column-major
        return (_OP_T if trans else _OP_N), max(array.strides[0] // item, cols, 1)
    if array.strides[0] == item or rows == 1:  # a transposed view: memory holds `array` column-major
        return (_OP_N if trans else _OP_T), max(array.strides[1] // item, rows, 1)
    raise ValueError(f"a GEMM operand needs a unit stride along one axis, got strides {array.strides}")


def _captured_gemm(xp, out, a, b, trans_a, trans_b, accumulate):
    cublas = _nvmath_cublas()
    if cublas is None:
        raise NotImplementedError(capture_refusal())
    if not (a.dtype == b.dtype == out.dtype and out.dtype in (numpy.float32, numpy.float64)):
        raise TypeError(f"a captured GEMM takes float32 or float64 arrays of one type, got {a.dtype}, {b.dtype}, "
                        f"{out.dtype}")
    if out.strides[1] != out.itemsize and out.shape[1] != 1:
        raise ValueError(f"a captured GEMM writes rows that are contiguous, got strides {out.strides}")
    handle = prepare_capture(xp)
    cublas.set_stream(handle, xp.cuda.get_current_stream().ptr)
    m, n = out.shape
    k = a.shape[0] if trans_a else a.shape[1]
    op_a, ld_a = _operand(a, trans_a)
    op_b, ld_b = _operand(b, trans_b)
    # Host pointer mode: cuBLAS reads alpha and beta when it is called, so the graph keeps these values.
    alpha, beta = numpy.ones(1, out.dtype), numpy.array([1 if accumulate else 0], out.dtype)
    gemm = cublas.sgemm if out.dtype == numpy.float32 else cublas.dgemm
    gemm(handle, op_b, op_a, n, m, k, alpha.ctypes.data, _pointer(b), ld_b, _pointer(a), ld_a,
         beta.ctypes.data, _pointer(out), max(out.strides[0] // out.itemsize, n, 1))
