"""`Comm`: an mpi4py Intracomm whose buffer collectives run the hierarchical algorithms.

Each override validates its arguments on the calling rank before any message moves, picks an algorithm
from the table in `collectives.algorithms`, and runs it. Whatever we do not compute ourselves
(user-defined ops, derived datatypes, bool or structured dtypes) goes to the wrapped MPI unchanged, so
swapping `MPI.COMM_WORLD` for `Comm(MPI.COMM_WORLD)` never changes a program's meaning.
"""
import itertools

import numpy
from mpi4py import MPI

from collectives import algorithms, settings, stall, waiting
from collectives.algorithms import device as device_algorithm
from collectives.algorithms.pipeline import ScratchPool
from collectives.buffers import named_stream, parse, writable
from collectives.call import Call, Plan
from collectives.device import PinnedPool, Staging, synchronize
from collectives.errors import CollectiveError, MismatchError, install_abort_hook
from collectives.events import Name, finished, reported, started, with_label
from collectives.intranode.ipc import NodeIpc
from collectives.intranode.shm import SharedWindows
from collectives.latency import Lane, Seen
from collectives.ops import computes, native_reduces, op_name, supports
from collectives.progress import Progress
from collectives.topology import Topology

# Each kind with the wrapped MPI's blocking and nonblocking methods for it, which name the overrides' Lanes.
_METHODS = (("reduce", MPI.Intracomm.Reduce, MPI.Intracomm.Ireduce),
            ("allreduce", MPI.Intracomm.Allreduce, MPI.Intracomm.Iallreduce),
            ("bcast", MPI.Intracomm.Bcast, MPI.Intracomm.Ibcast))
# Numbers each Comm's set-up: every rank sets up its communicators in the same order (set-up is
# collective), so the number names the same communicator on all of them (collectives.events.Name).
_set_ups = itertools.count()
# What mpi4py raises on arguments it rejects before calling MPI (a read-only or resized buffer, say).
_REJECTED = (BufferError, ValueError)


def _nbytes(buf, recvbuf):
    """A message's size for collectives.events when the wrapped MPI runs the user's arguments: that of the
    buffer numpy can see in them (0 for a derived datatype, which only MPI understands)."""
    parsed = parse(recvbuf if buf is MPI.IN_PLACE else buf)
    return 0 if parsed is None or parsed.array is None else parsed.array.nbytes


# Where a call's data is reduced, in SCAFFE_CHECK's signature: through the host (host buffers, and device
# buffers staged through it, which may mix), or on the devices (whose ranks wait for each other there).
_PATHS = ("host", "direct")


def _user_args(kind, buf, recvbuf, op, root):
    """The wrapped MPI method's arguments as the user passed them: Reduce's four, Allreduce's three, Bcast's two."""
    if kind == "reduce":
        return buf, recvbuf, op, root
    return (buf, recvbuf, op) if kind == "allreduce" else (buf, root)


def _host_args(call):
    """The wrapped MPI method's arguments for `call` on the host stand-ins of its device buffers."""
    send = MPI.IN_PLACE if call.send is call.recv else call.send
    if call.kind == "bcast":
        return call.recv, call.root
    if call.kind == "allreduce":
        return send, call.recv, call.op
    return send, call.recv, call.op, call.root


def _computes(name, send, recv):
    """Whether our kernels compute op `name` (None: one they do not know) on these Buffers (recv None: this
    rank receives nothing); raises where no MPI could compute it either."""
    if name is None or send.array is None or recv is not None and recv.array is None:
        return False
    s = send.array
    if recv is not None and (recv.array.dtype != s.dtype or recv.array.shape != s.shape):
        raise CollectiveError(f"sendbuf holds {s.shape[0]} x {s.dtype} but recvbuf holds "
                              f"{recv.array.shape[0]} x {recv.array.dtype}; they must match")
    if not computes(s.dtype):
        return False
    if not supports(name, s.dtype):
        raise CollectiveError(f"op {name.upper()} is not defined for dtype {s.dtype}")
    return True


