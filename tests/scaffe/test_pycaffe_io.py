"""pycaffe's caffe.io (scaffe.io): Transformer, load_image, resize_image, oversample and the Datum /
BlobProto conversions, checked against numpy oracles written from Caffe's documented behaviour."""
import sys

import numpy
import pytest
from PIL import Image

import scaffe
from scaffe.proto import caffe_pb2


# Linear weights of skimage.transform.resize(mode='constant'), from its documented sampling: output
# pixel d reads source coordinate (d + 0.5) * src / dst - 0.5, and pixels beyond the edges are 0.
# 2 -> 4: coordinates -0.25, 0.25, 0.75, 1.25.
_CENTRED_2_TO_4 = numpy.array([[0.75, 0], [0.75, 0.25], [0.25, 0.75], [0, 0.75]])
# scipy.ndimage.zoom (other channel counts) aligns the corners: 2 -> 3 reads 0, 0.5, 1.
_CORNERS_2_TO_3 = numpy.array([[1, 0], [0.5, 0.5], [0, 1]])


def _separable(weights_rows, channel, weights_cols):
    return weights_rows @ channel @ weights_cols.T


def test_caffe_io_is_scaffe_io_with_pycaffe_names():
    for name in ("Transformer", "load_image", "resize_image", "oversample", "array_to_datum", "datum_to_array",
                 "array_to_blobproto", "blobproto_to_array", "arraylist_to_blobprotovector_str",
                 "blobprotovector_str_to_arraylist"):
        assert callable(getattr(scaffe.io, name)), name


def test_resize_image_samples_pixel_centres_with_zeros_beyond_the_edges():
    im = numpy.stack([[[0.2, 1.0], [0.6, 0.2]], [[3, 5], [1, 4]], [[2, 2], [2, 0.5]]], axis=2).astype(numpy.float32)
    out = scaffe.io.resize_image(im, (4, 4))
    assert out.shape == (4, 4, 3) and out.dtype == numpy.float32
    for k in range(3):
        # pycaffe scales the whole image to [0, 1] first: zeros beyond the edges are its minimum
        low, span = im.min(), im.max() - im.min()
        expected = _separable(_CENTRED_2_TO_4, (im[:, :, k] - low) / span, _CENTRED_2_TO_4) * span + low
        numpy.testing.assert_allclose(out[:, :, k], expected, rtol=1e-6, atol=1e-6)
    # Shrinking skips pixels (no antialiasing): rows [0, 0, 0, 1] to 1 x 1 read columns 1 and 2.
    ramp = numpy.zeros((4, 4, 1), numpy.float32)
    ramp[:, 3] = 1
    assert scaffe.io.resize_image(ramp, (1, 1)).tolist() == [[[0.0]]]


def test_resize_image_other_channel_counts_align_corners():
    im = numpy.random.default_rng(0).uniform(-3, 7, size=(2, 2, 2))
    out = scaffe.io.resize_image(im, (3, 3))
    for k in range(2):
        numpy.testing.assert_allclose(out[:, :, k], _separable(_CORNERS_2_TO_3, im[:, :, k], _CORNERS_2_TO_3),
                                      rtol=1e-6)


def test_resize_image_constant_and_bad_input():
    constant = scaffe.io.resize_image(numpy.full((5, 5, 3), 0.25, numpy.float32), (2, 7))
    assert constant.shape == (2, 7, 3) and constant.dtype == numpy.float32 and (constant == 0.25).all()
    with pytest.raises(ValueError, match="interp_order"):
        scaffe.io.resize_image(numpy.ones((3, 3, 1)), (4, 4), interp_order=7)
    with pytest.raises(ValueError, match="H x W x K"):
        scaffe.io.resize_image(numpy.ones((3, 3)), (4, 4))


def test_resize_image_without_scikit_image(monkeypatch):
    # The numpy stand-in for linear interpolation; other orders need scikit-image.
    monkeypatch.setitem(sys.modules, "skimage.transform", None)
    monkeypatch.setitem(sys.modules, "scipy.ndimage", None)
    test_resize_image_samples_pixel_centres_with_zeros_beyond_the_edges()
    test_resize_image_other_channel_counts_align_corners()
    with pytest.raises(RuntimeError, match="pip install scikit-image"):
        scaffe.io.resize_image(numpy.eye(3)[:, :, None], (4, 4), interp_order=3)


