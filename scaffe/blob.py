"""Blob: Caffe's N-d array pair (data and diff) living on numpy or cupy."""
import numpy


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
        count = int(numpy.prod(shape, dtype=numpy.int64)) if shape else 1
        if count > self._capacity:
            self._data_store = self.xp.zeros(count, dtype=self.dtype)
            self._diff_store = self.xp.zeros(count, dtype=self.dtype)
            self._capacity = count
        self.shape = shape
        self.count = count
        self.data = self._data_store[:count].reshape(shape)
        self.diff = self._diff_store[:count].reshape(shape)

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
