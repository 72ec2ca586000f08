"""Picks the array module (numpy or cupy) for an array, importing cupy only when a device array is seen."""
import numpy

_cupy = None
_cupy_checked = False


def cupy_or_none():
    """cupy if it imports and a CUDA device is usable, else None (cupy imports fine without a GPU)."""
    global _cupy, _cupy_checked
    if not _cupy_checked:
        _cupy_checked = True
        try:
            import cupy
            if cupy.cuda.runtime.getDeviceCount() > 0:
                _cupy = cupy
        except Exception:  # no cupy, no driver or no device: the CPU path is the whole story
            _cupy = None
    return _cupy


def get_array_module(*arrays):
    """numpy or cupy, like chainer.backend.get_array_module: cupy when any argument is a cupy array."""
    for a in arrays:
        if type(a).__module__.startswith("cupy"):
            import cupy
            return cupy
    return numpy
