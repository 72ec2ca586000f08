"""A CPU stand-in for the collectives' device interface (collectives.devices), for tests only.

It behaves like a GPU where it matters for synchronisation, so that the device algorithms run across MPI
processes in CI and a missing wait gives wrong results:
- memory is an anonymous shared-memory file (memfd) that other processes map by its handle (its path
  under the owner's /proc/<pid>/fd while the owner holds it), as CUDA IPC maps a peer's allocation; it
  goes away with the last process that maps it, however the processes end (Linux only);
- an allocation has an address range, handed out first fit from the ranges of arrays that are gone
  (adjacent ones merged), so a later allocation gets a freed one's address, or a range covering
  several freed ones, with a new handle, as numba's and cupy's unpooled allocators do; `open` refuses
  to map a range that overlaps one this process still has mapped, as CUDA does (cudaErrorAlreadyMapped);
- a stream is a worker thread running its queue in order, each piece of work after a random delay, so
  work queued on two streams finishes in any order and nothing is done when the call that queued it
  returns;
- an event is a pair of counters (records made, records completed) that a stream can wait on and the
  host can query or block on; a wait covers the records made before it, as cudaStreamWaitEvent does.
Every process has one such device per `CpuDevice`; `gpu` numbers the physical device it pretends to be,
so that tests can put ranks on one shared device or on several. Like CUDA's, its calls may come from
several threads at once.

`DeviceArray` is the device buffer a test passes to a collective (and the flat view the collectives make
of it); `register()` tells collectives.devices to serve it with a CpuDevice.
"""
import bisect
import itertools
import mmap
import os
import queue
import random
import threading
import time
import weakref

import numpy

from collectives import devices
from kernels.reduce import reduce_into

_EVENT_SLOTS = 4096
_WAIT_LIMIT_S = 60.0  # a wait that long means a record that never comes: fail the stream, do not hang
_POLL_S = 100e-6
# Numbers this process's allocations: a closed memfd's descriptor number comes back for the next one, and a
# handle must never name two allocations (peers cache what they opened by handle, as for CUDA's handles).
_serials = itertools.count()
_ADDRESS_ALIGN = 256  # as cudaMalloc's
_free_ranges = []  # [start, size] of address ranges whose arrays are gone, by start, adjacent ones merged
_untouched = {}  # pid -> the lowest address no allocation has had yet
# (start, nbytes) of arrays gone since the last allocation: a finalizer runs in whichever thread drops an
# array, even inside _take_range (the garbage collector), so it only appends here and allocations merge.
_given_back = []
_ranges_lock = threading.Lock()


def _take_range(nbytes):
    with _ranges_lock:
        while _given_back:
            _merge(*_given_back.pop())
        return _first_fit(nbytes)


