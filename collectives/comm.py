"""`Comm`: an mpi4py Intracomm whose buffer collectives run the hierarchical algorithms.

Each override validates its arguments on the calling rank before any message moves, picks an algorithm
from the table in `collectives.algorithms`, and runs it. Whatever we do not compute ourselves
(user-defined ops, derived datatypes, bool or structured dtypes) goes to the wrapped MPI unchanged, so
swapping `MPI.COMM_WORLD` for `Comm(MPI.COMM_WORLD)` never changes a program's meaning.
"""
import itertools

import numpy
from mpi4py import MPI

from collectives import algorithms, settings, stall
from collectives.algorithms import device as device_algorithm
from collectives.algorithms.pipeline import ScratchPool
from collectives.buffers import parse, writable
from collectives.device import PinnedPool, Staging, synchronize
from collectives.errors import CollectiveError, MismatchError, install_abort_hook
from collectives.events import Name, finished, reported, started, with_label
from collectives.intranode.ipc import NodeIpc
from collectives.intranode.shm import SharedWindows
from collectives.ops import computes, native_reduces, op_name, supports
from collectives.progress import Progress
from collectives.topology import Topology

_EVENT_NAMES = ("Reduce", "Allreduce", "Bcast", "Ireduce", "Iallreduce", "Ibcast", "Signature check")
# Numbers each Comm's set-up: every rank sets up its communicators in the same order (set-up is
# collective), so the number names the same communicator on all of them (collectives.events.Name).
_set_ups = itertools.count()


class Call:
    """One validated collective: flat numpy views, the user's original arguments and the op.

    `staging` is set when device buffers stand behind the host views; `computed` is False when only
    native MPI can do the work (which, staged, it does on the host views rather than the user's buffers).
    `device` is set when send and recv are device views that collectives.algorithms.device reduces directly.
    """

    __slots__ = ("kind", "send", "recv", "send_spec", "recv_spec", "op", "op_name", "root", "nbytes",
                 "staging", "computed", "device")

    def __init__(self, kind, send, recv, send_spec, recv_spec, op, name, root, staging=None, computed=True,
                 device=None):
        self.kind, self.send, self.recv = kind, send, recv
        self.send_spec, self.recv_spec = send_spec, recv_spec
        self.op, self.op_name, self.root = op, name, root
        self.nbytes = (send if send is not None else recv).nbytes
        self.staging, self.computed, self.device = staging, computed, device


_NATIVE_ON_HOST = object()  # _offload's answer for device buffers whose call native MPI must make


def _fits(sendbuf, recvbuf):
    """Whether `recvbuf` is a plain, contiguous, writable ndarray of sendbuf's dtype and size."""
    if (type(recvbuf) is not numpy.ndarray or recvbuf.nbytes != sendbuf.nbytes
            or recvbuf.dtype is not sendbuf.dtype and recvbuf.dtype != sendbuf.dtype):
        return False
    flags = recvbuf.flags
    return flags.c_contiguous and flags.writeable


# What _FastPath remembers of a call that passed: the ids of its buffers (not the buffers: remembering a
# call must not keep them alive), its op and root, the send (or Bcast) buffer's dtype and size, which an
# array can change in place (`a.dtype = ...`, `a.resize(...)`) and which decide the algorithm, on which all
# ranks must agree, and `plan`: None when native MPI ran it, else (the algorithm, the op's name).
# Comm's methods compare a call with a record inline (a function call is a measurable part of this
# path), testing the type before looking inside: a new object can get a freed one's id.
def _record(buf, recvbuf, op, root, plan=None):
    return (id(buf), id(recvbuf), op, root, buf.dtype, buf.nbytes, plan)


_UNSEEN = (object(),) * 7  # a record that no call repeats
# What mpi4py raises on arguments it rejects before calling MPI (a read-only or resized buffer, say).
_REJECTED = (BufferError, ValueError)


def _nbytes(call, args):
    """A message's size for collectives.events: the Call's, else that of the buffer numpy can see in the
    user's arguments (0 for a derived datatype, which only MPI understands)."""
    if call is not None:
        return call.nbytes
    parsed = parse(args[1] if args[0] is MPI.IN_PLACE else args[0])
    return 0 if parsed is None or parsed.array is None else parsed.array.nbytes


