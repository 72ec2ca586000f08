"""The fused K-input reduce, CPU path and numba.cuda path, against numpy on every op x dtype.

Without a GPU the device path runs in numba's CUDA simulator (tests/conftest.py turns it on), so CI
checks the very kernel source that runs on the device.
"""
import numpy
import pytest

from kernels.numba_cuda import cuda
from collectives.ops import supports
from kernels.reduce import UFUNCS, reduce_into

DTYPES = [numpy.int8, numpy.uint8, numpy.int16, numpy.uint16, numpy.int32, numpy.uint32, numpy.int64,
          numpy.uint64, numpy.float16, numpy.float32, numpy.float64, numpy.complex64, numpy.complex128]
CASES = [(op, numpy.dtype(d)) for op in sorted(UFUNCS) for d in DTYPES if supports(op, d)]

def _inputs(k, n, dtype, seed=0, small=False):
    rng = numpy.random.default_rng(seed)
    if dtype.kind in "iu":
        high = 3 if small or dtype.itemsize == 1 else 50
        return [rng.integers(0, high, n).astype(dtype) for _ in range(k)]
    parts = [rng.uniform(0.5, 1.5, n) + (1j * rng.uniform(0.5, 1.5, n) if dtype.kind == "c" else 0)
             for _ in range(k)]
    return [p.astype(dtype) for p in parts]

def _expected(inputs, op):
    ufunc = UFUNCS[op]
    acc = inputs[0].copy()
    for a in inputs[1:]:
        acc = ufunc(acc, a).astype(acc.dtype)
    return acc

def _close(got, want):
    if want.dtype.kind in "iu":
        numpy.testing.assert_array_equal(got, want)
    else:
        rtol = 1e-2 if want.dtype == numpy.float16 else 1e-6
        numpy.testing.assert_allclose(got, want, rtol=rtol)

@pytest.mark.parametrize("op,dtype", CASES, ids=[f"{o}-{d}" for o, d in CASES])
def test_cpu_and_device_paths_match_numpy(op, dtype):
    for k, n in [(1, 7), (2, 1001), (3, 0), (4, 65), (8, 33)]:
        inputs = _inputs(k, n, dtype, small=op == "prod")  # products of 8 stay in range
        want = _expected(inputs, op)
        out = numpy.empty(n, dtype)
        reduce_into(out, inputs, op)
        _close(out, want)
        device_out = cuda.device_array(n, dtype=dtype)
        reduce_into(device_out, [cuda.to_device(a) for a in inputs], op)
        _close(device_out.copy_to_host(), want)

@pytest.mark.parametrize("position", [0, 1, 2])
def test_output_may_be_any_input(position):
    inputs = _inputs(3, 501, numpy.dtype(numpy.float64), seed=1)
    want = _expected(inputs, "sum")
    host = [a.copy() for a in inputs]
    reduce_into(host[position], host, "sum")
    numpy.testing.assert_allclose(host[position], want)
    device = [cuda.to_device(a) for a in inputs]
    reduce_into(device[position], device, "sum")
    numpy.testing.assert_allclose(device[position].copy_to_host(), want)

def test_min_max_propagate_nan_like_numpy():
    a = numpy.array([1.0, numpy.nan, 3.0, numpy.nan])
    b = numpy.array([numpy.nan, 2.0, 1.0, numpy.nan])
    for op in ("min", "max"):
        out = cuda.device_array(4)
        reduce_into(out, [cuda.to_device(a), cuda.to_device(b)], op)
        numpy.testing.assert_array_equal(out.copy_to_host(), UFUNCS[op](a, b))
