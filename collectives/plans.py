"""One road for every collective call: a plan per call signature, built once, run by every call.

Each override (Reduce, Ireduce, ...) of a communicator has a `Lane` (collectives.planning). A call looks
up the plan its buffers' identities name in the lane's small cache and checks that the rest of its
signature (op, root, the message's type, dtype and size) is the plan's; a miss builds the plan there.
Either way the call then runs `plan.run(...)`. A plan's path (native MPI, a
host algorithm, the node's device path) is a function of the signature alone, which every rank of a
correct program shares, so every rank takes the same path whether it found the plan or built it.

What a signature cannot see (an array made read-only or non-contiguous in place) makes a repeated
plan `Stale` before any message moves, and the lane then builds the call's plan again through the full
validation, which says what changed.
"""
import array
import mmap
import threading
import time
import weakref

import numpy
from mpi4py import MPI

from collectives import devices, waiting
from collectives.call import Call
from collectives.devices.memory import synchronize
from collectives.errors import CollectiveError
from collectives.events import reported, with_label
from collectives.progress import nudged

# What mpi4py raises on arguments it rejects before calling MPI (a read-only or resized buffer, say).
REJECTED = (BufferError, ValueError)
_BYTE_SIZED = frozenset((bytes, bytearray, mmap.mmap))
_HOST_KINDS = _BYTE_SIZED | {numpy.ndarray, memoryview, array.array}


class Stale(Exception):
    """A repeated plan no longer fits its call's buffers (`error`: what mpi4py said, if it said it)."""

    def __init__(self, error=None):
        super().__init__(error)
        self.error = error


def signature(obj):
    """What a plan's path depends on in a buffer argument, cheap to compute and compare: its type, element
    format and size (a spec's: its buffer's, the buffer's identity and the spec's other items). An object
    of unknown kind, or one that can no longer be read (a closed mmap), gets a value equal to nothing."""
    kind = type(obj)
    try:
        if kind is numpy.ndarray:
            return kind, obj.dtype, obj.nbytes
        if kind is list or kind is tuple:
            return (kind, id(obj[0]), signature(obj[0]), *obj[1:]) if obj else (kind,)
        if kind in _BYTE_SIZED:  # their length is their size; a buffer export would cost microseconds
            return kind, len(obj)
        if kind is memoryview:
            return kind, obj.format, obj.nbytes
        if obj is None or obj is MPI.IN_PLACE:
            return kind
        with memoryview(obj) as view:
            return kind, view.format, view.nbytes
    except (TypeError, ValueError):
        return object()


def host_kinds(obj):
    """The types of a buffer argument that only host memory has (a spec's and its buffer's), or None for
    any other (device arrays, exporters whose memory may live anywhere)."""
    kind = type(obj)
    if kind is list or kind is tuple:
        return (kind, type(obj[0])) if obj and type(obj[0]) in _HOST_KINDS else None
    return kind if kind in _HOST_KINDS else None


def _reference(obj):
    try:
        return weakref.ref(obj)
    except TypeError:  # None, MPI.IN_PLACE: kept as they are
        return lambda: obj


def fixed_memory(obj):
    """Whether `obj`'s device memory cannot change under it: cupy's and numba's device arrays, the
    registered kinds (and no buffer at all: None, MPI.IN_PLACE)."""
    if obj is None or obj is MPI.IN_PLACE or type(obj).__module__.split(".")[0] in ("cupy", "numba", "numba_cuda"):
        return True
    return devices.find_registered(obj) is not None


def _stream_named_now(buf, recvbuf):
    """The stream the first of two device arrays that names one names now (each is None, IN_PLACE or an
    array whose stream agreed with the other's when the call was validated)."""
    for obj in (buf, recvbuf):
        interface = getattr(obj, "__cuda_array_interface__", None)
        if interface is not None and interface.get("stream") is not None:
            return interface["stream"]
    return None


def _flat(array):
    return array if array.ndim == 1 else array.reshape(-1)


def fitting_recv(sendbuf, recvbuf):
    """Whether `recvbuf` is a plain, contiguous, writable ndarray of sendbuf's dtype and size."""
    if (type(recvbuf) is not numpy.ndarray or recvbuf.nbytes != sendbuf.nbytes
            or recvbuf.dtype is not sendbuf.dtype and recvbuf.dtype != sendbuf.dtype):
        return False
    flags = recvbuf.flags
    return flags.c_contiguous and flags.writeable


