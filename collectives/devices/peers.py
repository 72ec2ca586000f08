"""The registration cache of peers' memory: one per device per process, shared by every communicator.

Opening a CUDA IPC handle maps the peer's allocation (tens of microseconds), so an allocation a peer has
shown us stays mapped: a training loop reduces the same buffers every step and pays for the mapping once.
A mapping is kept under its allocation's (exporting process, base address) and remembers the handle it
was opened from and the allocation's size. A peer that frees buffers and allocates others where they
were (numba, cupy without a pool and PyTorch's caching allocator do) exports new handles for them, at the
same base or at one whose range covers freed ones: every mapping of that peer whose range the new
allocation overlaps is stale and is closed before the new one is opened, since CUDA refuses to map a
range that is still mapped (cudaErrorAlreadyMapped). Should CUDA refuse all the same (it maps some
allocations by larger regions), every mapping of that peer is closed and the open tried once more, as
UCX's CUDA IPC cache does. The least recently used mappings are closed beyond `capacity`. `closes`
counts every close: a plan holding mapped pointers is valid only while it has not moved.

A cache lives as long as the communicators that use it (`use`, `release`): when the last of them is freed,
every mapping is closed, so peers' memory is not held mapped by a process that has stopped communicating.

The communicators of a process share their device's cache (the S-Caffe schedule's two run their calls
from two progress threads), so whoever maps views and runs work reading them holds `lock` from the
mapping (or the check of `closes`) to the end of that work: no thread closes a mapping while another's
kernel may read it. The lock guards this process's own work only: never wait for another process under it.
"""
import collections
import threading

import numpy

_caches = {}  # Device -> PeerMemory
_users_lock = threading.Lock()  # counts of users change only under it


def of(device):
    """The registration cache of `device` in this process."""
    cache = _caches.get(device)
    if cache is None:
        cache = _caches.setdefault(device, PeerMemory(device))  # two threads asking first get one cache
    return cache


def use(device):
    """The registration cache of `device`, for one more user (a communicator) until it calls `release`."""
    cache = of(device)
    with _users_lock:
        cache.users += 1
    return cache


def release(cache):
    """One user of `cache` is done with it; when it was the last, every mapping is closed (a later user maps
    what it needs again)."""
    with _users_lock:
        cache.users -= 1
        last = cache.users == 0
    if last:
        with cache.lock:  # no kernel of this process reads a mapping while it closes
            cache.close()


class PeerMemory:
    """Views of other processes' memory on one `device`, from what they exported (callers hold `lock`)."""

    def __init__(self, device, capacity=1024):
        self.device = device
        self.capacity = capacity  # a training step's buffers, 2 per peer rank and call, with room to spare
        self.lock = threading.Lock()
        self._opened = collections.OrderedDict()  # (pid, base) -> (handle bytes, size, what device.open returned)
        self.opens = 0  # how many handles were actually opened (the tests check the cache with it)
        self.closes = 0
        self.users = 0  # communicators using the cache (see `use`)

    def view(self, pid, base, size, handle, offset, count, dtype):
        """A view of `count` `dtype` elements at `offset` in process `pid`'s allocation of `size` bytes at
        `base`, which it exported as `handle`."""
        key, handle = (pid, base), bytes(handle)
        entry = self._opened.get(key)
        if entry is None or entry[0] != handle:
            entry = self._open(pid, base, size, handle)
        else:
            self._opened.move_to_end(key)
        return self.device.view(entry[2], offset, count, numpy.dtype(dtype))

    def _open(self, pid, base, size, handle):
        end = base + max(size, 1)
        self._close_where(lambda p, b, s: p == pid and b < end and base < b + max(s, 1))  # stale: freed
        try:
            opened = self.device.open(handle)
        except Exception as error:
            if "AlreadyMapped" not in str(error):  # cupy's and the stand-in's cudaErrorAlreadyMapped
                raise
            self._close_where(lambda p, b, s: p == pid)
            opened = self.device.open(handle)
        entry = self._opened[(pid, base)] = (handle, size, opened)
        self.opens += 1
        while len(self._opened) > self.capacity:
            self._close(next(iter(self._opened)))
        return entry

    def _close_where(self, stale):
        for key in [(p, b) for (p, b), (_, s, _) in self._opened.items() if stale(p, b, s)]:
            self._close(key)

    def _close(self, key):
        self.device.close(self._opened.pop(key)[2])
        self.closes += 1

    def close(self):
        self._close_where(lambda *_: True)
