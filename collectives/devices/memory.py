"""Device (GPU) buffers in the collectives: telling them from host buffers, and staging them through host memory.

Where a buffer lives is decided per pointer. numba device arrays (the CUDA simulator's included) are
device buffers. An object exporting `__cuda_array_interface__` is one when the CUDA driver says its
pointer is device or managed memory; host memory behind the interface (pinned or not, and every pointer
on a machine without a driver, like mpi4py's "fake GPU arrays") is read through a numpy view, exactly
like any host buffer. Managed memory is staged like device memory: the driver's copies are safe where
the CPU may not touch managed memory while a kernel runs, and they cost no more than the page faults
a host access would take. DLPack exporters say where they live themselves (CUDA or CUDA managed).

A device buffer is viewed as a flat numba device array without a copy (or as itself, for the kinds of
device arrays registered with collectives.devices); a producer stream named by the
interface (v3) is synchronised before its memory is read, on the device and on the host alike.

A device buffer never reaches MPI: inside a node the collectives reduce it on the devices
(collectives.devices.direct), and otherwise, or with SCAFFE_DEVICE_PATH=staged, the call runs on
pinned host copies (device-to-host before, host-to-device after), with the same algorithm selection a
host call of that size gets. That is what keeps a non-CUDA-aware MPI from dereferencing device
pointers, the crash a plain mpi4py program hits.
"""
import threading

import numpy

from collectives import devices
from collectives.devices import driver
from collectives.errors import CollectiveError

_DLPACK_CUDA_DEVICES = (2, 13)  # kDLCUDA, kDLCUDAManaged


def _is_numba_array(obj):
    return type(obj).__module__.startswith("numba.cuda")


def is_device_buffer(obj):
    """Whether `obj`'s memory must be staged: device or managed memory; False for every host buffer."""
    if isinstance(obj, numpy.ndarray):
        return False  # numba's mapped and managed arrays among them: the host addresses them
    if _is_numba_array(obj) or devices.find_registered(obj) is not None:
        return True
    interface = getattr(obj, "__cuda_array_interface__", None)
    if interface is not None:
        return driver.is_device_memory(interface["data"][0])
    dlpack_device = getattr(obj, "__dlpack_device__", None)
    if dlpack_device is not None:
        try:
            return dlpack_device()[0] in _DLPACK_CUDA_DEVICES
        except Exception:
            return False
    return False


class _HostInterface:
    """numpy's array interface over the host memory behind a CUDA array interface; keeps its owner alive."""

    def __init__(self, owner, interface):
        self.owner = owner
        self.__array_interface__ = interface


def host_view(obj, what):
    """A numpy array over the host memory behind `obj`'s `__cuda_array_interface__`, read-only if it says so."""
    interface = obj.__cuda_array_interface__
    if interface.get("mask") is not None:
        raise CollectiveError(f"{what}: masked CUDA arrays are not supported; pass the data without a mask")
    pointer, read_only = interface["data"]
    shape = tuple(interface["shape"])
    if not pointer and numpy.prod(shape) != 0:
        raise CollectiveError(f"{what}: __cuda_array_interface__ has a null pointer for shape {shape}")
    if driver.available():
        synchronize(interface.get("stream"))
    return numpy.asarray(_HostInterface(obj, {
        "shape": shape, "typestr": interface["typestr"], "descr": interface.get("descr", [("", interface["typestr"])]),
        "data": (pointer, bool(read_only)), "strides": interface.get("strides"), "version": 3}))


def synchronize(stream):
    """Wait for a producer's stream (anything with .synchronize(), or a raw CUDA stream handle; None: no wait)."""
    if stream is None:
        return
    if hasattr(stream, "synchronize"):
        stream.synchronize()
    else:
        from kernels.numba_cuda import cuda
        cuda.external_stream(int(stream)).synchronize()


def flat_device_view(obj, what):
    """A 1-D numba device array over `obj`'s memory (no copy); non-contiguous data is an error."""
    if devices.find_registered(obj) is not None:
        return obj.reshape(obj.size)  # a registered kind of device array is its own flat view
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


def _wait_for_streams(devices):
    """Synchronise the streams the copies of `devices` were queued on: numba's arrays carry the stream (0:
    numba copied synchronously); other registered kinds of device arrays copy synchronously."""
    waited = set()
    for device in devices:
        stream = getattr(device, "stream", 0)
        if stream and id(stream) not in waited:
            waited.add(id(stream))
            stream.synchronize()


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
        """Device to host, done when it returns: a view of an array that names its producer's stream (a
        cupy array) copies asynchronously on that stream (numba's rule), after the producer's work."""
        for device, array in self._inputs:
            if device.size:
                device.copy_to_host(array)
        _wait_for_streams(device for device, _ in self._inputs)

    def copy_out(self):
        """Host to device, done when it returns: the pinned buffers go back to the pool for other calls
        right after, and the caller's next work on its stream must see the result."""
        for array, device in self._outputs:
            if device.size:
                device.copy_to_device(array)
        _wait_for_streams(device for _, device in self._outputs)

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
