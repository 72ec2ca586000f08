"""Tile layer (Caffe's "Tile"): repeats the blob `tiles` times along `axis`; backward sums the copies."""
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import canonical_axis, count
from scaffe.layer_impls.layer import Layer


@register
class TileLayer(Layer):
    type = "Tile"
    capture_refusal_reason = None
    exact_num_bottom = 1
    exact_num_top = 1

    def setup(self, bottom, top):
        self.tiles = int(self.param.tile_param.tiles)
        if self.tiles < 1:
            raise ValueError(f"layer {self.name!r}: tiles must be at least 1")

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        axis = canonical_axis(self.param.tile_param.axis, len(shape), self)
        self.outer, self.inner = count(shape, 0, axis), count(shape, axis)
        top[0].reshape(shape[:axis] + (shape[axis] * self.tiles,) + shape[axis + 1:])

    def forward(self, bottom, top):
        x = bottom[0].data.reshape(self.outer, 1, self.inner)
        top[0].data.reshape(self.outer, self.tiles, self.inner)[...] = x

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            dy = top[0].diff.reshape(self.outer, self.tiles, self.inner)
            bottom[0].diff.reshape(self.outer, self.inner)[...] = dy.sum(axis=1, dtype=dy.dtype)
