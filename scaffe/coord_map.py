"""How the spatial coordinates of one NetSpec top map to another's (pycaffe's caffe.coord_map), and `crop`,
which adds the Crop layer that aligns a top with a reference top (as fully convolutional nets need).

A map is (axis, scale, shift): coordinate x of the input becomes scale * x + shift in the output, on every
axis after `axis` (scale and shift are numpy arrays, one entry per spatial axis, or scalars that apply to
all). The axis is None for layers that map each coordinate to itself (ReLU, Eltwise, ...). A convolution
or pooling of stride s, padding p and kernel extent k puts output x over the input window centred on
s * x - p + (k - 1) / 2; a deconvolution does the reverse.
"""
import numpy as np

from scaffe.net_spec import layers

__all__ = ["PASS_THROUGH_LAYERS", "UndefinedMapException", "AxisMismatchException", "UncroppableError",
           "coord_map", "compose", "inverse", "coord_map_from_to", "crop"]

# Layers whose output pixel (i, j) depends on their input at (i, j) only.
PASS_THROUGH_LAYERS = ["AbsVal", "BatchNorm", "Bias", "BNLL", "Clip", "Dropout", "Eltwise", "ELU", "Exp", "Log",
                       "LRN", "MVN", "Power", "PReLU", "ReLU", "Scale", "Sigmoid", "Split", "Swish", "TanH",
                       "Threshold"]

_IDENTITY = (None, 1, 0)


class UndefinedMapException(Exception):
    """The layer does not keep spatial coordinates (InnerProduct, ...), so no map goes through it."""


class AxisMismatchException(Exception):
    """Two maps to compose start their spatial axes at different axes."""


class UncroppableError(ValueError, AssertionError):
    """`crop` cannot align the two tops (different scales, or the reference lies outside the cropped top).
    An AssertionError too, as pycaffe raises one there."""


def _layer_params(fn, message_field):
    """The layer's keywords, from its `<type>_param` dict when it was given one, else the flat keywords."""
    return fn.params.get(message_field, fn.params)


def _per_axis(params, name, legacy_names, default):
    """A parameter as an array over the spatial axes; Caffe's 2-D `name_h`/`name_w` form is accepted too."""
    height, width = legacy_names
    if height in params or width in params:
        return np.array([params.get(height, default), params.get(width, default)])
    return np.array(params.get(name, default), ndmin=1)


def _window(fn):
    """(axis, stride, kernel extent with dilation, pad) of a Convolution, Deconvolution, Im2col or Pooling."""
    params = _layer_params(fn, "pooling_param" if fn.type_name == "Pooling" else "convolution_param")
    if params.get("global_pooling"):
        raise UndefinedMapException(f"{fn.type_name} with global_pooling keeps no spatial coordinates")
    kernel = _per_axis(params, "kernel_size", ("kernel_h", "kernel_w"), None)
    if kernel.dtype == object:
        raise ValueError(f"{fn.type_name}: no kernel_size to map coordinates through")
    dilation = np.array(params.get("dilation", 1), ndmin=1)
    stride = _per_axis(params, "stride", ("stride_h", "stride_w"), 1)
    pad = _per_axis(params, "pad", ("pad_h", "pad_w"), 0)
    return params.get("axis", 1), stride, (kernel - 1) * dilation + 1, pad


def coord_map(fn):
    """The map (axis, scale, shift) from the input coordinates of the layer `fn` (a NetSpec Function) to its
    output coordinates; UndefinedMapException for a layer that does not keep them."""
    if fn.type_name in ("Convolution", "Pooling", "Im2col"):
        axis, stride, extent, pad = _window(fn)
        return axis, 1 / stride, (pad - (extent - 1) / 2) / stride
    if fn.type_name == "Deconvolution":
        axis, stride, extent, pad = _window(fn)
        return axis, stride, (extent - 1) / 2 - pad
    if fn.type_name == "Crop":
        params = _layer_params(fn, "crop_param")
        # Crop's axis is its first cropped axis; a map's axis is the last one it leaves alone.
        return params.get("axis", 2) - 1, 1, -np.array(params.get("offset", 0), ndmin=1)
    if fn.type_name in PASS_THROUGH_LAYERS:
        return _IDENTITY
    raise UndefinedMapException(f"{fn.type_name} has no coordinate map")


def compose(first, then):
    """The map of applying map `then` and then map `first`: x -> a1 * (a2 * x + b2) + b1."""
    axis1, scale1, shift1 = first
    axis2, scale2, shift2 = then
    if axis1 is not None and axis2 is not None and axis1 != axis2:
        raise AxisMismatchException(f"cannot compose maps over axes {axis1} and {axis2}")
    return (axis2 if axis1 is None else axis1), scale1 * scale2, scale1 * shift2 + shift1


def inverse(mapping):
    """The map that undoes `mapping` (output coordinates back to input ones)."""
    axis, scale, shift = mapping
    return axis, 1 / scale, -shift / scale


def _mapped_bottoms(top):
    # Crop's second bottom only gives the output its size: coordinates come from the first.
    return top.fn.inputs[:1] if top.fn.type_name == "Crop" else top.fn.inputs


def _ancestor_maps(top):
    """Every top that `top` is computed from through coordinate-keeping layers (and `top` itself), each with
    the map from its coordinates to those of `top`."""
    maps = {top: _IDENTITY}
    pending = [top]
    while pending:
        current = pending.pop()
        try:
            step = coord_map(current.fn)
        except UndefinedMapException:
            continue
        for bottom in _mapped_bottoms(current):
            maps[bottom] = compose(maps[current], step)
            pending.append(bottom)
    return maps


def coord_map_from_to(top_from, top_to):
    """(axis, scale, shift) taking coordinates of `top_from` to those of `top_to` (NetSpec Tops that share an
    ancestor through layers that keep coordinates); RuntimeError when they share none."""
    from_maps = _ancestor_maps(top_from)
    to_maps = _ancestor_maps(top_to)
    common = [top for top in to_maps if top in from_maps]
    if not common:
        raise RuntimeError("no coordinate map between the two tops: they are not connected through layers "
                           "that keep spatial coordinates (Convolution, Pooling, Deconvolution, Crop, pointwise)")
    # Walk order puts top_to's nearest ancestors first; any common ancestor gives the same map in a
    # consistent net.
    ancestor = common[0]
    return compose(to_maps[ancestor], inverse(from_maps[ancestor]))


def crop(top_from, top_to):
    """A Crop layer that cuts `top_from` to the extent of `top_to` at the offset their coordinate map gives
    (the Top it returns is `top_from` aligned with `top_to`)."""
    axis, scale, shift = coord_map_from_to(top_from, top_to)
    if not np.all(scale == 1):
        raise UncroppableError(f"cannot crop: the tops' scales differ (scale {scale})")
    if not np.all(shift <= 0):
        raise UncroppableError(f"cannot crop: the reference top starts outside the cropped one (shift {shift})")
    if not np.all(np.round(shift) == shift):
        raise UncroppableError(f"cannot crop at a fractional offset (shift {shift})")
    offset = [int(value) for value in -np.round(np.atleast_1d(shift))]
    # No axis: only pointwise layers lie between, so crop the spatial axes of N, C, H, W as Crop does by default.
    first_cropped_axis = 2 if axis is None else axis + 1
    return layers.Crop(top_from, top_to, crop_param=dict(axis=first_cropped_axis, offset=offset))
