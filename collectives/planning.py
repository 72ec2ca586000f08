"""Finding and building a call's plan: each override's `Lane` and the one pipeline a new signature goes through.

A call whose signature its lane has met runs the plan it found (collectives.plans). A new one is planned
once: validated (on the calling rank, before any message moves), its path chosen, its buffers
registered for the device path, and the plan kept for the calls after it. A new call on plain contiguous
ndarrays of an (op, dtype) pair planned before skips the full validation: the checks a plain array
can fail are made inline (`_quick`).

Every rank must take the same path, or their messages never match: `_choose` decides it from what all
ranks of a correct call share (kind, size, dtype, op, the communicator's settings and topology) and
from where the buffers live, on which every rank of a node must agree (collectives.devices.direct).
"""
import linecache

import numpy
from mpi4py import MPI

from collectives import algorithms
from collectives.devices import direct as device_algorithm
from collectives.buffers import named_stream, parse, writable
from collectives.call import Call
from collectives.devices.memory import Staging, synchronize
from collectives.errors import CollectiveError, MismatchError
from collectives.events import listeners, reported, started_unwaited
from collectives.ops import computes, native_reduces, op_name, supports
from collectives.plans import (REJECTED, AlgorithmPlan, DevicePlan, NativePlan, Stale, StagedNativePlan, Trial,
                               WorkPlan, call_args, fitting_recv)

# Plans a lane keeps at most: a program passing new arrays at every call would otherwise grow it forever.
_KEPT = 64
# The measured choice (plans.Trial) is made for sizes below this many times the table's threshold: where the
# two roads are close. Far above it our algorithm wins by several times, which a trial would only slow.
TRIAL_SPAN = 8
# Where a call's data is reduced, in SCAFFE_CHECK's signature: through the host (host buffers, and device
# buffers staged through it, which may mix), or on the devices (whose ranks wait for each other there).
_PATHS = ("host", "direct")


def blocking(method):
    """Whether the wrapped MPI method named `method` blocks (Reduce; not Ireduce)."""
    return not method.startswith("I")


class Lane:
    """One override on one communicator: its kind, the wrapped MPI's method it stands in for (`native`),
    its event name, whether it blocks, and the plans of the calls it has met (`plans`, by the ids of the
    call's two buffer arguments, and `last`, the one found or kept last; `keeps` False when every call is
    planned afresh: SCAFFE_CHECK).

    `native_pairs` maps a dtype number to the handles of the ops that went native with it (None: a
    Bcast's); `computed_pairs` maps (op handle, dtype) to the op's name for those our algorithms ran (the
    dtype itself: its number does not tell byte orders apart). Both are the communicator's, shared.
    """

    __slots__ = ("kind", "native", "event_name", "tally", "blocking", "keeps", "plans", "last", "native_below",
                 "rank", "size", "native_pairs", "computed_pairs")

    def __init__(self, kind, native, event_name, keeps, several_nodes, rank, size, native_pairs, computed_pairs):
        self.kind, self.native, self.event_name, self.keeps = kind, native, event_name, keeps
        self.tally = event_name.tally
        self.blocking = blocking(native.__name__)
        self.plans = {}
        self.last = NO_PLAN
        native_below = algorithms.threshold(kind, several_nodes, nonblocking=not self.blocking)
        # The selection table's None (native at every size) as a size no call reaches.
        self.native_below = float("inf") if native_below is None else native_below
        self.rank, self.size = rank, size
        self.native_pairs, self.computed_pairs = native_pairs, computed_pairs

    def override(self, comm):
        """This lane's override on `comm`: a function with the wrapped MPI method's signature (and `stream`)
        that finds or builds each call's plan and runs it (collectives.comm sets it on the communicator)."""
        return _OVERRIDES[self.native.__name__](self, comm, self.plans, self.tally, self.native)

    def replanned(self, comm, buf, recvbuf, op, root, stream):
        """A call whose plan went stale (changed in place in a way its signature cannot see), planned through
        the full validation, which raises the clear error for what changed; what MPI still rejects after
        it is reported in MPI's own words."""
        self.plans.pop((id(buf), id(recvbuf)), None)
        self.last = NO_PLAN
        plan = _validated(comm, self, buf, recvbuf, op, root, stream)
        try:
            return plan.run(comm, buf, recvbuf, op, root, stream)
        except Stale as stale:
            self.plans.pop((id(buf), id(recvbuf)), None)
            self.last = NO_PLAN
            # What the validation let through and MPI rejects, in MPI's own words.
            raise (stale.error or CollectiveError(f"{self.kind}: the buffers changed while the call was planned")) from None

    def replace(self, plan, new):
        """Have `new` serve the calls `plan` was kept for."""
        key = (plan.send_id, plan.recv_id)
        if self.plans.get(key) is plan:
            new.send_id, new.recv_id = key
            self.plans[key] = new
        if self.last is plan:
            self.last = new

    def keep(self, buf, recvbuf, plan):
        if self.keeps and plan.kept:
            if len(self.plans) >= _KEPT:
                self.plans.clear()
            plan.send_id, plan.recv_id = key = id(buf), id(recvbuf)
            self.plans[key] = self.last = plan


