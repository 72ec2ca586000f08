"""numpy twins of the solvers' fused update kernels (kernels/cuda_sources.py, scaffe_<solver>_update), line by line:
each reads its elements `i`, computes in the kernel's type T and stores them back at `i`."""
import inspect

import numpy

from cupy._twins import twin
from kernels.cuda_sources import from_device


def _update(name):
    """Registers `body(t, g, local_rate, scalars..., h0[, h1])` -> step, with the common prologue and epilogue;
    the histories are passed as element values and the body returns their new values after the step."""
    def register(body):
        def run(i, data, diff, lr_mult, decay_mult, rate, grad_scale, weight_decay, l1, **rest):
            histories = {k: v for k, v in rest.items() if k.startswith("h")}
            scalars = {k: v for k, v in rest.items() if not k.startswith("h")}
            t = data.dtype.type
            x = data.reshape(-1)[i]
            g = diff.reshape(-1)[i] * t(grad_scale)
            local_decay = t(weight_decay) * _at(decay_mult, i)
            g = numpy.where(local_decay != 0, g + local_decay * (numpy.sign(x) if l1 else x), g)
            local_rate = t(rate) * _at(lr_mult, i)
            step, *updated = body(t, g, local_rate, **scalars, **{k: h.reshape(-1)[i] for k, h in histories.items()})
            for history, values in zip(histories.values(), updated):
                history.reshape(-1)[i] = values
            diff.reshape(-1)[i] = step
            data.reshape(-1)[i] = x - step
        own = [p for p in inspect.signature(body).parameters if p not in ("t", "g", "local_rate")
               and not p.startswith("h")]

        def run_from_device(i, data, diff, lr_mult, decay_mult, scalars, l1, **histories):
            rate, grad_scale, weight_decay, *values = scalars
            run(i, data, diff, lr_mult, decay_mult, rate, grad_scale, weight_decay, l1, **dict(zip(own, values)),
                **histories)
        twin(from_device(name))(run_from_device)
        return twin(name)(run)
    return register


def _at(array, i):
    return array.reshape(-1)[i]


@_update("scaffe_sgd_update")
def _sgd(t, g, local_rate, momentum, h0):
    h0 = t(momentum) * h0 + local_rate * g
    return h0, h0


@_update("scaffe_nesterov_update")
def _nesterov(t, g, local_rate, momentum, h0):
    previous = h0
    h0 = t(momentum) * h0 + local_rate * g
    return (t(1) + t(momentum)) * h0 - t(momentum) * previous, h0


@_update("scaffe_adagrad_update")
def _adagrad(t, g, local_rate, delta, h0):
    h0 = h0 + g * g
    return local_rate * (g / (numpy.sqrt(h0) + t(delta))), h0


@_update("scaffe_rmsprop_update")
def _rmsprop(t, g, local_rate, rms_decay, delta, h0):
    h0 = t(rms_decay) * h0 + (t(1) - t(rms_decay)) * (g * g)
    return local_rate * (g / (numpy.sqrt(h0) + t(delta))), h0


@_update("scaffe_adadelta_update")
def _adadelta(t, g, local_rate, momentum, delta, h0, h1):
    h0 = t(momentum) * h0 + (t(1) - t(momentum)) * (g * g)
    scaled = g * numpy.sqrt((h1 + t(delta)) / (h0 + t(delta)))
    h1 = t(momentum) * h1 + (t(1) - t(momentum)) * (scaled * scaled)
    return local_rate * scaled, h0, h1


@_update("scaffe_adam_update")
def _adam(t, g, local_rate, beta1, beta2, correction, delta, h0, h1):
    h0 = t(beta1) * h0 + (t(1) - t(beta1)) * g
    h1 = t(beta2) * h1 + (t(1) - t(beta2)) * (g * g)
    return (local_rate * t(correction)) * (h0 / (numpy.sqrt(h1) + t(delta))), h0, h1
