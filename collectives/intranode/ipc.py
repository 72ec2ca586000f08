"""Intra-node Reduce, Allreduce and Bcast of device buffers, with no host copy: CUDA IPC and events.

Each call, every local rank publishes a record in a small shared-memory window: the IPC handles and
offsets of its buffers (exported once per allocation), the call's arguments, and the handles of its two
interprocess events. `ready` says its buffers are ready to be read and written: it is recorded on the
rank's own stream after that stream has waited for an event recorded, at call time, on the caller's
stream (or on the legacy default stream), so the call orders itself after the caller's work without
blocking the host. `done` is recorded after the rank's share of the work.

Then the owners of the vector's slices each queue one fused kernel that reads the slice from every local
rank's buffer (mapped through the registration cache, collectives.devices.peers) and writes it where it
is needed: the Reduce root's buffer, every rank's for an Allreduce; a Bcast's kernel reads the root's
buffer and writes every other rank's. Before it, the owner's stream waits on every rank's `ready` event.
There is one owner per device: ranks sharing one GPU do not run kernels at the same time (without MPS),
so one kernel reads all of them; ranks on different GPUs reduce a slice each, their GPUs in parallel. The
root owns the whole vector on its device, so a Reduce's result never crosses a device twice.

A rank returns once every rank has passed its kernel (the `done` counters) and the owners' `done` events
have completed: a blocking call returns with its result in place and its buffers free, as MPI's do,
having waited on events, never on a whole device. For a fixed topology the order of summation is local
rank order, so results are reproducible.

Counters make the events safe to re-record: an event is recorded again only in the next call, which no
rank starts before every rank has waited on this call's records (every rank waits for all `done`
counters before it returns, and for all `ready` counters before it reads a record).
"""
import collections

import numpy
from mpi4py import MPI

from collectives.devices import HANDLE_BYTES
from collectives.devices.peers import PeerMemory
from collectives.errors import CollectiveError
from collectives.intranode.wait import wait_until

KINDS = ("reduce", "allreduce", "bcast")
_OP_CODES = {name: code for code, name in enumerate(
    ("sum", "prod", "min", "max", "land", "lor", "lxor", "band", "bor", "bxor"))}
_NO_OP = -1
_ALIGN_BYTES = 256  # slices start on this boundary: whole cache lines and aligned vector loads

_RECORD = numpy.dtype([
    ("ready", numpy.int64), ("done", numpy.int64), ("_line", numpy.uint8, 48),  # counters: a line of their own
    ("kind", numpy.int64), ("op", numpy.int64), ("dtype", numpy.int64), ("count", numpy.int64),
    ("root", numpy.int64), ("device", numpy.int64), ("send_offset", numpy.int64), ("recv_offset", numpy.int64),
    ("send_handle", numpy.uint8, HANDLE_BYTES), ("recv_handle", numpy.uint8, HANDLE_BYTES),
    ("ready_event", numpy.uint8, HANDLE_BYTES), ("done_event", numpy.uint8, HANDLE_BYTES),
])
_AGREED = ("kind", "op", "dtype", "count", "root")  # what every local rank must have passed alike


def _handle_field(handle):
    field = numpy.zeros(HANDLE_BYTES, dtype=numpy.uint8)
    field[:len(handle)] = numpy.frombuffer(bytes(handle), dtype=numpy.uint8)
    return field


class _DeviceState:
    """What this process keeps per device: its stream, its two interprocess events and their handles,
    spare events for marking the caller's stream, and the peers' memory and events opened so far."""

    def __init__(self, device):
        self.device = device
        with device.current():
            self.stream = device.new_stream()
            self.ready = device.new_event(interprocess=True)
            self.done = device.new_event(interprocess=True)
            self.ready_handle = _handle_field(device.export_event(self.ready))
            self.done_handle = _handle_field(device.export_event(self.done))
        self.spare_markers = collections.deque()  # taken by callers, given back by whoever ran the call
        self.peers = PeerMemory(device)
        self._peer_events = {}  # handle bytes -> opened event

    def marker(self):
        try:
            return self.spare_markers.pop()
        except IndexError:
            return self.device.new_event()

    def peer_event(self, field):
        handle = field.tobytes()
        event = self._peer_events.get(handle)
        if event is None:
            event = self._peer_events[handle] = self.device.open_event(handle)
        return event


