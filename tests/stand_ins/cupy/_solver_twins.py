"""numpy twins of the solvers' fused update kernels (scaffe.solvers.fused and each solver's body), line by line."""
import numpy

from cupy._twins import twin


def _gradient(data, diff, lr_mult, decay_mult, rate, grad_scale, weight_decay, l1):
    """The common prologue: (g, local_rate)."""
    t = data.dtype.type
    g = diff * t(grad_scale)
    local_decay = t(weight_decay) * decay_mult
    g = numpy.where(local_decay != 0, g + local_decay * (numpy.sign(data) if l1 else data), g)
    return g, t(rate) * lr_mult


def _apply(data, diff, step):
    diff[...] = step
    data -= step


def _update(name):
    def register(body):
        def run(i, data, diff, lr_mult, decay_mult, rate, grad_scale, weight_decay, l1, **rest):
            g, local_rate = _gradient(data, diff, lr_mult, decay_mult, rate, grad_scale, weight_decay, l1)
            _apply(data, diff, body(data.dtype.type, g, local_rate, **rest))
        return twin(name)(run)
    return register


@_update("scaffe_sgd_update")
def _sgd(t, g, local_rate, momentum, h0):
    h0[...] = t(momentum) * h0 + local_rate * g
    return h0.copy()


@_update("scaffe_nesterov_update")
def _nesterov(t, g, local_rate, momentum, h0):
    previous = h0.copy()
    h0[...] = t(momentum) * h0 + local_rate * g
    return (t(1) + t(momentum)) * h0 - t(momentum) * previous


@_update("scaffe_adagrad_update")
def _adagrad(t, g, local_rate, delta, h0):
    h0 += g * g
    return local_rate * (g / (numpy.sqrt(h0) + t(delta)))


@_update("scaffe_rmsprop_update")
def _rmsprop(t, g, local_rate, rms_decay, delta, h0):
    h0[...] = t(rms_decay) * h0 + (t(1) - t(rms_decay)) * (g * g)
    return local_rate * (g / (numpy.sqrt(h0) + t(delta)))


@_update("scaffe_adadelta_update")
def _adadelta(t, g, local_rate, momentum, delta, h0, h1):
    h0[...] = t(momentum) * h0 + (t(1) - t(momentum)) * (g * g)
    scaled = g * numpy.sqrt((h1 + t(delta)) / (h0 + t(delta)))
    h1[...] = t(momentum) * h1 + (t(1) - t(momentum)) * (scaled * scaled)
    return local_rate * scaled


@_update("scaffe_adam_update")
def _adam(t, g, local_rate, beta1, beta2, correction, delta, h0, h1):
    h0[...] = t(beta1) * h0 + (t(1) - t(beta1)) * g
    h1[...] = t(beta2) * h1 + (t(1) - t(beta2)) * (g * g)
    return (local_rate * t(correction)) * (h0 / (numpy.sqrt(h1) + t(delta)))
