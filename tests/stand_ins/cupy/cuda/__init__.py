"""cupy.cuda for the stand-in: one device, streams, events, pinned host memory.

Kernels are computed eagerly on the host, but each launch takes a place in the current stream's queue, so
events mark positions and `cupy._stand_in.ordered_after` says how much of one stream's work another stream's
next work is ordered after (a wait on an event covers that event's position, not what was queued later;
the legacy default stream covers everything queued on blocking streams). Uploads from pinned memory on a
non-default stream are queued on that stream and run only when something orders them (Stream/Event/Device
synchronize, or a stream waiting on an event recorded after them), so a missing wait or a host buffer
refilled too early shows as wrong data. Synchronisations are counted in `cupy._stand_in.counters`.

Stream capture makes a `Graph` of the kernels queued while it lasts (see cupy._stand_in for what a capture
refuses and undoes); `using_allocator` and `MemoryPool` say where a capture's arrays come from.
"""
import contextlib
import os
import collections
import threading

import numpy
import time
import weakref

from cupy import _stand_in
from cupy.cuda import runtime
from cupy.cuda.runtime import CUDARuntimeError  # noqa: F401 - cupy.cuda.runtime.CUDARuntimeError

_local = threading.local()


def _check_device(device_id):
    if not 0 <= device_id < runtime.getDeviceCount():
        raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")


class Device:
    def __init__(self, device=None):
        self.id = getattr(_local, "device", 0) if device is None else int(device)

    def use(self):
        _check_device(self.id)
        _local.device = self.id

    @property
    def mem_info(self):
        """(free, total) bytes: the host's memory, which the stand-in's arrays live in."""
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return total, total

    def synchronize(self):
        _check_device(self.id)
        _stand_in.count("synchronize")
        _synchronize_all()

    def __enter__(self):
        _check_device(self.id)
        self._previous = getattr(_local, "device", 0)
        _local.device = self.id
        return self

    def __exit__(self, *exc):
        _local.device = self._previous

    def __int__(self):
        return self.id

    def __eq__(self, other):
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self):
        return hash(self.id)

    def __repr__(self):
        return f"<CUDA Device {self.id}>"


class Event:
    """Marks a point in a stream's queue: synchronizing or waiting on it runs the stream up to there."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.disable_timing = disable_timing
        self._stream, self._position = None, 0
        self.time = None  # the host's perf_counter when the work before it had run (the device clock)

    def record(self, stream=None):
        stream = get_current_stream() if stream is None else stream
        if stream._capture is not None:
            raise NotImplementedError("cupy stand-in: events recorded during stream capture are not modelled")
        self._stream = stream
        self._position = self._stream._queued
        self.time = None
        self._stream._time_when_done(self)

    def _complete(self):
        if self._stream is not None:
            self._stream._run(self._position)

    def synchronize(self):
        _stand_in.count("synchronize")
        self._complete()

    @property
    def done(self):
        return self._stream is None or self._stream._done >= self._position


_streams = weakref.WeakSet()


def _synchronize_all():
    for stream in list(_streams):
        stream._run()


class Stream:
    """A CUDA stream; `Stream.null` is the legacy default stream, the current one unless another is used."""

    null = None  # set below

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
        self.is_null = null
        self.non_blocking = non_blocking
        self.ptr = 0 if null else id(self)
        self._lock = threading.Lock()
        self._work = collections.deque()  # (position, queued asynchronous copy), run in order
        self._queued = self._done = 0  # positions: every launch and copy takes one
        self._after = weakref.WeakKeyDictionary()  # stream -> the position of it this one waited for
        self._timed = []  # events recorded behind queued work, timed when it runs
        self._capture = None  # the _Capture under way, if any
        _streams.add(self)

    def _enqueue(self, work):
        with self._lock:
            self._queued += 1
            self._work.append((self._queued, work))

    def _launched(self):
        """A kernel launched on this stream: computed already, it still takes its place in the order."""
        with self._lock:
            self._queued += 1

    def _run(self, position=None):
        """Runs the queued work up to `position` (all of it by default)."""
        with self._lock:
            target = self._queued if position is None else position
            while self._work and self._work[0][0] <= target:
                self._work.popleft()[1]()
            self._done = max(self._done, target)
            now = time.perf_counter()
            for event in [e for e in self._timed if e._position <= target]:
                self._timed.remove(event)
                event.time = now

    def _time_when_done(self, event):
        """Gives `event` its time: now if the work before it has run (kernels run at launch), else when
        `_run` runs it."""
        with self._lock:
            if any(position <= event._position for position, _ in self._work):
                self._timed.append(event)
            else:
                event.time = time.perf_counter()

    def use(self):
        _local.stream = self
        return self

    def synchronize(self):
        _stand_in.count("synchronize")
        self._run()

    def record(self, event=None):
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event):
        """Work queued here after this call runs after the event; the stand-in computes eagerly, so the
        event's stream is run up to it now."""
        if not isinstance(event, Event):
            raise TypeError(f"wait_event takes a cupy.cuda.Event, not {type(event)}")
        if self._capture is not None:
            raise CUDARuntimeError("cudaErrorStreamCaptureIsolation: a capturing stream waited on an event "
                                   "recorded outside the capture")
        event._complete()
        if event._stream is not None and event._stream is not self:
            self._after[event._stream] = max(self._after.get(event._stream, 0), event._position)

    @property
    def done(self):
        return self._done >= self._queued

    # ---- stream capture
    def begin_capture(self, mode=None):
        if self.is_null:
            raise RuntimeError("cannot capture on the default (legacy) stream")
        if self._capture is not None:
            raise CUDARuntimeError("cudaErrorIllegalState: the stream is capturing already")
        self._capture = _Capture()

    def end_capture(self):
        if self._capture is None:
            raise CUDARuntimeError("cudaErrorIllegalState: the stream is not capturing")
        capture, self._capture = self._capture, None
        return capture.end()

    def is_capturing(self):
        return self._capture is not None

    def __enter__(self):
        self._previous = get_current_stream()
        _local.stream = self
        return self

    def __exit__(self, *exc):
        _local.stream = self._previous

    def __eq__(self, other):
        return isinstance(other, Stream) and other.ptr == self.ptr

    def __hash__(self):
        return hash(self.ptr)


