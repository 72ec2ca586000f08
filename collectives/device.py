"""Device (GPU) buffers in the collectives: recognising them, and staging them through host memory.

A buffer is a device buffer when it exports `__cuda_array_interface__` (cupy, numba, PyTorch, ...),
is a numba device array (the CUDA simulator's included), or exports DLPack from a CUDA device. It is
viewed as a flat numba device array without a copy; a producer stream named by the interface (v3) is
synchronised by numba before the view is made.

This build has no CUDA-aware transport yet, so a device buffer never reaches MPI: the call runs on
pinned host copies (device-to-host before, host-to-device after), with the same algorithm selection a
host call of that size gets. That is what keeps a non-CUDA-aware MPI from dereferencing device
pointers, the crash a plain mpi4py program hits.
"""
import threading

import numpy

from collectives.errors import CollectiveError

_DLPACK_CUDA_DEVICES = (2, 13)  # kDLCUDA, kDLCUDAManaged


def _is_numba_array(obj):
    return type(obj).__module__.startswith("numba.cuda")


def looks_like_device(obj):
    """Cheap test that avoids importing numba.cuda for host buffers."""
    if hasattr(obj, "__cuda_array_interface__") or _is_numba_array(obj):
        return True
    dlpack_device = getattr(obj, "__dlpack_device__", None)
    if dlpack_device is not None and not isinstance(obj, numpy.ndarray):
        try:
            return dlpack_device()[0] in _DLPACK_CUDA_DEVICES
        except Exception:
            return False
    return False


def flat_device_view(obj, what):
    """A 1-D numba device array over `obj`'s memory (no copy); non-contiguous data is an error."""
    from kernels.numba_cuda import as_device_array
    if not hasattr(obj, "__cuda_array_interface__") and not _is_numba_array(obj) and hasattr(obj, "__dlpack__"):
        obj = _from_dlpack(obj, what)
    array = as_device_array(obj)
    if not array.is_c_contiguous() and not array.is_f_contiguous():
        raise CollectiveError(f"{what}: device buffer of shape {array.shape} with strides {array.strides} "
                              "is not contiguous; pass a contiguous copy")
    return array.reshape(array.size)


def _from_dlpack(obj, what):
    from kernels.backend import cupy_or_none
    cupy = cupy_or_none()
    if cupy is None:
        raise CollectiveError(f"{what}: a DLPack device buffer needs cupy to be read; install the cuda12 or "
                              "cuda13 extra, or pass an object with __cuda_array_interface__")
    return cupy.from_dlpack(obj)


def is_read_only(obj):
    interface = getattr(obj, "__cuda_array_interface__", None)
    return bool(interface and interface["data"][1])


class PinnedPool:
    """Grow-only page-locked host buffers, handed out one per staged array and given back after the call.

    Page-locked memory copies to and from the device at full speed (about 3x pageable) but is slow to
    allocate, so it is kept; nonblocking calls in flight each hold their own.
    """

    def __init__(self):
        self._free = []
        self._lock = threading.Lock()  # buffers come back from the progress thread

    def take(self, nbytes):
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if b.nbytes >= nbytes]
            if fits:
                return self._free.pop(min(fits, key=lambda i: self._free[i].nbytes))
        from kernels.numba_cuda import cuda
        return cuda.pinned_array(max(int(nbytes), 64), dtype=numpy.uint8)

    def give(self, buf):
        with self._lock:
            self._free.append(buf)


class Staging:
    """Host stand-ins for a call's device buffers: copy in before the host collective, out after it."""

    def __init__(self, pool):
        self.pool = pool
        self._held = []
        self._inputs = []   # (device array, host array) pairs to fill before the call
        self._outputs = []  # (host array, device array) pairs to copy back after it

    def host(self, device, copy_in, copy_out):
        """A host array standing in for `device` (a flat numba device array)."""
        dtype = numpy.dtype(device.dtype)
        raw = self.pool.take(device.size * dtype.itemsize)
        self._held.append(raw)
        array = raw[:device.size * dtype.itemsize].view(dtype)
        if copy_in:
            self._inputs.append((device, array))
        if copy_out:
            self._outputs.append((array, device))
        return array

    def copy_in(self):
        for device, array in self._inputs:
            if device.size:
                device.copy_to_host(array)

    def copy_out(self):
        for array, device in self._outputs:
            if device.size:
                device.copy_to_device(array)

    def release(self):
        """Give the pinned buffers back to the pool (after copy_out)."""
        for raw in self._held:
            self.pool.give(raw)
        self._held = []

    def wrap(self, work):
        """`work` between the copies in and out, releasing the pinned buffers after it."""

        def staged():
            try:
                self.copy_in()
                work()
                self.copy_out()
            finally:
                self.release()

        return staged