class Plan:
    """How calls of one signature run. `op`, `root`, `dtype` and `nbytes` are the signature's parts that
    a lane's override compares inline for a plain array send buffer (`dtype` None for any other); `holds`
    tells the rest. `kept`: whether the plan may serve later calls (else it serves the call that built it);
    `send_id` and `recv_id`: the ids of the buffer arguments it is kept for (collectives.planning);
    `host_kind` and `spec_kind`: the send buffer's type and, for a spec, its buffer's, where they alone
    decide a repeat (NativePlan), else None."""

    __slots__ = ("lane", "op", "root", "dtype", "nbytes", "signature", "in_place", "send_id", "recv_id",
                 "host_kind", "spec_kind")
    kept = True
    # Whether the lane's override may make the wrapped MPI's call itself (a NativePlan's).
    direct = False

    def __init__(self, lane, buf, recvbuf, op, root, nbytes):
        self.lane, self.op, self.root, self.nbytes = lane, op, root, nbytes
        self.host_kind = self.spec_kind = None
        self.in_place = type(buf) is not numpy.ndarray and (buf is MPI.IN_PLACE or buf is None)
        self.dtype = buf.dtype if type(buf) is numpy.ndarray else None
        self.signature = signature(recvbuf if self.in_place else buf)

    def holds(self, buf, recvbuf, stream):
        """Whether a call with these buffers (whose ids and op and root are the plan's) is of its signature."""
        return signature(recvbuf if self.in_place else buf) == self.signature

    def run(self, comm, buf, recvbuf, op, root, stream):
        raise NotImplementedError


def native_args(kind, buf, recvbuf, op, root):
    """The wrapped MPI method's arguments as the user passed them: Reduce's four, Allreduce's three, Bcast's two."""
    if kind == "reduce":
        return buf, recvbuf, op, root
    return (buf, recvbuf, op) if kind == "allreduce" else (buf, root)


class NativePlan(Plan):
    """The wrapped MPI's method on the user's own arguments.

    Where native MPI runs the lane's calls at every size (a Bcast, unless SCAFFE_REDUCE_ALGO forces an
    algorithm), the path depends only on the buffer living on the host: the plan then compares the kinds
    of objects alone (`kinds`, from host_kinds), which costs a repeat far less than a signature."""

    __slots__ = ("kinds", "nudged")  # nudged: the request of a nonblocking call is (collectives.progress.nudged)
    direct = True

    def __init__(self, lane, buf, recvbuf, op, root, nbytes):
        super().__init__(lane, buf, recvbuf, op, root, nbytes)
        self.nudged = not lane.blocking and nudged(self.nbytes)
        self.kinds = host_kinds(recvbuf if self.in_place else buf) if lane.native_below == float("inf") else None
        if self.kinds is not None and not self.in_place:  # the kinds as the lane's override compares them inline
            self.host_kind, self.spec_kind = self.kinds if type(self.kinds) is tuple else (self.kinds, None)

    def holds(self, buf, recvbuf, stream):
        if self.kinds is None:
            return super().holds(buf, recvbuf, stream)
        return host_kinds(recvbuf if self.in_place else buf) == self.kinds

    def run(self, comm, buf, recvbuf, op, root, stream):
        if stream is not None:
            synchronize(stream)  # the caller's kernels that produce the data finish before MPI reads it
        lane = self.lane
        native, kind = lane.native, lane.kind
        try:
            if not lane.blocking:
                request = native(comm, *native_args(kind, buf, recvbuf, op, root))
                return comm.progress.follow(request, with_label(lane.event_name), self.nbytes)
            # The lane's override makes a call without a stream or listeners itself; this is every other one.
            return reported(with_label(lane.event_name), self.nbytes, native, comm,
                            *native_args(kind, buf, recvbuf, op, root))
        except REJECTED as error:
            raise Stale(error) from error


