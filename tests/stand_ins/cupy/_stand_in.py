"""What the stand-in counts, so tests can assert how code crosses between host and device.

`counters["device_to_host"]`: copies to the host (`.get()`, `cupy.asnumpy`, `float(x)`, `x.item()`, ...),
each one a host synchronisation in real cupy. `counters["host_to_device"]`: uploads (`cupy.asarray` of host
data, `x.set(host)`). `counters["synchronize"]`: explicit stream/device/event synchronisations.
`counters["launch:<name>"]`: launches of the ElementwiseKernel <name>.
"""
import collections
import ctypes
import weakref

counters = collections.Counter()


def count(kind):
    counters[kind] += 1


def reset():
    counters.clear()


def host_syncs():
    """Every point where the host waited for the device: copies back and explicit synchronisations."""
    return counters["device_to_host"] + counters["synchronize"]


def host_to_device(device_storage, host_array, stream=None):
    count("host_to_device")
    device_storage[...] = host_array


_pinned = []  # (weak reference to the buffer, first address, end address)


def register_pinned(buffer):
    """Records page-locked host memory (from cuda.alloc_pinned_memory); returns its address."""
    address = ctypes.addressof((ctypes.c_char * len(buffer)).from_buffer(buffer))
    _pinned.append((weakref.ref(buffer), address, address + len(buffer)))
    return address


def is_pinned(host_array):
    """Whether `host_array` lies inside live pinned memory (freed buffers' addresses may be reused)."""
    _pinned[:] = [entry for entry in _pinned if entry[0]() is not None]
    start = host_array.__array_interface__["data"][0]
    return any(lo <= start and start + host_array.nbytes <= hi for _, lo, hi in _pinned)
