"""`Comm`: an mpi4py Intracomm whose buffer collectives run the hierarchical algorithms.

This module is the mpi4py-facing surface and nothing else: set-up, `alloc`, `Free`, `Dup`, and the six
overrides, each its `Lane`'s override (collectives.planning), which finds or builds the call's plan
and runs it (collectives.plans). Whatever we do not compute ourselves (user-defined ops, derived
datatypes, bool or structured dtypes) goes to the wrapped MPI unchanged, so swapping `MPI.COMM_WORLD`
for `Comm(MPI.COMM_WORLD)` never changes a program's meaning.
"""
import itertools

import numpy
from mpi4py import MPI

from collectives import algorithms, settings, stall
from collectives.algorithms.pipeline import ScratchPool
from collectives.devices.memory import PinnedPool
from collectives.errors import install_abort_hook
from collectives.events import Name
from collectives.devices.ipc import NodeIpc
from collectives.intranode.shm import SharedWindows
from collectives.planning import Lane
from collectives.progress import Progress
from collectives.topology import Topology

# Each kind with the wrapped MPI's blocking and nonblocking methods for it: the overrides' Lanes, in this order.
_METHODS = (("reduce", MPI.Intracomm.Reduce), ("reduce", MPI.Intracomm.Ireduce),
            ("allreduce", MPI.Intracomm.Allreduce), ("allreduce", MPI.Intracomm.Iallreduce),
            ("bcast", MPI.Intracomm.Bcast), ("bcast", MPI.Intracomm.Ibcast))
_REDUCE, _IREDUCE, _ALLREDUCE, _IALLREDUCE, _BCAST, _IBCAST = range(6)
# Numbers each Comm's set-up: every rank sets up its communicators in the same order (set-up is
# collective), so the number names the same communicator on all of them (collectives.events.Name).
_set_ups = itertools.count()


class Comm(MPI.Intracomm):
    """Drop-in for an mpi4py intracommunicator with faster Reduce, Allreduce, Bcast and their I* forms.

    The first collective call (or `alloc`) sets up the topology and shared memory; it is collective,
    like every call that uses it. Nonblocking calls our algorithms run go in order to one helper thread
    (progress does not depend on the caller's waits) and return `MPI.Grequest` objects, so `Wait`, `Test`
    and `MPI.Request.Waitall` work as with any MPI request; `Wait` and `Test` raise the error of a call
    that failed (collectives.progress), and later calls still run. Those MPI runs return MPI's own
    request. Making one installs the abort hook (`collectives.install_abort_hook`) unless
    SCAFFE_ABORT_ON_ERROR=0.
    """

    _lanes = None  # the Lane of each wrapped MPI method, once set up
    _overrides = None  # each Lane's override, in the same order
    _device_path = None  # "direct" or "staged" as the constructor was told; None: SCAFFE_DEVICE_PATH's
    # True where this communicator's large reduces and broadcasts run while another moves data the other way
    # between the same nodes (the S-Caffe schedule's gradients and parameters): the node heads then take each
    # call's chunks along chains in turn, which loads every link alike both ways at once but fills a pipeline
    # per turn when one way runs alone (collectives.algorithms.hierarchical.heads_pipeline).
    two_way = False

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
        self.device_pipelines = {}  # Device -> the leaders' pipeline buffers (devices.nodes)
        self.check = settings.check()
        self.forced = settings.reduce_algo(algorithms.names())
        # Where the table picks a host algorithm, it is timed against native MPI first (plans.Trial), unless
        # the user forced one.
        self.measured = self.forced is None and settings.choice() == "measured"
        self.trials = {}  # (kind, blocking, op handle, dtype, size) -> its Trial
        self.progress = Progress(threaded=MPI.Query_thread() == MPI.THREAD_MULTIPLE, probed=self.private)
        index = next(_set_ups)
        self.signature_check = Name("Signature check", index)
        rank, size, native_pairs, computed_pairs = self.Get_rank(), self.Get_size(), {}, {}
        keeps = not self.check  # SCAFFE_CHECK compares every call's signature across the ranks
        # Everything a call reads on the latency path is in its Lane: attribute lookups on an mpi4py
        # subclass cost more than the checks themselves.
        lanes = tuple(Lane(kind, method, Name(method.__name__, index), keeps, self.several_nodes, rank, size,
                           native_pairs, computed_pairs)
                      for kind, method in _METHODS)
        stall.watch(self, index)
        self._lanes = lanes
        overrides = tuple(lane.override(self) for lane in lanes)
        # Set on the communicator itself, an override runs with no frame of ours before it; a method a subclass
        # overrides (or a patched class) keeps its own, which reaches the lane's through ours.
        for (_, method), override in zip(_METHODS, overrides):
            if getattr(type(self), method.__name__) is _OWN[method.__name__]:
                setattr(self, method.__name__, override)
        self._overrides = overrides
        return overrides

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
            for _, method in _METHODS:
                self.__dict__.pop(method.__name__, None)
            self._lanes = self._overrides = None  # they would send repeated calls to what was just freed
        MPI.Intracomm.Free(self)

    def Dup(self, *args, **kwargs):
        return Comm(MPI.Intracomm.Dup(self, *args, **kwargs), device_path=self._device_path)

    # -- the overrides: mpi4py's signatures, each its Lane's (collectives.planning), which set-up also sets on
    # the communicator itself; these run the first call, and a subclass's calls through super() -----------
    def Reduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0, stream=None):
        return (self._overrides or self._setup())[_REDUCE](sendbuf, recvbuf, op, root, stream)

    def Allreduce(self, sendbuf, recvbuf, op=MPI.SUM, stream=None):
        return (self._overrides or self._setup())[_ALLREDUCE](sendbuf, recvbuf, op, stream)

    def Bcast(self, buf, root=0, stream=None):
        return (self._overrides or self._setup())[_BCAST](buf, root, stream)

    def Ireduce(self, sendbuf, recvbuf, op=MPI.SUM, root=0, stream=None):
        return (self._overrides or self._setup())[_IREDUCE](sendbuf, recvbuf, op, root, stream)

    def Iallreduce(self, sendbuf, recvbuf, op=MPI.SUM, stream=None):
        return (self._overrides or self._setup())[_IALLREDUCE](sendbuf, recvbuf, op, stream)

    def Ibcast(self, buf, root=0, stream=None):
        return (self._overrides or self._setup())[_IBCAST](buf, root, stream)


# Comm's own overrides: set-up sets the lanes' on a communicator whose class has these.
_OWN = {method.__name__: Comm.__dict__[method.__name__] for _, method in _METHODS}
