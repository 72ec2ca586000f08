"""Filter layer (Caffe's "Filter"): keeps the items of bottoms 0..K-1 whose selector (the last bottom) is
non-zero; backward gives the kept items their top gradient and the dropped ones zero."""
from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls.layer import Layer


@register
class FilterLayer(Layer):
    type = "Filter"
    min_num_bottom = 2
    min_num_top = 1

    def setup(self, bottom, top):
        if len(top) != len(bottom) - 1:
            raise ValueError(f"layer {self.name!r}: Filter needs one top per filtered bottom "
                             f"({len(bottom) - 1}), got {len(top)}")
        self.selector_index = len(bottom) - 1
        # Caffe sizes the tops by the whole batch until the first selector is read.
        self.kept = None

    def allow_force_backward(self, bottom_index):
        return bottom_index != self.selector_index

    def reshape(self, bottom, top):
        selector = bottom[-1]
        if any(d != 1 for d in selector.shape[1:]):
            raise ValueError(f"layer {self.name!r}: the selector blob (last bottom) must be of shape (N, 1, ...), "
                             f"got {selector.shape}")
        for i, blob in enumerate(bottom[:-1]):
            if not blob.shape or blob.shape[0] != selector.shape[0]:
                raise ValueError(f"layer {self.name!r}: bottom {i} has shape {blob.shape}; every bottom needs the "
                                 f"selector's first dimension {selector.shape[0]}")
        if self.kept is None:
            self.kept = get_array_module(selector.data).arange(selector.shape[0])
            num_kept = selector.shape[0]
        else:
            # Reading the selector here is a host sync, as in Caffe: the top shapes depend on it.
            self.kept = get_array_module(selector.data).flatnonzero(selector.data.reshape(selector.shape[0]))
            num_kept = int(self.kept.size)
        for blob, out in zip(bottom[:-1], top):
            out.reshape((num_kept,) + blob.shape[1:])

    def forward(self, bottom, top):
        for blob, out in zip(bottom[:-1], top):
            out.data[...] = blob.data[self.kept]

    def backward(self, top, propagate_down, bottom):
        if propagate_down[-1]:
            raise ValueError(f"layer {self.name!r}: Filter cannot backpropagate to its selector (last bottom)")
        for blob, out, wanted in zip(bottom[:-1], top, propagate_down):
            if wanted:
                blob.diff[...] = 0
                blob.diff[self.kept] = out.diff