class _NoPlan:
    """The plan of buffers a lane has not met: no call's signature is its own."""

    send_id = recv_id = -1  # no object's id
    op = dtype = host_kind = None
    root = object()  # equal to no root

    @staticmethod
    def holds(buf, recvbuf, stream):
        return False


NO_PLAN = _NoPlan()

# The body of every override, one function per wrapped method, made from this text once at import: the
# methods' signatures differ (mpi4py's parameter names, Allreduce without a root), and a repeated small
# call cannot afford a frame more to adapt them (perf/RESULTS.md, "One frame for a repeated call").
# A call finds its plan by its buffers' ids (the lane's last plan, else its dictionary), compares the rest
# of its signature inline for a plain array or where the kinds of objects alone decide (a native Bcast's),
# else by `holds`, and runs it; a direct native plan's MPI call is made here (`_DIRECT`).
_OVERRIDE = """
def make(lane, comm, plans, tally, native):
    def {name}({params}, stream=None):
        plan = lane.last
        if id({buf}) != plan.send_id or {recv_id} != plan.recv_id:
            plan = lane.last = plans.get((id({buf}), {recv_id}), NO_PLAN)
        if not ({op} is plan.op and {root} == plan.root
                and ({buf}.dtype is plan.dtype and {buf}.nbytes == plan.nbytes if type({buf}) is ndarray
                     else type({buf}) is plan.host_kind
                          and (plan.spec_kind is None or {buf} and type({buf}[0]) is plan.spec_kind)
                     or plan.holds({buf}, {recv}, stream))):
            plan = planned(comm, lane, {buf}, {recv}, {op}, {root}, stream)
        if plan.direct and stream is None and not listeners:{direct}
        try:
            return plan.run(comm, {buf}, {recv}, {op}, {root}, stream)
        except Stale:
            return lane.replanned(comm, {buf}, {recv}, {op}, {root}, stream)
    return {name}
"""
# A direct call on a blocking lane, counted started and finished around it; on a nonblocking one, MPI's own request
# handed back as it is, counted finished when the stall inspector sees it freed (collectives.events), a large one
# nudged while outstanding (collectives.progress).
_DIRECT = {True: """
            tally[0] += 1
            tally[2] = plan.nbytes
            try:
                return native(comm, {native_args})
            except REJECTED:
                pass  # what changed is found by the full validation, once this call is counted finished
            finally:
                tally[1] += 1
            return lane.replanned(comm, {buf}, {recv}, {op}, {root}, stream)""",
           False: """
            try:
                request = native(comm, {native_args})
            except REJECTED:
                return lane.replanned(comm, {buf}, {recv}, {op}, {root}, stream)
            started_unwaited(lane.event_name, plan.nbytes, request)
            if plan.nudged:
                comm.progress.nudge(request)
            return request"""}
