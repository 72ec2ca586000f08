"""`Comm`: an mpi4py Intracomm whose buffer collectives run the hierarchical algorithms.

Each override validates its arguments on the calling rank before any message moves, picks an algorithm
from the table in `collectives.algorithms`, and runs it. Whatever we do not compute ourselves
(user-defined ops, derived datatypes, bool or structured dtypes) goes to the wrapped MPI unchanged, so
swapping `MPI.COMM_WORLD` for `Comm(MPI.COMM_WORLD)` never changes a program's meaning.
"""
import os

import numpy
from mpi4py import MPI

from collectives import algorithms
from collectives.algorithms.pipeline import ScratchPool
from collectives.buffers import parse, writable
from collectives.errors import CollectiveError, MismatchError
from collectives.intranode.shm import SharedWindows
from collectives.ops import op_name
from collectives.progress import Progress
from collectives.settings import positive_int
from collectives.topology import Topology
from kernels.reduce import supports

_COMPUTED_KINDS = "iufc"  # integer, unsigned, float, complex: what the reduce kernels handle
# Native MPI has no portable half-precision type (Open MPI lacks one), so float16 never goes native.
_NEVER_NATIVE = {numpy.dtype(numpy.float16)}


class Call:
    """One validated collective: flat numpy views, the user's original arguments and the op."""

    __slots__ = ("kind", "send", "recv", "send_spec", "recv_spec", "op", "op_name", "root", "nbytes")

    def __init__(self, kind, send, recv, send_spec, recv_spec, op, name, root):
        self.kind, self.send, self.recv = kind, send, recv
        self.send_spec, self.recv_spec = send_spec, recv_spec
        self.op, self.op_name, self.root = op, name, root
        self.nbytes = (send if send is not None else recv).nbytes


class _FastPath:
    """The latency path's checks: a small call on plain arrays goes straight to MPI when it passes.

    They are the full validation's checks restricted to what a plain contiguous ndarray can get
    wrong, and an (op, dtype) pair must have passed the full validation once before.
    """

    __slots__ = ("rank", "size", "pairs", "reduce_below", "allreduce_below")

    def __init__(self, rank, size, pairs):
        self.rank, self.size, self.pairs = rank, size, pairs
        self.reduce_below = algorithms.SELECTION["reduce"]
        self.allreduce_below = algorithms.SELECTION["allreduce"]

    def reduce_ok(self, sendbuf, recvbuf, op, root):
        return (0 <= root < self.size
                and self.allowed(sendbuf, recvbuf, op, self.rank == root, self.reduce_below))

    def allowed(self, sendbuf, recvbuf, op, receives, below):
        if type(sendbuf) is not numpy.ndarray or sendbuf.nbytes >= below or not sendbuf.flags.c_contiguous:
            return False
        if receives:
            if type(recvbuf) is not numpy.ndarray or recvbuf.size != sendbuf.size:
                return False
            flags = recvbuf.flags
            if not (flags.c_contiguous and flags.writeable) or recvbuf.dtype != sendbuf.dtype:
                return False
        return (op.py2f(), sendbuf.dtype.num) in self.pairs


