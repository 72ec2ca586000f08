"""NeuronLayer: the base of element-wise layers (one bottom, one top of the same shape, in place allowed)."""
from kernels.backend import get_array_module
from scaffe.layer_impls.layer import Layer


class NeuronLayer(Layer):
    """Subclasses implement `compute(x, y)` and `gradient(x, y, dy, dx)` on arrays.

    `needs_input` says whether `gradient` reads x; when the layer runs in place x is overwritten by y,
    so a copy of x is kept from forward (Caffe does the same for the layers that need it).
    """

    exact_num_bottom = 1
    exact_num_top = 1
    needs_input = True

    def reshape(self, bottom, top):
        if top[0] is not bottom[0]:
            top[0].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        x = bottom[0].data
        if self.needs_input and top[0] is bottom[0]:
            xp = get_array_module(x)
            self._input = xp.array(x, copy=True)
            x = self._input
        self.compute(x, top[0].data)

    def backward(self, top, propagate_down, bottom):
        if not propagate_down[0]:
            return
        x = self._input if (self.needs_input and top[0] is bottom[0]) else bottom[0].data
        self.gradient(x, top[0].data, top[0].diff, bottom[0].diff)

    def compute(self, x, y):
        raise NotImplementedError

    def gradient(self, x, y, dy, dx):
        raise NotImplementedError
