"""Caffe's weight fillers (constant, uniform, gaussian, xavier, msra, positive_unitball, bilinear).

The distributions and their parameters follow Caffe's filler.hpp; the random streams do not
(Caffe uses Boost's generators), so a seeded run gives the same *kind* of weights as Caffe, not
the same numbers. Values are drawn on the host in float64 and then cast to the blob's dtype and
moved to its device, so a filler gives identical weights on CPU and GPU for the same rng.
"""
import math

import numpy

from scaffe.proto import caffe_pb2

__all__ = ["fill", "fill_array", "fan_in_out", "FILLER_TYPES"]


def fan_in_out(shape):
    """(fan_in, fan_out) as Caffe computes them for N-d blobs.

    fan_in = count / shape[0] (inputs feeding one output unit), fan_out = count / shape[1]; for a
    1-d blob fan_out is the whole count. A convolution's (out, in, kh, kw) weight thus has
    fan_in = in*kh*kw and fan_out = out*kh*kw.
    """
    count = int(numpy.prod(shape, dtype=numpy.int64)) if len(shape) else 1
    if not len(shape) or count == 0:
        return count, count
    fan_in = count // shape[0]
    fan_out = count // shape[1] if len(shape) > 1 else count
    return fan_in, fan_out


def _variance_n(param, shape):
    fan_in, fan_out = fan_in_out(shape)
    norm = param.variance_norm
    if norm == caffe_pb2.FillerParameter.AVERAGE:
        return (fan_in + fan_out) / 2.0
    if norm == caffe_pb2.FillerParameter.FAN_OUT:
        return float(fan_out)
    return float(fan_in)


def _constant(param, shape, rng):
    return numpy.full(shape, param.value, dtype=numpy.float64)


def _uniform(param, shape, rng):
    return rng.uniform(param.min, param.max, size=shape)


def _gaussian(param, shape, rng):
    values = rng.normal(param.mean, param.std, size=shape)
    if param.sparse >= 0:
        # Keep each weight with probability sparse / num_outputs, so every input feeds about
        # `sparse` outputs on average (Caffe's sparse Gaussian for deep, thin nets).
        if not len(shape):
            raise ValueError("a sparse gaussian filler needs a blob with at least one axis")
        keep = param.sparse / float(shape[0])
        values = values * (rng.uniform(0.0, 1.0, size=shape) < keep)
    return values


def _positive_unitball(param, shape, rng):
    values = rng.uniform(0.0, 1.0, size=shape)
    if not len(shape) or shape[0] == 0:
        return values
    rows = values.reshape(shape[0], -1)
    # Each output's weights are positive and sum to one.
    rows /= rows.sum(axis=1, keepdims=True)
    return rows.reshape(shape)


def _xavier(param, shape, rng):
    scale = math.sqrt(3.0 / _variance_n(param, shape))
    return rng.uniform(-scale, scale, size=shape)


def _msra(param, shape, rng):
    std = math.sqrt(2.0 / _variance_n(param, shape))
    return rng.normal(0.0, std, size=shape)


def _bilinear(param, shape, rng):
    # The weights of bilinear upsampling for a Deconvolution with kernel 2f - f%2 and stride f;
    # every (out, in) pair gets the same separable tent kernel.
    if len(shape) != 4 or shape[2] != shape[3]:
        raise ValueError(f"the bilinear filler needs a 4-d blob with square kernels, got shape {tuple(shape)}")
    k = shape[3]
    f = math.ceil(k / 2.0)
    c = (k - 1) / (2.0 * f)
    tent = 1.0 - numpy.abs(numpy.arange(k) / f - c)
    return numpy.broadcast_to(numpy.outer(tent, tent), shape).copy()


FILLER_TYPES = {
    "constant": _constant,
    "uniform": _uniform,
    "gaussian": _gaussian,
    "positive_unitball": _positive_unitball,
    "xavier": _xavier,
    "msra": _msra,
    "bilinear": _bilinear,
}


def fill_array(shape, filler_param=None, rng=None, dtype=numpy.float32):
    """A new numpy array of `shape` filled as `filler_param` (a FillerParameter) says.

    `filler_param` None means Caffe's default FillerParameter: constant 0. `rng` is anything with
    numpy's `uniform(low, high, size)` and `normal(loc, scale, size)` (RandomState or Generator);
    None uses numpy's global random state.
    """
    param = caffe_pb2.FillerParameter() if filler_param is None else filler_param
    shape = tuple(int(d) for d in shape)
    try:
        fill_fn = FILLER_TYPES[param.type]
    except KeyError:
        raise ValueError(f"unknown filler type {param.type!r}; known: {', '.join(sorted(FILLER_TYPES))}") from None
    if param.sparse >= 0 and param.type != "gaussian":
        raise ValueError(f"filler {param.type!r} does not support 'sparse' (only gaussian does)")
    if param.type == "positive_unitball" and param.HasField("min") and param.min != 0:
        raise ValueError("the positive_unitball filler draws from [0, 1); do not set 'min'")
    rng = numpy.random if rng is None else rng
    return numpy.asarray(fill_fn(param, shape, rng), dtype=numpy.float64).astype(dtype, copy=False)


def fill(blob, filler_param=None, rng=None):
    """Fills `blob.data` (a scaffe Blob, numpy or cupy) in place; returns the blob."""
    values = fill_array(blob.shape, filler_param, rng, dtype=blob.dtype)
    if isinstance(blob.data, numpy.ndarray):
        blob.data[...] = values
    else:
        blob.data[...] = blob.xp.asarray(values)
    return blob
