"""The CUDA driver, asked directly through ctypes: is there one, and is a pointer's memory on a device.

Asked through libcuda itself rather than numba or cupy: the question needs neither of them nor a
context, and it must be answerable (as "no driver") on machines without CUDA at all.
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
_CU_MEMORYTYPE_DEVICE = 2


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
    """(start, buffer id, device ordinal, IPC capable) of the device allocation holding `pointer`.

    The buffer id is unique to an allocation for the life of the process, unlike its address, which a
    later allocation may reuse; memory from cudaMallocAsync pools is not CUDA-IPC capable.
    """
    wanted = (_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, _CU_POINTER_ATTRIBUTE_BUFFER_ID,
              _CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, _CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE)
    values = [ctypes.c_uint64(0) for _ in wanted]  # wide enough for each; the int-sized ones fill the low half
    data = (ctypes.c_void_p * len(wanted))(*(ctypes.addressof(v) for v in values))
    status = _driver().cuPointerGetAttributes(len(wanted), (ctypes.c_int * len(wanted))(*wanted), data, pointer)
    if status != 0:
        raise RuntimeError(f"the CUDA driver could not describe the allocation of {pointer:#x} (CUresult {status})")
    start, buffer_id, ordinal, capable = (v.value for v in values)
    return start, buffer_id, ordinal & 0xFFFFFFFF, bool(capable & 0xFFFFFFFF)
