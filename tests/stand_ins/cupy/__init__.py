"""A strict numpy-backed stand-in for cupy, for tests only: runs scaffe's cupy paths on a machine without a GPU.

It is imported as `cupy` when tests/stand_ins is first on sys.path (the `cupy_stand_in` fixture in
tests/conftest.py; PYTHONPATH for subprocesses). Arrays are `cupy.ndarray`s over numpy storage that refuse
every implicit host/device conversion real cupy refuses (see _core.py); one device is visible. Only what
scaffe's code uses is here, and every name is one real cupy has, with cupy's signature. ElementwiseKernels
and RawKernels run numpy twins of their CUDA source, looked up by kernel name in _twins.py. `cupy._stand_in` counts
host/device crossings so tests can assert, e.g., that an iteration makes no host sync.
"""
import builtins as _builtins

import numpy

from cupy import _stand_in, cuda, random  # noqa: F401 - submodules `import cupy` loads, as in cupy (not cublas)
from cupy._core import device_routine as _device_routine, ndarray, ufunc, unwrap_nested as _unwrap_nested, wrap as _wrap
from cupy._kernel import ElementwiseKernel, RawKernel  # noqa: F401 - as in cupy

__version__ = "13.0.0+stand-in"

# numpy's own type objects and constants, as cupy re-exports them
for _name in ("bool_", "complex64", "complex128", "dtype", "e", "finfo", "float16", "float32", "float64", "iinfo",
              "inf", "int8", "int16", "int32", "int64", "intp", "nan", "newaxis", "pi", "promote_types",
              "result_type", "uint8", "uint16", "uint32", "uint64"):
    globals()[_name] = getattr(numpy, _name)

_UFUNCS = (
    "absolute", "add", "arctan", "arctan2", "bitwise_and", "bitwise_or", "bitwise_xor", "ceil", "copysign",
    "cos", "cosh", "equal", "exp", "exp2", "expm1", "floor", "floor_divide", "fmax", "fmin", "fmod",
    "greater", "greater_equal", "hypot", "invert", "isfinite", "isinf", "isnan", "less", "less_equal", "log",
    "log10", "log1p", "log2", "logical_and", "logical_not", "logical_or", "logical_xor", "maximum", "minimum",
    "multiply", "negative", "not_equal", "power", "reciprocal", "remainder", "rint", "sign", "signbit", "sin",
    "sinh", "sqrt", "square", "subtract", "tan", "tanh", "true_divide",
)
for _name in _UFUNCS:
    globals()[_name] = ufunc(getattr(numpy, _name))
del _name
abs = absolute  # noqa: A001,F821 - cupy.abs is cupy.absolute
divide = true_divide  # noqa: F821
mod = remainder  # noqa: F821

_ROUTINES = (
    "all", "amax", "amin", "any", "arange", "argmax", "argmin", "broadcast_to", "clip", "concatenate",
    "count_nonzero", "cumsum", "dot", "einsum", "empty", "empty_like", "expand_dims", "eye", "full",
    "full_like", "linspace", "matmul", "max", "mean", "min", "moveaxis", "ones", "ones_like", "outer", "pad",
    "prod", "ravel", "repeat", "reshape", "split", "squeeze", "stack", "std", "sum",
    "swapaxes", "take", "tensordot", "tile", "transpose", "var", "where", "zeros",
    "zeros_like",
)
for _name in _ROUTINES:
    globals()[_name] = _device_routine(getattr(numpy, _name))
del _name


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0):
    """A new device array from host data (an upload) or from a device array (a device copy)."""
    if isinstance(obj, ndarray):
        source = obj._array
        return _wrap(_stand_in.run(lambda: numpy.array(source, dtype=dtype, copy=copy, order=order, ndmin=ndmin)))
    if isinstance(obj, (list, tuple)) and _builtins.any(isinstance(o, ndarray) for o in obj):  # stacked on the device
        parts = _unwrap_nested(obj)
        return _wrap(_stand_in.view(lambda: numpy.array(parts, dtype=dtype, order=order, ndmin=ndmin)))
    host = numpy.array(obj, dtype=dtype, order=order, ndmin=ndmin)
    device = _wrap(numpy.empty(host.shape, dtype=host.dtype, order="C" if order in ("K", "A") else order))
    _stand_in.host_to_device(device._array, host)
    return device


def asarray(a, dtype=None, order=None):
    """`a` as a device array: host data is uploaded; a device array is returned as is (or cast)."""
    if isinstance(a, ndarray):
        if dtype is None or numpy.dtype(dtype) == a.dtype:
            return a
        return a.astype(dtype)
    return array(a, dtype=dtype, copy=False, order=order or "K")


def ascontiguousarray(a, dtype=None):
    if not isinstance(a, ndarray):
        raise TypeError(f"Argument 'a' has incorrect type (expected cupy._core.core._ndarray_base, got "
                        f"{type(a).__name__})")
    source = a._array
    return _wrap(_stand_in.view(lambda: numpy.ascontiguousarray(source, dtype=dtype)))


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    """`a` on the host: a device array is copied back (counted), anything else goes through numpy."""
    if isinstance(a, ndarray):
        return a.get(stream=stream, order=order, out=out, blocking=blocking)
    host = numpy.asarray(a, order=order)
    if out is not None:
        out[...] = host
        return out
    return host


def get_array_module(*args):
    """cupy when any argument is a device array, numpy otherwise."""
    for a in args:
        if isinstance(a, ndarray):
            import cupy
            return cupy
    return numpy


def isscalar(element):
    return numpy.isscalar(element)


def take_along_axis(a, indices, axis):
    """cupy wraps out-of-range indices around instead of raising (its fancy indexing does)."""
    _check_along_axis(a, indices)
    return _wrap(_stand_in.view(lambda: numpy.take_along_axis(a._array, indices._array % a.shape[axis], axis=axis)))


def put_along_axis(a, indices, values, axis):
    _check_along_axis(a, indices)
    source = _unwrap_nested(values)
    _stand_in.run(lambda: numpy.put_along_axis(a._array, indices._array % a.shape[axis], source, axis=axis))


def _check_along_axis(a, indices):
    if not isinstance(a, ndarray) or not isinstance(indices, ndarray):
        raise TypeError(f"Unsupported type {type(a if not isinstance(a, ndarray) else indices)}")
