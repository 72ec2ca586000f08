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
import os

import numpy
from mpi4py import MPI

from collectives import settings
from collectives.algorithms.pipeline import chunk_slices

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
    if os.environ.get("MV2_USE_CUDA") == "1":
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
            _reduce(comm, own, out, op, parent, children, chunk, scratch, direct, pieces)
        elif out is not own:
            device.copy(out, own, scratch.compute)
        for stream in (scratch.compute, scratch.upload, scratch.download):
            device.synchronize_stream(stream)  # `out` is complete, and the next call may reuse every slot


def _reduce(comm, own, out, op, parent, children, chunk, scratch, direct, pieces):
    device, upload, download, compute = scratch.device, scratch.upload, scratch.download, scratch.compute
    landed, reduced, fetched = scratch.landed, scratch.reduced, scratch.fetched
    dtype = numpy.dtype(own.dtype)
    device_in = [scratch.slots(("in", i), chunk, dtype, pinned=False) for i in range(len(children))]
    host_in = None if direct else [scratch.slots(("in", i), chunk, dtype, pinned=True) for i in range(len(children))]
    device_out = scratch.slots("out", chunk, dtype, pinned=False) if children and parent is not None else None
    host_out = scratch.slots("out", chunk, dtype, pinned=True) if parent is not None and not direct else None
    recvs, sends = {}, [None] * _DEPTH

    def post(c):
        if c < len(pieces):
            width, d = _width(pieces[c]), c % _DEPTH
            into = device_in if direct else host_in
            recvs[c] = [comm.Irecv(device.mpi_buffer(into[i][d][:width]) if direct else into[i][d][:width],
                                   child, _TAG) for i, child in enumerate(children)]

    def finish(c):
        """The host's part of chunk c, done while the device works on chunk c+1."""
        d, width = c % _DEPTH, _width(pieces[c])
        if parent is not None:
            if direct:
                if children:
                    device.synchronize(reduced[d])  # MPI reads the reduced chunk from the device
                source = device_out[d][:width] if children else own[pieces[c]]
                sends[d] = comm.Isend(device.mpi_buffer(source), parent, _TAG)
            else:
                device.synchronize(fetched[d])  # MPI reads the pinned copy of the chunk
                sends[d] = comm.Isend(host_out[d][:width], parent, _TAG)
        if children:
            # The receive buffers of slot d take chunk c+2 once chunk c has left them.
            device.synchronize(reduced[d] if direct else landed[d])
            post(c + _DEPTH)

    for c in range(_DEPTH):
        post(c)
    for c, s in enumerate(pieces):
        d, width = c % _DEPTH, _width(s)
        source = own[s]
        if children:
            MPI.Request.Waitall(recvs.pop(c))
            if not direct:
                device.wait(upload, reduced[d])  # the reduce of chunk c-2 has read the device slot
                for i in range(len(children)):
                    device.copy(device_in[i][d][:width], host_in[i][d][:width], upload)
                device.record(landed[d], upload)
                device.wait(compute, landed[d])  # the kernel reads what the copies wrote
            if parent is None:
                target = out[s]
            else:
                target = device_out[d][:width]
                if direct and sends[d] is not None:
                    sends[d].Wait()  # MPI has read chunk c-2 from the device slot
                elif not direct:
                    device.wait(compute, fetched[d])  # the copy of chunk c-2 has read the device slot
            device.reduce([target], [source] + [device_in[i][d][:width] for i in range(len(children))], op, compute)
            device.record(reduced[d], compute)
            source = target
        if parent is not None and not direct:
            if sends[d] is not None:
                sends[d].Wait()  # MPI has sent chunk c-2 from the pinned slot
            if children:
                device.wait(download, reduced[d])  # the copy reads the reduced chunk
            device.copy(host_out[d][:width], source, download)
            device.record(fetched[d], download)
        if c > 0:
            finish(c - 1)
    finish(len(pieces) - 1)
    MPI.Request.Waitall([r for r in sends if r is not None])


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
            recvs[c] = comm.Irecv(host[c % _DEPTH][:_width(pieces[c])], parent, _TAG)

    def finish(c):
        d, width = c % _DEPTH, _width(pieces[c])
        device.synchronize(moved[d])  # the root: MPI reads the pinned copy; the others: the slot is free
        if parent is None:
            sends[d] = [comm.Isend(host[d][:width], child, _TAG) for child in children]
        else:
            MPI.Request.Waitall(sends[d])
            post(c + _DEPTH)

    for c in range(_DEPTH):
        post(c)
    for c, s in enumerate(pieces):
        d, width = c % _DEPTH, _width(s)
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


def _width(piece):
    return piece.stop - piece.start