def _first_fit(nbytes):
    size = -(-max(nbytes, 1) // _ADDRESS_ALIGN) * _ADDRESS_ALIGN
    for index, (start, free) in enumerate(_free_ranges):
        if free >= size:  # first fit
            if free == size:
                del _free_ranges[index]
            else:
                _free_ranges[index] = [start + size, free - size]
            return start
    # Distinct between processes, as one device's unified address space keeps allocations apart.
    start = _untouched.get(os.getpid(), os.getpid() << 48)
    _untouched[os.getpid()] = start + size
    return start


def _merge(start, nbytes):
    size = -(-max(nbytes, 1) // _ADDRESS_ALIGN) * _ADDRESS_ALIGN
    index = bisect.bisect(_free_ranges, [start, size])
    _free_ranges.insert(index, [start, size])
    if index + 1 < len(_free_ranges) and start + size == _free_ranges[index + 1][0]:
        _free_ranges[index][1] += _free_ranges.pop(index + 1)[1]
    if index and sum(_free_ranges[index - 1]) == start:
        _free_ranges[index - 1][1] += _free_ranges.pop(index)[1]


class _Address:
    """An allocation's address, its range given back when the array a test allocated goes (its views
    need not)."""

    def __init__(self, nbytes):
        self.value = _take_range(nbytes)
        weakref.finalize(self, _given_back.append, (self.value, nbytes))


class _Mapping:
    """Shared memory mapped into this process: made by its owner (path None) or opened by another from the
    owner's `path`, which stays valid while the owner's mapping lives."""

    def __init__(self, nbytes, path=None, address=0):
        size = max(nbytes, 1)
        if path is None:
            fd = os.memfd_create("scaffe-cpu-device")
            os.ftruncate(fd, size)
            self.memory = mmap.mmap(fd, size)
            path = f"/proc/{os.getpid()}/fd/{fd}"
            weakref.finalize(self, os.close, fd)  # the owner's descriptor is what peers open
        else:
            fd = os.open(path, os.O_RDWR)
            try:
                self.memory = mmap.mmap(fd, size)
            finally:
                os.close(fd)
        self.path, self.nbytes, self.serial, self.address = path, nbytes, next(_serials), address
        self.bytes = numpy.frombuffer(self.memory, dtype=numpy.uint8)


class DeviceArray:
    """An array in stand-in device memory. The host touches it only through streams, `write` and `read`
    (which order themselves like CUDA's synchronous copies on the legacy default stream) and `peek`."""

    def __init__(self, mapping, offset, shape, dtype, device, address=None):
        self.mapping, self.offset, self.device = mapping, offset, device
        self.address = address  # held by the array a test allocated, not by its views
        self.dtype = numpy.dtype(dtype)
        self.shape = tuple(shape)
        self.size = int(numpy.prod(self.shape, dtype=numpy.int64))
        self.nbytes = self.size * self.dtype.itemsize
        self.memory = mapping.bytes[offset:offset + self.nbytes].view(self.dtype).reshape(self.shape)

    @property
    def ndim(self):
        return len(self.shape)

    def __len__(self):
        return self.shape[0]

    def __getitem__(self, key):
        if self.ndim != 1 or not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("stand-in device arrays take only contiguous slices of 1-D arrays")
        start, stop, _ = key.indices(self.size)
        stop = max(start, stop)
        return DeviceArray(self.mapping, self.offset + start * self.dtype.itemsize, (stop - start,), self.dtype,
                           self.device)

    def reshape(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        return DeviceArray(self.mapping, self.offset, self.memory.reshape(shape).shape, self.dtype, self.device)

    def write(self, values, stream=None):
        """Queue a copy of host `values` into this array on `stream` (the default stream if None)."""
        values = numpy.array(values, dtype=self.dtype, copy=True).reshape(self.shape)
        stream = stream if stream is not None else self.device.default_stream
        stream.enqueue(lambda: numpy.copyto(self.memory, values))

    def read(self):
        """The contents after the default stream's work, as a synchronous cudaMemcpy would see them."""
        self.device.default_stream.synchronize()
        return self.memory.copy()

    def peek(self):
        """The contents right now, whatever is still queued: what a test checks a result with."""
        return self.memory.copy()

    # numba's DeviceNDArray calls, which the staged path (collectives.devices.memory.Staging) makes
    def copy_to_host(self, ary=None, stream=0):
        data = self.read()
        if ary is None:
            return data
        numpy.copyto(ary.reshape(self.shape), data)
        return ary

    def copy_to_device(self, ary, stream=0):
        self.device.default_stream.synchronize()
        numpy.copyto(self.memory, numpy.asarray(ary).reshape(self.shape))


class Stream:
    """An ordered queue of work run by its own thread, each piece after a random delay."""

    def __init__(self, device):
        self.device = device
        self._queue = queue.Queue()
        self._random = random.Random(device.seed)
        self.error = None
        self.queued = self.finished = 0  # pieces of work queued and finished (cudaStreamQuery's answer)
        self._count_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="cpu-device-stream", daemon=True)
        self._thread.start()

    def enqueue(self, work):
        with self._count_lock:
            self.queued += 1
        self._queue.put(work)

    def _run(self):
        while True:
            work = self._queue.get()
            if work is None:
                return
            time.sleep(self._random.uniform(0, self.device.max_delay_s))
            if self.error is None:
                try:
                    work()
                except BaseException as error:  # kept for synchronize to raise, as CUDA reports sticky errors
                    self.error = error
            work = None  # what it held may go now (an array a test freed gives its address back)
            self.finished += 1

    def synchronize(self):
        done = threading.Event()
        self._queue.put(done.set)
        done.wait()
        if self.error is not None:
            raise RuntimeError(f"work on a stand-in stream failed: {self.error}") from self.error

    def stop(self):
        self._queue.put(None)


class Event:
    """Two counters in a shared-memory file: [records made, records completed]."""

    def __init__(self, mapping, slot):
        self.mapping, self.slot = mapping, slot
        self.counters = mapping.bytes.view(numpy.int64)[2 * slot:2 * slot + 2]

    def completed(self, target):
        return self.counters[1] >= target


def _wait_for(event, target, what):
    deadline = time.monotonic() + _WAIT_LIMIT_S
    while not event.completed(target):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: event record {target} never completed within {_WAIT_LIMIT_S:.0f} s")
        time.sleep(_POLL_S)


class CpuDevice(devices.Device):
    """The stand-in device of one process. `gpu`: which physical device it pretends to be;
    `max_delay_s`: the longest random delay before each piece of stream work."""

    def __init__(self, gpu=0, max_delay_s=1e-3, seed=None):
        self.key = gpu + 1
        self.max_delay_s = max_delay_s
        self.seed = seed
        self._events = None  # this process's event file, made on first use
        self._next_slot = 0
        self._mapped = {}  # address -> what `open` mapped there, until `close`
        self._lock = threading.Lock()  # for the two above
        self.default_stream = Stream(self)

    # -- memory -------------------------------------------------------------------------------------
    def empty(self, count, dtype):
        return self.array((count,), dtype)

    def array(self, shape, dtype):
        """A new DeviceArray of `shape` (what a test allocates its buffers with)."""
        dtype = numpy.dtype(dtype)
        nbytes = int(numpy.prod(shape, dtype=numpy.int64)) * dtype.itemsize
        address = _Address(nbytes)
        return DeviceArray(_Mapping(nbytes, address=address.value), 0, shape, dtype, self, address)

    def pinned(self, count, dtype):
        return numpy.empty(count, dtype)  # the host's own memory: page-locking makes no difference here

    def mpi_buffer(self, view):
        return view.memory  # what a CUDA-aware MPI reads through the device pointer

    def export(self, view):
        mapping = view.mapping
        handle = f"{mapping.path}:{mapping.nbytes}:{mapping.serial}:{mapping.address}".encode()
        if len(handle) > devices.HANDLE_BYTES:
            raise ValueError(f"stand-in handle {handle!r} is longer than {devices.HANDLE_BYTES} bytes")
        return handle, mapping.address, mapping.nbytes, view.offset

    def open(self, handle):
        path, nbytes, _, address = bytes(handle).rstrip(b"\0").decode().split(":")
        address, nbytes = int(address), int(nbytes)
        end = address + max(nbytes, 1)
        with self._lock:
            for other in self._mapped.values():
                if other.address < end and address < other.address + max(other.nbytes, 1):
                    raise RuntimeError(f"cudaErrorAlreadyMapped: the stand-in range at {address:#x} overlaps the "
                                       f"mapped one at {other.address:#x}; close the stale mapping first")
            opened = self._mapped[address] = _Mapping(nbytes, path, address)
        return opened

    def close(self, opened):
        # The memory goes when the last view of it does, as a real unmapping's would; the address is free.
        with self._lock:
            del self._mapped[opened.address]

    def view(self, opened, offset, count, dtype):
        return DeviceArray(opened, offset, (count,), dtype, self)

    # -- streams and work on them -------------------------------------------------------------------
    def new_stream(self):
        return Stream(self)

    def user_stream(self, stream):
        if stream is None:
            return self.default_stream
        if not isinstance(stream, Stream):
            raise TypeError(f"the stand-in device takes its own streams, not {type(stream).__name__}")
        return stream

    def copy(self, target, source, stream):
        target, source = _memory(target), _memory(source)  # device views, or pinned host arrays
        stream.enqueue(lambda: numpy.copyto(target, source))

    def reduce(self, outputs, inputs, op, stream):
        def run():
            # Every input is read before any output is written, as each thread of the GPU kernel does.
            result = numpy.empty(outputs[0].size, dtype=outputs[0].dtype)
            if op == "copy":
                numpy.copyto(result, inputs[0].memory)
            else:
                reduce_into(result, [view.memory for view in inputs], op)
            for view in outputs:
                numpy.copyto(view.memory, result)

        stream.enqueue(run)

    def synchronize_stream(self, stream):
        stream.synchronize()

    def idle(self, stream):
        # The default stream stands for CUDA's legacy one, whose query would not cover other streams.
        return stream is not self.default_stream and stream.finished == stream.queued

    # -- events -------------------------------------------------------------------------------------
    def new_event(self):
        with self._lock:
            if self._events is None:
                self._events = _Mapping(_EVENT_SLOTS * 16)
            if self._next_slot == _EVENT_SLOTS:
                raise RuntimeError(f"the stand-in device has room for {_EVENT_SLOTS} events per process")
            self._next_slot += 1
            return Event(self._events, self._next_slot - 1)

    def record(self, event, stream):
        event.counters[0] += 1
        target = int(event.counters[0])

        def complete():
            if event.counters[1] < target:
                event.counters[1] = target

        stream.enqueue(complete)

    def wait(self, stream, event):
        target = int(event.counters[0])  # the records made so far, as cudaStreamWaitEvent takes them
        stream.enqueue(lambda: _wait_for(event, target, "a stream wait"))

    def query(self, event):
        return event.completed(int(event.counters[0]))

    def synchronize(self, event):
        _wait_for(event, int(event.counters[0]), "an event synchronize")


def _memory(array):
    return array.memory if isinstance(array, DeviceArray) else array


def register(device):
    """Serve every DeviceArray in the collectives with `device` (this process's stand-in device)."""
    devices.register(DeviceArray, lambda view: device)