class AlgorithmPlan(Plan):
    """One of our host algorithms (`algorithm(comm, call)`) on flat views of the call's buffers, taken
    anew at every call: a plan keeps no buffer alive and no memory exported (an mmap it held a view of
    could not be closed). With a `trial`, the first calls of its size also time native MPI against it."""

    __slots__ = ("algorithm", "op_name", "trial", "parsed_views")

    def __init__(self, lane, buf, recvbuf, op, root, nbytes, algorithm, op_name, trial, parsed_views=None):
        super().__init__(lane, buf, recvbuf, op, root, nbytes)
        self.algorithm, self.op_name, self.trial = algorithm, op_name, trial
        # (buf, recvbuf) -> (send, recv) flat views, raising Stale when they no longer fit, for buffer arguments
        # other than plain C-ordered ndarrays (`plain_views`, made inline).
        self.parsed_views = parsed_views

    def run(self, comm, buf, recvbuf, op, root, stream):
        views = self.plain_views if self.parsed_views is None else self.parsed_views
        send, recv = views(buf, recvbuf)
        if stream is not None:
            synchronize(stream)
        lane = self.lane
        call = Call(lane.kind, send, recv, op, self.op_name, root)
        algorithm, trial = self.algorithm, self.trial
        if trial is None or trial.native is False:
            return launch(comm, lane, lambda: algorithm(comm, call), call.nbytes)
        # Once the trial has chosen native MPI, a NativePlan serves the signature (MPI's call made by the lane's
        # override). Every rank learns it at the same call: a blocking call's trial has run by the time it returns;
        # a nonblocking one's runs on the progress thread, and the caller counts its calls to know when to wait.
        if lane.blocking:
            if trial.native:
                return self.replaced(comm, buf, recvbuf, op, root, stream)
            return launch(comm, lane, lambda: trial.run(comm, algorithm, call), call.nbytes)
        if trial.posted < trial.CALLS:
            trial.posted += 1
            posted_at = time.perf_counter()
            return launch(comm, lane, lambda: trial.run(comm, algorithm, call, posted_at), call.nbytes)
        if trial.chosen(lane.kind):
            return self.replaced(comm, buf, recvbuf, op, root, stream)
        return launch(comm, lane, lambda: algorithm(comm, call), call.nbytes)

    def replaced(self, comm, buf, recvbuf, op, root, stream):
        """The call run by the NativePlan that serves its signature from now on (native MPI chosen)."""
        plan = NativePlan(self.lane, buf, recvbuf, op, root, self.nbytes)
        self.lane.replace(self, plan)
        return plan.run(comm, buf, recvbuf, op, root, None)  # the stream was waited for above

    def plain_views(self, buf, recvbuf):
        """Views of a plain contiguous ndarray send buffer and, where this rank receives, a receive buffer
        that fits it."""
        if type(buf) is not numpy.ndarray or not buf.flags.c_contiguous:
            raise Stale()
        lane = self.lane
        if lane.kind == "allreduce" or lane.rank == self.root:
            if not fitting_recv(buf, recvbuf):
                raise Stale()
            return _flat(buf), _flat(recvbuf)
        return _flat(buf), None


class Trial:
    """Our algorithm against the wrapped MPI on the first calls of one (kind, blocking or not, op, dtype, size)
    of a communicator (SCAFFE_CHOICE=measured): they alternate, one untimed call each and then ROUNDS timed
    calls each, then one small allreduce of the times makes every rank keep the same one: native MPI
    where it was clearly faster, else ours (`native`: None until then).

    A trial belongs to the signature's contents, not to a plan: ranks find plans by ids, which differ
    between them, but make the same calls in the same order. It runs in call order (in the thread that
    runs the communicator's calls), so every rank counts the same calls, and the native twin runs
    blocking on the communicator's private duplicate, like the algorithm's own messages. A nonblocking
    call of ours costs its caller the hand-off to the progress thread as well, where MPI's own goes back
    to the caller at once: our road's time then runs from the call's posting, or from the end of the
    thread's previous work if later (time queued behind other calls is theirs, not the hand-off's).
    """

    ROUNDS = 3
    CALLS = 2 + 2 * ROUNDS
    # The table's pick stands unless native MPI beats it clearly: a few calls in a loaded VM misjudge a
    # close race (at 128 KiB on 2 ranks, trials without a margin kept native MPI where ours was 1.3-2x faster).
    MARGIN = 0.8
    __slots__ = ("calls", "seconds", "native", "posted", "done")

    def __init__(self):
        self.calls, self.seconds, self.native = 0, numpy.zeros(2), None
        self.posted = 0  # nonblocking calls posted by the caller
        self.done = threading.Event()  # the choice made, or the trial failed

    def run(self, comm, algorithm, call, posted_at=None):
        """One of the trial's calls (the plan runs the chosen road itself once the choice is made)."""
        try:
            road = self.calls % 2
            start = time.perf_counter()
            if road:
                _native_twin(comm, call)
            else:
                algorithm(comm, call)
            end = time.perf_counter()
            if self.calls >= 2:  # each road's first call warms it up (our node loop compiles): not timed
                if not road and posted_at is not None:
                    start = max(posted_at, comm.progress.free_since)
                self.seconds[road] += end - start
            self.calls += 1
            if self.calls == self.CALLS:
                comm.private.Allreduce(MPI.IN_PLACE, self.seconds, MPI.SUM)
                self.native = bool(self.seconds[1] < self.MARGIN * self.seconds[0])
                self.done.set()
        except BaseException:
            self.done.set()  # a caller waiting for the choice raises instead
            raise

    def chosen(self, kind):
        """Whether native MPI was chosen, once the progress thread has made the choice (a nonblocking lane's)."""
        self.done.wait()
        if self.native is None:
            raise CollectiveError(f"{kind}: the measured choice between our algorithm and MPI's was not made: "
                                  f"an earlier call of this size failed")
        return self.native


