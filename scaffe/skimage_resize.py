"""pycaffe's `caffe.io.resize_image`: scikit-image's resize (SciPy's zoom for other channel counts)
called as pycaffe calls them, with a numpy stand-in for the default, linear, order where they are
not installed (`pip install scaffe[image]` brings them).

pycaffe scales 1- and 3-channel images to [0, 1] and calls skimage.transform.resize with
mode='constant' and no antialiasing (the scikit-image of Caffe's day had none): output pixel d
samples the source at (d + 0.5) * src / dst - 0.5, with zeros beyond the edges, so a shrink skips
pixels instead of averaging them and an enlargement darkens its border. Other channel counts go
through scipy.ndimage.zoom, whose grid puts the corners of input and output on each other.
"""
import numpy

__all__ = ["resize_image"]

_MAX_ORDER = 5  # spline orders scikit-image and SciPy interpolate with


def resize_image(im, new_dims, interp_order=1):
    """`im` (H x W x K) resized to new_dims (height, width) as float32, with spline interpolation of
    order `interp_order` (0 nearest, 1 linear, 3 cubic, ...), as pycaffe's resize_image."""
    im = numpy.asarray(im)
    if im.ndim != 3:
        raise ValueError(f"resize_image: expected an H x W x K image, got shape {im.shape}")
    if interp_order not in range(_MAX_ORDER + 1):
        raise ValueError(f"resize_image: interp_order must be 0 (nearest), 1 (linear) ... {_MAX_ORDER}, "
                         f"got {interp_order}")
    dims = tuple(int(d) for d in new_dims)
    if im.shape[-1] not in (1, 3):
        return _zoom(im, dims, interp_order).astype(numpy.float32)
    low, high = im.min(), im.max()
    if not high > low:  # a constant image: pycaffe fills rather than divide by 0
        return numpy.full(dims + im.shape[-1:], low, dtype=numpy.float32)
    unit = (im - low) / (high - low)
    return (_skimage_resize(unit, dims, interp_order) * (high - low) + low).astype(numpy.float32)


def _skimage_resize(unit, dims, order):
    try:
        from skimage.transform import resize
    except ImportError:
        return _linear_zero_padded(unit, dims, order, centred=True)
    return resize(unit, dims, order=order, mode="constant", anti_aliasing=False)


def _zoom(im, dims, order):
    try:
        from scipy.ndimage import zoom
    except ImportError:
        return _linear_zero_padded(im, dims, order, centred=False)
    return zoom(im, tuple(numpy.divide(dims, im.shape[:2])) + (1,), order=order)


def _linear_zero_padded(im, dims, order, centred):
    """Linear interpolation over the first two axes with zeros beyond the edges: at pixel centres
    (scikit-image's resize) or with the corners aligned (SciPy's zoom, which never reaches past them)."""
    if order != 1:
        raise RuntimeError(f"resize_image: interp_order {order} needs scikit-image and SciPy, which are not "
                           f"installed: pip install scikit-image (or scaffe[image])")
    out = numpy.asarray(im, dtype=numpy.float64)
    for axis, size in enumerate(dims):
        n = out.shape[axis]
        if centred:
            coord = (numpy.arange(size) + 0.5) * (n / size) - 0.5
        else:
            coord = numpy.arange(size) * ((n - 1) / (size - 1) if size > 1 else 0.0)
        first = numpy.floor(coord).astype(numpy.intp)
        frac = (coord - first).reshape((-1,) + (1,) * (out.ndim - axis - 1))
        padded = numpy.pad(out, [(1, 1) if a == axis else (0, 0) for a in range(out.ndim)])
        out = numpy.take(padded, first + 1, axis) * (1 - frac) + numpy.take(padded, first + 2, axis) * frac
    return out
