"""Chunked, pipelined reduce and broadcast of device buffers along a tree of ranks (the node leaders).

The shape of `collectives.algorithms.pipeline`, on device memory. Without a CUDA-aware MPI each chunk is
staged through pinned host double buffers: device-to-host on a download stream while MPI sends the
previous chunk, host-to-device on an upload stream as chunks arrive, and the fused K-input reduce on a
compute stream after them. With a CUDA-aware MPI the device chunks go to MPI directly. Streams order the
device work, events order the streams, and the host waits on an event only where MPI or a reused buffer
needs the data: each wait is named in a comment, since a missing one reads a chunk before it has landed.

Everything device-side goes through the collectives' device interface (collectives.devices.Device), so
the CPU stand-in (tests/stand_ins/cpu_device.py) runs this code, waits included, in CI.
"""
import collections
import ctypes

import numpy
from mpi4py import MPI

from collectives import settings
from collectives.algorithms.pipeline import chunk_slices, chunk_width

_TAG = 7302
_DEPTH = 2  # double buffering: chunk c+1 moves while chunk c is reduced


def cuda_aware():
    """(does the MPI library take device pointers, how we know). SCAFFE_CUDA_AWARE=0|1 overrides the detection."""
    forced = settings.cuda_aware_override()
    if forced is not None:
        return forced, "SCAFFE_CUDA_AWARE"
    query = getattr(MPI, "Query_cuda_support", None)  # mpi4py builds against an MPI that declares it
    if query is not None:
        return bool(query()), "MPI.Query_cuda_support()"
    try:  # MPICH 4, Open MPI 4+ and MVAPICH2-GDR export it; mpi4py loads libmpi with global symbols
        query = ctypes.CDLL(None).MPIX_Query_cuda_support
    except (AttributeError, OSError):
        query = None
    if query is not None:
        query.restype = ctypes.c_int
        return bool(query()), "MPIX_Query_cuda_support()"
    if settings.mvapich_cuda():
        return True, "MV2_USE_CUDA=1"
    return False, "the library has no MPIX_Query_cuda_support"


class Scratch:
    """Grow-only device and pinned chunk buffers, streams and events of one communicator's pipelines."""

    def __init__(self, device):
        self.device = device
        with device.current():
            # Copies each way and the kernel on streams of their own: chunk c+1 goes up while chunk c is
            # reduced and chunk c-1 comes down.
            self.upload = device.new_stream()
            self.download = device.new_stream()
            self.compute = device.new_stream()
            # Per slot: its copies to the device done, its reduce done, its copy to the host done.
            self.landed, self.reduced, self.fetched = ([device.new_event() for _ in range(_DEPTH)] for _ in range(3))
        self._buffers = {}
        self._spare_marks = collections.deque()  # events for marking the caller's stream, reused
        self.cuda_aware = cuda_aware()[0]

    def node_result(self, count, dtype):
        """Device memory for a node's sum at a head that is not the root (other processes map it by IPC)."""
        return self._grown(("node", numpy.dtype(dtype).str), count, dtype, self.device.empty)

    def mark(self, stream):
        """An event recorded now on the caller's `stream` (None: the legacy default stream), for `wait_for`."""
        with self.device.current():
            event = self._spare_marks.pop() if self._spare_marks else self.device.new_event()
            self.device.record(event, self.device.user_stream(stream))
        return event

    def wait_for(self, mark):
        """Block until the caller's work before `mark` has finished, and take the event back."""
        self.device.synchronize(mark)
        self._spare_marks.append(mark)

    def slots(self, key, count, dtype, pinned):
        """_DEPTH buffers of `count` elements of `dtype`: device memory, or page-locked host memory."""
        allocate = self.device.pinned if pinned else self.device.empty
        return [self._grown((key, d, dtype.str, pinned), count, dtype, allocate) for d in range(_DEPTH)]

    def _grown(self, name, count, dtype, allocate):
        have = self._buffers.get(name)
        if have is None or have.size < count:
            have = self._buffers[name] = allocate(count, dtype)
        return have[:count]


