"""Intra-node Reduce, Allreduce and Bcast of device buffers, with no host copy: CUDA IPC and host-side flags.

Each call, every local rank publishes a record in a small shared-memory window: the id of its `LocalCall`
(its arguments and buffers; the IPC handles, bases and offsets of the buffers go with a new id only), and
two counters. `ready` says its buffers may be read and written: the rank raises it once its own process
has seen the caller's work on them complete (an ordinary event recorded on the caller's stream, or the
legacy default stream, when the call is made, and synchronised by the caller for a blocking call, by the
progress thread for an I* call; no event at all where the caller's stream is a non-blocking one that is
idle already, so that only the kernels' owners queue work on the GPU during a call). No process ever
waits on another process's event: on one GPU such a wait costs 150-300 us per peer, a host-side flag
about a microsecond (issue 22's measurements).

Then the owners of the vector's slices each run one fused kernel on their own stream that reads the
slice from every local rank's buffer (mapped through the registration cache, collectives.devices.peers)
and writes it where it is needed: the Reduce root's buffer, every rank's for an Allreduce; a Bcast's
kernel reads the root's buffer and writes every other rank's. There is one owner per device: ranks
sharing one GPU do not run kernels at the same time (without MPS), so one kernel reads all of them;
ranks on different GPUs reduce a slice each, in parallel. The root owns the whole vector on its device,
so a Reduce's result never crosses a device twice. An owner synchronises its stream and raises `done`;
every rank returns once all have: a blocking call returns with its result in place and its buffers free,
as MPI's do. For a fixed topology the order of summation is local rank order: results are reproducible.

What a call needs on the owner (mapped peer views, the kernel, its grid and arguments) is a `_Plan`, made
once for the local ranks' ids and kept in a small cache: a repeated call compares those few integers and
runs.

A call that fails anywhere on one rank fails on all of them, with that rank's error, at once: its buffer
cannot be exported, its device cannot map a peer's (no peer access), its launch or its stream fails, or
a peer never comes (it took another path: the wait ends after half the stall limit, SCAFFE_STALL_S). The
rank leaves the call (`_leave`): it writes its error in its record, lowers its `ready` again, so that no
rank still waiting can start the call's kernels on its buffers, and raises `failed`, which ends every
other rank's wait; each of them leaves the call the same way and raises the same error. A rank returns
from a failed call only once every rank that may have started its kernels has finished or left, and
starts its next call only once every local rank has left the failed one: a late rank cannot take the
next call's `ready` for this one's. (The two fences of `_leave` and of the waits keep a rank that
lowers its `ready` and a late one that raises its own from both missing the other's write.)
"""
import collections
import itertools
import os

import numpy

from collectives import ops, settings
from collectives.devices import HANDLE_BYTES, peers
from collectives.errors import CollectiveError
from collectives.intranode.counters import CounterBlock
from collectives.intranode.wait import wait_until

KINDS = ("reduce", "allreduce", "bcast")
_NO_OP = -1  # a Bcast's op code
_ALIGN_BYTES = 256  # slices start on this boundary: whole cache lines and aligned vector loads
_ERROR_BYTES = 480
_PLANS_KEPT = 16  # plans per communicator: a training step's few buffers, each in a call or two
_local_ids = itertools.count(1)  # LocalCall ids, never reused in a process: an id names one call's buffers