Stream.null = Stream(null=True)


class _Capture:
    """The work of one capture: (compute, the storage it wrote) pairs, and device memory as it was before."""

    def __init__(self):
        self.work = []
        self.saved = {key: (root, root.copy()) for key, root in _stand_in.live_roots().items()}

    def made_during(self, result):
        """Whether `result` is memory allocated during this capture."""
        return isinstance(result, numpy.ndarray) and id(_stand_in.storage_root(result)) not in self.saved

    def record(self, compute, result):
        if isinstance(result, numpy.generic):  # a reduction's scalar: the 0-d device array cupy would give
            result = numpy.asarray(result)
        for part in result if isinstance(result, tuple) else (result,):
            if self.made_during(part) and _stand_in.shared_pool():
                raise RuntimeError("cupy stand-in: an array was allocated during stream capture from cupy's shared "
                                   "pool, which hands it out again after the capture while the graph still writes "
                                   "it; allocate from a pool of the graph's own (cupy.cuda.using_allocator)")
        self.work.append((compute, result))
        return result

    def end(self):
        """Device memory back as before the capture; memory allocated during it holds garbage."""
        for root, before in self.saved.values():
            root[...] = before
        for key, root in _stand_in.live_roots().items():
            if key not in self.saved and root.size:
                if root.dtype.kind in "fc":
                    root[...] = numpy.nan
                elif root.dtype.kind in "iu":
                    root[...] = numpy.iinfo(root.dtype).max
                else:
                    root[...] = True
        return Graph(self.work)


class Graph:
    """A captured CUDA graph: `launch` runs its kernels again, in order, on `stream` (one launch)."""

    def __init__(self, work):
        self._work = work

    def launch(self, stream=None):
        stream = get_current_stream() if stream is None else stream
        if stream._capture is not None:
            raise NotImplementedError("cupy stand-in: graph launches during stream capture are not modelled")
        _stand_in.counters["graph_launches"] += 1
        with stream:
            _stand_in.launch()
        for compute, saved in self._work:
            value = compute()
            for target, part in zip(saved, value) if isinstance(saved, tuple) else ((saved, value),):
                if isinstance(target, numpy.ndarray) and part is not target:
                    target[...] = part


class MemoryPool:
    """cupy's device memory pool; the stand-in's arrays are numpy's, so only its identity matters."""

    def malloc(self, size):
        raise NotImplementedError("cupy stand-in: no raw device memory")


@contextlib.contextmanager
def using_allocator(allocator=None):
    """Arrays made in this thread inside the block come from `allocator` (cupy.cuda.using_allocator)."""
    previous = getattr(_stand_in._local, "allocator", None)
    _stand_in._local.allocator = allocator
    try:
        yield
    finally:
        _stand_in._local.allocator = previous


def get_current_stream(device_id=-1):
    return getattr(_local, "stream", Stream.null)


def get_elapsed_time(start_event, end_event):
    """Milliseconds between two completed timing events, as cudaEventElapsedTime refuses others."""
    for event in (start_event, end_event):
        if event.disable_timing:
            raise RuntimeError("cudaErrorInvalidResourceHandle: an event made with disable_timing has no time")
        if event.time is None:
            raise RuntimeError("cudaErrorNotReady: the event has not completed (or was never recorded)")
    return (end_event.time - start_event.time) * 1e3


class PinnedMemoryPointer(bytearray):
    """Page-locked host memory: `numpy.frombuffer(ptr, dtype, count)` views it, as with cupy. (A bytearray
    underneath: Python 3.11 classes cannot export buffers otherwise.)"""

    def __init__(self, size):
        super().__init__(int(size))
        self.size = int(size)
        self.ptr = _stand_in.register_pinned(self)


def alloc_pinned_memory(size):
    return PinnedMemoryPointer(size)
