"""Im2col layer (Caffe's "Im2col"): the patches a convolution would see, as channels.

Top (N, C*kh*kw, oh, ow), channel c*kh*kw + i*kw + j holding kernel tap (i, j) of input channel c.
"""
from kernels.geometry import conv_output_size
from kernels.im2col import col2im, im2col
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import spatial_geometry
from scaffe.layer_impls.layer import Layer


@register
class Im2colLayer(Layer):
    type = "Im2col"
    capture_refusal_reason = None
    exact_num_bottom = 1
    exact_num_top = 1

    def setup(self, bottom, top):
        self.kernel, self.pad, self.stride, self.dilation = spatial_geometry(self.param.convolution_param, self)

    def reshape(self, bottom, top):
        if len(bottom[0].shape) != 4:
            raise ValueError(f"layer {self.name!r}: Im2col needs 4-d (N, C, H, W) input, got {bottom[0].shape}")
        n_img, channels, height, width = bottom[0].shape
        oh = conv_output_size(height, self.kernel[0], self.pad[0], self.stride[0], self.dilation[0])
        ow = conv_output_size(width, self.kernel[1], self.pad[1], self.stride[1], self.dilation[1])
        top[0].reshape((n_img, channels * self.kernel[0] * self.kernel[1], oh, ow))

    def forward(self, bottom, top):
        col = im2col(bottom[0].data, self.kernel, self.pad, self.stride, self.dilation)
        n_img, rows = top[0].shape[:2]
        top[0].data.reshape(n_img, rows, -1)[...] = col.transpose(1, 0, 2)

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            n_img, rows = top[0].shape[:2]
            col = top[0].diff.reshape(n_img, rows, -1).transpose(1, 0, 2).copy()
            col2im(col, bottom[0].shape, self.kernel, self.pad, self.stride, self.dilation, out=bottom[0].diff)
