"""The one place that imports numba.cuda, mending known breakage between numba-cuda and numpy first.

numba-cuda 0.30 calls `numpy.row_stack` while compiling, which numpy 2.5 removed (it was an alias of
`vstack`); without the alias every kernel compile fails with an AttributeError.

With NUMBA_ENABLE_CUDASIM=1 the same kernels run on the CPU in numba's CUDA simulator, which is how
CI exercises them without a GPU.
"""
import numpy

if not hasattr(numpy, "row_stack"):
    numpy.row_stack = numpy.vstack

from numba import config, cuda  # noqa: E402  (needs the alias above first)

SIMULATED = bool(config.ENABLE_CUDASIM)


def as_device_array(obj):
    """A numba device-array view of `obj`'s device memory, without a copy and without waiting for the stream
    its `__cuda_array_interface__` names (numba's default blocks the host on it): the view keeps that stream,
    and the caller orders its own work after it."""
    if SIMULATED and not hasattr(obj, "__cuda_array_interface__"):
        return obj
    return cuda.as_cuda_array(obj, sync=False)
