"""The allreduce schedule: every rank updates; gradients are fused into buckets and allreduced.

Parameters are broadcast from the root once, at the first iteration, so all ranks start equal and
stay equal (same summed gradient, same update). During backward, finished gradients are packed into
the current bucket; a full bucket is allreduced at once (nonblocking) while backward goes on. Few
large messages beat many small ones: each collective pays a latency, and large ones take the
shared-memory path. Buckets live in `comm.alloc` memory where the communicator offers it.

Stop/snapshot requests ride in the last bucket: each rank appends one 0/1 flag per effect, and the
summed flags (exact in any float type) tell every rank, after the same Waitall, what any rank asked.

On a GPU the buckets are device buffers of the gradients' own array module, packed on the compute
stream; each bucket's Iallreduce starts once an event after its packing has completed (see
scaffe.parallel.streams). The flags then travel in a small host Iallreduce of their own, after the
last bucket: reading them from a device bucket would make the host wait for the device.
"""
import numpy
from mpi4py import MPI


from scaffe.parallel.base import Schedule
from scaffe.solvers.signals import requests_from_flags

BUCKET_BYTES = 4 << 20


class AllreduceSchedule(Schedule):
    def __init__(self, solver, comm, bucket_bytes=BUCKET_BYTES):
        super().__init__(solver, comm)
        self.bucket_bytes = bucket_bytes
        self._buckets = []       # [(flat buffer, [(pid, start, stop)], request)]
        self._pending = []       # pids waiting to be packed into the next bucket
        self._pending_bytes = 0
        self._pending_layers = []  # the layers whose backward gave them (what the timeline shows)
        self._storage = {}       # bucket index -> flat buffer, grown once and reused
        self._flags = None       # the final bucket's request flags (host flags on a GPU), once launched
        self._flags_request = None  # on a GPU: the Iallreduce of the host flags

    def on_start(self):
        self.passes = 0
        self._buckets = []
        self._pending, self._pending_bytes, self._pending_layers = [], 0, []
        self._flags = self._flags_request = None
        self.sync_once()

    def grads_ready(self, layer_id):
        if not self.last_pass():
            return
        for pid in self.net.grads_ready_at(layer_id):
            self._pending.append(pid)
            self._pending_bytes += self.params[pid].diff.nbytes
            self._pending_layers.append(layer_id)
        final = layer_id == self.final_grads_layer
        if self._pending_bytes >= self.bucket_bytes or final:
            self._launch(final)

    def _launch(self, final=False):
        xp = self.xp
        dtype = self.params[self._pending[0]].diff.dtype if self._pending else numpy.float32
        count = sum(self.params[pid].diff.size for pid in self._pending)
        flags_inside = final and xp is numpy
        flat = self._bucket_buffer(len(self._buckets), count + (self.flag_count if flags_inside else 0), dtype)
        layout, start = [], 0
        for pid in self._pending:
            diff = self.buffer(self.params[pid].diff)
            flat[start:start + diff.size] = diff
            layout.append((pid, start, start + diff.size))
            start += diff.size
        if flags_inside:
            self._flags = flat[count:]
            self._flags[:] = self.local_flags()
        label = ("gradients", tuple(dict.fromkeys(self._pending_layers))) if self._pending else None
        request = self.order.start(lambda stream: self.comm.Iallreduce(MPI.IN_PLACE, flat, op=MPI.SUM, stream=stream),
                                   after=self.order.mark(), label=label)
        self._buckets.append((flat, layout, request))
        self._pending, self._pending_bytes, self._pending_layers = [], 0, []
        if final and not flags_inside:
            self._flags = numpy.array(self.local_flags(), numpy.int32)
            self._flags_request = self.order.start(  # host flags: nothing to order after
                lambda _: self.comm.Iallreduce(MPI.IN_PLACE, self._flags, op=MPI.SUM))

    def _bucket_buffer(self, index, count, dtype):
        """Bucket `index`'s buffer, grown when too small and kept: host buckets live in the communicator's
        shared memory where it offers it, device buckets are of the gradients' own array module."""
        buf = self._storage.get(index)
        if buf is None or buf.size < count or buf.dtype != dtype:
            alloc = getattr(self.comm, "alloc", None) if self.xp is numpy else None
            buf = alloc((count,), dtype) if alloc is not None else self.xp.empty(count, dtype)
            self._storage[index] = buf
        return buf[:count]

    def on_gradients_ready(self):
        if self._flags is None:  # a net without gradients still agrees on requests
            self._launch(final=True)
        self.wait_all([request for _, _, request in self._buckets] + [self._flags_request], "gradients")
        self.agreed = requests_from_flags(self._flags)
        scale = numpy.float32(1.0 / self.size)
        for flat, layout, _ in self._buckets:
            for pid, start, stop in layout:
                diff = self.buffer(self.params[pid].diff)
                self.xp.multiply(flat[start:stop], scale, out=diff)
        self._buckets = []