# Each wrapped method's parameters (before `stream`), and its buffer, receive buffer, op and root as the
# body names them.
_SIGNATURES = {
    "reduce": dict(params="sendbuf, recvbuf, op=SUM, root=0", buf="sendbuf", recv="recvbuf", recv_id="id(recvbuf)",
                   op="op", root="root", native_args="sendbuf, recvbuf, op, root"),
    "allreduce": dict(params="sendbuf, recvbuf, op=SUM", buf="sendbuf", recv="recvbuf", recv_id="id(recvbuf)",
                      op="op", root="0", native_args="sendbuf, recvbuf, op"),
    "bcast": dict(params="buf, root=0", buf="buf", recv="None", recv_id="NONE_ID", op="None", root="root",
                  native_args="buf, root"),
}


def _override_factory(name, kind):
    signature = _SIGNATURES[kind]
    direct = _DIRECT[blocking(name)].format(**signature)
    source = _OVERRIDE.format(name=name, direct=direct, **signature)
    # Named under this module's file, its source registered where the traceback module and debuggers look.
    filename = f"{__file__}:<{name} override>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    scope = dict(__name__=__name__, SUM=MPI.SUM, NO_PLAN=NO_PLAN, NONE_ID=id(None), ndarray=numpy.ndarray,
                 listeners=listeners, REJECTED=REJECTED, Stale=Stale, planned=_planned,
                 started_unwaited=started_unwaited)
    exec(compile(source, filename, "exec"), scope)
    return scope["make"]


def _planned(comm, lane, buf, recvbuf, op, root, stream):
    """The plan of a call whose signature `lane` has not met."""
    plan = _quick(comm, lane, buf, recvbuf, op, root) if lane.keeps else None
    if plan is None:
        return _validated(comm, lane, buf, recvbuf, op, root, stream)
    lane.keep(buf, recvbuf, plan)
    return plan


def _validated(comm, lane, buf, recvbuf, op, root, stream):
    """The plan of a call through the full validation."""
    call = _validate(comm, lane.kind, buf, recvbuf, op, root)
    plan = _path(comm, lane, call, buf, recvbuf, op, root, stream)
    lane.keep(buf, recvbuf, plan)
    return plan


_OVERRIDES = {name: _override_factory(name, kind)
              for kind, names in (("reduce", ("Reduce", "Ireduce")), ("allreduce", ("Allreduce", "Iallreduce")),
                                  ("bcast", ("Bcast", "Ibcast")))
              for name in names}


# -- the quick checks: a plain array of an (op, dtype) pair planned before -------------------------------
def _quick(comm, lane, buf, recvbuf, op, root):
    """The plan the full validation would make for a call on a plain contiguous ndarray whose (op, dtype)
    pair went native below the lane's threshold or was computed by our algorithms, or None when it must decide."""
    # Ordered for speed: these checks are most of what a new small call costs.
    if type(buf) is not numpy.ndarray or not 0 <= root < lane.size or not buf.flags.c_contiguous:
        return None
    kind = lane.kind
    if kind == "bcast":
        fits = lane.rank == root or buf.flags.writeable
    else:
        fits = kind == "reduce" and lane.rank != root or fitting_recv(buf, recvbuf)
    if not fits:
        return None
    if buf.nbytes < lane.native_below and _handle(op) in lane.native_pairs.get(buf.dtype.num, ()):
        return NativePlan(lane, buf, recvbuf, op, root, buf.nbytes)
    name = None if kind == "bcast" else lane.computed_pairs.get((op.py2f(), buf.dtype))
    if name is None:
        return None
    return _host_plan(comm, lane, Call(kind, buf, None, op, name, root), buf, recvbuf, op, root)


def _handle(op):
    """An op's handle, hashable where the op is not (None: a Bcast's)."""
    return None if op is None else op.py2f()


# -- choosing the path ----------------------------------------------------------------------------------
def _choose(comm, lane, call):
    """The algorithm for a validated call on host memory: the selection table's or SCAFFE_REDUCE_ALGO's,
    "native" for what only MPI computes, "tree" instead of native MPI for a dtype it cannot reduce.
    Every input is one all ranks share: the call's kind, size, op and dtype, whether it blocks (MPI matches
    blocking calls only with blocking ones), the settings (SCAFFE_WAIT among them), the topology."""
    if not call.computed or comm.Get_size() == 1 and native_reduces(call.dtype):
        return "native"  # on one rank there is nothing to combine: MPI's call is a copy, whatever is forced
    compiled = call.op_name is not None and comm.shm.compiled_applies(call.op_name, call.dtype)
    name = algorithms.select(call.kind, call.nbytes, comm.forced, comm.several_nodes, compiled,
                             nonblocking=not lane.blocking)
    return "tree" if name == "native" and not native_reduces(call.dtype) else name


