"""The registration cache of peers' memory: each IPC handle is opened once and kept, as MVAPICH2-GDR does.

Opening a CUDA IPC handle maps the peer's allocation (tens of microseconds, and it may be opened only once
per process), so every allocation a peer has shown us stays mapped, keyed by its handle: a training loop
reduces the same buffers every step and pays for the mapping once. A handle names one allocation for its
whole life, so a key cannot go stale; the least recently used mappings are closed beyond `capacity`.
"""
import collections

import numpy


class PeerMemory:
    """Views of other processes' memory on one `device`, from (handle, offset) pairs they exported."""

    def __init__(self, device, capacity=256):
        self.device = device
        self.capacity = capacity  # well above the 2 buffers per local rank that one call maps
        self._opened = collections.OrderedDict()  # handle bytes -> what device.open returned
        self.opens = 0  # how many handles were actually opened (the tests check the cache with it)

    def view(self, handle, offset, count, dtype):
        handle = bytes(handle)
        opened = self._opened.get(handle)
        if opened is None:
            opened = self.device.open(handle)
            self.opens += 1
            self._opened[handle] = opened
            while len(self._opened) > self.capacity:
                self.device.close(self._opened.popitem(last=False)[1])
        else:
            self._opened.move_to_end(handle)
        return self.device.view(opened, offset, count, numpy.dtype(dtype))

    def close(self):
        while self._opened:
            self.device.close(self._opened.popitem()[1])
