"""Pooling kernels against a direct loop over Caffe's window rules, and Caffe's pooled-size rule."""
import numpy
import pytest

from kernels.backend import cupy_or_none
from kernels.geometry import pooled_size
from kernels.pooling import ave_pool_backward, ave_pool_forward, max_pool_backward, max_pool_forward

# (H, W), kernel, pad, stride, ceil rounding
GEOMETRIES = [
    ((14, 14), (3, 3), (0, 0), (2, 2), True),    # last window cut off by the image edge (ceil)
    ((7, 7), (3, 3), (1, 1), (2, 2), True),      # padding counts in AVE's divisor
    ((7, 7), (2, 2), (0, 0), (2, 2), False),     # floor rounding drops the last row
    ((6, 5), (3, 2), (1, 0), (2, 1), True),
    ((5, 5), (5, 5), (0, 0), (1, 1), True),      # global pooling
    ((8, 8), (2, 2), (0, 0), (2, 2), True),
    ((4, 4), (3, 3), (2, 2), (3, 3), True),      # pad reduces the ceil size by one
]


def test_pooled_size_follows_caffe():
    assert pooled_size(14, 3, 0, 2) == 7               # pool1 of the layer zoo
    assert pooled_size(7, 2, 0, 2, ceil_mode=False) == 3
    assert pooled_size(7, 2, 0, 2) == 4
    assert pooled_size(7, 3, 1, 2) == 4                # pool2a
    assert pooled_size(4, 3, 2, 3) == 2                # ceil gives 3, whose window starts in the padding
    assert pooled_size(28, 2, 0, 2) == 14


def direct_pool(x, kernel, pad, stride, out_size, mode):
    n_img, channels, height, width = x.shape
    (kh, kw), (ph, pw), (sh, sw), (oh, ow) = kernel, pad, stride, out_size
    top = numpy.zeros((n_img, channels, oh, ow), x.dtype)
    dx_weights = {}  # (py, px) -> list of ((h, w), weight) giving d top / d x
    for py in range(oh):
        for px in range(ow):
            hs, ws = py * sh - ph, px * sw - pw
            he, we = min(hs + kh, height + ph), min(ws + kw, width + pw)
            divisor = (he - hs) * (we - ws)
            cells = [(h, w) for h in range(max(hs, 0), min(he, height)) for w in range(max(ws, 0), min(we, width))]
            window = numpy.stack([x[:, :, h, w] for h, w in cells], axis=-1)
            if mode == "max":
                top[:, :, py, px] = window.max(-1)
                dx_weights[py, px] = (cells, window.argmax(-1))   # argmax: first maximum, as Caffe
            else:
                top[:, :, py, px] = window.sum(-1) / divisor
                dx_weights[py, px] = (cells, divisor)
    return top, dx_weights


def direct_backward(x_shape, dtop, weights, mode):
    dx = numpy.zeros(x_shape, dtop.dtype)
    for (py, px), (cells, how) in weights.items():
        if mode == "max":
            for n, c in numpy.ndindex(x_shape[:2]):
                h, w = cells[how[n, c]]
                dx[n, c, h, w] += dtop[n, c, py, px]
        else:
            for h, w in cells:
                dx[:, :, h, w] += dtop[:, :, py, px] / how
    return dx


