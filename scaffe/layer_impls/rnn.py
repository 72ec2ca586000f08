"""RNN layer (Caffe's "RNN"): a simple recurrent net over T steps, per step

    h_t = tanh(W_hh (cont_t * h_{t-1}) + W_xh x_t + b_h [+ W_xh_static x_static])
    o_t = tanh(W_ho h_t + b_o)

The output is o. Parameters, in Caffe's order: W_xh (D, x size), b_h (D), [W_xh_static (D, x_static
size)], W_hh (D, D), W_ho (D, D), b_o (D).
"""
from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls.recurrent import RecurrentLayer, scaled_by_cont


@register
class RNNLayer(RecurrentLayer):
    type = "RNN"
    num_states = 1

    def recurrent_params(self):
        rp = self.param.recurrent_param
        square = (self.dim, self.dim)
        return [(square, rp.weight_filler), (square, rp.weight_filler), ((self.dim,), rp.bias_filler)]

    def recur_forward(self, pre, cont, initial):
        xp = get_array_module(pre)
        w_hh, w_ho, b_o = (b.data for b in self.blobs[self.first_recurrent_param:])
        (h,) = initial
        self.h_conted, hidden = [], []
        for t in range(pre.shape[0]):
            h_conted = scaled_by_cont(h, cont[t])
            self.h_conted.append(h_conted)
            h = xp.tanh(pre[t] + h_conted @ w_hh.T)
            hidden.append(h)
        self.hidden = xp.stack(hidden)
        self.outputs = xp.tanh(self.hidden @ w_ho.T + b_o)
        return self.outputs, [h]

    def recur_backward(self, d_outputs, cont, d_finals):
        xp = get_array_module(d_outputs)
        index = self.first_recurrent_param
        w_hh, w_ho = self.blobs[index].data, self.blobs[index + 1].data
        d_out_pre = (d_outputs * (1 - self.outputs * self.outputs)).reshape(-1, self.dim)
        hidden_flat = self.hidden.reshape(-1, self.dim)
        self._add_param_grad(index + 1, d_out_pre.T @ hidden_flat)
        self._add_param_grad(index + 2, d_out_pre.sum(axis=0, dtype=d_out_pre.dtype))
        d_hidden = (d_out_pre @ w_ho).reshape(self.hidden.shape)
        (dh_next,) = d_finals
        d_pre = [None] * len(self.h_conted)
        for t in reversed(range(len(self.h_conted))):
            d_pre[t] = (d_hidden[t] + dh_next) * (1 - self.hidden[t] * self.hidden[t])
            dh_next = scaled_by_cont(d_pre[t] @ w_hh, cont[t])
        d_pre = xp.stack(d_pre)
        self._add_param_grad(index, d_pre.reshape(-1, self.dim).T @ xp.stack(self.h_conted).reshape(-1, self.dim))
        return d_pre, [dh_next]
