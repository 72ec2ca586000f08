"""The small device interface the collectives use, and the registry that finds it for a device buffer.

A `Device` is one accelerator as one process sees it: memory it can export to the other processes of the
node and open from them (CUDA IPC), asynchronous copies and the fused K-input reduce on ordered streams,
and events, which other processes can open too, to order their streams after this one's work. The
collectives' device algorithms (collectives.devices.ipc) are written against this interface only;
collectives.devices.cuda implements it with cupy, and a CPU stand-in with truly asynchronous streams
implements it for the tests (tests/stand_ins/), so the algorithms and their synchronisation run in CI.

Views are flat device arrays (what collectives.buffers makes of a device buffer): they have `size`,
`dtype`, `nbytes` and slicing. Streams and events are whatever the implementation hands out; only it
looks inside them.

Which implementation serves a view is looked up by the view's type (`device_for`). numba's device
arrays, which is what collectives.buffers makes of every CUDA buffer, are served by the cupy
implementation when cupy is installed; other kinds of device memory register themselves with
`register`. A view without an implementation takes the staged path (collectives.devices.memory).

Every piece of the collectives' device code lives in this package: `driver` (the CUDA driver's calls),
`memory` (telling device buffers from host ones, viewing and staging them), `cuda` (this interface on
cupy), `peers` (the registration cache of other processes' memory), `ipc` (the node's protocol and its
fused kernel's launch), `direct` (which calls take the device path), `nodes` and `pipeline` (the path
across nodes: the node stage, then the leaders' chunked pipeline).
"""
import contextlib
import functools
import importlib

HANDLE_BYTES = 64  # what a CUDA IPC handle takes; every implementation's handles fit in it


class Device:
    """One device as this process sees it. `key` is the same number in every process that uses the same
    physical device, and differs between devices of one node."""

    key = 0

    # -- memory -------------------------------------------------------------------------------------
    def empty(self, count, dtype):
        """A new flat array of `count` elements of `dtype` in this device's memory, exportable."""
        raise NotImplementedError

    def pinned(self, count, dtype):
        """A new flat numpy array of `count` elements of `dtype` in page-locked host memory, which `copy`
        moves to and from the device asynchronously (the leaders' staging buffers)."""
        raise NotImplementedError

    def mpi_buffer(self, view):
        """What a CUDA-aware MPI library is handed for device `view` (the view itself where it exports
        __cuda_array_interface__)."""
        return view

    def export(self, view):
        """(handle, base, size, offset): the IPC handle (bytes) of the allocation holding `view`, the
        allocation's base address and size in bytes, and `view`'s byte offset in it. Exporting an
        allocation again gives the same handle; a new allocation where freed ones were gives another
        (collectives.devices.peers relies on both)."""
        raise NotImplementedError

    def open(self, handle):
        """Another process's allocation, mapped into this one from its `handle` (see `PeerMemory`)."""
        raise NotImplementedError

    def close(self, opened):
        """Unmap what `open` mapped (no view of it may be used afterwards)."""
        raise NotImplementedError

    def view(self, opened, offset, count, dtype):
        """A flat array of `count` `dtype` elements at byte `offset` of an opened allocation."""
        raise NotImplementedError

    # -- streams and work on them -------------------------------------------------------------------
    def new_stream(self):
        """A stream of this process's own, ordered with no other stream unless told to wait."""
        raise NotImplementedError

    def user_stream(self, stream):
        """The stream the caller's work on its buffers was queued on: `stream` as the caller passed it to a
        collective, or the legacy default stream for None (never a guess at a current stream)."""
        raise NotImplementedError

    def copy(self, target, source, stream):
        """Queue target[:] = source[:] on `stream` (views of one dtype and size, local or opened, or one of
        them a `pinned` host array)."""
        raise NotImplementedError

    def reduce(self, outputs, inputs, op, stream):
        """Queue every outputs[m][:] = inputs[0] op inputs[1] op ... (left to right, one fused pass) on `stream`;
        `op` is kernels.reduce's name ("sum", ...) or "copy" with one input. Outputs may be inputs."""
        raise NotImplementedError

    def prepare_reduce(self, outputs, inputs, op):
        """`reduce` of these views made ready to queue again and again: launch(stream) queues it. A device
        computes here whatever a launch would otherwise compute each time (kernel, grid, arguments)."""
        return lambda stream: self.reduce(outputs, inputs, op, stream)

    def synchronize_stream(self, stream):
        """Block until all work queued on `stream` so far has finished."""
        raise NotImplementedError

    def idle(self, stream):
        """Whether every piece of work an event recorded on `stream` now would wait for has finished,
        known without queueing anything (False where the device cannot tell)."""
        return False

    # -- events -------------------------------------------------------------------------------------
    def new_event(self):
        """An event, for ordering streams and for the host to wait on."""
        raise NotImplementedError

    def record(self, event, stream):
        """Queue `event` on `stream`: it completes when the work queued before it has."""
        raise NotImplementedError

    def wait(self, stream, event):
        """Make work queued on `stream` from now on wait for the last `record` of `event` made before this
        call (in any process), without blocking the host."""
        raise NotImplementedError

    def query(self, event):
        """Whether the last record of `event` has completed."""
        raise NotImplementedError

    def synchronize(self, event):
        """Block the host until the last record of `event` has completed."""
        raise NotImplementedError

    def current(self):
        """A context manager making this device the calling thread's current one."""
        return contextlib.nullcontext()


# view type -> resolve(view): the Device that serves the view, or None when none can (it is then staged)
_registry = {}
# Registered by type name so that nothing is imported until such a view is seen: "module:function".
_BUILT_IN = {
    "numba.cuda.cudadrv.devicearray.DeviceNDArray": "collectives.devices.cuda:device_for",
}


def register(view_type, resolve):
    """Make `resolve(view)` give the Device for views of `view_type` (flat arrays that
    collectives.buffers yields for such buffers), or None for views that must be staged."""
    _registry[view_type] = resolve


def device_for(view):
    """The Device serving `view`, or None: no implementation for its type (or none usable here)."""
    for kind in type(view).__mro__:
        resolve = _registry.get(kind) or _built_in(f"{kind.__module__}.{kind.__qualname__}")
        if resolve is not None:
            return resolve(view)
    return None


@functools.cache
def _built_in(type_name):
    path = _BUILT_IN.get(type_name)
    if path is None:
        return None
    module, function = path.split(":")
    return getattr(importlib.import_module(module), function)


def find_registered(obj):
    """The `register`ed view type that `obj` is an instance of, or None (the built-in ones are not:
    collectives.devices.memory knows numba's device arrays)."""
    for view_type in _registry:
        if isinstance(obj, view_type):
            return view_type
    return None
