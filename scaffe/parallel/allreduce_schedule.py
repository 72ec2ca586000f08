"""The allreduce schedule: every rank updates; gradients are fused into buckets and allreduced.

Parameters are broadcast from the root once, at the first iteration, so all ranks start equal and
stay equal (same summed gradient, same update). During backward, finished gradients are packed into
the current bucket; a full bucket is allreduced at once (nonblocking) while backward goes on. Few
large messages beat many small ones: each collective pays a latency, and large ones take the
shared-memory path. Buckets live in `comm.alloc` memory where the communicator offers it.
"""
import numpy
from mpi4py import MPI

from scaffe.parallel.base import Schedule

BUCKET_BYTES = 4 << 20


class AllreduceSchedule(Schedule):
    def __init__(self, solver, comm, bucket_bytes=BUCKET_BYTES):
        super().__init__(solver, comm)
        self.bucket_bytes = bucket_bytes
        self._synced = False
        self._buckets = []       # [(flat buffer, [(pid, start, stop)], request)]
        self._pending = []       # pids waiting to be packed into the next bucket
        self._pending_bytes = 0
        self._storage = {}       # bucket index -> flat buffer, grown once and reused

    def on_start(self):
        self.passes = 0
        self._buckets = []
        self._pending, self._pending_bytes = [], 0
        if not self._synced:
            for blob in self.params:
                self.comm.Bcast(self.buffer(blob.data), root=self.root)
            self._synced = True

    def grads_ready(self, layer_id):
        if not self.last_pass():
            return
        for pid in self.net.grads_ready_at(layer_id):
            self._pending.append(pid)
            self._pending_bytes += self.params[pid].diff.nbytes
        if self._pending_bytes >= self.bucket_bytes or (layer_id == 0 and self._pending):
            self._launch()

    def _launch(self):
        dtype = self.params[self._pending[0]].diff.dtype
        count = sum(self.params[pid].diff.size for pid in self._pending)
        flat = self._bucket_buffer(len(self._buckets), count, dtype)
        layout, start = [], 0
        for pid in self._pending:
            diff = self.buffer(self.params[pid].diff)
            flat[start:start + diff.size] = diff
            layout.append((pid, start, start + diff.size))
            start += diff.size
        request = self.comm.Iallreduce(MPI.IN_PLACE, flat, op=MPI.SUM)
        self._buckets.append((flat, layout, request))
        self._pending, self._pending_bytes = [], 0

    def _bucket_buffer(self, index, count, dtype):
        buf = self._storage.get(index)
        if buf is None or buf.size < count or buf.dtype != dtype:
            alloc = getattr(self.comm, "alloc", None)
            buf = alloc((count,), dtype) if alloc is not None else numpy.empty(count, dtype)
            self._storage[index] = buf
        return buf[:count]

    def on_gradients_ready(self):
        if self._pending:
            self._launch()
        MPI.Request.Waitall([request for _, _, request in self._buckets])
        scale = numpy.float32(1.0 / self.size)
        for flat, layout, _ in self._buckets:
            for pid, start, stop in layout:
                diff = self.buffer(self.params[pid].diff)
                numpy.multiply(flat[start:stop], scale, out=diff)
        self._buckets = []
