"""LRN layer (Caffe's "LRN"): local response normalization across or within channels (kernels/lrn.py)."""
from kernels.lrn import lrn_backward, lrn_forward
from scaffe.layer_impls import register
from scaffe.layer_impls.layer import Layer


@register
class LRNLayer(Layer):
    type = "LRN"
    capture_refusal_reason = None
    exact_num_bottom = 1
    exact_num_top = 1

    def setup(self, bottom, top):
        p = self.param.lrn_param
        self.size, self.alpha, self.beta, self.k = int(p.local_size), float(p.alpha), float(p.beta), float(p.k)
        self.region = int(p.norm_region)
        if self.size % 2 != 1:
            raise ValueError(f"layer {self.name!r}: LRN only supports odd local_size, got {self.size}")

    def reshape(self, bottom, top):
        if len(bottom[0].shape) != 4:
            raise ValueError(f"layer {self.name!r}: LRN needs 4-d (N, C, H, W) input, got {bottom[0].shape}")
        if top[0] is bottom[0]:
            raise ValueError(f"layer {self.name!r}: LRN cannot run in place")
        top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        _, self.scale = lrn_forward(bottom[0].data, self.size, self.alpha, self.beta, self.k, self.region,
                                    y=top[0].data)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            lrn_backward(bottom[0].data, top[0].data, self.scale, top[0].diff, self.size, self.alpha, self.beta,
                         self.region, dx=bottom[0].diff)
