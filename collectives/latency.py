"""The latency path: calls on plain ndarrays that skip the full validation because one like them passed it.

A call that repeats the last one of its kind that passed (`Seen`: a benchmark's loop, a training step's
gradients) goes straight to native MPI, or to the algorithm that ran it, with only its arrays' dtype and
size compared. A new small call that the full validation's checks, restricted to what a plain contiguous
ndarray can get wrong (`Lane.goes_native`), let through goes to native MPI, once its (op, dtype) pair went
native after the full validation. A larger one of an (op, dtype) pair our algorithms ran gets its Call
from `Lane.computed_call` (perf/RESULTS.md, "The Comm's own layers", has what each saves).
"""
import weakref

import numpy
from mpi4py import MPI

from collectives import devices
from collectives.call import Call


class Seen:
    """The last call of one kind (Reduce, Allreduce or Bcast, blocking or not) that passed on plain ndarrays.

    It keeps the ids of its buffers, not the buffers: remembering a call must not keep them alive, and
    Comm._collective, which compares a call with it, tests the type before looking inside because a new
    object can get a freed one's id. It keeps the dtype and size, which an array can change in place
    (`a.dtype = ...`, `a.resize(...)`) and which decide the algorithm, on which all ranks must agree. Whatever else an array can change in place
    (strides, the writeable flag) mpi4py rejects before calling MPI; the caller then forgets the record.
    `algorithm` is None when native MPI ran the call, else it and `op_name` run it again.
    """

    __slots__ = ("send_id", "recv_id", "op", "root", "dtype", "nbytes", "algorithm", "op_name")

    def __init__(self):
        self.forget()

    def forget(self):
        self.send_id = None  # no id equals it: nothing matches

    def remember(self, buf, recvbuf, op, root, algorithm=None, op_name=None):
        self.send_id, self.recv_id, self.op, self.root = id(buf), id(recvbuf), op, root
        self.dtype, self.nbytes, self.algorithm, self.op_name = buf.dtype, buf.nbytes, algorithm, op_name


class DeviceSeen:
    """The last call of one kind on device buffers that took the direct path inside a node: the user's
    objects (weakly, where they allow it, so that remembering them neither keeps them alive nor mistakes a
    new object for them), and this rank's LocalCall (collectives.intranode.ipc), which a repeat starts
    again. Only kinds of device arrays whose memory an object keeps for its whole life are remembered.
    `named` is the stream their `__cuda_array_interface__` named (collectives.buffers.named_stream): a call
    given no stream repeats only while they name the same one, since that stream is the call's."""

    __slots__ = ("send", "recv", "op", "root", "nbytes", "local", "named")

    def __init__(self, buf, recvbuf, op, root, nbytes, local, named):
        self.send, self.recv, self.op, self.root = _reference(buf), _reference(recvbuf), op, root
        self.nbytes, self.local, self.named = nbytes, local, named

    def matches(self, buf, recvbuf, op, root, stream):
        return (self.send() is buf and self.recv() is recvbuf and op is self.op and root == self.root
                and (stream is not None or _named_stream(buf, recvbuf) == self.named))


def _named_stream(buf, recvbuf):
    """The stream the first of two device arrays that names one names now (each is None, IN_PLACE or an
    array whose stream agreed with the other's when the call was validated)."""
    for obj in (buf, recvbuf):
        interface = getattr(obj, "__cuda_array_interface__", None)
        if interface is not None and interface.get("stream") is not None:
            return interface["stream"]
    return None


def _reference(obj):
    try:
        return weakref.ref(obj)
    except TypeError:  # None, MPI.IN_PLACE: kept as they are
        return lambda: obj


def fixed_memory(obj):
    """Whether `obj`'s memory cannot change under it: cupy's and numba's device arrays, the registered kinds
    (and no buffer at all: None, MPI.IN_PLACE)."""
    if obj is None or obj is MPI.IN_PLACE or type(obj).__module__.split(".")[0] in ("cupy", "numba", "numba_cuda"):
        return True
    return devices.find_registered(obj) is not None


def _fits(sendbuf, recvbuf):
    """Whether `recvbuf` is a plain, contiguous, writable ndarray of sendbuf's dtype and size."""
    if (type(recvbuf) is not numpy.ndarray or recvbuf.nbytes != sendbuf.nbytes
            or recvbuf.dtype is not sendbuf.dtype and recvbuf.dtype != sendbuf.dtype):
        return False
    flags = recvbuf.flags
    return flags.c_contiguous and flags.writeable


