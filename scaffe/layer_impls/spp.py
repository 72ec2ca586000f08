"""SPP layer (Caffe's "SPP", spatial pyramid pooling): pools each map into 1, 2x2, 4x4, ... bins
(pyramid_height levels), flattens every level and concatenates them: a fixed-length output for any
input size. Level l uses kernel ceil(H / 2^l), stride = kernel and the padding that centres the bins."""
import math

from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls.layer import Layer
from scaffe.layer_impls.pooling import Pooler


def level_geometry(level, height, width):
    bins = 2 ** level
    kh, kw = math.ceil(height / bins), math.ceil(width / bins)
    ph, pw = (kh * bins - height + 1) // 2, (kw * bins - width + 1) // 2
    return (kh, kw), (ph, pw), (kh, kw)


@register
class SPPLayer(Layer):
    type = "SPP"
    capture_refusal_reason = None
    exact_num_bottom = 1
    exact_num_top = 1

    def setup(self, bottom, top):
        sp = self.param.spp_param
        self.height_levels = int(sp.pyramid_height)
        if self.height_levels < 1:
            raise ValueError(f"layer {self.name!r}: pyramid_height must be at least 1")
        self.method = sp.pool

    def reshape(self, bottom, top):
        if len(bottom[0].shape) != 4:
            raise ValueError(f"layer {self.name!r}: SPP needs 4-d (N, C, H, W) input, got {bottom[0].shape}")
        n_img, channels, height, width = bottom[0].shape
        self.poolers, self.sizes = [], []
        for level in range(self.height_levels):
            kernel, pad, stride = level_geometry(level, height, width)
            try:
                pooler = Pooler(self.method, kernel, pad, stride)
            except ValueError as e:
                raise ValueError(f"layer {self.name!r}: pyramid level {level} of a {height}x{width} input: {e}; "
                                 f"use fewer pyramid levels or a larger input") from None
            self.poolers.append(pooler)
            self.sizes.append(pooler.out_size(height, width))
        if self.height_levels == 1:
            # Caffe hands a one-level pyramid to a plain pooling layer, which keeps the 4-d shape.
            top[0].reshape((n_img, channels) + self.sizes[0])
        else:
            top[0].reshape((n_img, channels * sum(h * w for h, w in self.sizes)))

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        n_img, channels = bottom[0].shape[:2]
        out = top[0].data.reshape(n_img, -1)
        start = 0
        for pooler, size in zip(self.poolers, self.sizes):
            pooled = xp.empty((n_img, channels) + size, dtype=bottom[0].dtype)
            pooler.forward(bottom[0].data, pooled)
            width = pooled[0].size
            out[:, start:start + width] = pooled.reshape(n_img, -1)
            start += width

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        xp = get_array_module(top[0].diff)
        n_img, channels = bottom[0].shape[:2]
        dy = top[0].diff.reshape(n_img, -1)
        dx = bottom[0].diff
        part = xp.empty_like(dx)
        start = 0
        for level, (pooler, size) in enumerate(zip(self.poolers, self.sizes)):
            width = channels * size[0] * size[1]
            piece = xp.ascontiguousarray(dy[:, start:start + width]).reshape((n_img, channels) + size)
            pooler.backward(piece, dx if level == 0 else part)
            if level:
                dx += part
            start += width
