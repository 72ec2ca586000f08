"""Caffe's output sizes of convolution and pooling windows: plain arithmetic, without the compiled kernels
around it, so that the compute model (scaffe.modelled.shapes) can use it without importing numba."""
import math


def conv_output_size(size, kernel, pad, stride, dilation=1):
    """Caffe's convolution output length along one axis (floor rounding)."""
    extent = dilation * (kernel - 1) + 1
    return (size + 2 * pad - extent) // stride + 1


def pooled_size(size, kernel, pad, stride, ceil_mode=True):
    """Caffe's pooled length along one axis: ceil (default) or floor rounding; with padding the last
    window must start inside the image (or its left padding), else it is dropped."""
    span = size + 2 * pad - kernel
    if ceil_mode:
        out = int(math.ceil(span / stride)) + 1
    else:
        out = span // stride + 1
    if pad > 0 and (out - 1) * stride >= size + pad:
        out -= 1
    return out