_BLOCKING = {"reduce": MPI.Intracomm.Reduce, "allreduce": MPI.Intracomm.Allreduce, "bcast": MPI.Intracomm.Bcast}
_NONBLOCKING = {"reduce": MPI.Intracomm.Ireduce, "allreduce": MPI.Intracomm.Iallreduce, "bcast": MPI.Intracomm.Ibcast}


def _native_twin(comm, call):
    """The wrapped MPI's call on a validated call's flat views, on the private duplicate, to its end."""
    return waiting.complete(_BLOCKING[call.kind], _NONBLOCKING[call.kind], comm.private, *call_args(call))


def call_args(call):
    """The wrapped MPI method's arguments for a validated Call's flat views (or host stand-ins)."""
    if call.kind == "bcast":
        return call.recv, call.root
    send = MPI.IN_PLACE if call.send is call.recv else call.send
    return native_args(call.kind, send, call.recv, call.op, call.root)


class DevicePlan(Plan):
    """This rank's part of a call on device buffers inside a node (a collectives.devices.ipc LocalCall),
    started again by every call on the same objects. The plan holds them weakly, where they allow it, so
    that it neither keeps them alive nor mistakes a new object for them; only kinds of device arrays whose
    memory an object keeps for its whole life get one that is kept. `named` is the stream their
    `__cuda_array_interface__` named (collectives.buffers.named_stream): a call given no stream repeats the
    plan only while they name the same one, since that stream is the call's."""

    __slots__ = ("send_ref", "recv_ref", "local", "named", "kept")

    def __init__(self, lane, buf, recvbuf, op, root, nbytes, local, named):
        super().__init__(lane, buf, recvbuf, op, root, nbytes)
        self.send_ref, self.recv_ref = _reference(buf), _reference(recvbuf)
        self.local, self.named = local, named
        self.kept = local.failure is None and fixed_memory(buf) and fixed_memory(recvbuf)

    def holds(self, buf, recvbuf, stream):
        return (self.send_ref() is buf and self.recv_ref() is recvbuf
                and (stream is not None or _stream_named_now(buf, recvbuf) == self.named))

    def run(self, comm, buf, recvbuf, op, root, stream):
        return launch(comm, self.lane, self.local.start(self.named if stream is None else stream), self.nbytes)


class WorkPlan(Plan):
    """Work made for one call only (staged device buffers, a device call across nodes): it holds the
    call's own buffers and, for a device call, the mark made on its stream."""

    __slots__ = ("work",)
    kept = False

    def __init__(self, lane, nbytes, work):
        self.lane, self.nbytes, self.work = lane, nbytes, work

    def run(self, comm, buf, recvbuf, op, root, stream):
        return launch(comm, self.lane, self.work, self.nbytes)


class StagedNativePlan(Plan):
    """The wrapped MPI's method on host stand-ins of device buffers (`host_args`, from `staging`), for one call.

    It starts right away in this thread, as a host call going native would: collectives on the user's
    communicator must start in the same order on every rank. An I* call stays an I* call: MPI never
    matches a blocking collective with a nonblocking one, and the other ranks may have made theirs
    with host buffers, natively.
    """

    __slots__ = ("staging", "host_args")
    kept = False

    def __init__(self, lane, nbytes, staging, host_args):
        self.lane, self.nbytes, self.staging, self.host_args = lane, nbytes, staging, host_args

    def run(self, comm, buf, recvbuf, op, root, stream):
        lane, staging, native = self.lane, self.staging, self.lane.native
        name = with_label(lane.event_name)
        if lane.blocking:
            return reported(name, self.nbytes, staging.wrap(lambda: native(comm, *self.host_args)))
        staging.copy_in()
        request = native(comm, *self.host_args)

        def finish():
            try:
                waiting.wait(request)
                staging.copy_out()
            finally:
                staging.release()

        return comm.progress.submit(finish, name, self.nbytes)


def launch(comm, lane, work, nbytes):
    """Run `work()` in call order: now if `lane`'s override blocks, else behind the progress thread's queue,
    returning the request that completes when it has run."""
    run = comm.progress.run if lane.blocking else comm.progress.submit
    return run(work, with_label(lane.event_name), nbytes)
