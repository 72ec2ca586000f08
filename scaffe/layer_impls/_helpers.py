"""Small pieces shared by the layer modules: parameter blobs, fillers, geometry fields, loss normalization."""
import numbers

import numpy

from kernels.backend import get_array_module
from scaffe.blob import Blob
from scaffe.fillers import fill
from scaffe.proto import caffe_pb2


def new_blob(shape, like):
    """A Blob of `shape` with the dtype and array module of Blob `like` (so float64 gradient checks and
    cupy nets get parameters of their own kind)."""
    return Blob(shape, dtype=like.dtype, xp=like.xp)


def layer_rng(layer):
    """The random source for fillers and Dropout: the layer's `rng` attribute when the net or solver set
    one (a numpy Generator or RandomState), else numpy's global state, which Caffe's `random_seed`
    seeds through the solver."""
    rng = getattr(layer, "rng", None)
    return numpy.random if rng is None else rng


def filled_blob(layer, shape, like, filler_param=None):
    blob = new_blob(shape, like)
    fill(blob, filler_param, layer_rng(layer))
    return blob


def param_grad_wanted(layer, index):
    """False when the net has frozen param blob `index` (lr_mult 0), so its gradient can be skipped."""
    wanted = getattr(layer, "param_propagate_down", None)
    return True if wanted is None or index >= len(wanted) else bool(wanted[index])


def canonical_axis(axis, num_axes, layer=None):
    if not -num_axes <= axis < max(num_axes, 1):
        where = f"layer {layer.name!r}: " if layer is not None else ""
        raise ValueError(f"{where}axis {axis} out of range for a blob with {num_axes} axes")
    return axis + num_axes if axis < 0 else axis


def axis_or_legacy_dim(param, legacy_field, num_axes, layer):
    """The axis of a Concat/Slice parameter: `axis`, or the deprecated `concat_dim`/`slice_dim` (never both)."""
    if param.HasField("axis") and param.HasField(legacy_field):
        raise ValueError(f"layer {layer.name!r}: give either axis or {legacy_field}, not both")
    if param.HasField(legacy_field):
        return int(getattr(param, legacy_field))
    return canonical_axis(param.axis, num_axes, layer)


def count(shape, start=0, end=None):
    end = len(shape) if end is None else end
    return int(numpy.prod(shape[start:end], dtype=numpy.int64))


def spatial_geometry(conv_param, layer, kernel_required=True):
    """(kernel, pad, stride, dilation) as (h, w) pairs from a ConvolutionParameter, with Caffe's rules:
    the _h/_w fields win when set; repeated fields give one value for both axes or one per axis."""
    def pick(name, default, h_field=None, w_field=None):
        if h_field is not None and (conv_param.HasField(h_field) or conv_param.HasField(w_field)):
            if not (conv_param.HasField(h_field) and conv_param.HasField(w_field)):
                raise ValueError(f"layer {layer.name!r}: {h_field} and {w_field} must be given together")
            if len(getattr(conv_param, name)):
                raise ValueError(f"layer {layer.name!r}: give either {name} or {h_field}/{w_field}, not both")
            return int(getattr(conv_param, h_field)), int(getattr(conv_param, w_field))
        values = list(getattr(conv_param, name))
        if not values:
            if default is None:
                raise ValueError(f"layer {layer.name!r}: {name} (or {h_field}/{w_field}) is required")
            return default, default
        if len(values) == 1:
            return int(values[0]), int(values[0])
        if len(values) == 2:
            return int(values[0]), int(values[1])
        raise ValueError(f"layer {layer.name!r}: {name} has {len(values)} values; 2-d convolution takes 1 or 2")

    kernel = pick("kernel_size", None if kernel_required else 1, "kernel_h", "kernel_w")
    pad = pick("pad", 0, "pad_h", "pad_w")
    stride = pick("stride", 1, "stride_h", "stride_w")
    dilation = pick("dilation", 1)
    if min(kernel) <= 0 or min(stride) <= 0 or min(dilation) <= 0:
        raise ValueError(f"layer {layer.name!r}: kernel, stride and dilation must be positive")
    return kernel, pad, stride, dilation


def pair_field(param, both, height, width):
    """(h, w) of a pooling_param size: the _h/_w pair if either is given, else `both` twice."""
    if param.HasField(height) or param.HasField(width):
        return getattr(param, height), getattr(param, width)
    return getattr(param, both), getattr(param, both)


def loss_scale(top):
    """The loss weight the net stored in the loss top's diff (Caffe's convention), as a float64 scalar
    where the diff lives: reading it into a Python float would make the host wait for the device."""
    return top.diff.reshape(-1)[0].astype(numpy.float64)


def normalization_mode(layer, default=caffe_pb2.LossParameter.VALID):
    """Caffe's rule: an explicit `normalization` wins; else the legacy `normalize` bool picks VALID or
    BATCH_SIZE; else the layer's default."""
    lp = layer.param.loss_param
    if lp.HasField("normalization"):
        return lp.normalization
    if lp.HasField("normalize"):
        return caffe_pb2.LossParameter.VALID if lp.normalize else caffe_pb2.LossParameter.BATCH_SIZE
    return default


def normalizer(mode, outer, inner, valid_count=None):
    """The divisor of a loss (never below 1, as in Caffe). valid_count None means "all count"; a count
    on the device gives a divisor on the device, so the host never waits for it."""
    modes = caffe_pb2.LossParameter
    if mode == modes.FULL:
        value = outer * inner
    elif mode == modes.VALID:
        value = outer * inner if valid_count is None else valid_count
    elif mode == modes.BATCH_SIZE:
        value = outer
    elif mode == modes.NONE:
        value = 1
    else:
        raise ValueError(f"unknown loss normalization mode {mode}")
    if isinstance(value, numbers.Number):
        return max(1.0, float(value))
    return get_array_module(value).maximum(value.astype(numpy.float64), 1.0)


class DeferredLabelCheck:
    """Out-of-range labels met on the device, remembered there until the host asks: checking every batch
    at once would make the host wait for the GPU each iteration. `message()` (a host sync) names the
    first bad label seen; the net asks when the host reads results (Net.check_deferred_errors)."""

    def __init__(self, layer, channels, state=None):
        self.where, self.channels = f"layer {layer.name!r}", channels
        self.seen = self.first = None
        self.state = state  # or a fused kernel keeps (seen, first label) in this device array itself

    def record(self, labels, bad):
        xp = get_array_module(labels)
        flat_bad = bad.reshape(-1)
        any_bad = flat_bad.any()
        label = labels.reshape(-1)[flat_bad.argmax()]
        if self.seen is None:
            self.seen, self.first = any_bad, label
        else:  # in place: a CUDA graph replaying this (scaffe.capture) keeps adding to the same two arrays
            self.first[...] = xp.where(self.seen, self.first, label)
            self.seen |= any_bad

    def message(self):
        if self.state is not None:
            seen, first = (int(value) for value in self.state.get())
        elif self.seen is None:
            return None
        else:
            seen, first = bool(self.seen), int(self.first)
        return f"{self.where}: label {first} is outside 0..{self.channels - 1}" if seen else None


class LossLayer:
    """Mixin for loss layers: a scalar first top, loss weight 1 by default, no gradient for labels."""

    def is_loss(self):
        return True

    def allow_force_backward(self, bottom_index):
        return bottom_index != 1

    def reshape_loss(self, bottom, top):
        if bottom[0].shape[0] != bottom[1].shape[0]:
            raise ValueError(f"layer {self.name!r}: the data and label blobs must have the same number of "
                             f"items: {bottom[0].shape} vs {bottom[1].shape}")
        top[0].reshape(())
