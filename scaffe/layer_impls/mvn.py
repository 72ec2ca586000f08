"""MVN layer (Caffe's "MVN"): subtracts the mean and optionally divides by (std + eps), per item and
channel (or per item with across_channels). Backward uses Caffe's formula, which treats eps as 0."""
from scaffe.layer_impls import register
from scaffe.layer_impls.layer import Layer


@register
class MVNLayer(Layer):
    type = "MVN"
    capture_refusal_reason = None
    exact_num_bottom = 1
    exact_num_top = 1

    def setup(self, bottom, top):
        mp = self.param.mvn_param
        self.normalize_variance = bool(mp.normalize_variance)
        self.across_channels = bool(mp.across_channels)
        self.eps = float(mp.eps)

    def reshape(self, bottom, top):
        shape = bottom[0].shape
        groups = shape[0] if self.across_channels or len(shape) < 2 else shape[0] * shape[1]
        self.rows = (groups, -1)
        if top[0] is not bottom[0]:
            top[0].reshape(shape)

    def forward(self, bottom, top):
        x = bottom[0].data.reshape(self.rows)
        centered = x - x.mean(axis=1, keepdims=True, dtype=x.dtype)
        y = top[0].data.reshape(self.rows)
        if self.normalize_variance:
            var = (centered * centered).mean(axis=1, keepdims=True, dtype=x.dtype)
            self.std_eps = var ** x.dtype.type(0.5) + x.dtype.type(self.eps)
            y[...] = centered / self.std_eps
            self.y = y.copy()
        else:
            y[...] = centered

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        dy = top[0].diff.reshape(self.rows)
        dx = bottom[0].diff.reshape(self.rows)
        mean_dy = dy.mean(axis=1, keepdims=True, dtype=dy.dtype)
        if self.normalize_variance:
            mean_dyy = (dy * self.y).mean(axis=1, keepdims=True, dtype=dy.dtype)
            dx[...] = (dy - mean_dy - self.y * mean_dyy) / self.std_eps
        else:
            dx[...] = dy - mean_dy
