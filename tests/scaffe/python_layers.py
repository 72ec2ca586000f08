"""Layers written in Python for the tests of the "Python" layer type (python_param { module: "python_layers" }).

Tests put this folder on sys.path (mpiexec jobs on PYTHONPATH), as Caffe users put their layer modules.
"""
import scaffe


class MultiplyLayer(scaffe.Layer):
    """top = value * bottom, the value read from param_str."""

    def setup(self, bottom, top):
        self.value = float(self.param_str)

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = self.value * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = self.value * top[0].diff


class EuclideanLossLayer(scaffe.Layer):
    """The built-in EuclideanLoss in Python: sum((a - b)^2) / (2 N), gradients into both bottoms."""

    def setup(self, bottom, top):
        if len(bottom) != 2:
            raise ValueError("EuclideanLossLayer needs two bottoms")

    def reshape(self, bottom, top):
        if bottom[0].count != bottom[1].count:
            raise ValueError("EuclideanLossLayer: bottoms must have the same count")
        top[0].reshape()

    def forward(self, bottom, top):
        self.diff = bottom[0].data - bottom[1].data.reshape(bottom[0].data.shape)
        top[0].data[...] = (self.diff * self.diff).sum() / bottom[0].num / 2.0

    def backward(self, top, propagate_down, bottom):
        scale = top[0].diff / bottom[0].num
        for i, sign in ((0, 1.0), (1, -1.0)):
            if propagate_down[i]:
                bottom[i].diff[...] = (sign * scale * self.diff).reshape(bottom[i].data.shape)


class BiasLayer(scaffe.Layer):
    """top = bottom + b with one learnable value per channel (axis 1), made with blobs.add_blob."""

    def setup(self, bottom, top):
        self.blobs.add_blob(bottom[0].channels)
        self.blobs[0].data[...] = 0.5

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def _per_channel(self, bottom):
        return self.blobs[0].data.reshape((1, -1) + (1,) * (len(bottom[0].shape) - 2))

    def forward(self, bottom, top):
        top[0].data[...] = bottom[0].data + self._per_channel(bottom)

    def backward(self, top, propagate_down, bottom):
        axes = tuple(i for i in range(len(top[0].shape)) if i != 1)
        self.blobs[0].diff[...] += top[0].diff.sum(axis=axes)
        if propagate_down[0]:
            bottom[0].diff[...] = top[0].diff


class PhaseLayer(scaffe.Layer):
    """A scalar top holding the net's phase."""

    def reshape(self, bottom, top):
        top[0].reshape()

    def forward(self, bottom, top):
        top[0].data[()] = self.phase


class FailingSetupLayer(scaffe.Layer):
    def setup(self, bottom, top):
        raise KeyError("raised by the layer's own setup")


class NotALayer:
    pass


class ForgetsBaseInitLayer(scaffe.Layer):
    def __init__(self, param):
        self.value = 1