def test_resize_image_is_pycaffes_call_where_scikit_image_is_installed(monkeypatch):
    resize = pytest.importorskip("skimage.transform").resize
    zoom = pytest.importorskip("scipy.ndimage").zoom
    rng = numpy.random.default_rng(3)
    for shape, dims in [((5, 7, 3), (9, 4)), ((8, 8, 1), (3, 5)), ((6, 4, 3), (6, 11))]:
        im = rng.uniform(-2, 9, size=shape).astype(numpy.float32)
        unit = (im - im.min()) / (im.max() - im.min())
        for order in (0, 1, 3):
            expected = resize(unit, dims, order=order, mode="constant", anti_aliasing=False)
            numpy.testing.assert_allclose(scaffe.io.resize_image(im, dims, order),
                                          expected * (im.max() - im.min()) + im.min(), rtol=1e-5, atol=1e-5)
    four = rng.uniform(size=(5, 6, 4))
    numpy.testing.assert_allclose(scaffe.io.resize_image(four, (7, 3)), zoom(four, (7 / 5, 3 / 6, 1), order=1),
                                  rtol=1e-6)
    # the numpy stand-in gives the same linear values
    expected = scaffe.io.resize_image(im, (4, 13))
    monkeypatch.setitem(sys.modules, "skimage.transform", None)
    monkeypatch.setitem(sys.modules, "scipy.ndimage", None)
    numpy.testing.assert_allclose(scaffe.io.resize_image(im, (4, 13)), expected, rtol=1e-5, atol=1e-6)
    numpy.testing.assert_allclose(scaffe.io.resize_image(four, (7, 3)), zoom(four, (7 / 5, 3 / 6, 1), order=1),
                                  rtol=1e-6)


def test_load_image(tmp_path):
    rgb = numpy.random.default_rng(1).integers(0, 256, size=(5, 7, 3), dtype=numpy.uint8)
    Image.fromarray(rgb).save(tmp_path / "rgb.png")
    rgba = numpy.dstack([rgb, numpy.full((5, 7), 9, numpy.uint8)])
    Image.fromarray(rgba).save(tmp_path / "rgba.png")
    Image.fromarray(rgb[:, :, 0]).save(tmp_path / "grey.png")
    as_float = rgb.astype(numpy.float32) / 255
    for name in ("rgb.png", "rgba.png"):
        image = scaffe.io.load_image(str(tmp_path / name))
        assert image.dtype == numpy.float32 and image.shape == (5, 7, 3)
        numpy.testing.assert_allclose(image, as_float, atol=1e-7)
    numpy.testing.assert_allclose(scaffe.io.load_image(str(tmp_path / "grey.png")),
                                  numpy.repeat(as_float[:, :, :1], 3, axis=2), atol=1e-7)
    grey = scaffe.io.load_image(str(tmp_path / "grey.png"), color=False)
    numpy.testing.assert_allclose(grey, as_float[:, :, :1], atol=1e-7)
    luma = scaffe.io.load_image(str(tmp_path / "rgb.png"), color=False)
    numpy.testing.assert_allclose(luma[:, :, 0], as_float @ numpy.array([0.2125, 0.7154, 0.0721]), atol=1e-6)


def test_oversample():
    images = numpy.arange(2 * 6 * 5 * 1, dtype=numpy.float32).reshape(2, 6, 5, 1)
    crops = scaffe.io.oversample(images, (4, 3))
    assert crops.shape == (20, 4, 3, 1) and crops.dtype == numpy.float32
    for i, image in enumerate(images):
        # corners top-left, top-right, bottom-left, bottom-right, then the centre; then all mirrored.
        for j, (y, x) in enumerate([(0, 0), (0, 2), (2, 0), (2, 2), (1, 1)]):
            numpy.testing.assert_array_equal(crops[10 * i + j], image[y:y + 4, x:x + 3])
            numpy.testing.assert_array_equal(crops[10 * i + 5 + j], image[y:y + 4, x:x + 3][:, ::-1])


