"""Crop layer (Caffe's "Crop"): cuts the first bottom to the second's shape from `axis` on, at `offset`.

The second bottom only supplies a shape: it never gets a gradient (Caffe leaves it at zero).
"""
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import canonical_axis
from scaffe.layer_impls.layer import Layer


@register
class CropLayer(Layer):
    type = "Crop"
    capture_refusal_reason = None
    exact_num_bottom = 2
    exact_num_top = 1

    def reshape(self, bottom, top):
        cp = self.param.crop_param
        shape, ref = bottom[0].shape, bottom[1].shape
        if len(shape) != len(ref):
            raise ValueError(f"layer {self.name!r}: bottoms must have the same number of axes, got {shape} and {ref}")
        start = canonical_axis(cp.axis, len(shape), self)
        offsets = list(cp.offset)
        if len(offsets) > 1 and len(offsets) != len(shape) - start:
            raise ValueError(f"layer {self.name!r}: give one offset, or one per cropped axis "
                             f"({len(shape) - start}), got {len(offsets)}")
        index, out = [], []
        for i in range(len(shape)):
            if i < start:
                index.append(slice(None))
                out.append(shape[i])
                continue
            off = 0 if not offsets else int(offsets[0] if len(offsets) == 1 else offsets[i - start])
            if shape[i] - off < ref[i]:
                raise ValueError(f"layer {self.name!r}: axis {i} of size {shape[i]} cannot be cropped to "
                                 f"{ref[i]} at offset {off}")
            index.append(slice(off, off + ref[i]))
            out.append(ref[i])
        self.index = tuple(index)
        top[0].reshape(out)

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data[self.index]

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = 0
            bottom[0].diff[self.index] = top[0].diff
        if propagate_down[1]:
            bottom[1].diff[...] = 0
