"""LSTMUnit layer (Caffe's "LSTMUnit"): one LSTM time step from the previous cell state, the gate inputs
[i', f', o', g'] and the sequence continuation flags; the step functions are shared with the LSTM layer.

    i = sigmoid(i'), f = cont * sigmoid(f'), o = sigmoid(o'), g = tanh(g')
    c = f * c_prev + i * g,  h = o * tanh(c)
"""
from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls.layer import Layer
from scaffe.layer_impls.sigmoid import sigmoid


def unit_forward(c_prev, gates, cont):
    """(c, h, acts) of one step for (N, D) c_prev, (N, 4D) gates and (N,) cont; `acts` is what
    unit_backward needs: the activated gates (i, f, o, g) and tanh(c)."""
    xp = get_array_module(gates)
    dim = c_prev.shape[-1]
    i = sigmoid(gates[:, :dim])
    # Caffe zeroes the forget gate where cont is 0 (rather than multiplying), so a NaN or inf there
    # in a fresh sequence's predecessor does not leak into it.
    f = xp.where(cont[:, None] == 0, 0, cont[:, None] * sigmoid(gates[:, dim:2 * dim])).astype(gates.dtype)
    o = sigmoid(gates[:, 2 * dim:3 * dim])
    g = xp.tanh(gates[:, 3 * dim:])
    c = f * c_prev + i * g
    tanh_c = xp.tanh(c)
    return c, o * tanh_c, (i, f, o, g, tanh_c)


def unit_backward(c_prev, acts, dc, dh):
    """(dc_prev, dgates) of one step from the gradients of its c and h outputs."""
    xp = get_array_module(dh)
    i, f, o, g, tanh_c = acts
    c_term = dc + dh * o * (1 - tanh_c * tanh_c)
    dgates = xp.concatenate([c_term * g * i * (1 - i),
                             c_term * c_prev * f * (1 - f),
                             dh * tanh_c * o * (1 - o),
                             c_term * i * (1 - g * g)], axis=1)
    return c_term * f, dgates


@register
class LSTMUnitLayer(Layer):
    """Bottoms: c_prev (1, N, D), gate inputs (1, N, 4D), cont (1, N). Tops: c and h, both (1, N, D)."""

    type = "LSTMUnit"
    exact_num_bottom = 3
    exact_num_top = 2

    def allow_force_backward(self, bottom_index):
        return bottom_index != 2

    def reshape(self, bottom, top):
        num = bottom[0].shape[1] if bottom[0].num_axes > 1 else None
        for k, blob in enumerate(bottom):
            axes = 2 if k == 2 else 3
            if blob.num_axes != axes or blob.shape[0] != 1 or blob.shape[1] != num:
                raise ValueError(f"layer {self.name!r}: bottom {k} has shape {blob.shape}; LSTMUnit needs c_prev "
                                 f"(1, N, D), gate inputs (1, N, 4D) and cont (1, N)")
        self.dim = bottom[0].shape[2]
        if bottom[1].shape[2] != 4 * self.dim:
            raise ValueError(f"layer {self.name!r}: gate inputs have {bottom[1].shape[2]} channels; "
                             f"4 x the cell size {self.dim} = {4 * self.dim} expected")
        top[0].reshape(bottom[0].shape)
        top[1].reshape(bottom[0].shape)

    def forward(self, bottom, top):
        c, h, self.acts = unit_forward(bottom[0].data[0], bottom[1].data[0], bottom[2].data[0])
        top[0].data[0] = c
        top[1].data[0] = h

    def backward(self, top, propagate_down, bottom):
        if propagate_down[2]:
            raise ValueError(f"layer {self.name!r}: LSTMUnit cannot backpropagate to the sequence indicators")
        if propagate_down[0] or propagate_down[1]:
            dc_prev, dgates = unit_backward(bottom[0].data[0], self.acts, top[0].diff[0], top[1].diff[0])
            bottom[0].diff[0] = dc_prev
            bottom[1].diff[0] = dgates
