"""Scale layer (Caffe's "Scale"): multiplies by a learned blob or a second bottom, optionally adds a bias.

Broadcasting follows Bias (see bias.py). Blobs: [scale, bias] with one bottom, [bias] with two bottoms
and bias_term, as in Caffe. Backward needs the input, so a copy is kept when the layer runs in place.
"""
from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import filled_blob, param_grad_wanted
from scaffe.layer_impls.bias import broadcast_axes, operand_blob_shape, reduce_to_operand
from scaffe.layer_impls.layer import Layer
from scaffe.proto import caffe_pb2


@register
class ScaleLayer(Layer):
    type = "Scale"
    capture_refusal_reason = None
    min_num_bottom = 1
    max_num_bottom = 2
    exact_num_top = 1

    def setup(self, bottom, top):
        sp = self.param.scale_param
        self.blobs = []
        if len(bottom) == 1:
            shape = operand_blob_shape(self, bottom[0].shape, sp.axis, sp.num_axes)
            if sp.HasField("filler"):
                filler = sp.filler
            else:
                # Caffe's default scale is 1, not the generic filler's 0.
                filler = caffe_pb2.FillerParameter(type="constant", value=1.0)
            self.blobs.append(filled_blob(self, shape, bottom[0], filler))
        self.bias_term = bool(sp.bias_term)
        if self.bias_term:
            scale_shape = self.blobs[0].shape if len(bottom) == 1 else bottom[1].shape
            filler = sp.bias_filler if sp.HasField("bias_filler") else None
            self.blobs.append(filled_blob(self, scale_shape, bottom[0], filler))
        self.bias_index = len(self.blobs) - 1 if self.bias_term else None

    def _scale(self, bottom):
        return bottom[1] if len(bottom) > 1 else self.blobs[0]

    def reshape(self, bottom, top):
        s = self._scale(bottom)
        self.dims = broadcast_axes(self, bottom[0].shape, s.shape, self.param.scale_param.axis)
        if self.bias_term and self.blobs[self.bias_index].shape != s.shape:
            raise ValueError(f"layer {self.name!r}: the bias has shape {self.blobs[self.bias_index].shape}, "
                             f"the scale {s.shape}")
        if top[0] is not bottom[0]:
            top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        outer, dim, inner = self.dims
        x = bottom[0].data.reshape(outer, dim, inner)
        if top[0] is bottom[0]:
            self._input = x.copy()
        y = top[0].data.reshape(outer, dim, inner)
        xp.multiply(x, self._scale(bottom).data.reshape(1, dim, 1), out=y)
        if self.bias_term:
            y += self.blobs[self.bias_index].data.reshape(1, dim, 1)

    def backward(self, top, propagate_down, bottom):
        outer, dim, inner = self.dims
        dy = top[0].diff.reshape(outer, dim, inner)
        if self.bias_term and param_grad_wanted(self, self.bias_index):
            bias = self.blobs[self.bias_index]
            bias.diff += reduce_to_operand(dy).reshape(bias.shape)
        scale = self._scale(bottom)
        scale_is_param = len(bottom) == 1
        if (param_grad_wanted(self, 0) if scale_is_param else propagate_down[1]):
            x = self._input if top[0] is bottom[0] else bottom[0].data.reshape(outer, dim, inner)
            grad = reduce_to_operand(dy * x).reshape(scale.shape)
            if scale_is_param:
                scale.diff += grad
            else:
                scale.diff[...] = grad
        if propagate_down[0]:
            xp = get_array_module(dy)
            xp.multiply(dy, scale.data.reshape(1, dim, 1), out=bottom[0].diff.reshape(outer, dim, inner))
