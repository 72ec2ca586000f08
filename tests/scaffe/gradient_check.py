"""Finite-difference gradient checker for layers (the idea of Caffe's GradientChecker), in float64.

The layer's tops are contracted with fixed random weights R into a scalar objective
f = sum_t <R_t, top_t>; backward is run with top diffs R, and every checked bottom and parameter
element is compared with the central difference (f(x + h) - f(x - h)) / 2h. For a loss layer R_0 is
the (random) loss weight, which also checks that the gradient scales with it.

Layers run with float64 blobs, so the comparison is tight; a layer that needs one (in-place runs, or
state kept between forward and backward) gets a fresh forward before each backward-free evaluation.
"""
import numpy
from google.protobuf import text_format

from scaffe.blob import Blob
from scaffe.layer_impls import create_layer
from scaffe.proto import caffe_pb2


def layer_param(text):
    """A LayerParameter from prototxt text (the body of a `layer { ... }`)."""
    lp = caffe_pb2.LayerParameter()
    text_format.Parse(text, lp)
    return lp


class LayerHarness:
    """One layer wired to float64 blobs made from numpy arrays; bottoms are restored before each forward."""

    def __init__(self, param, bottoms, phase=caffe_pb2.TRAIN, num_tops=None, in_place=False, rng=None):
        if isinstance(param, str):
            param = layer_param(param)
        self.param = param
        self.inputs = [numpy.array(b, dtype=numpy.float64) for b in bottoms]
        self.bottoms = [Blob(b.shape, dtype=numpy.float64) for b in self.inputs]
        n_tops = num_tops if num_tops is not None else max(len(param.top), 1)
        if in_place:
            self.tops = [self.bottoms[0]] + [Blob((), dtype=numpy.float64) for _ in range(n_tops - 1)]
        else:
            self.tops = [Blob((), dtype=numpy.float64) for _ in range(n_tops)]
        self.layer = create_layer(param, phase)
        if rng is not None:
            self.layer.rng = rng
        self._restore()
        self.layer.setup(self.bottoms, self.tops)
        self.layer.reshape(self.bottoms, self.tops)

    def _restore(self):
        for blob, array in zip(self.bottoms, self.inputs):
            blob.data[...] = array

    def forward(self):
        self._restore()
        self.layer.reshape(self.bottoms, self.tops)
        self.layer.forward(self.bottoms, self.tops)
        return [t.data.copy() for t in self.tops]

    def backward(self, top_diffs, propagate_down):
        for t, d in zip(self.tops, top_diffs):
            t.diff[...] = d
        for blob in self.layer.blobs:
            blob.diff[...] = 0
        for i, b in enumerate(self.bottoms):
            if not (self.tops and b is self.tops[0]):
                # A layer must overwrite bottom gradients; NaN makes an accumulate-into bug visible.
                b.diff[...] = numpy.nan if propagate_down[i] else 0
        self.layer.backward(self.tops, propagate_down, self.bottoms)
        return [b.diff.copy() for b in self.bottoms], [p.diff.copy() for p in self.layer.blobs]


def check_gradients(param, bottoms, *, phase=caffe_pb2.TRAIN, check_bottoms=None, check_params=True,
                    num_tops=None, in_place=False, step=1e-5, tolerance=1e-6, seed=0, params=None,
                    outputs_only=None):
    """Checks a layer's analytic gradients against central differences; raises AssertionError on a mismatch.

    param: LayerParameter or its prototxt text. bottoms: numpy arrays. check_bottoms: indices of the
    bottoms to check (default all). params: optional arrays to load into the layer's blobs after setup.
    outputs_only: indices of tops that are outputs only, whose gradient the layer ignores (Caffe's
    softmax losses' probability top): they get weight 0 in the objective.
    Returns the harness, for further checks by the caller.
    """
    rng = numpy.random.default_rng(seed)
    harness = LayerHarness(param, bottoms, phase, num_tops, in_place)
    if params is not None:
        for blob, array in zip(harness.layer.blobs, params):
            blob.data[...] = array
    check_bottoms = list(range(len(bottoms))) if check_bottoms is None else list(check_bottoms)
    weights = _top_weights(harness, rng, outputs_only)

    def objective():
        return sum(float((w * t).sum()) for w, t in zip(weights, harness.forward()))

    propagate = [i in check_bottoms for i in range(len(bottoms))]
    harness.forward()
    bottom_grads, param_grads = harness.backward(weights, propagate)
    checks = [(bottom_grads[i], harness.inputs[i], f"bottom {i}") for i in check_bottoms]
    if check_params:
        checks += [(param_grads[k], blob.data, f"param blob {k}") for k, blob in enumerate(harness.layer.blobs)]
    for analytic, values, what in checks:
        numeric = _central_differences(objective, values, step)
        _assert_close(analytic.reshape(-1), numeric, tolerance, f"{_layer_label(harness)}: gradient of {what}")
    return harness


def _top_weights(harness, rng, outputs_only):
    """Random weights w of the objective sum(w * top): a scalar for a loss, 0 for output-only tops."""
    weights = [rng.standard_normal(t.shape) for t in harness.forward()]
    if harness.layer.is_loss():
        weights[0] = numpy.asarray(rng.uniform(0.5, 2.0))
    for k in outputs_only or ():
        weights[k] = numpy.zeros_like(weights[k])
    return weights


def _central_differences(objective, values, step):
    """d objective / d values, element by element, changing `values` in place and putting it back."""
    flat = values.reshape(-1)
    numeric = numpy.empty(flat.size)
    for e in range(flat.size):
        original = flat[e]
        flat[e] = original + step
        plus = objective()
        flat[e] = original - step
        minus = objective()
        flat[e] = original
        numeric[e] = (plus - minus) / (2 * step)
    return numeric


def _assert_close(analytic, numeric, tolerance, what):
    scale = numpy.maximum(1.0, numpy.maximum(numpy.abs(analytic), numpy.abs(numeric)))
    # Written as "not close" so that a NaN on either side counts as a mismatch.
    bad = ~(numpy.abs(analytic - numeric) <= tolerance * scale)
    if bad.any():
        e = int(numpy.argmax(bad))
        raise AssertionError(f"{what} wrong at flat index {e}: analytic {analytic[e]!r}, numeric {numeric[e]!r} "
                             f"({int(bad.sum())} of {bad.size} elements off)")


def _layer_label(harness):
    return f"{harness.param.type} ({harness.param.name or 'unnamed'})"
