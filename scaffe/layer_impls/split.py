"""Split layer (Caffe's "Split", inserted by the net where one blob feeds several layers).

Forward copies the bottom to every top (Caffe shares the memory instead; a copy keeps each top an
independent Blob, which in-place consumers rely on); backward sums the tops' gradients.
"""
from scaffe.layer_impls import register
from scaffe.layer_impls.layer import Layer


@register
class SplitLayer(Layer):
    type = "Split"
    capture_refusal_reason = None
    exact_num_bottom = 1
    min_num_top = 1

    def reshape(self, bottom, top):
        for t in top:
            if t is bottom[0]:
                raise ValueError(f"layer {self.name!r}: a Split cannot run in place")
            t.reshape(bottom[0].shape)

    def forward(self, bottom, top):
        for t in top:
            t.data[...] = bottom[0].data

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dx = bottom[0].diff
        if len(top) == 1:
            dx[...] = top[0].diff
            return
        # Summed in top order, like Caffe's caffe_add chain, so float32 results match bit for bit.
        dx[...] = top[0].diff + top[1].diff
        for t in top[2:]:
            dx += t.diff