def _flat(array):
    return array if array.ndim == 1 else array.reshape(-1)


class _FastPath:
    """The latency path's checks: a small call on plain arrays goes straight to MPI when it passes, and a
    larger one gets its Call without the full validation.

    They are the full validation's checks restricted to what a plain contiguous ndarray can get
    wrong, and an (op, dtype) pair must have passed the full validation once before: `pairs` maps a
    dtype number to the handles of the ops that went native with it (None: a Bcast), `computed` maps
    (op handle, dtype) to the op's name for those our own algorithms ran (the dtype itself: its number
    does not tell byte orders apart).

    The last arguments of each kind that passed are remembered (`*_seen`), and a call that repeats them
    (a benchmark's loop, a training step's gradients) skips most checks. A small one goes to MPI
    unchecked (perf/RESULTS.md has what that saves). Whatever an array can change in place besides its dtype and
    size, such as its strides or writeable flag, mpi4py rejects before calling MPI; the caller then
    forgets the record and the checks raise their own error. A large one runs the remembered algorithm
    on a Call from `plain_call`, which checks what the views in a Call need, instead of building the Call
    and choosing the algorithm again.
    """

    __slots__ = ("rank", "size", "pairs", "computed", "reduce_below", "allreduce_below", "bcast_native",
                 "reduce_seen", "allreduce_seen", "bcast_seen", "reduce_name", "allreduce_name", "bcast_name")

    def __init__(self, rank, size, pairs, computed, several_nodes, event_names):
        self.rank, self.size, self.pairs, self.computed = rank, size, pairs, computed
        self.reduce_name, self.allreduce_name, self.bcast_name = (
            event_names["Reduce"], event_names["Allreduce"], event_names["Bcast"])
        self.reduce_below = algorithms.threshold("reduce", several_nodes)
        self.allreduce_below = algorithms.threshold("allreduce", several_nodes)
        self.bcast_native = algorithms.threshold("bcast", several_nodes) is None  # at every size
        self.forget()

    def forget(self):
        self.reduce_seen = self.allreduce_seen = self.bcast_seen = _UNSEEN

    def remember(self, call, algorithm):
        """`algorithm` runs `call`, a Reduce/Allreduce: the same plain arrays next time go straight to it."""
        sendbuf, recvbuf = call.send_spec, call.recv_spec
        if type(sendbuf) is not numpy.ndarray or call.recv is not None and type(recvbuf) is not numpy.ndarray:
            return
        plan = (algorithm, call.op_name)
        if call.kind == "reduce":
            self.reduce_seen = _record(sendbuf, recvbuf, call.op, call.root, plan)
        else:
            self.allreduce_seen = _record(sendbuf, recvbuf, call.op, None, plan)

    def reduce_ok(self, sendbuf, recvbuf, op, root):
        if not (0 <= root < self.size and self._allowed(sendbuf, recvbuf, op, self.rank == root, self.reduce_below)):
            return False
        self.reduce_seen = _record(sendbuf, recvbuf, op, root)
        return True

    def allreduce_ok(self, sendbuf, recvbuf, op):
        if not self._allowed(sendbuf, recvbuf, op, True, self.allreduce_below):
            return False
        self.allreduce_seen = _record(sendbuf, recvbuf, op, None)
        return True

    def _allowed(self, sendbuf, recvbuf, op, receives, below):
        # Ordered for speed: these checks are most of what the latency path costs when they run.
        if type(sendbuf) is not numpy.ndarray or sendbuf.nbytes >= below or receives and not _fits(sendbuf, recvbuf):
            return False
        return sendbuf.flags.c_contiguous and op.py2f() in self.pairs.get(sendbuf.dtype.num, ())

    def call(self, kind, sendbuf, recvbuf, op, root):
        """The Call that `Comm._reduction` would make for a Reduce/Allreduce on plain arrays, or None
        when it must decide (measured: the full validation was 15-20% of a 1 MiB Allreduce on 2 ranks)."""
        if type(sendbuf) is not numpy.ndarray or not 0 <= root < self.size:
            return None
        name = self.computed.get((op.py2f(), sendbuf.dtype))
        return None if name is None else self.plain_call(kind, name, sendbuf, recvbuf, op, root)

    def plain_call(self, kind, name, sendbuf, recvbuf, op, root):
        """The Call of an ndarray sendbuf whose (op `name`, dtype) our algorithms compute, or None unless
        it and the receive buffer (where this rank receives) are contiguous and fit each other."""
        if not sendbuf.flags.c_contiguous:
            return None
        recv = None
        if kind == "allreduce" or self.rank == root:
            if not _fits(sendbuf, recvbuf):
                return None
            recv = _flat(recvbuf)
        return Call(kind, _flat(sendbuf), recv, sendbuf, recvbuf, op, name, root)

    def bcast_ok(self, buf, root):
        # A Bcast that goes native at every size skips the full validation (measured: 3-6% of a 4-16
        # MiB broadcast on 2 ranks, where the root's delay holds the other rank up).
        if not self.bcast_native or type(buf) is not numpy.ndarray or not 0 <= root < self.size:
            return False
        flags = buf.flags
        if not (flags.c_contiguous and (flags.writeable or self.rank == root)
                and None in self.pairs.get(buf.dtype.num, ())):
            return False
        self.bcast_seen = _record(buf, None, None, root)
        return True