class Comm(MPI.Intracomm):
    """Drop-in for an mpi4py intracommunicator with faster Reduce, Allreduce, Bcast and their I* forms.

    The first collective call (or `alloc`) sets up the topology and shared memory; it is collective,
    like every call that uses it. Nonblocking calls run in order on one helper thread (progress does
    not depend on the caller's waits) and return `MPI.Grequest` objects, so `Wait`, `Test` and
    `MPI.Request.Waitall` work as with any MPI request.
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

    # -- set-up -------------------------------------------------------------------------------------
    def _setup(self):
        # Our own messages travel on a duplicate, so they can never match the user's point-to-point traffic.
        # mpi4py's Dup returns our own class; the plain Intracomm keeps our traffic off our overrides.
        self.private = MPI.Intracomm(MPI.Intracomm.Dup(self))
        self.node_topology = Topology(self.private)
        self.shm = SharedWindows(self.node_topology.node_comm)
        self.chunk_bytes = positive_int("SCAFFE_CHUNK_BYTES", 1 << 20)
        self.shm_chunk_bytes = positive_int("SCAFFE_SHM_CHUNK_BYTES", 4 << 20)
        self.scratch = ScratchPool()
        self.check = os.environ.get("SCAFFE_CHECK", "0").strip() not in ("", "0")
        self.forced = algorithms.forced()
        self.progress = Progress(threaded=MPI.Query_thread() == MPI.THREAD_MULTIPLE)
        self._native_pairs = set()  # (op handle, dtype number) pairs already validated for the native path
        # Everything the latency path reads, in one object: attribute lookups on an mpi4py
        # subclass cost more than the checks themselves.
        self._fast = (_FastPath(self.Get_rank(), self.Get_size(), self._native_pairs)
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
            self.node_topology.free()
            self.private.Free()
            self._ready = False
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
        if sendbuf is MPI.IN_PLACE and not receives:
            raise CollectiveError(f"MPI.IN_PLACE is only valid at the root (rank {root}) of Reduce")
        recv = parse(recvbuf, "recvbuf") if receives else None
        if receives:
            if recv is None:
                raise CollectiveError(f"recvbuf is required on rank {rank}")
            if recv.array is not None:
                writable(recv, "recvbuf")
        send = recv if sendbuf is MPI.IN_PLACE else parse(sendbuf, "sendbuf")
        if send is None:
            raise CollectiveError("sendbuf is required (or MPI.IN_PLACE at the root)")
        name = op_name(op)
        arrays = (send.array,) if recv is None else (send.array, recv.array)
        computed = name is not None and all(a is not None for a in arrays)
        if computed:
            s = send.array
            if recv is not None and (recv.array.dtype != s.dtype or recv.array.shape != s.shape):
                raise CollectiveError(
                    f"sendbuf holds {s.shape[0]} x {s.dtype} but recvbuf holds "
                    f"{recv.array.shape[0]} x {recv.array.dtype}; they must match")
            if s.dtype.kind not in _COMPUTED_KINDS or s.dtype.byteorder not in "=|":
                computed = False
            elif not supports(name, s.dtype):
                raise CollectiveError(f"op {name.upper()} is not defined for dtype {s.dtype}")
        if self.check:
            self._check_signature(kind, send.array if computed else None, op, root)
        if not computed:
            return None
        return Call(kind, send.array, None if recv is None else recv.array,
                    sendbuf, recvbuf, op, name, root)

    def _check_signature(self, kind, array, op, root):
        """SCAFFE_CHECK=1: one small allreduce finds ranks that disagree, and all of them raise."""
        count = -1 if array is None else array.shape[0]
        dtype = -1 if array is None else array.dtype.num
        mine = numpy.array([count, dtype, op.py2f(), root], dtype=numpy.int64)
        both = numpy.concatenate([mine, -mine])
        extremes = numpy.empty_like(both)
        self.private.Allreduce(both, extremes, op=MPI.MAX)
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
        if target.array is not None and self.Get_rank() != root:
            writable(target, "buffer")
        if self.check:
            self._check_signature("bcast", target.array, MPI.OP_NULL, root)
        if target.array is None:
            return None
        return Call("bcast", None, target.array, None, buf, None, None, root)

    def _offload(self, call):
        """The work of a validated call as a zero-argument callable, or None when the wrapped MPI does it.

        Honours SCAFFE_REDUCE_ALGO; an (op, dtype) pair that went native joins the latency path.
        """
        if call is None:
            return None
        name = algorithms.select(call.kind, call.nbytes, self.forced)
        dtype = (call.send if call.send is not None else call.recv).dtype
        if name == "native" and dtype in _NEVER_NATIVE:
            name = "tree"
        if name == "native":
            if call.send is not None:
                self._native_pairs.add((call.op.py2f(), call.send.dtype.num))
            return None
        run = algorithms.get(name, call.kind)
        return lambda: run(self, call)

    # -- blocking collectives -----------------------------------------------------------------------
    def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0):
        fast = self._fast
        if fast is not None and fast.reduce_ok(sendbuf, recvbuf, op, root):
            return MPI.Intracomm.Reduce(self, sendbuf, recvbuf, op, root)
        work = self._offload(self._reduction("reduce", sendbuf, recvbuf, op, root))
        if work is None:
            return MPI.Intracomm.Reduce(self, sendbuf, recvbuf, op, root)
        self.progress.run(work)

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        fast = self._fast
        if fast is not None and fast.allowed(sendbuf, recvbuf, op, True, fast.allreduce_below):
            return MPI.Intracomm.Allreduce(self, sendbuf, recvbuf, op)
        work = self._offload(self._reduction("allreduce", sendbuf, recvbuf, op, 0))
        if work is None:
            return MPI.Intracomm.Allreduce(self, sendbuf, recvbuf, op)
        self.progress.run(work)

    def Bcast(self, buf, root=0):
        work = self._offload(self._broadcast(buf, root))
        if work is None:
            return MPI.Intracomm.Bcast(self, buf, root)
        self.progress.run(work)

    # -- nonblocking collectives --------------------------------------------------------------------
    def Ireduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0):
        work = self._offload(self._reduction("reduce", sendbuf, recvbuf, op, root))
        if work is None:
            return MPI.Intracomm.Ireduce(self, sendbuf, recvbuf, op, root)
        return self.progress.submit(work)

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM):
        work = self._offload(self._reduction("allreduce", sendbuf, recvbuf, op, 0))
        if work is None:
            return MPI.Intracomm.Iallreduce(self, sendbuf, recvbuf, op)
        return self.progress.submit(work)

    def Ibcast(self, buf, root=0):
        work = self._offload(self._broadcast(buf, root))
        if work is None:
            return MPI.Intracomm.Ibcast(self, buf, root)
        return self.progress.submit(work)