def reduce(comm, own, out, op, parent, children, chunk, scratch, direct):
    """Reduce device array `own` of every rank of the tree into `out` at the rank whose parent is None.

    `comm` holds the tree's ranks; `own` is ready to be read (its producer has finished) and `out` may be
    `own`. `direct`: the MPI library takes device memory. Returns when `out` holds the result and every
    buffer may be reused.
    """
    device = scratch.device
    pieces = chunk_slices(own.shape[0], chunk)
    if not pieces:
        return
    with device.current():
        if children or parent is not None:
            _ReducePipeline(comm, own, out, op, parent, children, chunk, scratch, direct, pieces).run()
        elif out is not own:
            device.copy(out, own, scratch.compute)
        for stream in (scratch.compute, scratch.upload, scratch.download):
            device.synchronize_stream(stream)  # `out` is complete, and the next call may reuse every slot


class _ReducePipeline:
    """One rank's part of `reduce` on a tree with more than one rank: the chunk buffers, the MPI requests
    in flight and the steps of a chunk (receive, upload, reduce, download, send up)."""

    def __init__(self, comm, own, out, op, parent, children, chunk, scratch, direct, pieces):
        self.comm, self.own, self.out, self.op = comm, own, out, op
        self.parent, self.children, self.direct, self.pieces = parent, children, direct, pieces
        self.device, self.upload, self.download, self.compute = (scratch.device, scratch.upload, scratch.download,
                                                                 scratch.compute)
        self.landed, self.reduced, self.fetched = scratch.landed, scratch.reduced, scratch.fetched
        dtype = numpy.dtype(own.dtype)
        fan_in = range(len(children))
        self.device_in = [scratch.slots(("in", i), chunk, dtype, pinned=False) for i in fan_in]
        self.host_in = None if direct else [scratch.slots(("in", i), chunk, dtype, pinned=True) for i in fan_in]
        has_parent = parent is not None
        self.device_out = scratch.slots("out", chunk, dtype, pinned=False) if children and has_parent else None
        self.host_out = scratch.slots("out", chunk, dtype, pinned=True) if has_parent and not direct else None
        self.recvs, self.sends = {}, [None] * _DEPTH

    def run(self):
        for c in range(_DEPTH):
            self._post(c)
        for c, s in enumerate(self.pieces):
            d, width = c % _DEPTH, chunk_width(s)
            source = self._reduce_chunk(c, d, width) if self.children else self.own[s]
            if self.parent is not None and not self.direct:
                self._fetch(d, width, source)
            if c > 0:
                self._finish(c - 1)
        self._finish(len(self.pieces) - 1)
        MPI.Request.Waitall([r for r in self.sends if r is not None])

    def _post(self, c):
        """Receive chunk c from every child into slot c % _DEPTH (pinned, or the device slot when direct)."""
        if c < len(self.pieces):
            width, d = chunk_width(self.pieces[c]), c % _DEPTH
            if self.direct:
                into = [self.device.mpi_buffer(slots[d][:width]) for slots in self.device_in]
            else:
                into = [slots[d][:width] for slots in self.host_in]
            self.recvs[c] = [self.comm.Irecv(buffer, child, _TAG) for buffer, child in zip(into, self.children)]

    def _reduce_chunk(self, c, d, width):
        """Sum chunk c of `own` and the children's on the compute stream; returns where the sum goes."""
        MPI.Request.Waitall(self.recvs.pop(c))
        if not self.direct:
            self._land(d, width)
        target = self._reduce_target(c, d, width)
        inputs = [self.own[self.pieces[c]]] + [slots[d][:width] for slots in self.device_in]
        self.device.reduce([target], inputs, self.op, self.compute)
        self.device.record(self.reduced[d], self.compute)
        return target

    def _land(self, d, width):
        """Copy the children's pinned chunks of slot d to the device slot, on the upload stream."""
        device = self.device
        device.wait(self.upload, self.reduced[d])  # the reduce of chunk c-2 has read the device slot
        for device_slots, host_slots in zip(self.device_in, self.host_in):
            device.copy(device_slots[d][:width], host_slots[d][:width], self.upload)
        device.record(self.landed[d], self.upload)
        device.wait(self.compute, self.landed[d])  # the kernel reads what the copies wrote

    def _reduce_target(self, c, d, width):
        """`out` at the root; elsewhere device slot d, once chunk c-2 has left it."""
        if self.parent is None:
            return self.out[self.pieces[c]]
        if self.direct and self.sends[d] is not None:
            self.sends[d].Wait()  # MPI has read chunk c-2 from the device slot
        elif not self.direct:
            self.device.wait(self.compute, self.fetched[d])  # the copy of chunk c-2 has read the device slot
        return self.device_out[d][:width]

    def _fetch(self, d, width, source):
        """Copy the chunk to send up from the device to pinned slot d, on the download stream."""
        if self.sends[d] is not None:
            self.sends[d].Wait()  # MPI has sent chunk c-2 from the pinned slot
        if self.children:
            self.device.wait(self.download, self.reduced[d])  # the copy reads the reduced chunk
        self.device.copy(self.host_out[d][:width], source, self.download)
        self.device.record(self.fetched[d], self.download)

    def _finish(self, c):
        """The host's part of chunk c, done while the device works on chunk c+1."""
        d, width = c % _DEPTH, chunk_width(self.pieces[c])
        if self.parent is not None:
            self.sends[d] = self._send_up(c, d, width)
        if self.children:
            # The receive buffers of slot d take chunk c+2 once chunk c has left them.
            self.device.synchronize(self.reduced[d] if self.direct else self.landed[d])
            self._post(c + _DEPTH)

    def _send_up(self, c, d, width):
        if not self.direct:
            self.device.synchronize(self.fetched[d])  # MPI reads the pinned copy of the chunk
            return self.comm.Isend(self.host_out[d][:width], self.parent, _TAG)
        if self.children:
            self.device.synchronize(self.reduced[d])  # MPI reads the reduced chunk from the device
        source = self.device_out[d][:width] if self.children else self.own[self.pieces[c]]
        return self.comm.Isend(self.device.mpi_buffer(source), self.parent, _TAG)


