"""BatchNorm layer (Caffe's "BatchNorm"): per-channel normalization with running statistics, no scale/shift.

Caffe's semantics, which saved models depend on: three blobs, the running sum of means, the running
sum of (unbiased) variances, and the weight of those sums; TRAIN updates them during forward as
blob = moving_average_fraction * blob + batch statistic (blob2 accumulates the weights), and TEST
divides blobs 0 and 1 by blob 2. The blobs are not learned: setup appends `param { lr_mult: 0 }`
specs to this layer's LayerParameter, as Caffe does, and backward never writes their gradients.
"""
import numpy

from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import new_blob
from scaffe.layer_impls.layer import Layer
from scaffe.proto import caffe_pb2


@register
class BatchNormLayer(Layer):
    type = "BatchNorm"
    capture_refusal_reason = None
    exact_num_bottom = 1
    exact_num_top = 1

    def setup(self, bottom, top):
        p = self.param.batch_norm_param
        self.moving_average_fraction = float(p.moving_average_fraction)
        self.use_global_stats = (p.use_global_stats if p.HasField("use_global_stats")
                                 else self.phase == caffe_pb2.TEST)
        self.eps = float(p.eps)
        shape = bottom[0].shape
        self.channels = 1 if len(shape) == 1 else shape[1]
        self.blobs = [new_blob((self.channels,), bottom[0]), new_blob((self.channels,), bottom[0]),
                      new_blob((1,), bottom[0])]
        for i in range(3):
            if i == len(self.param.param):
                self.param.param.add().lr_mult = 0
            elif self.param.param[i].lr_mult != 0:
                raise ValueError(f"layer {self.name!r}: BatchNorm's statistics cannot be learned; "
                                 f"set lr_mult to 0 for its param {i} (or leave the param specs out)")

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if len(shape) > 1 and shape[1] != self.channels:
            raise ValueError(f"layer {self.name!r}: input has {shape[1]} channels, expected {self.channels}")
        if top[0] is not bottom[0]:
            top[0].reshape(shape)

    def _view(self, a):
        """(N, C, spatial) view of a blob's array."""
        n = a.shape[0] if a.ndim else 1
        return a.reshape(n, self.channels, -1)

    def forward(self, bottom, top):
        x = self._view(bottom[0].data)
        xp = get_array_module(x)
        t = x.dtype.type
        if self.use_global_stats:
            # Caffe's 1 / weight (0 for weight 0), computed where the blob lives: no host sync
            weight = self.blobs[2].data.reshape(-1)[0].astype(numpy.float64)
            factor = ((weight != 0) / xp.where(weight == 0, 1.0, weight)).astype(x.dtype)
            mean = self.blobs[0].data * factor
            var = self.blobs[1].data * factor
        else:
            mean = x.mean(axis=(0, 2), dtype=x.dtype)
        centered = x - mean.reshape(1, -1, 1)
        if not self.use_global_stats:
            var = (centered * centered).mean(axis=(0, 2), dtype=x.dtype)
            m = x.shape[0] * x.shape[2]
            maf = t(self.moving_average_fraction)
            self.blobs[2].data *= maf
            self.blobs[2].data += 1
            self.blobs[0].data[...] = maf * self.blobs[0].data + mean
            correction = t(m / (m - 1.0) if m > 1 else 1.0)
            self.blobs[1].data[...] = maf * self.blobs[1].data + correction * var
        self.std = xp.sqrt(var + t(self.eps)).reshape(1, -1, 1)
        y = self._view(top[0].data)
        xp.divide(centered, self.std, out=y)
        # The normalized values are needed by backward; in place, the top is overwritten by the next layer.
        self.x_norm = y.copy()

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = self._view(top[0].diff)
        dx = self._view(bottom[0].diff)
        if self.use_global_stats:
            get_array_module(dy).divide(dy, self.std, out=dx)
            return
        y = self.x_norm
        # dx = (dy - mean(dy) - mean(dy * y) * y) / std, means over batch and space (Caffe's formula).
        mean_dy = dy.mean(axis=(0, 2), keepdims=True, dtype=dy.dtype)
        mean_dyy = (dy * y).mean(axis=(0, 2), keepdims=True, dtype=dy.dtype)
        dx[...] = (dy - mean_dy - mean_dyy * y) / self.std
