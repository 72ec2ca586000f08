"""The device interface on CUDA, through cupy: IPC memory handles, streams, events, and the fused reduce
(kernels._reduce_raw), compiled by cupy once per (op, dtype, inputs, outputs) and launched through the
driver with its arguments packed once (collectives.driver.Launch).

Streams are cupy Stream objects (the caller's own, or an ExternalStream around a handle it passed);
events are raw cudaEvent_t handles, created without timing (cheaper to record and wait on). Every call
runs with this device current, since the collectives' progress thread has no current device of its own.
"""
import ctypes
import hashlib

import numpy

from collectives.devices import driver
from collectives.devices import Device
from collectives.errors import CollectiveError

_EVENT_DISABLE_TIMING = 0x02  # cudaEventDisableTiming
_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: the direction follows from the (unified) addresses
_NOT_READY = 600  # cudaErrorNotReady
# The default streams' handles: 0 and cudaStreamLegacy (1, as __cuda_array_interface__ names the legacy
# default stream), cudaStreamPerThread (2).
_DEFAULT_STREAMS = (0, 1, 2)
_EXPORTS_KEPT = 4096  # exported handles remembered (64 bytes each), by allocation

_devices = {}  # device ordinal -> CudaDevice


def device_for(view):
    """The CudaDevice of the GPU holding `view` (a numba device array), or None without cupy."""
    try:
        import cupy  # noqa: F401
    except ImportError:
        return None
    ordinal = driver.allocation(_pointer(view))[3]
    device = _devices.get(ordinal)
    if device is None:
        device = _devices[ordinal] = CudaDevice(ordinal)
    return device


def _pointer(view):
    """The address of a device view, or of a host (pinned) numpy array."""
    interface = getattr(view, "__cuda_array_interface__", None) or view.__array_interface__
    return interface["data"][0]


class CudaDevice(Device):
    def __init__(self, ordinal):
        import cupy
        self._cupy = cupy
        self._runtime = cupy.cuda.runtime
        self.ordinal = ordinal
        self._device = cupy.cuda.Device(ordinal)
        # The same GPU has the same PCI address in every process, whatever CUDA_VISIBLE_DEVICES numbers it.
        bus_id = self._runtime.deviceGetPCIBusId(ordinal)
        self.key = int.from_bytes(hashlib.blake2b(bus_id.encode(), digest_size=7).digest(), "little")
        self._exported = {}  # allocation's base address -> (its buffer id, its IPC handle)
        self._streams = []  # the streams made here, kept alive with the device

    def current(self):
        return self._device

    # -- memory -------------------------------------------------------------------------------------
    def empty(self, count, dtype):
        with self._device:
            return self._cupy.empty(count, dtype)

    def pinned(self, count, dtype):
        dtype = numpy.dtype(dtype)
        with self._device:
            memory = self._cupy.cuda.alloc_pinned_memory(max(count, 1) * dtype.itemsize)
        return numpy.frombuffer(memory, dtype, count)  # the array keeps the memory alive

    def export(self, view):
        pointer = _pointer(view)
        start, size, buffer_id, _, capable = driver.allocation(pointer)
        if not capable:
            raise CollectiveError(f"device buffer at {pointer:#x} cannot be shared through CUDA IPC (memory from "
                                  "cudaMallocAsync pools cannot); allocate it with cudaMalloc (cupy's default "
                                  "pool) or set SCAFFE_DEVICE_PATH=staged")
        kept = self._exported.get(start)
        if kept is None or kept[0] != buffer_id:  # a new allocation at a freed one's address: a new handle
            if len(self._exported) >= _EXPORTS_KEPT:
                self._exported.clear()
            with self._device:
                kept = self._exported[start] = (buffer_id, self._runtime.ipcGetMemHandle(start))
        return kept[1], start, size, pointer - start

    def open(self, handle):
        with self._device:
            return self._runtime.ipcOpenMemHandle(bytes(handle))

    def close(self, opened):
        with self._device:
            self._runtime.ipcCloseMemHandle(opened)

    def view(self, opened, offset, count, dtype):
        dtype = numpy.dtype(dtype)
        memory = self._cupy.cuda.UnownedMemory(opened + offset, count * dtype.itemsize, self, self.ordinal)
        return self._cupy.ndarray((count,), dtype, self._cupy.cuda.MemoryPointer(memory, 0))

    # -- streams and work on them -------------------------------------------------------------------
    def new_stream(self):
        with self._device:
            stream = self._cupy.cuda.Stream(non_blocking=True)
        self._streams.append(stream)
        return stream

    def user_stream(self, stream):
        cuda = self._cupy.cuda
        if stream is None:
            return cuda.Stream.null  # the legacy default stream: ordered after every blocking stream's work
        if hasattr(stream, "ptr") and hasattr(stream, "record"):  # cupy's Stream, ExternalStream, Stream.null
            return stream
        if hasattr(stream, "__cuda_stream__"):
            handle = stream.__cuda_stream__()[1]
        elif hasattr(stream, "cuda_stream"):  # PyTorch's
            handle = stream.cuda_stream
        elif hasattr(stream, "handle"):  # numba's: a ctypes pointer, or a cuda-python CUstream
            handle = getattr(stream.handle, "value", None) or int(stream.handle or 0)
        else:
            handle = int(stream)
        return cuda.ExternalStream(handle, self.ordinal)

    def copy(self, target, source, stream):
        if target.nbytes:
            with self._device:
                self._runtime.memcpyAsync(_pointer(target), _pointer(source), target.nbytes, _MEMCPY_DEFAULT,
                                          stream.ptr)

    def reduce(self, outputs, inputs, op, stream):
        self.prepare_reduce(outputs, inputs, op)(stream)

    def prepare_reduce(self, outputs, inputs, op):
        count = outputs[0].size
        if count == 0:
            return lambda stream: None
        from kernels.cuda_sources import reduce_kernel
        from kernels.grid import THREADS, blocks
        kernel = reduce_kernel(op, numpy.dtype(outputs[0].dtype), len(inputs), len(outputs))
        # Pointers pass as 64-bit integers: the views are numba's and cupy's arrays alike, and the launch
        # keeps none of them (their owners decide when the memory goes).
        arguments = [ctypes.c_uint64(_pointer(view)) for view in (*inputs, *outputs)] + [ctypes.c_int64(count)]
        with self._device:
            function = kernel.kernel.ptr  # compiled and loaded for this device on first use
        launch = driver.Launch(function, blocks(count), THREADS, arguments)
        return lambda stream: launch(stream.ptr)

    def synchronize_stream(self, stream):
        driver.synchronize_stream(stream.ptr)

    def idle(self, stream):
        # Only a non-blocking stream's query covers all an event recorded on it would wait for: the legacy
        # default stream's and a blocking stream's would leave out the work they are ordered after.
        return stream.ptr not in _DEFAULT_STREAMS and driver.non_blocking(stream.ptr) and stream.done

    # -- events -------------------------------------------------------------------------------------
    def new_event(self):
        with self._device:
            return self._runtime.eventCreateWithFlags(_EVENT_DISABLE_TIMING)

    def record(self, event, stream):
        with self._device:
            self._runtime.eventRecord(event, stream.ptr)

    def wait(self, stream, event):
        with self._device:
            self._runtime.streamWaitEvent(stream.ptr, event, 0)

    def query(self, event):
        status = self._runtime.eventQuery(event)
        if status not in (0, _NOT_READY):
            raise RuntimeError(f"cudaEventQuery failed with CUDA error {status}")
        return status == 0

    def synchronize(self, event):
        self._runtime.eventSynchronize(event)
