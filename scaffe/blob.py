"""Blob: Caffe's N-d array pair (data and diff) living on numpy or cupy."""
import math
import os

import numpy

# Caffe's Blob::Reshape refuses more elements than an int holds ("blob size exceeds INT_MAX").
MAX_COUNT = 2 ** 31 - 1


class Blob:
    """Holds `data` and `diff` of one shape and dtype; `reshape` keeps storage when the size does not grow."""

    def __init__(self, shape=(), dtype=numpy.float32, xp=numpy):
        self.xp = xp
        self.dtype = numpy.dtype(dtype)
        self._capacity = 0
        self._data_store = None
        self._diff_store = None
        self.reshape(shape)

    def reshape(self, shape):
        shape = tuple(int(d) for d in shape)
        # math.prod of Python ints cannot overflow, as numpy's int64 product of huge sizes does.
        count = math.prod(shape)
        if count > self._capacity:
            self._check_size(shape, count)
            self._data_store = self.xp.zeros(count, dtype=self.dtype)
            self._diff_store = self.xp.zeros(count, dtype=self.dtype)
            self._capacity = count
        self.shape = shape
        self.count = count
        self.data = self._data_store[:count].reshape(shape)
        self.diff = self._diff_store[:count].reshape(shape)

    def _check_size(self, shape, count):
        """Refuses, before allocating, a size Caffe refuses or that the memory cannot hold (data and diff);
        the net's set-up adds the layer's name to the error."""
        if count > MAX_COUNT:
            raise ValueError(f"a blob of shape {shape} has {count:,} elements, more than Caffe's limit of "
                             f"{MAX_COUNT:,} (INT_MAX)")
        needed, memory = 2 * count * self.dtype.itemsize, _memory_bytes(self.xp)
        if needed > memory:
            raise ValueError(f"a blob of shape {shape} needs {needed / 2 ** 30:.1f} GiB (data and diff), more "
                             f"than the {memory / 2 ** 30:.1f} GiB of memory this machine has")

    def place(self, data_store, diff_store):
        """Keep data and diff in `data_store` and `diff_store` (flat views of this blob's size, into the
        solver's flat buffers); a reshape to the same count keeps them."""
        self._data_store, self._diff_store, self._capacity = data_store, diff_store, data_store.size
        self.data = data_store.reshape(self.shape)
        self.diff = diff_store.reshape(self.shape)

    def layout(self):
        """What device work captured into a CUDA graph relies on: the storage objects and the shape."""
        return self._data_store, self._diff_store, self.shape

    def reshape_like(self, other):
        self.reshape(other.shape)

    @property
    def num_axes(self):
        return len(self.shape)

    def canonical_axis(self, axis):
        """Caffe's CanonicalAxisIndex: negative axes count from the end; out of range is an error."""
        n = len(self.shape)
        if not -n <= axis < max(n, 1):
            raise ValueError(f"axis {axis} out of range for a blob of shape {self.shape}")
        return axis + n if axis < 0 else axis

    def count_range(self, start, end=None):
        end = len(self.shape) if end is None else end
        return int(numpy.prod(self.shape[start:end], dtype=numpy.int64))

    def share_data(self, other):
        """Makes this blob's data the other's (Caffe's ShareData, used by in-place and shared params)."""
        self.data = other.data

    def share_diff(self, other):
        self.diff = other.diff

    def __repr__(self):
        return f"Blob(shape={self.shape}, dtype={self.dtype})"


def _memory_bytes(xp):
    """All the memory blobs of module `xp` can live in: the current GPU's for cupy, the host's for numpy."""
    if xp is numpy:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(xp.cuda.Device().mem_info[1])
