"""LSTM layer (Caffe's "LSTM"): a long short-term memory over T steps, per step

    gates_t = W_hc (cont_t * h_{t-1}) + W_xc x_t + b_c [+ W_xc_static x_static]
    c_t, h_t = LSTMUnit(c_{t-1}, gates_t, cont_t)

with the gates ordered (i, f, o, g); the output is h. Parameters, in Caffe's order:
W_xc (4D, x size), b_c (4D), [W_xc_static (4D, x_static size)], W_hc (4D, D).
"""
from kernels.backend import get_array_module
from scaffe.layer_impls import register
from scaffe.layer_impls.lstm_unit import unit_backward, unit_forward
from scaffe.layer_impls.recurrent import RecurrentLayer, scaled_by_cont


@register
class LSTMLayer(RecurrentLayer):
    type = "LSTM"
    num_states = 2   # h and c, in Caffe's order of the exposed hidden blobs
    gate_multiple = 4

    def recurrent_params(self):
        return [((4 * self.dim, self.dim), self.param.recurrent_param.weight_filler)]

    def recur_forward(self, pre, cont, initial):
        w_hc = self.blobs[self.first_recurrent_param].data
        h, c = initial
        self.h_conted, self.c_prev, self.acts = [], [], []
        outputs = []
        for t in range(pre.shape[0]):
            h_conted = scaled_by_cont(h, cont[t])
            self.h_conted.append(h_conted)
            self.c_prev.append(c)
            c, h, acts = unit_forward(c, pre[t] + h_conted @ w_hc.T, cont[t])
            self.acts.append(acts)
            outputs.append(h)
        return get_array_module(pre).stack(outputs), [h, c]

    def recur_backward(self, d_outputs, cont, d_finals):
        xp = get_array_module(d_outputs)
        index = self.first_recurrent_param
        w_hc = self.blobs[index].data
        dh_next, dc_next = d_finals
        d_pre = [None] * len(self.acts)
        for t in reversed(range(len(self.acts))):
            dc_next, d_pre[t] = unit_backward(self.c_prev[t], self.acts[t], dc_next, d_outputs[t] + dh_next)
            dh_next = scaled_by_cont(d_pre[t] @ w_hc, cont[t])
        d_pre = xp.stack(d_pre)
        width = d_pre.shape[-1]
        self._add_param_grad(index, d_pre.reshape(-1, width).T @ xp.stack(self.h_conted).reshape(-1, self.dim))
        return d_pre, [dh_next, dc_next]