def test_transformer_preprocess_deprocess():
    rng = numpy.random.default_rng(2)
    image = rng.uniform(size=(4, 5, 3)).astype(numpy.float32)
    mean = rng.uniform(50, 150, size=(3, 4, 5)).astype(numpy.float32)
    t = scaffe.io.Transformer({"data": (1, 3, 4, 5)})
    t.set_transpose("data", (2, 0, 1))
    t.set_channel_swap("data", (2, 1, 0))
    t.set_raw_scale("data", 255)
    t.set_mean("data", mean)
    t.set_input_scale("data", 0.5)
    expected = (image.transpose(2, 0, 1)[::-1] * 255 - mean) * 0.5
    out = t.preprocess("data", image)
    assert out.dtype == numpy.float32 and out.shape == (3, 4, 5)
    numpy.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-4)
    numpy.testing.assert_allclose(t.deprocess("data", out[None]), image, atol=1e-5)
    # Per-channel mean, and images of another size are resized to the input's first.
    t.set_mean("data", numpy.array([1.0, 2.0, 3.0]))
    big = scaffe.io.resize_image(image, (8, 10))
    numpy.testing.assert_allclose(t.preprocess("data", big), t.preprocess("data", scaffe.io.resize_image(big, (4, 5))))
    numpy.testing.assert_allclose(t.preprocess("data", image)[:, 0, 0],
                                  (image[0, 0, ::-1] * 255 - [1, 2, 3]) * 0.5, rtol=1e-5)
    with pytest.raises(ValueError, match="not one of the net inputs"):
        t.preprocess("label", image)
    with pytest.raises(ValueError, match="channels"):
        t.set_mean("data", numpy.zeros(4))
    with pytest.raises(ValueError, match="axes"):
        t.set_transpose("data", (1, 0))
    with pytest.raises(ValueError, match="channels"):
        t.set_channel_swap("data", (1, 0))


def test_mean_image_of_another_size_is_resized():
    t = scaffe.io.Transformer({"data": (1, 1, 2, 2)})
    t.set_mean("data", numpy.full((1, 6, 6), 3.0))
    assert t.mean["data"].shape == (1, 2, 2) and numpy.allclose(t.mean["data"], 3.0)


def test_datum_conversions():
    pixels = numpy.arange(24, dtype=numpy.uint8).reshape(2, 3, 4)
    datum = scaffe.io.array_to_datum(pixels, label=3)
    assert (datum.channels, datum.height, datum.width, datum.label) == (2, 3, 4, 3) and datum.data == pixels.tobytes()
    numpy.testing.assert_array_equal(scaffe.io.datum_to_array(datum), pixels)
    floats = numpy.linspace(-1, 1, 24).reshape(2, 3, 4)
    back = scaffe.io.datum_to_array(caffe_pb2.Datum.FromString(scaffe.io.array_to_datum(floats).SerializeToString()))
    numpy.testing.assert_allclose(back, floats, rtol=1e-6)
    # No label given: no label field written (pycaffe's array_to_datum(arr) makes the smaller message).
    assert not scaffe.io.array_to_datum(floats).HasField("label")
    with pytest.raises(ValueError, match="C x H x W"):
        scaffe.io.array_to_datum(numpy.zeros((3, 3)))


def test_blobproto_conversions():
    arrays = [numpy.arange(6, dtype=numpy.float32).reshape(2, 3), numpy.ones((1, 2, 2, 2), numpy.float32)]
    for got, want in zip(scaffe.io.blobprotovector_str_to_arraylist(
            scaffe.io.arraylist_to_blobprotovector_str(arrays)), arrays):
        numpy.testing.assert_array_equal(got, want)
    blob = scaffe.io.array_to_blobproto(arrays[0], numpy.full((2, 3), 2, numpy.float32))
    numpy.testing.assert_array_equal(scaffe.io.blobproto_to_array(blob, return_diff=True), numpy.full((2, 3), 2))
    legacy = caffe_pb2.BlobProto(num=1, channels=1, height=2, width=3, data=list(range(6)))
    assert scaffe.io.blobproto_to_array(legacy).shape == (1, 1, 2, 3)
    with pytest.raises(ValueError):
        scaffe.io.blobproto_to_array(caffe_pb2.BlobProto(data=[1.0, 2.0]))  # no shape for 2 values
