"""The registration cache of peers' memory: one per device per process, shared by every communicator.

Opening a CUDA IPC handle maps the peer's allocation (tens of microseconds), so an allocation a peer has
shown us stays mapped: a training loop reduces the same buffers every step and pays for the mapping once.
A mapping is kept under its allocation's (exporting process, base address) and remembers the handle it
was opened from. A peer that frees a buffer and allocates another at the same address (numba, cupy
without a pool and PyTorch's caching allocator do) exports a new handle for it: the stale mapping is
closed before the new one is opened, since CUDA refuses to map an address range that is still mapped
(cudaErrorAlreadyMapped). The least recently used mappings are closed beyond `capacity`.
"""
import collections

import numpy

_caches = {}  # Device -> PeerMemory


def of(device):
    """The registration cache of `device` in this process."""
    cache = _caches.get(device)
    if cache is None:
        cache = _caches[device] = PeerMemory(device)
    return cache


class PeerMemory:
    """Views of other processes' memory on one `device`, from what they exported."""

    def __init__(self, device, capacity=256):
        self.device = device
        self.capacity = capacity  # well above the 2 buffers per local rank that one call maps
        self._opened = collections.OrderedDict()  # (pid, base) -> (handle bytes, what device.open returned)
        self.opens = 0  # how many handles were actually opened (the tests check the cache with it)

    def view(self, pid, base, handle, offset, count, dtype):
        """A view of `count` `dtype` elements at `offset` in process `pid`'s allocation at `base`."""
        key, handle = (pid, base), bytes(handle)
        entry = self._opened.get(key)
        if entry is not None and entry[0] != handle:
            del self._opened[key]
            self.device.close(entry[1])  # the peer's address now holds another allocation
            entry = None
        if entry is None:
            entry = self._opened[key] = (handle, self.device.open(handle))
            self.opens += 1
            while len(self._opened) > self.capacity:
                self.device.close(self._opened.popitem(last=False)[1][1])
        else:
            self._opened.move_to_end(key)
        return self.device.view(entry[1], offset, count, numpy.dtype(dtype))

    def close(self):
        while self._opened:
            self.device.close(self._opened.popitem()[1][1])
