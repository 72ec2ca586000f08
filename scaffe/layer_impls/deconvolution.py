"""Deconvolution layer (Caffe's "Deconvolution"): a convolution run backwards, sharing ConvEngine.

Forward is the convolution's data-gradient pass (GEMM then col2im), backward's data gradient is a
convolution forward, and the weight gradient is the convolution's weight gradient with the roles of
input and output swapped. Weights are (input channels, num_output / group, kh, kw), as in Caffe.
"""
from kernels import blas
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import param_grad_wanted
from scaffe.layer_impls.convolution import _ConvolutionBase


@register
class DeconvolutionLayer(_ConvolutionBase):
    type = "Deconvolution"

    def capture_refusal(self):
        return blas.capture_refusal()  # its GEMMs (the im2col engine's)

    def weight_shape(self, channels):
        return (channels, self.num_output // self.group)

    def output_hw(self, height, width):
        (kh, kw), (ph, pw), (sh, sw), (dh, dw) = (self.engine.kernel, self.engine.pad, self.engine.stride,
                                                  self.engine.dilation)
        return (sh * (height - 1) + dh * (kh - 1) + 1 - 2 * ph,
                sw * (width - 1) + dw * (kw - 1) + 1 - 2 * pw)

    def forward(self, bottom, top):
        weight = self.blobs[0].data
        for b, t in zip(bottom, top):
            # In convolution terms the top is the image and the bottom is the convolution's output.
            self.engine.backward(t.data, weight, b.data, None, None, t.data)
            if self.bias_term:
                t.data += self.blobs[1].data.reshape(1, -1, 1, 1)

    def backward(self, top, propagate_down, bottom):
        weight = self.blobs[0].data
        weight_diff = self.blobs[0].diff if param_grad_wanted(self, 0) else None
        for i, (b, t) in enumerate(zip(bottom, top)):
            if self.bias_term and param_grad_wanted(self, 1):
                self.blobs[1].diff += t.diff.sum(axis=(0, 2, 3), dtype=t.diff.dtype)
            self.engine.columns_cached = False
            if propagate_down[i]:
                # Runs im2col(top diff) once; the weight gradient below reuses those columns when they fit.
                self.engine.forward(t.diff, weight, None, b.diff)
            if weight_diff is not None:
                self.engine.backward(t.diff, weight, b.data, weight_diff, None, None)