def _flat(array):
    return array if array.ndim == 1 else array.reshape(-1)


class Lane:
    """One override (Reduce, Ireduce, ...) on one communicator: its kind, its event name, whether it blocks,
    and its latency path (`seen` is shared with its blocking or nonblocking twin; None when every call
    gets the full validation: SCAFFE_CHECK, SCAFFE_REDUCE_ALGO).

    `native_pairs` maps a dtype number to the handles of the ops that went native with it (None: a
    Bcast's); `computed_pairs` maps (op handle, dtype) to the op's name for those our algorithms ran (the
    dtype itself: its number does not tell byte orders apart). Both are the communicator's, shared.
    """

    __slots__ = ("kind", "event_name", "blocking", "seen", "native_below", "rank", "size", "native_pairs",
                 "computed_pairs", "device_seen")

    def __init__(self, kind, event_name, blocking, seen, native_below, rank, size, native_pairs, computed_pairs):
        self.kind, self.event_name, self.blocking, self.seen = kind, event_name, blocking, seen
        # The selection table's None (native at every size) as a size no call reaches.
        self.native_below = float("inf") if native_below is None else native_below
        self.rank, self.size = rank, size
        self.native_pairs, self.computed_pairs = native_pairs, computed_pairs
        self.device_seen = None  # a DeviceSeen, when `seen` is kept

    def device_called(self, local, buf, recvbuf, op, root, nbytes, named):
        """`local` ran a call on these device buffers, which named stream `named`: the same objects next
        time start it again."""
        if self.seen is not None and local.failure is None and fixed_memory(buf) and fixed_memory(recvbuf):
            self.device_seen = DeviceSeen(buf, recvbuf, op, root, nbytes, local, named)

    def went_native(self, call):
        """Native MPI ran `call`, a validated call on host buffers: its (op, dtype) pair takes `goes_native`."""
        self.native_pairs.setdefault(call.dtype.num, set()).add(None if call.op is None else call.op.py2f())

    def computed(self, call, algorithm, sendbuf, recvbuf):
        """`algorithm` runs `call`, a validated Reduce/Allreduce on host buffers: its (op, dtype) pair takes
        `computed_call`, and the same plain arrays next time go straight to `algorithm`."""
        self.computed_pairs[(call.op.py2f(), call.dtype)] = call.op_name
        if (self.seen is not None and type(sendbuf) is numpy.ndarray
                and (call.recv is None or type(recvbuf) is numpy.ndarray)):
            self.seen.remember(sendbuf, recvbuf, call.op, call.root, algorithm, call.op_name)

    def goes_native(self, buf, recvbuf, op, root):
        """Whether a small call on a plain ndarray may go straight to the wrapped MPI."""
        # Ordered for speed: these checks are most of what the latency path costs when they run.
        if type(buf) is not numpy.ndarray or buf.nbytes >= self.native_below or not 0 <= root < self.size:
            return False
        if self.kind == "bcast":
            fits = self.rank == root or buf.flags.writeable
        else:
            fits = self.kind == "reduce" and self.rank != root or _fits(buf, recvbuf)
        return (fits and buf.flags.c_contiguous
                and (None if op is None else op.py2f()) in self.native_pairs.get(buf.dtype.num, ()))

    def computed_call(self, sendbuf, recvbuf, op, root):
        """The Call that the full validation would make for a Reduce/Allreduce on plain arrays of an
        (op, dtype) pair our algorithms ran, or None when it must decide."""
        if self.kind == "bcast" or type(sendbuf) is not numpy.ndarray or not 0 <= root < self.size:
            return None
        name = self.computed_pairs.get((op.py2f(), sendbuf.dtype))
        return None if name is None else self.plain_call(name, sendbuf, recvbuf, op, root)

    def plain_call(self, name, sendbuf, recvbuf, op, root):
        """The Call of an ndarray sendbuf whose (op `name`, dtype) our algorithms compute, or None unless
        it and the receive buffer (where this rank receives) are contiguous and fit each other."""
        if not sendbuf.flags.c_contiguous:
            return None
        recv = None
        if self.kind == "allreduce" or self.rank == root:
            if not _fits(sendbuf, recvbuf):
                return None
            recv = _flat(recvbuf)
        return Call(self.kind, _flat(sendbuf), recv, op, name, root)