def _path(comm, lane, call, buf, recvbuf, op, root, stream):
    """The plan of a validated call (`call` None: the wrapped MPI runs it with the user's own arguments)."""
    if call is None:
        return NativePlan(lane, buf, recvbuf, op, root, _nbytes(buf, recvbuf))
    if call.device is not None:
        local = device_algorithm.local_call(comm, call)
        if local is None:
            return WorkPlan(lane, call.nbytes, device_algorithm.start(comm, call, call.stream if stream is None else stream))
        return DevicePlan(lane, buf, recvbuf, op, root, call.nbytes, local, call.stream)
    synchronize(stream)  # the caller's kernels that produce the data finish before we read it
    if call.staging is not None:
        return _staged_plan(comm, lane, call)
    return _host_plan(comm, lane, call, buf, recvbuf, op, root)


def _host_plan(comm, lane, call, buf, recvbuf, op, root):
    """The plan of a validated call on host buffers, and what its (op, dtype) pair teaches the quick checks."""
    name = _choose(comm, lane, call)
    if name == "native":
        lane.native_pairs.setdefault(call.dtype.num, set()).add(_handle(call.op))
        return NativePlan(lane, buf, recvbuf, op, root, call.nbytes)
    if call.op is not None:
        lane.computed_pairs[(call.op.py2f(), call.dtype)] = call.op_name
    trial = None
    if comm.measured and call.nbytes < TRIAL_SPAN * lane.native_below:
        trial = comm.trials.setdefault((call.kind, lane.blocking, _handle(call.op), call.dtype, call.nbytes), Trial())
    # Plain C-ordered ndarrays are viewed inline; any other buffer argument is parsed again at every call.
    plain = (type(buf) is numpy.ndarray and buf.flags.c_contiguous and lane.kind != "bcast"
             and (call.recv is None or type(recvbuf) is numpy.ndarray and recvbuf.flags.c_contiguous))
    parsed = None if plain else lambda buf, recvbuf: _parsed_views(comm, lane.kind, buf, recvbuf, root)
    return AlgorithmPlan(lane, buf, recvbuf, op, root, call.nbytes, algorithms.get(name, call.kind), call.op_name,
                         trial, parsed)


def _staged_plan(comm, lane, call):
    name = _choose(comm, lane, call)
    if name == "native":
        return StagedNativePlan(lane, call.nbytes, call.staging, call_args(call))
    algorithm = algorithms.get(name, call.kind)
    return WorkPlan(lane, call.nbytes, call.staging.wrap(lambda: algorithm(comm, call)))


def _parsed_views(comm, kind, buf, recvbuf, root):
    """(send, recv) flat host views of a repeated call's buffers parsed again (any buffer argument: specs,
    memoryviews, mmaps), raising Stale where they no longer are what its plan was made for."""
    if kind == "bcast":
        target = parse(buf, "buffer")
        if target is None or target.array is None or comm.Get_rank() != root and not target.array.flags.writeable:
            raise Stale()
        return None, target.array
    send, recv = _reduction_buffers(comm, kind, buf, recvbuf, root)
    if send.array is None or send.device is not None or recv is not None and (
            recv.array is None or recv.device is not None or recv.array.dtype != send.array.dtype
            or recv.array.shape != send.array.shape):
        raise Stale()
    return send.array, None if recv is None else recv.array


def _nbytes(buf, recvbuf):
    """A message's size for collectives.events when the wrapped MPI runs the user's arguments: that of the
    buffer numpy can see in them (0 for a derived datatype, which only MPI understands)."""
    parsed = parse(recvbuf if buf is MPI.IN_PLACE else buf)
    return 0 if parsed is None or parsed.array is None else parsed.array.nbytes


