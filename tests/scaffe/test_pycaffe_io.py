"""pycaffe's caffe.io (scaffe.io): Transformer, load_image, resize_image, oversample and the Datum /
BlobProto conversions, checked against numpy oracles written from Caffe's documented behaviour."""
import numpy
import pytest
from PIL import Image

import scaffe
from scaffe.proto import caffe_pb2


def _bilinear_oracle(im, height, width):
    """Half-pixel-centred bilinear resampling with border pixels repeated (upsampling)."""
    def coords(n_out, n_in):
        x = (numpy.arange(n_out) + 0.5) * n_in / n_out - 0.5
        x = numpy.clip(x, 0, n_in - 1)
        lo = numpy.floor(x).astype(int)
        hi = numpy.minimum(lo + 1, n_in - 1)
        return lo, hi, x - lo
    y0, y1, wy = coords(height, im.shape[0])
    x0, x1, wx = coords(width, im.shape[1])
    rows = im[y0] * (1 - wy)[:, None, None] + im[y1] * wy[:, None, None]
    return rows[:, x0] * (1 - wx)[None, :, None] + rows[:, x1] * wx[None, :, None]


def test_caffe_io_is_scaffe_io_with_pycaffe_names():
    for name in ("Transformer", "load_image", "resize_image", "oversample", "array_to_datum", "datum_to_array",
                 "array_to_blobproto", "blobproto_to_array", "arraylist_to_blobprotovector_str",
                 "blobprotovector_str_to_arraylist"):
        assert callable(getattr(scaffe.io, name)), name


def test_resize_image():
    rng = numpy.random.default_rng(0)
    im = rng.uniform(-3, 7, size=(3, 4, 2)).astype(numpy.float32)
    numpy.testing.assert_allclose(scaffe.io.resize_image(im, (9, 8)), _bilinear_oracle(im, 9, 8), atol=1e-5)
    numpy.testing.assert_array_equal(scaffe.io.resize_image(im, (3, 4)), im)
    nearest = scaffe.io.resize_image(im, (6, 8), interp_order=0)
    numpy.testing.assert_array_equal(nearest, im.repeat(2, axis=0).repeat(2, axis=1))
    constant = scaffe.io.resize_image(numpy.full((5, 5, 3), 0.25, numpy.float32), (2, 7))
    assert constant.shape == (2, 7, 3) and constant.dtype == numpy.float32 and (constant == 0.25).all()
    cubic = scaffe.io.resize_image(im, (12, 16), interp_order=3)
    assert cubic.min() >= im.min() and cubic.max() <= im.max()
    with pytest.raises(ValueError, match="interp_order"):
        scaffe.io.resize_image(im, (4, 4), interp_order=5)


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
