"""MemoryData layer: batches cut from numpy arrays the caller hands over with `set_input_arrays`."""
import numpy

from scaffe.data.layer_support import copy_to_blob
from scaffe.layer_impls import register
from scaffe.layer_impls.layer import Layer


@register
class MemoryDataLayer(Layer):
    """Serves batch_size rows at a time from the arrays, wrapping around; no transformation.

    The arrays are used as given (no copy when they are already contiguous float32), so the caller
    must keep them unchanged while the layer uses them, as with Caffe's MemoryDataLayer::Reset.
    Sharding does not apply: each process passes its own arrays.
    """

    type = "MemoryData"
    exact_num_bottom = 0
    min_num_top = 1
    max_num_top = 2

    def setup(self, bottom, top):
        p = self.param.memory_data_param
        self.batch_size, self.channels, self.height, self.width = (
            int(p.batch_size), int(p.channels), int(p.height), int(p.width))
        if min(self.batch_size, self.channels, self.height, self.width) <= 0:
            raise ValueError(f"layer {self.name!r} (MemoryData): batch_size, channels, height and width "
                             "must be given and positive in memory_data_param")
        top[0].reshape((self.batch_size, self.channels, self.height, self.width))
        if len(top) > 1:
            top[1].reshape((self.batch_size,))
        self.data = None
        self.labels = None
        self.pos = 0

    def set_input_arrays(self, data, labels):
        """Uses `data` (N x C x H x W) and `labels` (N values) from the next forward on; N % batch_size == 0."""
        data = numpy.ascontiguousarray(data, dtype=numpy.float32)
        labels = numpy.ascontiguousarray(labels, dtype=numpy.float32).reshape(-1)
        where = f"layer {self.name!r} (MemoryData)"
        if data.ndim != 4 or data.shape[1:] != (self.channels, self.height, self.width):
            raise ValueError(f"{where}: data must be N x {self.channels} x {self.height} x {self.width}, "
                             f"got {data.shape}")
        if labels.shape[0] != data.shape[0]:
            raise ValueError(f"{where}: {data.shape[0]} samples but {labels.shape[0]} labels")
        if data.shape[0] == 0 or data.shape[0] % self.batch_size:
            raise ValueError(f"{where}: the number of samples ({data.shape[0]}) must be a positive "
                             f"multiple of batch_size ({self.batch_size})")
        self.data, self.labels, self.pos = data, labels, 0

    reset = set_input_arrays

    def set_batch_size(self, batch_size):
        if self.data is not None and self.data.shape[0] % batch_size:
            raise ValueError(f"layer {self.name!r} (MemoryData): {self.data.shape[0]} samples are not a "
                             f"multiple of the new batch_size {batch_size}")
        self.batch_size = int(batch_size)
        self.pos = 0

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        if self.data is None:
            raise RuntimeError(f"layer {self.name!r} (MemoryData): call set_input_arrays(data, labels) first")
        end = self.pos + self.batch_size
        copy_to_blob(top[0], self.data[self.pos:end])
        if len(top) > 1:
            copy_to_blob(top[1], self.labels[self.pos:end])
        self.pos = end % self.data.shape[0]

    def backward(self, top, propagate_down, bottom):
        pass