# -- the full validation --------------------------------------------------------------------------------
def _validate(comm, kind, buf, recvbuf, op, root):
    """The Call of a collective that passed every check, or None when the wrapped MPI must run it
    with the user's own arguments."""
    size = comm.Get_size()
    if not isinstance(root, (int, numpy.integer)) or not 0 <= root < size:
        raise CollectiveError(f"root {root!r} is out of range for a communicator of {size} ranks")
    if kind == "bcast":
        return _broadcast(comm, buf, root)
    return _reduction(comm, kind, buf, recvbuf, op, root)


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


def _reduction(comm, kind, sendbuf, recvbuf, op, root):
    """A Call for Reduce/Allreduce, or None when the wrapped MPI must do it."""
    send, recv = _reduction_buffers(comm, kind, sendbuf, recvbuf, root)
    device = device_algorithm.direct(comm, kind, send, recv, op)
    staging = None if device is not None else _staging(comm, send, recv)
    name = op_name(op)
    computed = _computes(name, send, recv)
    if comm.check:
        _check_signature(comm, kind, send.array if computed else None, op, root, int(device is not None))
    if not computed and staging is None:
        return None
    return Call(kind, send.array, None if recv is None else recv.array, op, name, root, staging, computed,
                device, None if device is None else named_stream(send, recv))


def _reduction_buffers(comm, kind, sendbuf, recvbuf, root):
    """The send and receive Buffers of a Reduce/Allreduce (one Buffer in place; recv None where this rank
    receives nothing)."""
    rank = comm.Get_rank()
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


def _staging(comm, send, recv):
    """Host stand-ins for the device buffers among `send` and `recv`, or None when there are none."""
    if send.device is None and (recv is None or recv.device is None):
        return None
    staging = Staging(comm.pinned)
    if recv is not None and recv.device is not None:
        recv.array = staging.host(recv.device, copy_in=send is recv, copy_out=True)
    if send is not recv and send.device is not None:
        send.array = staging.host(send.device, copy_in=True, copy_out=False)
    return staging


def _broadcast(comm, buf, root):
    """A Call for Bcast, or None when the wrapped MPI must do it."""
    target = parse(buf, "buffer")
    if target is None:
        raise CollectiveError("Bcast needs a buffer on every rank")
    receives = comm.Get_rank() != root
    if receives:
        writable(target, "buffer")
    staging = None
    device = device_algorithm.direct(comm, "bcast", None, target, None)
    if device is None and target.device is not None:
        staging = Staging(comm.pinned)
        target.array = staging.host(target.device, copy_in=not receives, copy_out=receives)
    if comm.check:
        _check_signature(comm, "bcast", target.array, MPI.OP_NULL, root, int(device is not None))
    if target.array is None:
        return None
    return Call("bcast", None, target.array, None, None, root, staging, device=device,
                stream=None if device is None else named_stream(None, target))


def _check_signature(comm, kind, array, op, root, path):
    """SCAFFE_CHECK=1: one small allreduce finds ranks that disagree, and all of them raise. `path` is
    the index in _PATHS of how this rank's buffers are handled: ranks of one node that mix them wait
    for each other in different places."""
    count = -1 if array is None else array.shape[0]
    dtype = -1 if array is None else array.dtype.num
    mine = numpy.array([count, dtype, op.py2f(), root, path], dtype=numpy.int64)
    both = numpy.concatenate([mine, -mine])
    extremes = numpy.empty_like(both)
    # Reported like a collective: a rank missing from this one would otherwise hang unseen.
    reported(comm.signature_check, both.nbytes, comm.private.Allreduce, both, extremes, MPI.MAX)
    fields = ["count", "dtype", "op", "root", "path"]
    highest, lowest = extremes[:len(fields)], -extremes[len(fields):]
    if (highest != lowest).any():
        differ = [f"{fields[i]} ({_PATHS[lowest[i]]}..{_PATHS[highest[i]]})" if fields[i] == "path"
                  else f"{fields[i]} ({lowest[i]}..{highest[i]})"
                  for i in range(len(fields)) if highest[i] != lowest[i]]
        raise MismatchError(f"{kind}: ranks disagree on {', '.join(differ)}; "
                            f"this rank passed count={count}, dtype={array.dtype if array is not None else '?'}")
