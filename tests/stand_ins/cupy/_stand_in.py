"""What the stand-in counts, so tests can assert how code crosses between host and device.

`counters["device_to_host"]`: copies to the host (`.get()`, `cupy.asnumpy`, `float(x)`, `x.item()`, ...),
each one a host synchronisation in real cupy. `counters["host_to_device"]`: uploads (`cupy.asarray` of host
data, `x.set(host)`). `counters["synchronize"]`: explicit stream/device/event synchronisations.
`counters["launch:<name>"]`: launches of the ElementwiseKernel <name>; `counters["launches"]`: every kernel
launch (elementwise, reductions, copies, RawKernels; a GEMM counts one), what per-launch host cost scales with. `counters["pinned_upload"]` and
`counters["pageable_upload"]` split the uploads by the host memory they read.
"""
import collections
import ctypes
import threading
import weakref

counters = collections.Counter()


def count(kind):
    """Counts one event; a host wait in another thread (a prefetch thread) is counted apart, as
    "<kind> in a helper thread", since it does not hold up the training thread."""
    if kind in ("device_to_host", "synchronize") and threading.current_thread() is not threading.main_thread():
        kind += " in a helper thread"
    counters[kind] += 1


def launch():
    """One kernel launched on the current stream: counted, and given its place in that stream's order."""
    from cupy import cuda
    counters["launches"] += 1
    cuda.get_current_stream()._launched()


def ordered_after(stream, other):
    """How much of `other`'s queue (a position: launches and copies counted from 1) work queued on `stream` now
    waits for: all of it on the same stream or across the legacy default stream and a blocking one, else
    what `stream`'s waits on `other`'s events covered."""
    if stream is other or ((stream.is_null or other.is_null) and not (stream.non_blocking or other.non_blocking)):
        return other._queued
    return stream._after.get(other, 0)


def reset():
    counters.clear()


def host_syncs():
    """Every point where the main thread waited for the device: copies back and synchronisations."""
    return counters["device_to_host"] + counters["synchronize"]


def host_to_device(device_storage, host_array, stream=None):
    """An upload. From pinned memory on a non-blocking stream other than the current one it is
    asynchronous, as in CUDA: it is queued on that stream and reads the host memory only when the stream
    runs it (at a synchronize, or when a stream waits on an event recorded after it), so reading the
    device array too early, or refilling the pinned buffer too early, gives the wrong batch. On the
    current stream it runs at once (the stand-in's kernels run eagerly, in that stream's order); on a
    blocking stream too (the legacy default stream orders it before later work); from pageable memory
    CUDA stages the copy before returning, so it happens at once as well."""
    from cupy import cuda
    count("host_to_device")
    pinned = is_pinned(host_array)
    if (stream is not None and stream.non_blocking and stream != cuda.get_current_stream()
            and pinned):
        count("pinned_upload")

        def copy():
            device_storage[...] = host_array
        stream._enqueue(copy)
        return
    count("pinned_upload" if pinned else "pageable_upload")
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
