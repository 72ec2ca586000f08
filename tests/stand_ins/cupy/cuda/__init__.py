"""cupy.cuda for the stand-in: one device, streams, events, pinned host memory.

Work is computed eagerly on the host, so streams and events order nothing by themselves; what they are
checked for is their API and the synchronisations they cost (counted in `cupy._stand_in.counters`).
"""
import threading

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

    def synchronize(self):
        _check_device(self.id)
        _stand_in.count("synchronize")

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
    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.disable_timing = disable_timing
        self.recorded = False

    def record(self, stream=None):
        self.recorded = True

    def synchronize(self):
        _stand_in.count("synchronize")

    @property
    def done(self):
        return True


class Stream:
    """A CUDA stream; `Stream.null` is the legacy default stream, the current one unless another is used."""

    null = None  # set below

    def __init__(self, null=False, non_blocking=False, ptds=False, priority=None):
        self.is_null = null
        self.non_blocking = non_blocking
        self.ptr = 0 if null else id(self)

    def use(self):
        _local.stream = self
        return self

    def synchronize(self):
        _stand_in.count("synchronize")

    def record(self, event=None):
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event):
        if not isinstance(event, Event):
            raise TypeError(f"wait_event takes a cupy.cuda.Event, not {type(event)}")

    @property
    def done(self):
        return True

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


def get_current_stream(device_id=-1):
    return getattr(_local, "stream", Stream.null)


def get_elapsed_time(start_event, end_event):
    raise NotImplementedError("the cupy stand-in has no device clock; elapsed times need a real GPU")


class PinnedMemoryPointer(bytearray):
    """Page-locked host memory: `numpy.frombuffer(ptr, dtype, count)` views it, as with cupy. (A bytearray
    underneath: Python 3.11 classes cannot export buffers otherwise.)"""

    def __init__(self, size):
        super().__init__(int(size))
        self.size = int(size)
        self.ptr = _stand_in.register_pinned(self)


def alloc_pinned_memory(size):
    return PinnedMemoryPointer(size)
