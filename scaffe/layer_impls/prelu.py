"""PReLU layer (Caffe's "PReLU"): max(x, 0) + a_c * min(x, 0) with a learned slope per channel (or shared)."""
from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import filled_blob, param_grad_wanted
from scaffe.layer_impls.layer import Layer
from scaffe.proto import caffe_pb2


@register
class PReLULayer(Layer):
    type = "PReLU"
    capture_refusal_reason = None
    exact_num_bottom = 1
    exact_num_top = 1

    def setup(self, bottom, top):
        pp = self.param.prelu_param
        if len(bottom[0].shape) < 2:
            raise ValueError(f"layer {self.name!r}: PReLU needs at least 2 axes (N, C, ...), got {bottom[0].shape}")
        self.channel_shared = bool(pp.channel_shared)
        self.channels = bottom[0].shape[1]
        filler = pp.filler if pp.HasField("filler") else caffe_pb2.FillerParameter(type="constant", value=0.25)
        # Caffe's shared slope is a blob with no axes.
        shape = () if self.channel_shared else (self.channels,)
        self.blobs = [filled_blob(self, shape, bottom[0], filler)]

    def reshape(self, bottom, top):
        if bottom[0].shape[1] != self.channels:
            raise ValueError(f"layer {self.name!r}: input has {bottom[0].shape[1]} channels, expected {self.channels}")
        if top[0] is not bottom[0]:
            top[0].reshape(bottom[0].shape)

    def _views(self, a):
        return a.reshape(a.shape[0], self.channels, -1)

    def _slope(self):
        s = self.blobs[0].data
        return s.reshape(1, 1, 1) if self.channel_shared else s.reshape(1, -1, 1)

    def forward(self, bottom, top):
        xp = get_array_module(bottom[0].data)
        x = self._views(bottom[0].data)
        if top[0] is bottom[0]:
            self._input = x.copy()
        self._views(top[0].data)[...] = xp.maximum(x, 0) + self._slope() * xp.minimum(x, 0)

    def backward(self, top, propagate_down, bottom):
        x = self._input if top[0] is bottom[0] else self._views(bottom[0].data)
        dy = self._views(top[0].diff)
        negative = x <= 0
        if param_grad_wanted(self, 0):
            grad = (dy * x * negative).sum(axis=(0, 2), dtype=dy.dtype)
            self.blobs[0].diff += grad.sum() if self.channel_shared else grad
        if propagate_down[0]:
            xp = get_array_module(dy)
            self._views(bottom[0].diff)[...] = dy * xp.where(negative, self._slope(), dy.dtype.type(1))