@pytest.mark.parametrize("dtype", [numpy.float32, numpy.float64])
@pytest.mark.parametrize("mode", ["max", "ave"])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_pooling_matches_direct_loops(geometry, mode, dtype):
    (height, width), kernel, pad, stride, ceil_mode = geometry
    out_size = (pooled_size(height, kernel[0], pad[0], stride[0], ceil_mode),
                pooled_size(width, kernel[1], pad[1], stride[1], ceil_mode))
    rng = numpy.random.default_rng(2)
    x = rng.standard_normal((2, 3, height, width)).astype(dtype)
    x[0, 0, :2, :2] = 0.5   # a tie: the first maximum in row-major order must win
    expected_top, weights = direct_pool(x, kernel, pad, stride, out_size, mode)
    dtop = rng.standard_normal(expected_top.shape).astype(dtype)
    expected_dx = direct_backward(x.shape, dtop, weights, mode)
    prefilled = numpy.full(x.shape, 3, dtype)
    if mode == "max":
        top, mask = max_pool_forward(x, kernel, pad, stride, out_size)
        dx = max_pool_backward(dtop, mask, kernel, pad, stride, x.shape, dx=prefilled)
        flat = x.reshape(2, 3, -1)
        picked = numpy.take_along_axis(flat, mask.reshape(2, 3, -1).astype(numpy.int64), axis=2)
        numpy.testing.assert_array_equal(picked.reshape(top.shape), top)
    else:
        top = ave_pool_forward(x, kernel, pad, stride, out_size)
        dx = ave_pool_backward(dtop, kernel, pad, stride, x.shape, dx=prefilled)
    tol = 1e-6 if dtype == numpy.float32 else 1e-12
    numpy.testing.assert_allclose(top, expected_top, rtol=tol, atol=tol)
    numpy.testing.assert_allclose(dx, expected_dx, rtol=tol, atol=tol)


def test_parallel_path_matches_serial(monkeypatch):
    import kernels._threads
    rng = numpy.random.default_rng(6)
    x = rng.standard_normal((3, 5, 9, 9)).astype(numpy.float32)
    geometry = ((3, 3), (1, 1), (2, 2), (5, 5))
    top, mask = max_pool_forward(x, *geometry)
    dmax = max_pool_backward(top, mask, *geometry[:3], x.shape)
    ave = ave_pool_forward(x, *geometry)
    dave = ave_pool_backward(ave, *geometry[:3], x.shape)
    monkeypatch.setattr(kernels._threads, "PARALLEL_MIN_WORK", 0)
    top_p, mask_p = max_pool_forward(x, *geometry)
    numpy.testing.assert_array_equal(top_p, top)
    numpy.testing.assert_array_equal(mask_p, mask)
    numpy.testing.assert_array_equal(max_pool_backward(top, mask, *geometry[:3], x.shape), dmax)
    numpy.testing.assert_array_equal(ave_pool_forward(x, *geometry), ave)
    numpy.testing.assert_array_equal(ave_pool_backward(ave, *geometry[:3], x.shape), dave)


@pytest.mark.gpu
@pytest.mark.skipif(cupy_or_none() is None, reason="needs cupy and a CUDA device")
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_gpu_twin_matches_cpu(geometry):
    cupy = cupy_or_none()
    (height, width), kernel, pad, stride, ceil_mode = geometry
    out_size = (pooled_size(height, kernel[0], pad[0], stride[0], ceil_mode),
                pooled_size(width, kernel[1], pad[1], stride[1], ceil_mode))
    rng = numpy.random.default_rng(3)
    x = rng.standard_normal((2, 3, height, width)).astype(numpy.float32)
    dtop = rng.standard_normal((2, 3) + out_size).astype(numpy.float32)
    top, mask = max_pool_forward(x, kernel, pad, stride, out_size)
    top_g, mask_g = max_pool_forward(cupy.asarray(x), kernel, pad, stride, out_size)
    numpy.testing.assert_array_equal(cupy.asnumpy(top_g), top)
    numpy.testing.assert_array_equal(cupy.asnumpy(mask_g), mask)
    dx = max_pool_backward(dtop, mask, kernel, pad, stride, x.shape)
    dx_g = max_pool_backward(cupy.asarray(dtop), mask_g, kernel, pad, stride, x.shape)
    numpy.testing.assert_allclose(cupy.asnumpy(dx_g), dx, rtol=1e-6, atol=1e-6)
    ave = ave_pool_forward(x, kernel, pad, stride, out_size)
    numpy.testing.assert_allclose(cupy.asnumpy(ave_pool_forward(cupy.asarray(x), kernel, pad, stride, out_size)),
                                  ave, rtol=1e-6, atol=1e-6)
    dx = ave_pool_backward(dtop, kernel, pad, stride, x.shape)
    dx_g = ave_pool_backward(cupy.asarray(dtop), kernel, pad, stride, x.shape)
    numpy.testing.assert_allclose(cupy.asnumpy(dx_g), dx, rtol=1e-6, atol=1e-6)