_RECORD = numpy.dtype([
    ("ready", numpy.int64), ("done", numpy.int64), ("_line", numpy.uint8, 48),  # counters: a line of their own
    ("failed", numpy.int64),  # the last call this rank left with an error (see `_leave`)
    ("call_id", numpy.int64), ("error_call", numpy.int64),  # error_call: the call whose error `error` is
    ("kind", numpy.int64), ("op", numpy.int64), ("dtype", numpy.int64), ("count", numpy.int64),
    ("root", numpy.int64), ("device", numpy.int64), ("pid", numpy.int64),
    ("send_base", numpy.uint64), ("send_size", numpy.uint64), ("send_offset", numpy.int64),
    ("recv_base", numpy.uint64), ("recv_size", numpy.uint64), ("recv_offset", numpy.int64),
    ("send_handle", numpy.uint8, HANDLE_BYTES), ("recv_handle", numpy.uint8, HANDLE_BYTES),
    ("error", f"S{_ERROR_BYTES}"),
])
_AGREED = ("kind", "op", "dtype", "count", "root")  # what every local rank must have passed alike
# The counters' words in a record (CounterBlock's protocol)
READY, DONE, FAILED = (_RECORD.fields[name][1] // 8 for name in ("ready", "done", "failed"))


def _handle_field(handle):
    field = numpy.zeros(HANDLE_BYTES, dtype=numpy.uint8)
    field[:len(handle)] = numpy.frombuffer(bytes(handle), dtype=numpy.uint8)
    return field


class _DeviceState:
    """What this process keeps per device for the direct path: its stream and spare events for marking
    the caller's stream."""

    def __init__(self, device):
        self.device = device
        self.peers = peers.use(device)  # released when the communicator is freed
        with device.current():
            self.stream = device.new_stream()
        self.spare_markers = collections.deque()  # taken by callers, given back by whoever ran the call

    def mark(self, stream):
        """An event recorded now on the caller's `stream` (None: the legacy default stream), or None when
        that stream is idle already: then no other process's kernel shares the GPU with this one's."""
        device = self.device
        user = device.user_stream(stream)
        if device.idle(user):
            return None
        try:
            marker = self.spare_markers.pop()
        except IndexError:
            marker = device.new_event()
        with device.current():
            device.record(marker, user)
        return marker


class LocalCall:
    """This rank's part of a repeated device call: its arguments and buffers as the record holds them.

    `send`/`recv` are this rank's device views (None where it has none: a Reduce's non-root receive
    buffer, a Bcast's send buffer; `send is recv` in place); `root` is the local root (0 for Allreduce).
    Exporting a buffer may fail (memory CUDA IPC cannot share): `failure` then holds the error, which
    every local rank raises when the call runs.
    """

    def __init__(self, ipc, device, kind, send, recv, op, root):
        self.ipc, self.state = ipc, ipc.state(device)
        self.send, self.recv = send, recv
        self.id = next(_local_ids)
        self.failure = None
        record = self.record = numpy.zeros((), dtype=_RECORD)
        some = send if send is not None else recv
        record["call_id"], record["kind"], record["root"] = self.id, KINDS.index(kind), root
        record["op"] = _NO_OP if op is None else ops.NAMES.index(op)
        record["dtype"], record["count"], record["device"] = numpy.dtype(some.dtype).num, some.size, device.key
        record["pid"] = os.getpid()  # names the exporter of the bases below in the registration cache
        try:
            for name, view in (("send", send), ("recv", recv)):
                if view is not None:
                    handle, base, size, offset = device.export(view)
                    record[f"{name}_handle"] = _handle_field(handle)
                    record[f"{name}_base"], record[f"{name}_size"], record[f"{name}_offset"] = base, size, offset
        except Exception as error:  # every local rank must hear of it, or they wait for this rank forever
            self.failure = error

    def start(self, stream):
        """Mark the caller's `stream` now (in the caller's thread) and return the call's work: a callable
        that runs it (from whichever thread runs the communicator's calls, in call order)."""
        marker = self.state.mark(stream)
        return lambda: self.ipc.run(self, marker)


class _Plan:
    """What one owner runs for a call the local ranks' ids name: its kernel, ready to launch (None: this
    rank owns no slice, or its slice has nothing to do), valid while the registration cache it took the
    peers' pointers from has closed no mapping since (`closes`, the cache's count when it was made)."""

    def __init__(self, launch, closes):
        self.launch, self.closes = launch, closes


class NodeIpc(CounterBlock):
    """The records of one node communicator (a counter block: `ready`, `done` and `failed` are its counters),
    its plans, and the per-device state behind them."""

    def __init__(self, node_comm):
        super().__init__(node_comm, _RECORD)
        self.node_comm = node_comm
        self.records = self.rows
        self._ready, self._done = self.records["ready"], self.records["done"]
        self._failed, self._call_ids = self.records["failed"], self.records["call_id"]
        stall_s = settings.stall_seconds()
        # Half the stall limit: this wait's one-line error comes before the stall inspector's report.
        self.wait_s = stall_s / 2 if stall_s else None
        self.calls = 0  # calls that ran here (what the tests look for)
        self._unfinished = None  # the last call that failed, until every local rank is seen to have left it
        self.plans_made = 0
        self._plans = collections.OrderedDict()  # local ranks' call ids (bytes) -> _Plan
        self._states = {}  # Device -> _DeviceState
        node_comm.Barrier()

    def free(self):
        self._plans.clear()
        for state in self._states.values():
            peers.release(state.peers)
        self._states.clear()
        super().free()

    def state(self, device):
        state = self._states.get(device)
        if state is None:
            state = self._states[device] = _DeviceState(device)
        return state

    def local_call(self, device, kind, send, recv, op, root):
        return LocalCall(self, device, kind, send, recv, op, root)

    # -- one call -----------------------------------------------------------------------------------
    def run(self, local, marker):
        state = local.state
        device = state.device
        self.calls += 1
        call = self.calls
        if self._unfinished is not None:
            self._await_unfinished(call)
        if local.failure is not None:
            self._leave(call, self._failure(call, "exporting its buffers", local.failure))
        if marker is not None:
            try:
                device.synchronize(marker)  # the caller's work on this rank's buffers is done: they may be shared
            except Exception as error:
                self._leave(call, self._failure(call, "waiting for the caller's work on its buffers", error))
            state.spare_markers.append(marker)
        mine = self.records[self.local_rank]
        if mine["call_id"] != local.id:
            record = local.record
            for counter in ("ready", "done", "failed"):
                record[counter] = mine[counter]  # only this rank writes them
            self.records[self.local_rank] = record
        self.publish(READY, call)
        self.fence()  # written before this rank reads the others': see `_leave`
        self.wait_all(READY, call, self.wait_s, FAILED)
        mapped = state.peers
        step = "planning its part (mapping its peers' buffers)"
        try:
            # Held from the plan's check to the kernel's end: another communicator's thread may close
            # mappings (stale ones, or all of a peer's) only when no kernel can be reading them. Never held
            # across a wait for other processes: two of them could each hold it while waiting for the other.
            with mapped.lock:
                call_ids = self._call_ids.tobytes()
                plan = self._plans.get(call_ids)
                if plan is None or plan.closes != mapped.closes:
                    plan = self._plan(local, call_ids)
                if plan.launch is not None:
                    step = "running its kernel"
                    with device.current():
                        plan.launch(state.stream)
                        device.synchronize_stream(state.stream)  # the results are in place before `done` says so
        except Exception as error:
            self._leave(call, self._failure(call, step, error))
        self.publish(DONE, call)
        self.wait_all(DONE, call, self.wait_s, FAILED)

    def missed(self, word, call):
        """Leave call `call`, whose wait for every local rank to reach it in counter `word` ended without: a
        rank left it, or half the stall limit passed."""
        failed = self._failed.max() >= call
        self._leave(call, None if failed else self._late(word, call))

    def _late(self, word, call):
        # Read before `failed`: a rank that has left lowers its `ready` only after raising `failed`.
        column, what = self.columns[word], "join" if word == READY else "finish"
        late = [rank for rank in range(self.local_size) if column[rank] < call and self._failed[rank] < call]
        advice = ("every rank of a node must pass device buffers to a call when one does (or set "
                  "SCAFFE_DEVICE_PATH=staged)" if what == "join" else "a kernel or a process is stuck")
        return f"device collective {call}: local ranks {late} did not {what} within {self.wait_s:.0f} s; {advice}"

    def _failure(self, call, step, error):
        """The one line every local rank raises when this rank's `step` of call `call` raised `error`."""
        if isinstance(error, CollectiveError):  # already a whole node's error (the ranks disagree)
            return str(error)
        return f"device collective {call} failed on local rank {self.local_rank} {step}: {type(error).__name__}: {error}"

    def _leave(self, call, failure):
        """Leave call `call` with the error every local rank raises: `failure`, this rank's own, or (None)
        the one a rank that left first wrote in its record."""
        me = self.local_rank
        if failure is None:
            failure = self._first_failure(call)
        else:
            failure = failure.encode()[:_ERROR_BYTES].decode(errors="ignore")  # what the record can hold
            self.records[me]["error"], self.records[me]["error_call"] = failure.encode(), call
        self.publish(FAILED, call)  # the error is visible before `failed` says there is one
        if self._ready[me] >= call:  # withdrawn: a rank still waiting for it can no longer start the call
            self.set_field(READY, call - 1)  # (after `failed`: no rank takes this one for a late one, see `_late`)
        self.fence()  # written before this rank reads which ranks may have started the call
        self._unfinished = call
        wait_until(lambda: not self._in_call(call, started_only=True), self.wait_s)
        raise CollectiveError(failure)

    def _first_failure(self, call):
        """The error of the lowest local rank that left call `call` with its own."""
        for record in self.records:
            if record["error_call"] == call:
                return record["error"].decode(errors="replace")
        # It has left the call and failed a later one since: its error for this one is gone.
        return f"device collective {call} failed on another local rank"

    def _in_call(self, call, started_only):
        """The local ranks that have neither finished call `call` nor left it (with `started_only`, of
        those only the ones whose `ready` says they may have started its kernels)."""
        return [rank for rank in range(self.local_size)
                if self._done[rank] < call and self._failed[rank] < call
                and not (started_only and self._ready[rank] < call)]

    def _await_unfinished(self, call):
        """Before this rank says it is ready for `call`: every local rank has left the last failed call
        (a rank that comes to that one late must see it failed, not this call's `ready`)."""
        failed = self._unfinished
        if not wait_until(lambda: not self._in_call(failed, started_only=False), self.wait_s):
            late = self._in_call(failed, started_only=False)
            self._leave(call, f"device collective {call}: local ranks {late} did not come to call {failed}, which "
                        f"failed, within {self.wait_s:.0f} s; every rank of a node must make the same calls")
        self._unfinished = None

    def _plan(self, local, call_ids):
        """Make (and keep) the plan for the calls the records name, after checking that they agree."""
        records = self.records.copy()
        problem = _disagreement(records)
        if problem:
            raise CollectiveError(problem)
        owners = _owners(records)
        mapped = local.state.peers
        launch = self._kernel(local, records, owners, mapped) if self.local_rank in owners else None
        plan = self._plans[call_ids] = _Plan(launch, mapped.closes)
        self.plans_made += 1
        while len(self._plans) > _PLANS_KEPT:
            self._plans.popitem(last=False)
        return plan

    def _kernel(self, local, records, owners, mapped):
        """My slice's kernel, ready to launch on my stream (None when it has nothing to do)."""
        record = records[self.local_rank]
        count = int(record["count"])
        dtype = numpy.dtype(local.send.dtype if local.send is not None else local.recv.dtype)
        index = owners.index(self.local_rank)
        lo, hi = _slice(count, dtype.itemsize, len(owners), index)
        inputs, outputs = self._operands(local, records, dtype, count, mapped)
        if len(inputs) == 1:
            outputs = [view for view in outputs if view is not inputs[0]]  # one rank in place: nothing to do
        if hi <= lo or not outputs:
            return None
        op = "copy" if len(inputs) == 1 else ops.NAMES[int(record["op"])]
        return local.state.device.prepare_reduce([view[lo:hi] for view in outputs],
                                                 [view[lo:hi] for view in inputs], op)

    def _operands(self, local, records, dtype, count, mapped):
        """(inputs, outputs) of the kernel as views, each rank's own or mapped (by `mapped`) from its record."""
        kind, root = KINDS[int(records[0]["kind"])], int(records[0]["root"])

        def view(rank, name):
            if rank == self.local_rank:
                return local.send if name == "send" else local.recv
            record = records[rank]
            return mapped.view(int(record["pid"]), int(record[f"{name}_base"]), int(record[f"{name}_size"]),
                               record[f"{name}_handle"].tobytes(), int(record[f"{name}_offset"]), count, dtype)

        everyone = range(self.local_size)
        if kind == "bcast":
            return [view(root, "recv")], [view(rank, "recv") for rank in everyone if rank != root]
        inputs = [view(rank, "send") for rank in everyone]
        if kind == "reduce":
            return inputs, [view(root, "recv")]
        return inputs, [view(rank, "recv") for rank in everyone]


def _disagreement(records):
    """A message naming the arguments the local ranks disagree on, or None."""
    differ = [f"{name} ({', '.join(str(v) for v in records[name])})"
              for name in _AGREED if (records[name] != records[name][0]).any()]
    if not differ:
        return None
    return (f"a device collective's ranks on this node disagree on {'; '.join(differ)} (listed by local rank); "
            "every rank must make the same call")


def _owners(records):
    """The local ranks that run a kernel: one per device, the root on its own device (else the lowest)."""
    root = int(records[0]["root"])
    devices = records["device"]
    owners = []
    for rank, key in enumerate(devices):
        if rank == root or (key != devices[root] and all(devices[o] != key for o in owners)):
            owners.append(rank)
    return sorted(owners)


def _slice(count, itemsize, parts, index):
    """[lo, hi) of slice `index` of `parts` near-equal slices of `count` elements, aligned to _ALIGN_BYTES."""
    unit = max(1, _ALIGN_BYTES // itemsize)
    units = -(-count // unit)
    lo = (units * index // parts) * unit
    hi = (units * (index + 1) // parts) * unit
    return min(lo, count), min(hi, count)
