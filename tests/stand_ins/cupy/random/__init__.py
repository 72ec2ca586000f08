"""cupy.random for the stand-in: the RandomState and Generator calls with cupy's signatures, drawing on the
device (numpy's generators compute the values; device arrays come back, never host arrays). RandomState's
draws (cuRAND's host API, whose offset a graph would keep) are refused during stream capture; Generator's
keep their state on the device, as cupy's do, and can be captured."""
import numpy

from cupy import _stand_in
from cupy._core import wrap


def _device(values, dtype):
    if _stand_in.capturing() is not None:  # a graph would replay the same draw: refused rather than modelled
        raise NotImplementedError("cupy stand-in: RandomState's draws during stream capture are not modelled")
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


class _BitGenerator:
    """cupy's bit generators (XORWOW by default) keep their state in device memory (`_state`), and each draw's
    kernel reads it and stores it back advanced: a CUDA graph that replays a draw draws new numbers. Here the
    state is a device counter, and a draw is numpy's Philox at that counter."""

    def __init__(self, seed=None):
        self._seed = int(numpy.random.SeedSequence(seed).generate_state(1, numpy.uint64)[0])
        self._state = wrap(numpy.zeros(1, dtype=numpy.uint64))


class Generator:
    """cupy.random.Generator (new API); `default_rng(seed)` makes one. Each draw is one kernel, on the device's
    state, so it can be captured into a CUDA graph."""

    def __init__(self, seed=None):
        self.bit_generator = _BitGenerator(seed)

    def _draw(self, size, dtype, out, values):
        """`values(numpy_generator)` drawn into `out` (or a new array of `size`, `dtype`) at the device's state."""
        result = wrap(numpy.empty(() if size is None else size, dtype=dtype)) if out is None else out
        bits, state, target = self.bit_generator, self.bit_generator._state._array, result._array

        def draw():
            generator = numpy.random.Generator(numpy.random.Philox(key=bits._seed, counter=int(state[0])))
            target[...] = values(generator)
            state[0] += 1
            return target
        _stand_in.run(draw)
        return result

    def random(self, size=None, dtype=numpy.float64, out=None):
        dtype = _float_dtype(dtype)
        return self._draw(size, dtype, out, lambda g: g.random(size, dtype=dtype))

    def uniform(self, low=0.0, high=1.0, size=None, dtype=numpy.float64):
        return self._draw(size, _float_dtype(dtype), None, lambda g: g.uniform(low, high, size))

    def standard_normal(self, size=None, dtype=numpy.float64, out=None):
        dtype = _float_dtype(dtype)
        return self._draw(size, dtype, out, lambda g: g.standard_normal(size, dtype=dtype))

    def integers(self, low, high=None, size=None, dtype=numpy.int64, endpoint=False):
        return self._draw(size, dtype, None, lambda g: g.integers(low, high, size, dtype=dtype, endpoint=endpoint))


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