class NodeIpc:
    """The records window of one node communicator and the per-device state behind it."""

    def __init__(self, node_comm):
        self.node_comm = node_comm
        self.local_rank = node_comm.Get_rank()
        self.local_size = node_comm.Get_size()
        # Every record lives in one block on local rank 0, so a wait reads one small region.
        size = _RECORD.itemsize * self.local_size if self.local_rank == 0 else 0
        self._win = MPI.Win.Allocate_shared(size, _RECORD.itemsize, comm=node_comm)
        self._win.Lock_all()
        memory, _ = self._win.Shared_query(0)
        self.records = numpy.frombuffer(memory, dtype=_RECORD, count=self.local_size)
        self.records[self.local_rank] = numpy.zeros((), dtype=_RECORD)
        self.calls = 0
        self._states = {}  # Device -> _DeviceState
        node_comm.Barrier()

    def free(self):
        for state in self._states.values():
            state.peers.close()
        self._win.Unlock_all()
        self._win.Free()

    def state(self, device):
        state = self._states.get(device)
        if state is None:
            state = self._states[device] = _DeviceState(device)
        return state

    def start(self, device, kind, send, recv, op, root, stream):
        """Mark the caller's `stream` now (in the caller's thread) and return the call's work: a callable
        that runs it (from whichever thread runs the communicator's calls, in call order).

        `send`/`recv` are this rank's device views (None where it has none: a Reduce's non-root receive
        buffer, a Bcast's send buffer; `send is recv` in place); `root` is the local root (0 for Allreduce).
        """
        state = self.state(device)
        marker = state.marker()
        with device.current():
            device.record(marker, device.user_stream(stream))
        return lambda: self._run(state, KINDS.index(kind), send, recv, _OP_CODES.get(op, _NO_OP), root, marker)

    # -- one call -----------------------------------------------------------------------------------
    def _run(self, state, kind, send, recv, op, root, marker):
        device = state.device
        self.calls += 1
        call = self.calls
        with device.current():
            device.wait(state.stream, marker)
            device.record(state.ready, state.stream)
            state.spare_markers.append(marker)  # the wait above has taken the record it needs
            self._publish_record(state, call, kind, send, recv, op, root)
            self._wait_all("ready", call)
            records = self.records.copy()
            problem = _disagreement(records)
            owners = [] if problem else _owners(records)
            if self.local_rank in owners:
                self._queue_share(state, records, owners, send, recv)
            device.record(state.done, state.stream)
            self._publish("done", call)
            self._wait_all("done", call)
            if problem:
                raise CollectiveError(problem)
            for owner in owners:
                device.synchronize(state.done if owner == self.local_rank
                                   else state.peer_event(records[owner]["done_event"]))

    def _publish_record(self, state, call, kind, send, recv, op, root):
        mine = self.records[self.local_rank]
        some = send if send is not None else recv
        mine["kind"], mine["op"], mine["root"] = kind, op, root
        mine["dtype"], mine["count"] = numpy.dtype(some.dtype).num, some.size
        mine["device"] = state.device.key
        for name, view in (("send", send), ("recv", recv)):
            if view is not None:
                handle, offset = state.device.export(view)
                mine[f"{name}_handle"], mine[f"{name}_offset"] = _handle_field(handle), offset
        mine["ready_event"], mine["done_event"] = state.ready_handle, state.done_handle
        self._publish("ready", call)

    def _publish(self, counter, call):
        self._win.Sync()  # what was written before the counter is visible before it
        self.records[self.local_rank][counter] = call

    def _wait_all(self, counter, call):
        column = self.records[counter]
        wait_until(lambda: column.min() >= call)
        self._win.Sync()

    def _queue_share(self, state, records, owners, send, recv):
        """Queue my slice's kernel on my stream, after every rank's buffers are ready."""
        record = records[self.local_rank]
        count = int(record["count"])
        dtype = send.dtype if send is not None else recv.dtype
        index = owners.index(self.local_rank)
        lo, hi = _slice(count, numpy.dtype(dtype).itemsize, len(owners), index)
        inputs, outputs = self._operands(state, records, send, recv, dtype, count)
        if len(inputs) == 1:
            outputs = [view for view in outputs if view is not inputs[0]]  # one rank in place: nothing to do
        if hi <= lo or not outputs:
            return
        device = state.device
        for rank in range(self.local_size):
            if rank != self.local_rank:
                device.wait(state.stream, state.peer_event(records[rank]["ready_event"]))
        op = "copy" if len(inputs) == 1 else _op_name(int(record["op"]))
        device.reduce([view[lo:hi] for view in outputs], [view[lo:hi] for view in inputs], op, state.stream)

    def _operands(self, state, records, send, recv, dtype, count):
        """(inputs, outputs) of the kernel as views, each rank's own or mapped from its record."""
        kind, root = KINDS[int(records[0]["kind"])], int(records[0]["root"])

        def view(rank, name):
            if rank == self.local_rank:
                return send if name == "send" else recv
            record = records[rank]
            return state.peers.view(record[f"{name}_handle"].tobytes(), int(record[f"{name}_offset"]), count, dtype)

        everyone = range(self.local_size)
        if kind == "bcast":
            return [view(root, "recv")], [view(rank, "recv") for rank in everyone if rank != root]
        inputs = [view(rank, "send") for rank in everyone]
        if kind == "reduce":
            return inputs, [view(root, "recv")]
        return inputs, [view(rank, "recv") for rank in everyone]


def _op_name(code):
    for name, number in _OP_CODES.items():
        if number == code:
            return name
    raise CollectiveError(f"unknown op code {code} in a device call record")


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