def bcast(comm, buf, parent, children, chunk, scratch, direct):
    """Broadcast device array `buf` from the rank whose parent is None down the tree, forwarding each
    chunk as it arrives. Returns when `buf` holds the data and every buffer may be reused."""
    device = scratch.device
    pieces = chunk_slices(buf.shape[0], chunk)
    if not pieces:
        return
    with device.current():
        if direct:
            _bcast_direct(comm, [device.mpi_buffer(buf[s]) for s in pieces], parent, children)
        else:
            _bcast_staged(comm, buf, parent, children, chunk, scratch, pieces)


def _bcast_staged(comm, buf, parent, children, chunk, scratch, pieces):
    device = scratch.device
    host = scratch.slots("bcast", chunk, numpy.dtype(buf.dtype), pinned=True)
    stream = scratch.download if parent is None else scratch.upload
    moved = scratch.landed  # slot d's copy (to or from the device) is done
    recvs, sends = {}, [[] for _ in range(_DEPTH)]

    def post(c):
        if parent is not None and c < len(pieces):
            recvs[c] = comm.Irecv(host[c % _DEPTH][:chunk_width(pieces[c])], parent, _TAG)

    def finish(c):
        d, width = c % _DEPTH, chunk_width(pieces[c])
        device.synchronize(moved[d])  # the root: MPI reads the pinned copy; the others: the slot is free
        if parent is None:
            sends[d] = [comm.Isend(host[d][:width], child, _TAG) for child in children]
        else:
            MPI.Request.Waitall(sends[d])
            post(c + _DEPTH)

    for c in range(_DEPTH):
        post(c)
    for c, s in enumerate(pieces):
        d, width = c % _DEPTH, chunk_width(s)
        if parent is None:
            MPI.Request.Waitall(sends[d])  # MPI has sent chunk c-2 from the pinned slot
            device.copy(host[d][:width], buf[s], stream)
        else:
            recvs.pop(c).Wait()
            sends[d] = [comm.Isend(host[d][:width], child, _TAG) for child in children]
            device.copy(buf[s], host[d][:width], stream)
        device.record(moved[d], stream)
        if c > 0:
            finish(c - 1)
    finish(len(pieces) - 1)
    MPI.Request.Waitall([r for d in range(_DEPTH) for r in sends[d]])
    device.synchronize_stream(stream)  # `buf` is complete on the device


def _bcast_direct(comm, chunks, parent, children):
    """The broadcast with a CUDA-aware MPI: device chunks straight to MPI, forwarded on arrival."""
    sends = []
    if parent is None:
        for chunk in chunks:
            sends.extend(comm.Isend(chunk, child, _TAG) for child in children)
    else:
        recvs = [comm.Irecv(chunk, parent, _TAG) for chunk in chunks]
        for request, chunk in zip(recvs, chunks):
            request.Wait()
            sends.extend(comm.Isend(chunk, child, _TAG) for child in children)
    MPI.Request.Waitall(sends)
