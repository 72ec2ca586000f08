"""Datum <-> numpy: raw uint8 pixels, float_data, and encoded JPEG/PNG images (via Pillow).

Colour images are kept in Caffe's channel order, B, G, R (Caffe reads images with OpenCV, which
gives BGR), so mean values and models trained by Caffe apply unchanged. Arrays are C x H x W.
"""
import io as _io

import numpy

from scaffe.data.resize import resize_linear
from scaffe.messages import parse_datum
from scaffe.proto import caffe_pb2

__all__ = ["parse_datum", "datum_to_array", "array_to_datum", "decode_image", "encode_image",
           "load_image", "require_pillow"]


def require_pillow(what="decoding encoded images"):
    try:
        from PIL import Image
    except ImportError:
        raise RuntimeError(f"{what} needs Pillow, which is not installed: pip install Pillow") from None
    return Image


def _pil_to_array(img, color):
    """uint8 C x H x W array in Caffe's channel order from a PIL image.

    color True forces 3 channels, False forces 1, None keeps the file's own kind (grey stays
    grey, everything else becomes 3-channel BGR; an alpha channel is dropped).
    """
    if color is None:
        color = img.mode not in ("1", "L", "LA", "I", "I;16", "F")
    if color:
        rgb = numpy.asarray(img.convert("RGB"), dtype=numpy.uint8)
        return numpy.ascontiguousarray(rgb[:, :, ::-1].transpose(2, 0, 1))
    grey = numpy.asarray(img.convert("L"), dtype=numpy.uint8)
    return grey[None, :, :].copy()


def decode_image(data, color=None):
    """A JPEG/PNG/... file's bytes as a uint8 C x H x W array (see `_pil_to_array` for `color`)."""
    Image = require_pillow()
    try:
        with Image.open(_io.BytesIO(bytes(data))) as img:
            return _pil_to_array(img, color)
    except OSError as e:
        raise ValueError(f"cannot decode the encoded image in a Datum: {e}") from None


def load_image(path, color=True, height=0, width=0):
    """An image file as a uint8 C x H x W array, optionally resized to height x width (both > 0)
    as Caffe's ReadImageToCVMat does (OpenCV's bilinear resize, scaffe.data.resize)."""
    Image = require_pillow("reading image files")
    with Image.open(path) as img:
        img.load()
        pixels = _pil_to_array(img, color)
    return resize_linear(pixels, height, width) if height > 0 and width > 0 else pixels


def encode_image(array, fmt="PNG"):
    """A uint8 C x H x W array (1 or 3 channels, BGR) as the bytes of an image file."""
    Image = require_pillow("encoding images")
    array = numpy.asarray(array, dtype=numpy.uint8)
    if array.shape[0] == 1:
        img = Image.fromarray(array[0], mode="L")
    elif array.shape[0] == 3:
        img = Image.fromarray(numpy.ascontiguousarray(array[::-1].transpose(1, 2, 0)), mode="RGB")
    else:
        raise ValueError(f"only 1- or 3-channel images can be encoded, got {array.shape[0]} channels")
    buf = _io.BytesIO()
    img.save(buf, format=fmt)
    return buf.getvalue()


def datum_to_array(value, color=None):
    """(array, label) of a Datum or its serialized bytes.

    Raw pixels come back as uint8 (C, H, W), float_data as float32 (C, H, W), encoded images as
    decoded uint8; `color` (True/False/None) forces the channel count of encoded images only,
    like TransformationParameter.force_color/force_gray.
    """
    datum = parse_datum(value)
    if datum.encoded:
        return decode_image(datum.data, color), datum.label
    shape = (datum.channels, datum.height, datum.width)
    count = datum.channels * datum.height * datum.width
    if len(datum.data):
        if len(datum.data) != count:
            raise ValueError(f"Datum holds {len(datum.data)} bytes for shape {shape} ({count} expected)")
        return numpy.frombuffer(datum.data, dtype=numpy.uint8).reshape(shape), datum.label
    if len(datum.float_data) != count:
        raise ValueError(f"Datum holds {len(datum.float_data)} float values for shape {shape} ({count} expected)")
    return numpy.array(datum.float_data, dtype=numpy.float32).reshape(shape), datum.label


def array_to_datum(array, label=0, encoded_bytes=None):
    """A Datum for a C x H x W array (uint8 -> raw `data`, other dtypes -> `float_data`).

    With `encoded_bytes` (a JPEG/PNG file's content) the Datum stores those bytes, `encoded: true`
    and the label only, as Caffe's convert_imageset --encoded does; `array` is then unused.
    """
    if encoded_bytes is not None:
        return caffe_pb2.Datum(data=bytes(encoded_bytes), label=int(label), encoded=True)
    array = numpy.asarray(array)
    if array.ndim == 2:
        array = array[None]
    if array.ndim != 3:
        raise ValueError(f"a Datum holds a C x H x W array, got shape {array.shape}")
    datum = caffe_pb2.Datum(channels=array.shape[0], height=array.shape[1], width=array.shape[2], label=int(label))
    if array.dtype == numpy.uint8:
        datum.data = numpy.ascontiguousarray(array).tobytes()
    else:
        datum.float_data.extend(numpy.asarray(array, dtype=numpy.float32).ravel().tolist())
    return datum