class Comm(MPI.Intracomm):
    """Drop-in for an mpi4py intracommunicator with faster Reduce, Allreduce, Bcast and their I* forms.

    The first collective call (or `alloc`) sets up the topology and shared memory; it is collective,
    like every call that uses it. Nonblocking calls run in order on one helper thread (progress does
    not depend on the caller's waits) and return `MPI.Grequest` objects, so `Wait`, `Test` and
    `MPI.Request.Waitall` work as with any MPI request; `Wait` and `Test` raise the error of a call that
    failed (collectives.progress), and later calls still run. Making one installs the abort hook
    (`collectives.install_abort_hook`) unless SCAFFE_ABORT_ON_ERROR=0.
    """

    _lanes = None  # the Lane of each wrapped MPI method, once set up
    _device_path = None  # "direct" or "staged" as the constructor was told; None: SCAFFE_DEVICE_PATH's

    def __new__(cls, comm=None, device_path=None):
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Intracomm) or comm.Is_inter():
            raise TypeError("collectives.Comm wraps an intracommunicator; "
                            "use the intercommunicator's own methods for intercommunicators")
        return super().__new__(cls, comm)

    def __init__(self, comm=None, device_path=None):
        self._device_path = settings.checked_device_path(device_path) if device_path is not None else None
        if settings.abort_on_error():
            install_abort_hook()  # else one rank's uncaught error leaves the others in a collective forever

    # -- set-up -------------------------------------------------------------------------------------
    def _setup(self):
        # Our own messages travel on a duplicate, so they can never match the user's point-to-point traffic.
        # mpi4py's Dup returns our own class; the plain Intracomm keeps our traffic off our overrides.
        self.private = MPI.Intracomm(MPI.Intracomm.Dup(self))
        self.node_topology = Topology(self.private)
        self.several_nodes = self.node_topology.num_nodes > 1  # which column of the selection table
        self.chunk_bytes = settings.chunk_bytes()
        node_comm = self.node_topology.node_comm
        self.shm = SharedWindows(node_comm)
        self.scratch = ScratchPool()
        self.pinned = PinnedPool()
        device_path = self._device_path or settings.device_path()
        self.device_ipc = NodeIpc(node_comm) if device_path == "direct" else None
        self.device_pipelines = {}  # Device -> the leaders' pipeline buffers (algorithms.device_nodes)
        self.check = settings.check()
        self.forced = settings.reduce_algo(algorithms.names())
        self.progress = Progress(threaded=MPI.Query_thread() == MPI.THREAD_MULTIPLE)
        index = next(_set_ups)
        self._signature_check = Name("Signature check", index)
        rank, size, native_pairs, computed_pairs = self.Get_rank(), self.Get_size(), {}, {}
        remembers = not self.check and self.forced is None
        # Everything an override reads on the latency path is in its Lane: attribute lookups on an
        # mpi4py subclass cost more than the checks themselves.
        lanes = {}
        for kind, blocking_method, nonblocking_method in _METHODS:
            seen = Seen() if remembers else None
            native_below = algorithms.threshold(kind, self.several_nodes)
            for method in (blocking_method, nonblocking_method):
                lanes[method] = Lane(kind, Name(method.__name__, index), method is blocking_method, seen,
                                     native_below, rank, size, native_pairs, computed_pairs)
        stall.watch(self, index)
        self._lanes = lanes
        return lanes

    @property
    def _ready(self):
        return self._lanes is not None

    def _state(self):
        if not self._ready:
            self._setup()
        return self

    def describe(self):
        """One line on the topology (collective the first time: it sets the communicator up)."""
        self._state()
        return self.node_topology.describe()

    def chunk_elements(self, dtype):
        return max(1, self.chunk_bytes // numpy.dtype(dtype).itemsize)

    def alloc(self, shape, dtype=numpy.float64):
        """A numpy array in node-shared memory (collective over the communicator).

        A Reduce/Allreduce whose send buffer (or Reduce root's receive buffer) lives in such an array
        skips the copy into shared memory, the analogue of registered buffers. The memory lives
        until the communicator is freed.
        """
        self._state()
        return self.shm.alloc(shape, dtype)

    def Free(self):
        if self._ready:
            self.progress.stop()
            self.shm.free()
            if self.device_ipc is not None:
                self.device_ipc.free()
            self.node_topology.free()
            self.private.Free()
            self._lanes = None  # they would send repeated calls to what was just freed
        MPI.Intracomm.Free(self)

    def Dup(self, *args, **kwargs):
        return Comm(MPI.Intracomm.Dup(self, *args, **kwargs), device_path=self._device_path)

    # -- the overrides: mpi4py's signatures; each names the wrapped MPI's method it stands in for -------
    def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0, stream=None):
        return self._collective(MPI.Intracomm.Reduce, stream, sendbuf, recvbuf, op, root)

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM, stream=None):
        return self._collective(MPI.Intracomm.Allreduce, stream, sendbuf, recvbuf, op, 0)

    def Bcast(self, buf, root=0, stream=None):
        return self._collective(MPI.Intracomm.Bcast, stream, buf, None, None, root)

    def Ireduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0, stream=None):
        return self._collective(MPI.Intracomm.Ireduce, stream, sendbuf, recvbuf, op, root)

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM, stream=None):
        return self._collective(MPI.Intracomm.Iallreduce, stream, sendbuf, recvbuf, op, 0)

    def Ibcast(self, buf, root=0, stream=None):
        return self._collective(MPI.Intracomm.Ibcast, stream, buf, None, None, root)

    # -- validate, pick, run ------------------------------------------------------------------------
    def _collective(self, native, stream, buf, recvbuf, op, root):
        """One call of an override: `native` is the wrapped MPI's method; (buf, recvbuf, op, root) is the
        user's call in the shape all kinds share (a Bcast's buffer is `buf`; see _user_args)."""
        lanes = self._lanes
        lane = (lanes if lanes is not None else self._setup())[native]
        device_seen = lane.device_seen
        if device_seen is not None and device_seen.matches(buf, recvbuf, op, root, stream):
            # The same device buffers again: this rank's part of the call, as last time (latency.DeviceSeen).
            start = device_seen.local.start(device_seen.named if stream is None else stream)
            return self._execute(lane, native, None, Plan(device_seen.nbytes, start), with_label(lane.event_name))
        seen = lane.seen
        if seen is not None:
            # Seen's record compared inline (a method call is a measurable part of this path); the type is
            # tested before looking inside, since a new object can get a freed one's id.
            if (id(buf) == seen.send_id and id(recvbuf) == seen.recv_id and op is seen.op and root == seen.root
                    and type(buf) is numpy.ndarray and buf.dtype is seen.dtype and buf.nbytes == seen.nbytes):
                if seen.algorithm is not None or not lane.blocking:
                    return self._repeat(lane, native, stream, buf, recvbuf, op, root)
                # The wrapped MPI's call made and reported inline, its arguments spelled out, without a label
                # (collectives.events.labelled): a Python call more is a measurable part of this path.
                name, kind = lane.event_name, lane.kind
                op_id = started(name, seen.nbytes)
                try:
                    if kind == "reduce":
                        return native(self, buf, recvbuf, op, root)
                    if kind == "allreduce":
                        return native(self, buf, recvbuf, op)
                    return native(self, buf, root)
                except _REJECTED:
                    seen.forget()  # an array changed in place: the full validation says how
                finally:
                    finished(name, op_id)
            elif lane.goes_native(buf, recvbuf, op, root):
                seen.remember(buf, recvbuf, op, root)
                return self._native(lane, native, _user_args(lane.kind, buf, recvbuf, op, root),
                                    with_label(lane.event_name), buf.nbytes)
        return self._validated(lane, native, stream, buf, recvbuf, op, root)

    def _repeat(self, lane, native, stream, buf, recvbuf, op, root):
        """A call that repeats the one `lane.seen` remembers: an I* call that went native, or one that our
        algorithm ran (again on the same arrays, unless a stream asks for the full path's synchronisation)."""
        seen = lane.seen
        algorithm = seen.algorithm
        if algorithm is None:
            try:
                return self._native(lane, native, _user_args(lane.kind, buf, recvbuf, op, root),
                                    with_label(lane.event_name), seen.nbytes)
            except _REJECTED:
                seen.forget()  # an array changed in place: the full validation says how
        elif stream is None:
            call = lane.plain_call(seen.op_name, buf, recvbuf, op, root)
            if call is not None:
                work = lambda: algorithm(self, call)  # noqa: E731
                return self._execute(lane, native, None, Plan(call.nbytes, work), with_label(lane.event_name))
        return self._validated(lane, native, stream, buf, recvbuf, op, root)

    def _validated(self, lane, native, stream, buf, recvbuf, op, root):
        """A call through the full validation (or the Call its (op, dtype) pair makes without it)."""
        call = lane.computed_call(buf, recvbuf, op, root) if lane.seen is not None else None
        if call is None:
            call = self._validate(lane.kind, buf, recvbuf, op, root)
        return self._execute(lane, native, _user_args(lane.kind, buf, recvbuf, op, root),
                             self._offload(lane, call, stream, buf, recvbuf), with_label(lane.event_name))

    def _offload(self, lane, call, stream, buf, recvbuf):
        """The Plan of a validated call (`call` None: the wrapped MPI runs it with the user's own arguments).

        Honours SCAFFE_REDUCE_ALGO; what runs on plain arrays joins the latency path.
        """
        if call is None:
            return Plan(_nbytes(buf, recvbuf))
        if call.device is not None:
            stream = call.stream if stream is None else stream
            local = device_algorithm.local_call(self, call)
            if local is None:
                return Plan(call.nbytes, device_algorithm.start(self, call, stream))
            lane.device_called(local, buf, recvbuf, call.op, call.root, call.nbytes, call.stream)
            return Plan(call.nbytes, local.start(stream))
        synchronize(stream)  # the caller's kernels that produce the data finish before we read it
        name = self._pick(call)
        if name == "native":
            if call.staging is not None:
                return Plan(call.nbytes, staging=call.staging, host_args=_host_args(call))
            lane.went_native(call)
            return Plan(call.nbytes)
        run = algorithms.get(name, call.kind)
        if call.op is not None and call.staging is None:
            lane.computed(call, run, buf, recvbuf)
        work = lambda: run(self, call)  # noqa: E731
        return Plan(call.nbytes, work if call.staging is None else call.staging.wrap(work))

    def _pick(self, call):
        """The algorithm for a validated call: the selection table's or SCAFFE_REDUCE_ALGO's, "native" for
        what only MPI computes, "tree" instead of native MPI for a dtype it cannot reduce."""
        if not call.computed:
            return "native"
        compiled = call.op_name is not None and self.shm.compiled_applies(call.op_name, call.dtype)
        name = algorithms.select(call.kind, call.nbytes, self.forced, self.several_nodes, compiled)
        return "tree" if name == "native" and not native_reduces(call.dtype) else name

    def _execute(self, lane, native, args, plan, event_name):
        """Run `plan` for `lane`'s method: now if it blocks, else behind the progress thread's queue,
        returning the request, which completes when the progress thread has seen the call done."""
        if plan.work is not None:
            launch = self.progress.run if lane.blocking else self.progress.submit
            return launch(plan.work, event_name, plan.nbytes)
        if plan.staging is None:
            return self._native(lane, native, args, event_name, plan.nbytes)
        return self._native_on_host(lane, native, plan, event_name)

    def _native(self, lane, native, args, event_name, nbytes):
        """The wrapped MPI's `native(self, *args)`, reported to collectives.events."""
        if not lane.blocking:
            return self.progress.follow(native(self, *args), event_name, nbytes)
        # Reported inline: events.reported would cost the latency path a call more.
        op_id = started(event_name, nbytes)
        try:
            return native(self, *args)
        finally:
            finished(event_name, op_id)

    def _native_on_host(self, lane, native, plan, event_name):
        """The wrapped MPI's method on the host stand-ins of device buffers.

        It starts right away in this thread, as a host call going native would: collectives on the user's
        communicator must start in the same order on every rank. An I* call stays an I* call: MPI never
        matches a blocking collective with a nonblocking one, and the other ranks may have made theirs
        with host buffers, natively.
        """
        staging = plan.staging
        if lane.blocking:
            return reported(event_name, plan.nbytes, staging.wrap(lambda: native(self, *plan.host_args)))
        staging.copy_in()
        request = native(self, *plan.host_args)

        def finish():
            try:
                waiting.wait(request)
                staging.copy_out()
            finally:
                staging.release()

        return self.progress.submit(finish, event_name, plan.nbytes)

    # -- the full validation ------------------------------------------------------------------------
    def _validate(self, kind, buf, recvbuf, op, root):
        """The Call of a collective that passed every check, or None when the wrapped MPI must run it
        with the user's own arguments."""
        self._check_root(root)
        if kind == "bcast":
            return self._broadcast(buf, root)
        return self._reduction(kind, buf, recvbuf, op, root)

    def _check_root(self, root):
        size = self.Get_size()
        if not isinstance(root, (int, numpy.integer)) or not 0 <= root < size:
            raise CollectiveError(f"root {root!r} is out of range for a communicator of {size} ranks")

    def _reduction(self, kind, sendbuf, recvbuf, op, root):
        """A Call for Reduce/Allreduce, or None when the wrapped MPI must do it."""
        send, recv = self._reduction_buffers(kind, sendbuf, recvbuf, root)
        device = device_algorithm.direct(self, kind, send, recv, op)
        staging = None if device is not None else self._staging(send, recv)
        name = op_name(op)
        computed = _computes(name, send, recv)
        if self.check:
            self._check_signature(kind, send.array if computed else None, op, root, int(device is not None))
        if not computed and staging is None:
            return None
        return Call(kind, send.array, None if recv is None else recv.array, op, name, root, staging, computed,
                    device, None if device is None else named_stream(send, recv))

    def _reduction_buffers(self, kind, sendbuf, recvbuf, root):
        """The send and receive Buffers of a Reduce/Allreduce (one Buffer in place; recv None where this rank
        receives nothing)."""
        rank = self.Get_rank()
        receives = kind == "allreduce" or rank == root
        in_place = sendbuf is MPI.IN_PLACE or sendbuf is None and receives  # mpi4py reads None as IN_PLACE
        if in_place and not receives:
            raise CollectiveError(f"MPI.IN_PLACE is only valid at the root (rank {root}) of Reduce")
        recv = None
        if receives:
            recv = parse(recvbuf, "recvbuf")
            if recv is None:
                raise CollectiveError(f"recvbuf is required on rank {rank}")
            writable(recv, "recvbuf")
        send = recv if in_place else parse(sendbuf, "sendbuf")
        if send is None:
            raise CollectiveError("sendbuf is required (or MPI.IN_PLACE at the root)")
        return send, recv

    def _staging(self, send, recv):
        """Host stand-ins for the device buffers among `send` and `recv`, or None when there are none."""
        if send.device is None and (recv is None or recv.device is None):
            return None
        staging = Staging(self.pinned)
        if recv is not None and recv.device is not None:
            recv.array = staging.host(recv.device, copy_in=send is recv, copy_out=True)
        if send is not recv and send.device is not None:
            send.array = staging.host(send.device, copy_in=True, copy_out=False)
        return staging

    def _broadcast(self, buf, root):
        """A Call for Bcast, or None when the wrapped MPI must do it."""
        target = parse(buf, "buffer")
        if target is None:
            raise CollectiveError("Bcast needs a buffer on every rank")
        receives = self.Get_rank() != root
        if receives:
            writable(target, "buffer")
        staging = None
        device = device_algorithm.direct(self, "bcast", None, target, None)
        if device is None and target.device is not None:
            staging = Staging(self.pinned)
            target.array = staging.host(target.device, copy_in=not receives, copy_out=receives)
        if self.check:
            self._check_signature("bcast", target.array, MPI.OP_NULL, root, int(device is not None))
        if target.array is None:
            return None
        return Call("bcast", None, target.array, None, None, root, staging, device=device,
                    stream=None if device is None else named_stream(None, target))

    def _check_signature(self, kind, array, op, root, path):
        """SCAFFE_CHECK=1: one small allreduce finds ranks that disagree, and all of them raise. `path` is
        the index in _PATHS of how this rank's buffers are handled: ranks of one node that mix them wait
        for each other in different places."""
        count = -1 if array is None else array.shape[0]
        dtype = -1 if array is None else array.dtype.num
        mine = numpy.array([count, dtype, op.py2f(), root, path], dtype=numpy.int64)
        both = numpy.concatenate([mine, -mine])
        extremes = numpy.empty_like(both)
        # Reported like a collective: a rank missing from this one would otherwise hang unseen.
        reported(self._signature_check, both.nbytes, self.private.Allreduce, both, extremes, MPI.MAX)
        fields = ["count", "dtype", "op", "root", "path"]
        highest, lowest = extremes[:len(fields)], -extremes[len(fields):]
        if (highest != lowest).any():
            differ = [f"{fields[i]} ({_PATHS[lowest[i]]}..{_PATHS[highest[i]]})" if fields[i] == "path"
                      else f"{fields[i]} ({lowest[i]}..{highest[i]})"
                      for i in range(len(fields)) if highest[i] != lowest[i]]
            raise MismatchError(f"{kind}: ranks disagree on {', '.join(differ)}; "
                                f"this rank passed count={count}, dtype={array.dtype if array is not None else '?'}")
