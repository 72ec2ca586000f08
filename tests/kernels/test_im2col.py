"""im2col/col2im against a direct loop over Caffe's definition, and col2im as the exact adjoint of im2col."""
import numpy
import pytest

from kernels.backend import cupy_or_none
from kernels.geometry import conv_output_size
from kernels.im2col import col2im, im2col

# (image H, W), kernel, pad, stride, dilation: odd shapes, padding larger than the stride,
# dilation, 1-wide kernels and a stride that skips the last rows.
GEOMETRIES = [
    ((7, 7), (3, 3), (1, 1), (1, 1), (1, 1)),
    ((7, 9), (3, 2), (2, 0), (2, 3), (2, 1)),
    ((5, 5), (1, 3), (0, 1), (1, 1), (1, 1)),
    ((6, 6), (5, 5), (3, 3), (4, 4), (1, 1)),
    ((8, 5), (2, 2), (0, 0), (2, 2), (1, 1)),
    ((4, 4), (1, 1), (0, 0), (1, 1), (1, 1)),
]


def direct_im2col(x, kernel, pad, stride, dilation):
    n_img, channels, height, width = x.shape
    (kh, kw), (ph, pw), (sh, sw), (dh, dw) = kernel, pad, stride, dilation
    oh = conv_output_size(height, kh, ph, sh, dh)
    ow = conv_output_size(width, kw, pw, sw, dw)
    col = numpy.zeros((channels * kh * kw, n_img, oh * ow), x.dtype)
    for c in range(channels):
        for i in range(kh):
            for j in range(kw):
                for oy in range(oh):
                    for ox in range(ow):
                        y, xx = oy * sh - ph + i * dh, ox * sw - pw + j * dw
                        if 0 <= y < height and 0 <= xx < width:
                            col[(c * kh + i) * kw + j, :, oy * ow + ox] = x[:, c, y, xx]
    return col


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_im2col_matches_definition_and_col2im_is_its_adjoint(geometry, dtype):
    (height, width), kernel, pad, stride, dilation = geometry
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((2, 3, height, width)).astype(dtype)
    col = im2col(x, kernel, pad, stride, dilation)
    numpy.testing.assert_array_equal(col, direct_im2col(x, kernel, pad, stride, dilation))
    dcol = rng.standard_normal(col.shape).astype(dtype)
    dx = col2im(dcol, x.shape, kernel, pad, stride, dilation, out=numpy.full(x.shape, 7, dtype))
    # <im2col(x), dcol> == <x, col2im(dcol)> for every x pins col2im down completely; the pre-filled
    # output checks that col2im overwrites rather than accumulates.
    expected = numpy.zeros_like(x)
    for idx in numpy.ndindex(x.shape):
        unit = numpy.zeros_like(x)
        unit[idx] = 1
        expected[idx] = (direct_im2col(unit, kernel, pad, stride, dilation) * dcol).sum()
    numpy.testing.assert_allclose(dx, expected, rtol=1e-5, atol=1e-5)


def test_parallel_path_matches_serial(monkeypatch):
    import kernels._threads
    rng = numpy.random.default_rng(5)
    x = rng.standard_normal((4, 3, 9, 8)).astype(numpy.float32)
    geometry = dict(kernel=(3, 2), pad=(1, 2), stride=(2, 1), dilation=(1, 2))
    col = im2col(x, **geometry)
    dcol = rng.standard_normal(col.shape).astype(numpy.float32)
    dx = col2im(dcol, x.shape, **geometry)
    monkeypatch.setattr(kernels._threads, "PARALLEL_MIN_WORK", 0)
    numpy.testing.assert_array_equal(im2col(x, **geometry), col)
    numpy.testing.assert_array_equal(col2im(dcol, x.shape, **geometry), dx)


def test_empty_output_is_an_error():
    with pytest.raises(ValueError, match="no output positions"):
        im2col(numpy.zeros((1, 1, 2, 2), numpy.float32), 5)


@pytest.mark.gpu
@pytest.mark.skipif(cupy_or_none() is None, reason="needs cupy and a CUDA device")
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_gpu_twin_matches_cpu(geometry):
    cupy = cupy_or_none()
    (height, width), kernel, pad, stride, dilation = geometry
    x = numpy.random.default_rng(1).standard_normal((2, 3, height, width)).astype(numpy.float32)
    col = im2col(x, kernel, pad, stride, dilation)
    numpy.testing.assert_array_equal(cupy.asnumpy(im2col(cupy.asarray(x), kernel, pad, stride, dilation)), col)
    dx = col2im(col, x.shape, kernel, pad, stride, dilation)
    dx_gpu = col2im(cupy.asarray(col), x.shape, kernel, pad, stride, dilation)
    numpy.testing.assert_allclose(cupy.asnumpy(dx_gpu), dx, rtol=1e-6, atol=1e-6)
