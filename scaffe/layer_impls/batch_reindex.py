"""BatchReindex layer (Caffe's "BatchReindex"): top item i is bottom[0] item int(bottom[1][i]); indices may
repeat or leave items out, and backward sums the gradients of repeated items."""
import numpy

from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls.layer import Layer


@register
class BatchReindexLayer(Layer):
    type = "BatchReindex"
    exact_num_bottom = 2
    exact_num_top = 1

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1

    def reshape(self, bottom, top):
        if bottom[1].num_axes != 1:
            raise ValueError(f"layer {self.name!r}: the index blob (bottom 1) must have 1 axis, "
                             f"got shape {bottom[1].shape}")
        top[0].reshape(bottom[1].shape[:1] + bottom[0].shape[1:])

    def forward(self, bottom, top):
        # Caffe truncates the float indices toward zero.
        index = bottom[1].data.astype(numpy.int64)
        num = bottom[0].shape[0]
        if index.size and bool(((index < 0) | (index >= num)).any()):
            raise ValueError(f"layer {self.name!r}: reindex indices must lie in 0..{num - 1} "
                             f"(the batch size of bottom 0)")
        self.index = index
        top[0].data[...] = bottom[0].data[index]

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise ValueError(f"layer {self.name!r}: BatchReindex cannot backpropagate to its indices")
        if propagate_down[0]:
            diff = bottom[0].diff
            diff[...] = 0
            get_array_module(diff).add.at(diff, self.index, top[0].diff)
