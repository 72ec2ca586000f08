"""LRN kernels against a direct loop over Caffe's definition, and backward against finite differences."""
import numpy
import pytest

from kernels.lrn import ACROSS_CHANNELS, WITHIN_CHANNEL, lrn_backward, lrn_forward


def direct_lrn(x, size, alpha, beta, k, region):
    n_img, channels, height, width = x.shape
    half = (size - 1) // 2
    y = numpy.empty_like(x)
    for n, c, h, w in numpy.ndindex(x.shape):
        if region == ACROSS_CHANNELS:
            window = x[n, max(c - half, 0):c + half + 1, h, w]
            scale = k + alpha / size * (window ** 2).sum()
        else:
            window = x[n, c, max(h - half, 0):h + half + 1, max(w - half, 0):w + half + 1]
            scale = 1 + alpha / size ** 2 * (window ** 2).sum()
        y[n, c, h, w] = x[n, c, h, w] * scale ** -beta
    return y


@pytest.mark.parametrize("region", [ACROSS_CHANNELS, WITHIN_CHANNEL])
@pytest.mark.parametrize("size", [1, 3, 5])
def test_lrn_forward_and_backward(region, size):
    rng = numpy.random.default_rng(4)
    x = rng.standard_normal((2, 6, 5, 4))
    alpha, beta, k = 0.7, 0.75, 2.0
    y, scale = lrn_forward(x, size, alpha, beta, k, region)
    numpy.testing.assert_allclose(y, direct_lrn(x, size, alpha, beta, k, region), rtol=1e-12)
    dy = rng.standard_normal(x.shape)
    dx = lrn_backward(x, y, scale, dy, size, alpha, beta, region)
    numeric = numpy.empty_like(x)
    step = 1e-6
    for idx in numpy.ndindex(x.shape):
        plus, minus = x.copy(), x.copy()
        plus[idx] += step
        minus[idx] -= step
        numeric[idx] = ((lrn_forward(plus, size, alpha, beta, k, region)[0] -
                         lrn_forward(minus, size, alpha, beta, k, region)[0]) * dy).sum() / (2 * step)
    numpy.testing.assert_allclose(dx, numeric, rtol=1e-6, atol=1e-8)


def test_float32_stays_float32_and_even_size_is_rejected():
    x = numpy.ones((1, 3, 2, 2), numpy.float32)
    y, scale = lrn_forward(x, 3, 1.0, 0.75, 1.0)
    assert y.dtype == numpy.float32 and scale.dtype == numpy.float32
    with pytest.raises(ValueError, match="odd"):
        lrn_forward(x, 4, 1.0, 0.75, 1.0)
