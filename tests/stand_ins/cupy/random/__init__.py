"""cupy.random for the stand-in: the RandomState and Generator calls with cupy's signatures, drawing on the
device (numpy's generators compute the values; device arrays come back, never host arrays)."""
import numpy

from cupy import _stand_in
from cupy._core import wrap


def _device(values, dtype):
    if _stand_in.capturing() is not None:  # a graph would replay the same draw: refused rather than modelled
        raise NotImplementedError("cupy stand-in: random draws during stream capture are not modelled")
    return wrap(numpy.asarray(values, dtype=dtype))


def _float_dtype(dtype):
    dtype = numpy.dtype(dtype)
    if dtype not in (numpy.float32, numpy.float64):
        raise TypeError(f"cupy.random supports float32 and float64, not {dtype}")
    return dtype


class RandomState:
    """cupy.random.RandomState (legacy API)."""

    def __init__(self, seed=None, method=None):
        self._rng = numpy.random.RandomState(seed)

    def seed(self, seed=None):
        self._rng.seed(seed)

    def random_sample(self, size=None, dtype=float):
        return _device(self._rng.random_sample(size), _float_dtype(dtype))

    def rand(self, *size, dtype=float):
        return self.random_sample(size, dtype)

    def randn(self, *size, dtype=float):
        return _device(self._rng.standard_normal(size), _float_dtype(dtype))

    def uniform(self, low=0.0, high=1.0, size=None, dtype=float):
        return _device(self._rng.uniform(low, high, size), _float_dtype(dtype))

    def normal(self, loc=0.0, scale=1.0, size=None, dtype=float):
        return _device(self._rng.normal(loc, scale, size), _float_dtype(dtype))

    def standard_normal(self, size=None, dtype=float):
        return _device(self._rng.standard_normal(size), _float_dtype(dtype))

    def randint(self, low, high=None, size=None, dtype="l"):
        return _device(self._rng.randint(low, high, size), dtype)


class Generator:
    """cupy.random.Generator (new API); `default_rng(seed)` makes one."""

    def __init__(self, seed=None):
        self._rng = numpy.random.default_rng(seed)

    def random(self, size=None, dtype=numpy.float64, out=None):
        values = _device(self._rng.random(size, dtype=_float_dtype(dtype)), dtype)
        if out is not None:
            out[...] = values
            return out
        return values

    def uniform(self, low=0.0, high=1.0, size=None, dtype=numpy.float64):
        return _device(self._rng.uniform(low, high, size), _float_dtype(dtype))

    def standard_normal(self, size=None, dtype=numpy.float64, out=None):
        values = _device(self._rng.standard_normal(size, dtype=_float_dtype(dtype)), dtype)
        if out is not None:
            out[...] = values
            return out
        return values

    def integers(self, low, high=None, size=None, dtype=numpy.int64, endpoint=False):
        return _device(self._rng.integers(low, high, size, dtype=dtype, endpoint=endpoint), dtype)


def default_rng(seed=None):
    return Generator(seed)


_state = RandomState()


def get_random_state():
    return _state


def seed(seed=None):
    _state.seed(seed)


def rand(*size, dtype=float):
    return _state.rand(*size, dtype=dtype)


def randn(*size, dtype=float):
    return _state.randn(*size, dtype=dtype)


def random_sample(size=None, dtype=float):
    return _state.random_sample(size, dtype)


def uniform(low=0.0, high=1.0, size=None, dtype=float):
    return _state.uniform(low, high, size, dtype)


def normal(loc=0.0, scale=1.0, size=None, dtype=float):
    return _state.normal(loc, scale, size, dtype)


def randint(low, high=None, size=None, dtype="l"):
    return _state.randint(low, high, size, dtype)
