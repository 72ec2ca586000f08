"""Recurrent layers' shared part (Caffe's RecurrentLayer, base of RNN and LSTM): the input and sequence
checks, the hidden state carried between batches or exposed as blobs, and the input transform.

Bottoms: x (T, N, ...), cont (T, N), optional x_static (N, ...), then with expose_hidden the initial
recurrent states (1, N, num_output) each. Tops: the output (T, N, num_output), then with expose_hidden
the final recurrent states. cont[t, n] = 0 starts a new sequence in stream n at step t.

Caffe unrolls the recurrence into an internal net of InnerProduct, Scale, Eltwise... layers; the math here
is the same, run as a loop over T with whole-batch matrix products. The parameter blobs come in the
order of that internal net, so a Caffe .caffemodel loads: W_x, b, [W_static], then the subclass's own.
Without expose_hidden the final states start the next batch (backpropagation stops at the batch edge);
with it, gradients flow into the initial-state bottoms and from the final-state tops, where Caffe
drops them (it shares only their data with the internal net).
"""
from kernels.backend import get_array_module
from scaffe.layer_impls._helpers import count, filled_blob, param_grad_wanted
from scaffe.layer_impls.layer import Layer


class RecurrentLayer(Layer):
    """Subclasses set `num_states` and implement `recurrent_params`, `recur_forward`, `recur_backward`."""

    num_states = 1
    min_num_bottom = 2
    min_num_top = 1
    gate_multiple = 1   # the input transform's width is gate_multiple x num_output

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1

    def setup(self, bottom, top):
        rp = self.param.recurrent_param
        self.dim = int(rp.num_output)
        if self.dim <= 0:
            raise ValueError(f"layer {self.name!r}: recurrent_param.num_output must be positive")
        self._check_sequence(bottom)
        self.steps = bottom[0].shape[0]
        self.expose_hidden = bool(rp.expose_hidden)
        exposed = self.num_states if self.expose_hidden else 0
        self.has_static = len(bottom) > 2 + exposed
        if len(bottom) != 2 + self.has_static + exposed or len(top) != 1 + exposed:
            raise ValueError(f"layer {self.name!r}: {self.type} takes x, cont, an optional x_static"
                             + (f" and {exposed} initial states" if exposed else "")
                             + f" as bottoms and {1 + exposed} tops; got {len(bottom)} bottoms, {len(top)} tops")
        width = self.gate_multiple * self.dim
        self.blobs = [filled_blob(self, (width, count(bottom[0].shape, 2)), bottom[0], rp.weight_filler),
                      filled_blob(self, (width,), bottom[0], rp.bias_filler)]
        if self.has_static:
            if bottom[2].num_axes < 1 or bottom[2].shape[0] != bottom[0].shape[1]:
                raise ValueError(f"layer {self.name!r}: x_static (bottom 2) has shape {bottom[2].shape}; "
                                 f"its first axis must be the number of streams {bottom[0].shape[1]}")
            self.blobs.append(filled_blob(self, (width, count(bottom[2].shape, 1)), bottom[0], rp.weight_filler))
        self.first_recurrent_param = len(self.blobs)
        self.blobs += [filled_blob(self, shape, bottom[0], filler) for shape, filler in self.recurrent_params()]
        self.state = None

    def _check_sequence(self, bottom):
        x, cont = bottom[0], bottom[1]
        if x.num_axes < 2:
            raise ValueError(f"layer {self.name!r}: bottom 0 has shape {x.shape}; it needs at least 2 axes "
                             f"(timesteps, streams, ...)")
        if cont.shape != x.shape[:2]:
            raise ValueError(f"layer {self.name!r}: cont (bottom 1) has shape {cont.shape}; "
                             f"(timesteps, streams) = {x.shape[:2]} expected")

    def reshape(self, bottom, top):
        self._check_sequence(bottom)
        if bottom[0].shape[0] != self.steps:
            raise ValueError(f"layer {self.name!r}: the number of timesteps changed from {self.steps} "
                             f"to {bottom[0].shape[0]}")
        streams = bottom[0].shape[1]
        state_shape = (1, streams, self.dim)
        top[0].reshape((self.steps, streams, self.dim))
        if self.expose_hidden:
            first = 2 + self.has_static
            for k in range(self.num_states):
                if bottom[first + k].shape != state_shape:
                    raise ValueError(f"layer {self.name!r}: initial state (bottom {first + k}) has shape "
                                     f"{bottom[first + k].shape}; {state_shape} expected")
                top[1 + k].reshape(state_shape)
        xp = get_array_module(bottom[0].data)
        if self.state is None or self.state[0].shape != (streams, self.dim):
            self.state = [xp.zeros((streams, self.dim), dtype=bottom[0].dtype) for _ in range(self.num_states)]

    def forward(self, bottom, top):
        w_x, bias = self.blobs[0].data, self.blobs[1].data
        steps, streams = self.steps, bottom[0].shape[1]
        self.x = bottom[0].data.reshape(steps * streams, -1)
        pre = (self.x @ w_x.T + bias).reshape(steps, streams, -1)
        if self.has_static:
            self.x_static = bottom[2].data.reshape(streams, -1)
            pre += self.x_static @ self.blobs[2].data.T
        if self.expose_hidden:
            initial = [b.data.reshape(streams, self.dim) for b in bottom[2 + self.has_static:]]
        else:
            initial = self.state
        self.cont = bottom[1].data
        outputs, finals = self.recur_forward(pre, self.cont, initial)
        top[0].data[...] = outputs
        if self.expose_hidden:
            for blob, final in zip(top[1:], finals):
                blob.data[0] = final
        else:
            self.state = finals

    def backward(self, top, propagate_down, bottom):
        if propagate_down[1]:
            raise ValueError(f"layer {self.name!r}: {self.type} cannot backpropagate to the sequence indicators")
        streams = bottom[0].shape[1]
        if self.expose_hidden:
            d_finals = [blob.diff.reshape(streams, self.dim) for blob in top[1:]]
        else:
            xp = get_array_module(top[0].diff)
            d_finals = [xp.zeros((streams, self.dim), dtype=top[0].dtype)] * self.num_states
        d_pre, d_initial = self.recur_backward(top[0].diff, self.cont, d_finals)
        d_pre_flat = d_pre.reshape(self.steps * streams, -1)
        self._add_param_grad(0, d_pre_flat.T @ self.x)
        self._add_param_grad(1, d_pre_flat.sum(axis=0, dtype=d_pre.dtype))
        if propagate_down[0]:
            bottom[0].diff.reshape(self.x.shape)[...] = d_pre_flat @ self.blobs[0].data
        if self.has_static:
            d_pre_static = d_pre.sum(axis=0, dtype=d_pre.dtype)
            self._add_param_grad(2, d_pre_static.T @ self.x_static)
            if propagate_down[2]:
                bottom[2].diff.reshape(self.x_static.shape)[...] = d_pre_static @ self.blobs[2].data
        if self.expose_hidden:
            first = 2 + self.has_static
            for k, grad in enumerate(d_initial):
                if propagate_down[first + k]:
                    bottom[first + k].diff[0] = grad

    def _add_param_grad(self, index, grad):
        if param_grad_wanted(self, index):
            self.blobs[index].diff += grad

    def recurrent_params(self):
        """[(shape, filler)] of the parameters after the input transform's, in Caffe's order."""
        raise NotImplementedError

    def recur_forward(self, pre, cont, initial):
        """(outputs (T, N, D), final states) from the transformed inputs `pre` (T, N, width), cont (T, N)
        and the initial states [(N, D)]; keeps what recur_backward needs."""
        raise NotImplementedError

    def recur_backward(self, d_outputs, cont, d_finals):
        """(d_pre, d_initial states) from the output and final-state gradients; adds the gradients of
        the subclass's own parameters (through _add_param_grad)."""
        raise NotImplementedError


def scaled_by_cont(h, cont_t):
    """Caffe's h_conted: the previous state times the continuation flag of each stream."""
    return h * cont_t[:, None]

