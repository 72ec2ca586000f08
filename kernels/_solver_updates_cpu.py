"""The solvers' fused update steps on the CPU: numba twins of the `scaffe_<solver>_update` CUDA kernels
(kernels/cuda_sources.py), keyed by the same names, compiled once per host and loaded without numba
(kernels.native) by kernels/solver_updates.py, for scaffe.solvers.fused.

Each makes one pass over a run of elements of a single learnable blob where the per-blob pipeline of
scaffe.solvers.sgd makes five or six over the whole blob, with a temporary array for most of them
(the time it saves: perf/RESULTS.md, "CPU solver steps as one pass per blob").
The arithmetic is the CUDA kernels', in their order and in the blob's type T: every scalar arrives as a
T (`one` too: an integer literal would promote float32 arithmetic to float64), numba does not contract
a * b + c into a fused multiply-add without fastmath, and numpy.sqrt and / round as IEEE says, so a step
equals the per-blob pipeline's bit for bit (tests/scaffe/test_gpu_training.py,
test_cpu_fused_step_equals_the_per_blob_pipeline). The blob's lr_mult and
decay_mult come folded into `local_rate` and `local_decay`, computed by the caller once per blob.
The scalars arrive in one array of T, `s`: one, scale, local_decay, local_rate, then the solver's own
(kernels/solver_updates.py writes them); h1 is the second history, where the solver keeps one.
"""
import numpy
from numba import njit, types

from kernels._views import view


@njit(inline="always")
def _gradient(x, d, scale, local_decay, l1):
    """The gradient after scaling and weight decay (the kernels' prologue)."""
    g = d * scale
    if local_decay != 0:
        g += local_decay * (numpy.sign(x) if l1 else x)
    return g


@njit(inline="always")
def _apply(data, diff, i, x, step):
    """Keep the step in diff and subtract it from data (the kernels' epilogue)."""
    diff[i] = step
    data[i] = x - step


@njit(nogil=True)
def _sgd(data, diff, s, l1, h0, h1, first, last):
    scale, local_decay, local_rate = s[1], s[2], s[3]
    momentum = s[4]
    for i in range(first, last):
        x = data[i]
        g = _gradient(x, diff[i], scale, local_decay, l1)
        step = momentum * h0[i] + local_rate * g
        h0[i] = step
        _apply(data, diff, i, x, step)


@njit(nogil=True)
def _nesterov(data, diff, s, l1, h0, h1, first, last):
    one, scale, local_decay, local_rate = s[0], s[1], s[2], s[3]
    momentum = s[4]
    for i in range(first, last):
        x = data[i]
        g = _gradient(x, diff[i], scale, local_decay, l1)
        previous = h0[i]
        h = momentum * previous + local_rate * g
        h0[i] = h
        step = (one + momentum) * h - momentum * previous
        _apply(data, diff, i, x, step)


@njit(nogil=True)
def _adagrad(data, diff, s, l1, h0, h1, first, last):
    scale, local_decay, local_rate = s[1], s[2], s[3]
    delta = s[4]
    for i in range(first, last):
        x = data[i]
        g = _gradient(x, diff[i], scale, local_decay, l1)
        h = h0[i] + g * g
        h0[i] = h
        step = local_rate * (g / (numpy.sqrt(h) + delta))
        _apply(data, diff, i, x, step)


@njit(nogil=True)
def _rmsprop(data, diff, s, l1, h0, h1, first, last):
    one, scale, local_decay, local_rate = s[0], s[1], s[2], s[3]
    rms_decay, delta = s[4], s[5]
    for i in range(first, last):
        x = data[i]
        g = _gradient(x, diff[i], scale, local_decay, l1)
        h = rms_decay * h0[i] + (one - rms_decay) * (g * g)
        h0[i] = h
        step = local_rate * (g / (numpy.sqrt(h) + delta))
        _apply(data, diff, i, x, step)


@njit(nogil=True)
def _adadelta(data, diff, s, l1, h0, h1, first, last):
    one, scale, local_decay, local_rate = s[0], s[1], s[2], s[3]
    momentum, delta = s[4], s[5]
    for i in range(first, last):
        x = data[i]
        g = _gradient(x, diff[i], scale, local_decay, l1)
        gh = momentum * h0[i] + (one - momentum) * (g * g)
        scaled = g * numpy.sqrt((h1[i] + delta) / (gh + delta))
        h0[i] = gh
        h1[i] = momentum * h1[i] + (one - momentum) * (scaled * scaled)
        step = local_rate * scaled
        _apply(data, diff, i, x, step)


@njit(nogil=True)
def _adam(data, diff, s, l1, h0, h1, first, last):
    one, scale, local_decay, local_rate = s[0], s[1], s[2], s[3]
    beta1, beta2, correction, delta = s[4], s[5], s[6], s[7]
    for i in range(first, last):
        x = data[i]
        g = _gradient(x, diff[i], scale, local_decay, l1)
        m = beta1 * h0[i] + (one - beta1) * g
        v = beta2 * h1[i] + (one - beta2) * (g * g)
        h0[i] = m
        h1[i] = v
        step = (local_rate * correction) * (m / (numpy.sqrt(v) + delta))
        _apply(data, diff, i, x, step)


STEPS = {"scaffe_sgd_update": _sgd, "scaffe_nesterov_update": _nesterov, "scaffe_adagrad_update": _adagrad,
         "scaffe_rmsprop_update": _rmsprop, "scaffe_adadelta_update": _adadelta, "scaffe_adam_update": _adam}


def update(name, dtype):
    """The update step `name` on elements [first, last) of `count` elements of `dtype`."""
    like, step = numpy.empty(0, dtype), STEPS[name]

    def entry(data, diff, scalars, scalar_count, l1, h0, h1, count, first, last):
        step(view(data, like, count), view(diff, like, count), view(scalars, like, scalar_count), l1 != 0,
             view(h0, like, count), view(h1, like, count), first, last)
    return entry, (types.int64,) * 10
