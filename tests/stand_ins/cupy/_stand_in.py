"""What the stand-in counts, so tests can assert how code crosses between host and device.

`counters["device_to_host"]`: copies to the host (`.get()`, `cupy.asnumpy`, `float(x)`, `x.item()`, ...),
each one a host synchronisation in real cupy. `counters["host_to_device"]`: uploads (`cupy.asarray` of host
data, `x.set(host)`). `counters["synchronize"]`: explicit stream/device/event synchronisations.
`counters["launch:<name>"]`: launches of the ElementwiseKernel <name>; `counters["launches"]`: every kernel
launch (elementwise, reductions, copies, RawKernels; a GEMM counts one), what per-launch host cost scales with. `counters["pinned_upload"]` and
`counters["pageable_upload"]` split the uploads by the host memory they read. `counters["graph_launches"]`:
CUDA graphs launched (each also one of `launches`).

Stream capture (cupy.cuda.Stream.begin_capture) is as strict as CUDA's: work queued on a capturing stream is
recorded for the graph and computes nothing (the stand-in computes it, so that results have their shapes, and
puts every device array back as it was when the capture ends; arrays made during the capture hold NaN,
their type's largest integer or True); a host sync or a pageable upload on it raises, as in CUDA, and so
do cuBLAS calls, as in cupy.
"""
import collections
import ctypes
import threading
import weakref

counters = collections.Counter()
# id -> every live device array, so that a capture can put device memory back as it found it
_live = weakref.WeakValueDictionary()
_local = threading.local()  # the thread's allocator (cupy.cuda.using_allocator); None: cupy's shared pool
CAPTURE_ERROR = "cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing"


def capturing():
    """The capture of the calling thread's current stream, or None."""
    from cupy import cuda
    return cuda.get_current_stream()._capture


def count(kind):
    """Counts one event; a host wait in another thread (a prefetch thread) is counted apart, as
    "<kind> in a helper thread", since it does not hold up the training thread. A host wait or a
    pageable upload on a capturing stream raises, as in CUDA."""
    if kind in ("device_to_host", "synchronize", "pageable_upload") and capturing() is not None:
        from cupy.cuda.runtime import CUDARuntimeError
        raise CUDARuntimeError(CAPTURE_ERROR)
    if kind in ("device_to_host", "synchronize") and threading.current_thread() is not threading.main_thread():
        kind += " in a helper thread"
    counters[kind] += 1


def launch():
    """One kernel launched on the current stream: counted, and given its place in that stream's order."""
    from cupy import cuda
    counters["launches"] += 1
    cuda.get_current_stream()._launched()


def run(compute):
    """One kernel on the current stream: launched (see `launch`) and computed by `compute()` (numpy on the
    arrays' storage, returning the result's). On a capturing stream it is recorded for the graph too, and
    what it computed is undone when the capture ends."""
    launch()
    result = compute()
    capture = capturing()
    return result if capture is None else capture.record(compute, result)


def view(compute):
    """A routine that makes a view (no launch counted); where numpy had to copy instead, a capture records
    the copy as the kernel cupy would have launched."""
    result = compute()
    capture = capturing()
    if capture is not None and capture.made_during(result):
        return capture.record(compute, result)
    return result


def track(array):
    """Registers a device array (its wrapper) with the captures."""
    _live[id(array)] = array
    return array


def storage_root(array):
    """The numpy array that owns `array`'s memory (the end of its chain of views)."""
    import numpy
    while isinstance(array.base, numpy.ndarray):
        array = array.base
    return array


def live_roots():
    """{id: the memory-owning numpy array} of every live device array."""
    roots = {}
    for wrapper in list(_live.values()):
        root = storage_root(wrapper._array)
        roots[id(root)] = root
    return roots


def shared_pool():
    """Whether the calling thread allocates from cupy's shared pool (no using_allocator in effect)."""
    return getattr(_local, "allocator", None) is None


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
    if capturing() is not None and pinned and (stream is None or stream == cuda.get_current_stream()):
        count("pinned_upload")

        def captured_copy():
            device_storage[...] = host_array
            return device_storage
        run(captured_copy)  # a memcpy node: the graph reads the pinned buffer each time it runs
        return
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
