"""The values a modelled run's gradients and parameters must hold, known in advance, and their checks.

Rank r's gradient of learnable blob b in iteration t is (r + 1) + 256 * base(t, b), base(t, b) =
(t mod 3) * 61 + (b mod 61): integers, so any sum of up to a few hundred ranks is exact in float32 in any
order, and a stale iteration, another blob's values or a missing rank all change it. The update of
iteration t sets the blob to -(1 + (t mod 5) * 61 + (b mod 61)); before the first update every rank but
the root holds 0.5 until the root's parameters arrive. A check reads each array's least and largest
value: both must be what is expected.
"""
import numpy


class ModelCheckError(RuntimeError):
    """A modelled run's value is wrong, missing or stale: one line naming layer, piece, rank and iteration."""


def _base(iteration, pid):
    return (iteration % 3) * 61 + pid % 61


def gradient(rank, iteration, pid):
    return float(rank + 1 + 256 * _base(iteration, pid))


def gradient_sum(size, iteration, pid):
    return float(size * (size + 1) // 2 + 256 * size * _base(iteration, pid))


def parameter(iteration, pid):
    return float(-(1 + (iteration % 5) * 61 + pid % 61))


def initial_values(net):
    """The root's parameters of `net` (a ModelledNet) as if from iteration -1; the others' 0.5."""
    for pid, blob in enumerate(net.learnable_params):
        blob.data[...] = parameter(-1, pid) if net.rank == 0 else 0.5


def write_gradient(net, pid, iteration, passes):
    """Backward's gradient of blob `pid`: written in the first pass, added in the later ones (Caffe's
    iter_size accumulation)."""
    diff = net.learnable_params[pid].diff
    value = gradient(net.rank, iteration, pid)
    if passes == 0:
        diff.fill(value)
    else:
        diff += numpy.float32(value)


def check_parameters(net, pid, iteration):
    """Blob `pid`'s parameters must be those of the update of `iteration`."""
    data = net.learnable_params[pid].data
    expected = parameter(iteration, pid)
    low, high = float(data.min()), float(data.max())
    if low != expected or high != expected:
        raise ModelCheckError(
            f"layer '{net.owner[pid]}' blob {pid}: rank {net.rank} at iteration {net.iteration} holds parameters "
            f"in [{low:g}, {high:g}], expected {expected:g} (the update of iteration {iteration}): "
            f"{'stale' if _is_parameter(low, pid) else 'wrong or missing'}")


def check_gradient(net, pid, start, stop, diff, grad_scale, iteration, iter_size):
    """The reduced gradient `diff` of elements start:stop of blob `pid`, times `grad_scale`, must be the
    mean of the ranks' gradients of `iteration`."""
    expected = gradient_sum(net.size, iteration, pid) * iter_size / net.size
    low, high = float(diff.min()) * grad_scale, float(diff.max()) * grad_scale
    tolerance = 1e-5 * expected
    if abs(low - expected) > tolerance or abs(high - expected) > tolerance:
        raise ModelCheckError(
            f"layer '{net.owner[pid]}' blob {pid} piece [{start}, {stop}): the reduced gradient of iteration "
            f"{iteration} on rank {net.rank} is in [{low:g}, {high:g}], expected {expected:g}")


def _is_parameter(value, pid):
    return any(value == parameter(t, pid) for t in range(5))
