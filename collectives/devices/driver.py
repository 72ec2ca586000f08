"""The CUDA driver, asked directly through ctypes: is there one, is a pointer's memory on a device; and the
repeated launch of a loaded kernel with its arguments packed once.

Asked through libcuda itself rather than numba or cupy: the question needs neither of them nor a
context, and it must be answerable (as "no driver") on machines without CUDA at all. A launch through
cuLaunchKernel with a parameter array built once costs the host one foreign call where cupy's RawKernel
converts every argument again (the measured difference: perf/RESULTS.md, "The device path on a GPU").
"""
import ctypes
import functools

_LIBRARY_NAMES = ("libcuda.so.1", "libcuda.so", "libcuda.dylib")
_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
_CU_POINTER_ATTRIBUTE_BUFFER_ID = 7
_CU_POINTER_ATTRIBUTE_IS_MANAGED = 8
_CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10
_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11
_CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12
_CU_MEMORYTYPE_DEVICE = 2
_CU_STREAM_NON_BLOCKING = 1


@functools.cache
def _driver():
    """libcuda after a successful cuInit, or None where there is no driver or no device (loaded once)."""
    for name in _LIBRARY_NAMES:
        try:
            library = ctypes.CDLL(name)
        except OSError:
            continue
        if library.cuInit(0) != 0:
            return None
        library.cuPointerGetAttributes.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_int),
                                                   ctypes.POINTER(ctypes.c_void_p), ctypes.c_ulonglong]
        library.cuPointerGetAttributes.restype = ctypes.c_int
        library.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        library.cuLaunchKernel.restype = ctypes.c_int
        library.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
        library.cuStreamSynchronize.restype = ctypes.c_int
        library.cuStreamGetFlags.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint)]
        library.cuStreamGetFlags.restype = ctypes.c_int
        return library
    return None


def available():
    """Whether a CUDA driver with at least one device is there."""
    return _driver() is not None


def is_device_memory(pointer):
    """Whether `pointer` is in device memory, managed memory included; False for host memory, pinned or
    not, and everywhere without a driver.

    Asked on every call, not cached: freed device memory's addresses can come back as other memory.
    """
    library = _driver()
    if library is None or not pointer:
        return False
    # cuPointerGetAttributes (unlike cuPointerGetAttribute) answers 0s for memory CUDA does not know.
    attributes = (ctypes.c_int * 2)(_CU_POINTER_ATTRIBUTE_MEMORY_TYPE, _CU_POINTER_ATTRIBUTE_IS_MANAGED)
    memory_type, managed = ctypes.c_uint64(0), ctypes.c_uint64(0)
    data = (ctypes.c_void_p * 2)(ctypes.addressof(memory_type), ctypes.addressof(managed))
    status = library.cuPointerGetAttributes(2, attributes, data, pointer)
    if status != 0:
        raise RuntimeError(f"the CUDA driver could not say where pointer {pointer:#x} lives (CUresult {status})")
    return memory_type.value == _CU_MEMORYTYPE_DEVICE or bool(managed.value)


def allocation(pointer):
    """(start, size, buffer id, device ordinal, IPC capable) of the device allocation holding `pointer`.

    The buffer id is unique to an allocation for the life of the process, unlike its address, which a
    later allocation may reuse; memory from cudaMallocAsync pools is not CUDA-IPC capable.
    """
    wanted = (_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, _CU_POINTER_ATTRIBUTE_RANGE_SIZE, _CU_POINTER_ATTRIBUTE_BUFFER_ID,
              _CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, _CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE)
    values = [ctypes.c_uint64(0) for _ in wanted]  # wide enough for each; the int-sized ones fill the low half
    data = (ctypes.c_void_p * len(wanted))(*(ctypes.addressof(v) for v in values))
    status = _driver().cuPointerGetAttributes(len(wanted), (ctypes.c_int * len(wanted))(*wanted), data, pointer)
    if status != 0:
        raise RuntimeError(f"the CUDA driver could not describe the allocation of {pointer:#x} (CUresult {status})")
    start, size, buffer_id, ordinal, capable = (v.value for v in values)
    return start, size, buffer_id, ordinal & 0xFFFFFFFF, bool(capable & 0xFFFFFFFF)


class Launch:
    """A loaded kernel (`function`, a CUfunction) with its grid and its arguments (ctypes scalars) packed
    into cuLaunchKernel's parameter array once; calling it with a stream's handle queues the kernel there,
    in the calling thread's current context."""

    def __init__(self, function, blocks, threads, arguments):
        self._arguments = arguments  # the parameter array points into them
        self._parameters = (ctypes.c_void_p * len(arguments))(*(ctypes.addressof(a) for a in arguments))
        self._function, self._blocks, self._threads = function, blocks, threads
        self._launch = _driver().cuLaunchKernel

    def __call__(self, stream):
        status = self._launch(self._function, self._blocks, 1, 1, self._threads, 1, 1, 0, stream, self._parameters,
                              None)
        if status:
            raise RuntimeError(f"cuLaunchKernel failed (CUresult {status})")


def synchronize_stream(stream):
    """Block until the work queued on the stream with handle `stream` has finished (the GIL released)."""
    status = _driver().cuStreamSynchronize(stream)
    if status:
        raise RuntimeError(f"cuStreamSynchronize failed (CUresult {status})")


def non_blocking(stream):
    """Whether the stream with handle `stream` was made non-blocking (ordered with no other stream, the
    legacy default stream included); asked each time, since a destroyed stream's handle comes back."""
    flags = ctypes.c_uint(0)
    status = _driver().cuStreamGetFlags(stream, ctypes.byref(flags))
    if status:
        raise RuntimeError(f"cuStreamGetFlags failed (CUresult {status})")
    return bool(flags.value & _CU_STREAM_NON_BLOCKING)