class Comm(MPI.Intracomm):
    """Drop-in for an mpi4py intracommunicator with faster Reduce, Allreduce, Bcast and their I* forms.

    The first collective call (or `alloc`) sets up the topology and shared memory; it is collective,
    like every call that uses it. Nonblocking calls run in order on one helper thread (progress does
    not depend on the caller's waits) and return `MPI.Grequest` objects, so `Wait`, `Test` and
    `MPI.Request.Waitall` work as with any MPI request. Making one installs the abort hook
    (`collectives.install_abort_hook`) unless SCAFFE_ABORT_ON_ERROR=0.
    """

    def __new__(cls, comm=None):
        comm = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(comm, MPI.Intracomm) or comm.Is_inter():
            raise TypeError("collectives.Comm wraps an intracommunicator; "
                            "use the intercommunicator's own methods for intercommunicators")
        return super().__new__(cls, comm)

    def __init__(self, comm=None):
        self._ready = False
        self._fast = None
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
        self.device_ipc = NodeIpc(node_comm) if settings.device_path() == "direct" else None
        self.device_pipelines = {}  # Device -> the leaders' pipeline buffers (algorithms.device_nodes)
        self.check = settings.check()
        self.forced = settings.reduce_algo(algorithms.names())
        self.progress = Progress(threaded=MPI.Query_thread() == MPI.THREAD_MULTIPLE)
        index = next(_set_ups)
        self._event_names = {text: Name(text, index) for text in _EVENT_NAMES}
        stall.watch(self, index)
        # dtype number -> handles of the ops validated with it for the native path (None: a Bcast's)
        self._native_pairs = {}
        self._computed_pairs = {}  # (op handle, dtype) -> op name: those our algorithms ran
        # Everything the latency path reads, in one object: attribute lookups on an mpi4py
        # subclass cost more than the checks themselves.
        self._fast = (_FastPath(self.Get_rank(), self.Get_size(), self._native_pairs, self._computed_pairs,
                                self.several_nodes, self._event_names)
                      if not self.check and self.forced is None else None)
        self._ready = True

    def _state(self):
        if not getattr(self, "_ready", False):
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
        if getattr(self, "_ready", False):
            self.progress.stop()
            self.shm.free()
            if self.device_ipc is not None:
                self.device_ipc.free()
            self.node_topology.free()
            self.private.Free()
            self._ready = False
            self._fast = None  # it would send repeated calls to what was just freed
        MPI.Intracomm.Free(self)

    def Dup(self, *args, **kwargs):
        return Comm(MPI.Intracomm.Dup(self, *args, **kwargs))

    # -- validation ---------------------------------------------------------------------------------
    def _check_root(self, root):
        size = self.Get_size()
        if not isinstance(root, (int, numpy.integer)) or not 0 <= root < size:
            raise CollectiveError(f"root {root!r} is out of range for a communicator of {size} ranks")

    def _reduction(self, kind, sendbuf, recvbuf, op, root):
        """A Call for Reduce/Allreduce, or None when the wrapped MPI must do it."""
        self._state()
        self._check_root(root)
        rank = self.Get_rank()
        receives = kind == "allreduce" or rank == root
        in_place = sendbuf is MPI.IN_PLACE or sendbuf is None and receives  # mpi4py reads None as IN_PLACE
        if in_place and not receives:
            raise CollectiveError(f"MPI.IN_PLACE is only valid at the root (rank {root}) of Reduce")
        recv = parse(recvbuf, "recvbuf") if receives else None
        if receives:
            if recv is None:
                raise CollectiveError(f"recvbuf is required on rank {rank}")
            writable(recv, "recvbuf")
        send = recv if in_place else parse(sendbuf, "sendbuf")
        if send is None:
            raise CollectiveError("sendbuf is required (or MPI.IN_PLACE at the root)")
        staging = None
        device = device_algorithm.direct(self, kind, send, recv, op)
        if device is None and (send.device is not None or (recv is not None and recv.device is not None)):
            staging = Staging(self.pinned)
            if recv is not None and recv.device is not None:
                recv.array = staging.host(recv.device, copy_in=send is recv, copy_out=True)
            if send is not recv and send.device is not None:
                send.array = staging.host(send.device, copy_in=True, copy_out=False)
        name = op_name(op)
        arrays = (send.array,) if recv is None else (send.array, recv.array)
        computed = name is not None and all(a is not None for a in arrays)
        if computed:
            s = send.array
            if recv is not None and (recv.array.dtype != s.dtype or recv.array.shape != s.shape):
                raise CollectiveError(
                    f"sendbuf holds {s.shape[0]} x {s.dtype} but recvbuf holds "
                    f"{recv.array.shape[0]} x {recv.array.dtype}; they must match")
            if not computes(s.dtype):
                computed = False
            elif not supports(name, s.dtype):
                raise CollectiveError(f"op {name.upper()} is not defined for dtype {s.dtype}")
        if self.check:
            self._check_signature(kind, send.array if computed else None, op, root)
        if not computed and staging is None:
            return None
        return Call(kind, send.array, None if recv is None else recv.array,
                    sendbuf, recvbuf, op, name, root, staging, computed, device)

    def _reduction_call(self, kind, sendbuf, recvbuf, op, root):
        fast = self._fast
        call = None if fast is None else fast.call(kind, sendbuf, recvbuf, op, root)
        return call if call is not None else self._reduction(kind, sendbuf, recvbuf, op, root)

    def _check_signature(self, kind, array, op, root):
        """SCAFFE_CHECK=1: one small allreduce finds ranks that disagree, and all of them raise."""
        count = -1 if array is None else array.shape[0]
        dtype = -1 if array is None else array.dtype.num
        mine = numpy.array([count, dtype, op.py2f(), root], dtype=numpy.int64)
        both = numpy.concatenate([mine, -mine])
        extremes = numpy.empty_like(both)
        # Reported like a collective: a rank missing from this one would otherwise hang unseen.
        reported(self._event_names["Signature check"], both.nbytes, self.private.Allreduce, both, extremes, MPI.MAX)
        highest, lowest = extremes[:4], -extremes[4:]
        if (highest != lowest).any():
            fields = ["count", "dtype", "op", "root"]
            differ = [f"{fields[i]} ({lowest[i]}..{highest[i]})" for i in range(4) if highest[i] != lowest[i]]
            raise MismatchError(f"{kind}: ranks disagree on {', '.join(differ)}; "
                                f"this rank passed count={count}, dtype={array.dtype if array is not None else '?'}")

    def _broadcast(self, buf, root):
        self._state()
        self._check_root(root)
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
            self._check_signature("bcast", target.array, MPI.OP_NULL, root)
        if target.array is None:
            return None
        return Call("bcast", None, target.array, None, buf, None, None, root, staging, device=device)

    def _offload(self, call, stream=None):
        """How a validated call runs: None when the wrapped MPI does it with the user's own arguments,
        _NATIVE_ON_HOST when it does it on the host stand-ins of device buffers, else the algorithm's
        work as a zero-argument callable (staged through host memory for device buffers).

        Honours SCAFFE_REDUCE_ALGO; an (op, dtype) pair that went native joins the latency path.
        """
        if call is None:
            return None
        if call.device is not None:
            return device_algorithm.start(self, call, stream)
        synchronize(stream)  # the caller's kernels that produce the data finish before we read it
        dtype = (call.send if call.send is not None else call.recv).dtype
        compiled = call.op_name is not None and self.shm.compiled_applies(call.op_name, dtype)
        name = (algorithms.select(call.kind, call.nbytes, self.forced, self.several_nodes, compiled)
                if call.computed else "native")
        if name == "native" and call.computed and not native_reduces(dtype):
            name = "tree"
        if name == "native":
            if call.staging is not None:
                return _NATIVE_ON_HOST
            if call.send is not None:
                self._native_pairs.setdefault(call.send.dtype.num, set()).add(call.op.py2f())
            elif call.kind == "bcast":
                self._native_pairs.setdefault(call.recv.dtype.num, set()).add(None)
            return None
        run = algorithms.get(name, call.kind)
        if call.op is not None and call.staging is None:
            self._computed_pairs[(call.op.py2f(), dtype)] = call.op_name
            if self._fast is not None:
                self._fast.remember(call, run)
        work = lambda: run(self, call)  # noqa: E731
        return work if call.staging is None else call.staging.wrap(work)

    def _run(self, call, stream, method, native, args):
        """Run blocking call `method`: ours, or else `native(self, *args)`, the wrapped MPI's with the user's
        arguments."""
        work = self._offload(call, stream)
        event_name = with_label(self._event_names[method])
        if work is None:
            reported(event_name, _nbytes(call, args), native, self, *args)
        elif work is _NATIVE_ON_HOST:
            # Right away in this thread, as a host call would go native: collectives on the user's
            # communicator must start in the same order on every rank.
            reported(event_name, call.nbytes, call.staging.wrap(lambda: self._native_on_host(call, blocking=True)))
        else:
            self.progress.run(work, event_name, call.nbytes)

    def _again(self, kind, plan, sendbuf, recvbuf, op, root, event_name):
        """Run a call that repeats a remembered one with its algorithm; False when the arrays no longer fit."""
        algorithm, name = plan
        call = self._fast.plain_call(kind, name, sendbuf, recvbuf, op, root)
        if call is None:
            return False
        self.progress.run(lambda: algorithm(self, call), event_name, call.nbytes)
        return True

    def _start(self, call, stream, method, native, args):
        """Start nonblocking call `method`: ours, or else `native(self, *args)`, the wrapped MPI's with the
        user's arguments; the request returned completes when the progress thread has seen it done."""
        work = self._offload(call, stream)
        event_name = with_label(self._event_names[method])
        if work is None:
            return self.progress.follow(native(self, *args), event_name, _nbytes(call, args))
        if work is not _NATIVE_ON_HOST:
            return self.progress.submit(work, event_name, call.nbytes)
        # Started now, for the same ordering reason as in _run; the progress thread finishes it.
        staging = call.staging
        staging.copy_in()
        request = self._native_on_host(call, blocking=False)

        def finish():
            try:
                request.Wait()
                staging.copy_out()
            finally:
                staging.release()

        return self.progress.submit(finish, event_name, call.nbytes)

    def _native_on_host(self, call, blocking):
        """The wrapped MPI's collective on the host stand-ins of device buffers; the request if not blocking.

        An I* call stays an I* call: MPI never matches a blocking collective with a nonblocking one,
        and the other ranks may have made theirs with host buffers, natively.
        """
        send = MPI.IN_PLACE if call.send is call.recv else call.send
        if call.kind == "reduce":
            args = (send, call.recv, call.op, call.root)
            native = MPI.Intracomm.Reduce if blocking else MPI.Intracomm.Ireduce
        elif call.kind == "allreduce":
            args = (send, call.recv, call.op)
            native = MPI.Intracomm.Allreduce if blocking else MPI.Intracomm.Iallreduce
        else:
            args = (call.recv, call.root)
            native = MPI.Intracomm.Bcast if blocking else MPI.Intracomm.Ibcast
        return native(self, *args)

    # -- blocking collectives -----------------------------------------------------------------------
    # The latency path reports its calls to collectives.events inline: a helper would cost a call more.
    def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0, stream=None):
        fast = self._fast
        if fast is not None:
            seen = fast.reduce_seen
            if (id(sendbuf) == seen[0] and id(recvbuf) == seen[1] and op is seen[2] and root == seen[3]
                    and type(sendbuf) is numpy.ndarray and sendbuf.dtype is seen[4] and sendbuf.nbytes == seen[5]):
                if seen[6] is None:
                    op_id = started(fast.reduce_name, seen[5])
                    try:
                        return MPI.Intracomm.Reduce(self, sendbuf, recvbuf, op, root)
                    except _REJECTED:
                        fast.forget()
                    finally:
                        finished(fast.reduce_name, op_id)
                elif stream is None and self._again("reduce", seen[6], sendbuf, recvbuf, op, root, fast.reduce_name):
                    return
            if fast.reduce_ok(sendbuf, recvbuf, op, root):
                op_id = started(fast.reduce_name, sendbuf.nbytes)
                try:
                    return MPI.Intracomm.Reduce(self, sendbuf, recvbuf, op, root)
                finally:
                    finished(fast.reduce_name, op_id)
        self._run(self._reduction_call("reduce", sendbuf, recvbuf, op, root), stream,
                  "Reduce", MPI.Intracomm.Reduce, (sendbuf, recvbuf, op, root))

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM, stream=None):
        fast = self._fast
        if fast is not None:
            seen = fast.allreduce_seen
            if (id(sendbuf) == seen[0] and id(recvbuf) == seen[1] and op is seen[2]
                    and type(sendbuf) is numpy.ndarray and sendbuf.dtype is seen[4] and sendbuf.nbytes == seen[5]):
                if seen[6] is None:
                    op_id = started(fast.allreduce_name, seen[5])
                    try:
                        return MPI.Intracomm.Allreduce(self, sendbuf, recvbuf, op)
                    except _REJECTED:
                        fast.forget()
                    finally:
                        finished(fast.allreduce_name, op_id)
                elif stream is None and self._again("allreduce", seen[6], sendbuf, recvbuf, op, 0,
                                                    fast.allreduce_name):
                    return
            if fast.allreduce_ok(sendbuf, recvbuf, op):
                op_id = started(fast.allreduce_name, sendbuf.nbytes)
                try:
                    return MPI.Intracomm.Allreduce(self, sendbuf, recvbuf, op)
                finally:
                    finished(fast.allreduce_name, op_id)
        self._run(self._reduction_call("allreduce", sendbuf, recvbuf, op, 0), stream,
                  "Allreduce", MPI.Intracomm.Allreduce, (sendbuf, recvbuf, op))

    def Bcast(self, buf, root=0, stream=None):
        fast = self._fast
        if fast is not None:
            seen = fast.bcast_seen
            if (id(buf) == seen[0] and root == seen[3] and type(buf) is numpy.ndarray and buf.dtype is seen[4]
                    and buf.nbytes == seen[5]):
                op_id = started(fast.bcast_name, seen[5])
                try:
                    return MPI.Intracomm.Bcast(self, buf, root)
                except _REJECTED:
                    fast.forget()
                finally:
                    finished(fast.bcast_name, op_id)
            if fast.bcast_ok(buf, root):
                op_id = started(fast.bcast_name, buf.nbytes)
                try:
                    return MPI.Intracomm.Bcast(self, buf, root)
                finally:
                    finished(fast.bcast_name, op_id)
        self._run(self._broadcast(buf, root), stream, "Bcast", MPI.Intracomm.Bcast, (buf, root))

    # -- nonblocking collectives --------------------------------------------------------------------
    def Ireduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0, stream=None):
        return self._start(self._reduction_call("reduce", sendbuf, recvbuf, op, root), stream,
                           "Ireduce", MPI.Intracomm.Ireduce, (sendbuf, recvbuf, op, root))

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM, stream=None):
        return self._start(self._reduction_call("allreduce", sendbuf, recvbuf, op, 0), stream,
                           "Iallreduce", MPI.Intracomm.Iallreduce, (sendbuf, recvbuf, op))

    def Ibcast(self, buf, root=0, stream=None):
        return self._start(self._broadcast(buf, root), stream, "Ibcast", MPI.Intracomm.Ibcast, (buf, root))
