"""pycaffe's views of blobs: `BlobView` (caffe.Blob) over one Blob, `BlobVec` (a layer's `blobs`) over a list."""
import collections.abc

import numpy

from scaffe.blob import Blob


class BlobView:
    """pycaffe's Blob: `data` and `diff` arrays (write into them with `[...] =`), `shape`, `count`,
    `num`/`channels`/`height`/`width` and `reshape(*shape)`, over a Blob of the net."""

    __slots__ = ("_blob",)

    def __init__(self, blob):
        self._blob = blob

    @property
    def data(self):
        return self._blob.data

    @property
    def diff(self):
        return self._blob.diff

    @property
    def shape(self):
        return self._blob.shape

    @property
    def count(self):
        return self._blob.count

    def _axis(self, i):
        # Caffe's legacy accessors: axes past the blob's own count as 1.
        return self._blob.shape[i] if i < len(self._blob.shape) else 1

    num = property(lambda self: self._axis(0))
    channels = property(lambda self: self._axis(1))
    height = property(lambda self: self._axis(2))
    width = property(lambda self: self._axis(3))

    def reshape(self, *shape):
        """`blob.reshape(n, c, h, w)` like pycaffe (a single tuple works too); call `net.reshape()` after."""
        if len(shape) == 1 and not numpy.isscalar(shape[0]):
            shape = tuple(shape[0])
        self._blob.reshape(shape)

    def __repr__(self):
        return f"BlobView(shape={self.shape})"


class BlobVec(collections.abc.Sequence):
    """pycaffe's BlobVec: a layer's parameter blobs as BlobViews, and `add_blob(*shape)` to make a new one.

    It views `blobs`, a list of Blobs that the net also holds, so what a Python layer adds is saved,
    loaded, shared and updated by the solver like any layer's parameters. New blobs take the array
    module and dtype of the net's blobs (numpy or cupy, float32 or float64), set before the layer's setup.
    """

    def __init__(self, blobs, xp=numpy, dtype=numpy.float32):
        self.blobs = blobs
        self.xp = xp
        self.dtype = dtype

    def add_blob(self, *shape):
        """Appends a zero-filled blob of `shape` (integers, as Caffe's BlobVec.add_blob)."""
        self.blobs.append(Blob(tuple(int(d) for d in shape), dtype=self.dtype, xp=self.xp))

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [BlobView(b) for b in self.blobs[index]]
        return BlobView(self.blobs[index])

    def __len__(self):
        return len(self.blobs)

    def __repr__(self):
        return f"BlobVec({[b.shape for b in self.blobs]})"
