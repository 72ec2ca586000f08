"""InnerProduct layer (Caffe's "InnerProduct"): y = x W^T + b over the axes from `axis` on, one GEMM; the
parameter gradients accumulate in one BLAS call each (kernels.blas)."""
from kernels import blas
from kernels.backend import get_array_module
from kernels.blas import add_column_sums, add_product, product
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import canonical_axis, count, filled_blob, param_grad_wanted
from scaffe.layer_impls.layer import Layer


@register
class InnerProductLayer(Layer):
    type = "InnerProduct"
    exact_num_bottom = 1
    exact_num_top = 1

    def capture_refusal(self):
        return blas.capture_refusal()

    def setup(self, bottom, top):
        ip = self.param.inner_product_param
        self.num_output = int(ip.num_output)
        if self.num_output <= 0:
            raise ValueError(f"layer {self.name!r}: num_output must be positive")
        self.bias_term = bool(ip.bias_term)
        self.transpose = bool(ip.transpose)
        self.axis = canonical_axis(ip.axis, len(bottom[0].shape), self)
        self.k = count(bottom[0].shape, self.axis)
        # Caffe stores (num_output, K), or (K, num_output) with transpose: true.
        shape = (self.k, self.num_output) if self.transpose else (self.num_output, self.k)
        self.blobs = [filled_blob(self, shape, bottom[0], ip.weight_filler)]
        if self.bias_term:
            self.blobs.append(filled_blob(self, (self.num_output,), bottom[0], ip.bias_filler))

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        if count(shape, self.axis) != self.k:
            raise ValueError(f"layer {self.name!r}: input size {count(shape, self.axis)} (from shape {shape}) "
                             f"does not match the weights' {self.k}")
        top[0].reshape(shape[:self.axis] + (self.num_output,))

    def _weight_t(self):
        """The weight as (K, num_output), a view either way."""
        w = self.blobs[0].data
        return w if self.transpose else w.T

    def _ones(self, dy):
        """A vector of ones as long as the batch, where `dy` lives (the bias gradient's GEMV), kept."""
        ones = getattr(self, "_batch_ones", None)
        if ones is None or ones.shape[0] != dy.shape[0] or ones.dtype != dy.dtype or type(ones) is not type(dy):
            ones = self._batch_ones = get_array_module(dy).ones(dy.shape[0], dtype=dy.dtype)
        return ones

    def forward(self, bottom, top):
        x = bottom[0].data.reshape(-1, self.k)
        y = top[0].data.reshape(-1, self.num_output)
        product(y, x, self._weight_t())
        if self.bias_term:
            y += self.blobs[1].data

    def backward(self, top, propagate_down, bottom):
        dy = top[0].diff.reshape(-1, self.num_output)
        x = bottom[0].data.reshape(-1, self.k)
        if param_grad_wanted(self, 0):
            if self.transpose:
                add_product(self.blobs[0].diff, x, dy, trans_a=True)
            else:
                add_product(self.blobs[0].diff, dy, x, trans_a=True)
        if self.bias_term and param_grad_wanted(self, 1):
            add_column_sums(self.blobs[1].diff, dy, self._ones(dy))
        if propagate_down[0]:
            product(bottom[0].diff.reshape(-1, self.k), dy, self._weight_t(), trans_b=True)
