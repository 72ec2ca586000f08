"""Caffe's image resizing (OpenCV's INTER_LINEAR on uint8, scaffe.data.resize): values worked out from
OpenCV's documented sampling and fixed-point formula, and OpenCV itself where cv2 is installed."""
import math

import numpy
import pytest

from scaffe.data.resize import resize_linear


def _formula_pixel(image, channel, y, x, height, width):
    """One output pixel from the formula, one scalar at a time: source coordinate (d + 0.5) * src / dst
    - 0.5 in float32; across a row, a coordinate off either end reads the edge pixel with weight 0;
    weights w = round(2048 * (1 - f)), round(2048 * f); a row sums S = p0 * w0 + p1 * w1 exactly, and
    the column blends S0, S1 by ((S0 >> 4) * v0 >> 16) + ((S1 >> 4) * v1 >> 16), then (+ 2) >> 2."""
    src_h, src_w = image.shape[1:]

    def coordinate(d, src, dst):
        c = float(numpy.float32((d + 0.5) * (src / dst) - 0.5))
        i = math.floor(c)
        return i, float(numpy.float32(c - i))

    def weights(f):
        return round_half_even(2048 * float(numpy.float32(1 - f))), round_half_even(2048 * f)

    sx, fx = coordinate(x, src_w, width)
    if sx < 0 or sx >= src_w - 1:
        sx, fx = min(max(sx, 0), src_w - 1), 0.0
    a0, a1 = weights(fx)
    sy, fy = coordinate(y, src_h, height)
    b0, b1 = weights(fy)

    def row_sum(r):
        r = min(max(r, 0), src_h - 1)
        return int(image[channel, r, sx]) * a0 + int(image[channel, r, min(sx + 1, src_w - 1)]) * a1

    return ((row_sum(sy) >> 4) * b0 >> 16) + ((row_sum(sy + 1) >> 4) * b1 >> 16) + 2 >> 2


def round_half_even(v):
    return int(round(v))  # Python's round() is OpenCV's cvRound: halves go to the even neighbour


def _formula(image, height, width):
    return numpy.array([[[_formula_pixel(image, c, y, x, height, width) for x in range(width)]
                         for y in range(height)] for c in range(image.shape[0])], dtype=numpy.uint8)


def test_shrinking_samples_without_averaging():
    # Rows [0, 0, 0, 255] shrunk to 1 x 1: the centre (1.5, 1.5) blends columns 1 and 2, both 0.
    # (Pillow's bilinear, which averages the whole row when shrinking, gives 53.)
    ramp = numpy.zeros((1, 4, 4), numpy.uint8)
    ramp[:, :, 3] = 255
    assert resize_linear(ramp, 1, 1).tolist() == [[[0]]]
    # Halving: each output pixel is the rounded mean of a 2 x 2 block ((sum + 2) >> 2).
    block = numpy.array([[[10, 20, 0, 0], [30, 41, 0, 255], [1, 2, 3, 4], [5, 6, 7, 8]]], numpy.uint8)
    assert resize_linear(block, 2, 2).tolist() == [[[25, 64], [4, 6]]]


def test_two_by_two_upscaled_to_four_by_four():
    # Coordinates -0.25, 0.25, 0.75, 1.25 on both axes: weights (2048, 0) at the ends of a row,
    # (1536, 512) and (512, 1536) inside; the outer rows blend row 0 (or 1) with itself.
    image = numpy.array([[[0, 100], [200, 40]]], numpy.uint8)
    expected = [[0, 25, 75, 100],
                [50, 59, 76, 85],      # 0.75 * row 0 + 0.25 * row 3: 50, 58.75, 76.25, 85
                [150, 126, 79, 55],    # 0.25 * row 0 + 0.75 * row 3: 150, 126.25, 78.75, 55
                [200, 160, 80, 40]]
    assert resize_linear(image, 4, 4)[0].tolist() == expected
    numpy.testing.assert_array_equal(resize_linear(image, 4, 4), _formula(image, 4, 4))


@pytest.mark.parametrize("size", [(5, 3), (2, 9), (7, 7), (1, 4)])
def test_three_channels_non_square_match_the_formula(size):
    image = numpy.random.default_rng(sum(size)).integers(0, 256, (3, 4, 6), dtype=numpy.uint8)
    numpy.testing.assert_array_equal(resize_linear(image, *size), _formula(image, *size))


def test_same_size_is_a_copy_and_bad_input_is_named():
    image = numpy.arange(12, dtype=numpy.uint8).reshape(1, 3, 4)
    same = resize_linear(image, 3, 4)
    numpy.testing.assert_array_equal(same, image)
    assert same is not image
    with pytest.raises(ValueError, match="uint8 C x H x W"):
        resize_linear(image.astype(numpy.float32), 2, 2)
    with pytest.raises(ValueError, match="positive"):
        resize_linear(image, 0, 2)


def test_matches_opencv_where_installed():
    cv2 = pytest.importorskip("cv2")
    rng = numpy.random.default_rng(7)
    sizes = [((375, 500), (256, 256)), ((256, 256), (227, 227)), ((6, 8), (3, 4)), ((17, 5), (40, 33)),
             ((1, 9), (4, 2)), ((31, 29), (30, 31))]
    for (src_h, src_w), (h, w) in sizes:
        for channels in (1, 3):
            hwc = rng.integers(0, 256, (src_h, src_w, channels), dtype=numpy.uint8)
            expected = cv2.resize(hwc, (w, h), interpolation=cv2.INTER_LINEAR).reshape(h, w, channels)
            numpy.testing.assert_array_equal(resize_linear(hwc.transpose(2, 0, 1), h, w),
                                             expected.transpose(2, 0, 1))
