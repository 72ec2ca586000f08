"""Pinned, double-buffered upload of host batches to the GPU, run by a data layer's prefetch thread.

A batch goes host -> page-locked buffer -> device on a stream of its own, in the prefetch thread, so the
copy overlaps the training step and runs at full bus speed (a copy from pageable memory is staged by the
driver and blocks). Each slot holds one batch's pinned and device buffers; a slot is refilled only once
the training stream has copied its batch out (an event), so neither buffer is overwritten while in use,
and the training stream waits on the slot's upload event before reading it: no host synchronisation.
"""
import queue

import numpy

__all__ = ["DeviceUploader"]


class _Slot:
    def __init__(self, xp):
        self.xp = xp
        self.pinned, self.device = [], []
        self.uploaded = xp.cuda.Event(disable_timing=True)
        self.consumed = xp.cuda.Event(disable_timing=True)

    def _buffers(self, k, like):
        if k == len(self.pinned) or self.pinned[k].shape != like.shape or self.pinned[k].dtype != like.dtype:
            memory = self.xp.cuda.alloc_pinned_memory(max(like.nbytes, 1))
            buffers = (numpy.frombuffer(memory, like.dtype, like.size).reshape(like.shape),
                       self.xp.empty(like.shape, dtype=like.dtype))
            if k == len(self.pinned):
                self.pinned.append(buffers[0])
                self.device.append(buffers[1])
            else:
                self.pinned[k], self.device[k] = buffers
        return self.pinned[k], self.device[k]

    def load(self, arrays, stream):
        for k, host in enumerate(arrays):
            pinned, device = self._buffers(k, host)
            pinned[...] = host
            device.set(pinned, stream=stream)
        self.uploaded.record(stream)


class DeviceUploader:
    """`upload(arrays)` in the producer thread returns a slot; `deliver(slot, blobs)` in the training
    thread copies it into the blobs on the current stream. At most `slots` batches are in flight."""

    def __init__(self, xp, slots=2):
        self.xp = xp
        self.device_id = xp.cuda.Device().id  # cupy's current device is per thread
        self.stream = xp.cuda.Stream(non_blocking=True)
        self._free = queue.Queue()
        for _ in range(max(2, slots)):
            self._free.put(_Slot(xp))

    def upload(self, arrays):
        slot = self._free.get()
        if slot is None:
            raise RuntimeError("the device uploader was closed")
        with self.xp.cuda.Device(self.device_id):
            slot.consumed.synchronize()  # its last batch was copied out, so its upload is done too
            slot.load(arrays, self.stream)
        return slot

    def deliver(self, slot, blobs):
        stream = self.xp.cuda.get_current_stream()
        stream.wait_event(slot.uploaded)
        for blob, device in zip(blobs, slot.device):
            if tuple(blob.shape) != device.shape:
                blob.reshape(device.shape)
            blob.data[...] = device
        slot.consumed.record(stream)
        self._free.put(slot)

    def close(self):
        """Wakes a producer waiting for a free slot; it then fails instead of uploading."""
        self._free.put(None)
