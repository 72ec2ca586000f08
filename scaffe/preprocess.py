"""pycaffe's input preparation for deploy nets (`caffe.io`): Transformer, load_image, resize_image, oversample.

Images are H x W x K float32 arrays, RGB in [0, 1] as load_image gives them; a Transformer turns one
into a net input (K x H x W, in the net's channel order and scale) and back. Images are read with
Pillow, where Caffe uses scikit-image, and resized as pycaffe does (scaffe.skimage_resize).
"""
import numpy

from scaffe.skimage_resize import resize_image

__all__ = ["Transformer", "load_image", "resize_image", "oversample"]

# ITU-R 709 luma, the weights scikit-image's rgb2gray (Caffe's load_image with color=False) uses.
_GREY_WEIGHTS = numpy.array([0.2125, 0.7154, 0.0721], dtype=numpy.float32)
# Pillow modes of integer pixels wider than 8 bits, and the value that reads as 1.0 (skimage's img_as_float).
_WIDE_MODES = {"I;16": 65535.0, "I;16B": 65535.0, "I;16L": 65535.0, "I": 2147483647.0}


def _image_module():
    from PIL import Image
    return Image


def _pixels(img):
    """A PIL image as float32 in [0, 1]: H x W for grey images, H x W x 3 (RGB) for the rest."""
    if img.mode == "F":
        return numpy.asarray(img, dtype=numpy.float32)
    if img.mode in _WIDE_MODES:
        return numpy.asarray(img, dtype=numpy.float32) / numpy.float32(_WIDE_MODES[img.mode])
    kind = "L" if img.mode in ("1", "L", "LA") else "RGB"  # an alpha channel is dropped, as in Caffe
    return numpy.asarray(img.convert(kind), dtype=numpy.float32) / numpy.float32(255)


def load_image(filename, color=True):
    """The image file as float32 in [0, 1]: H x W x 3 RGB (grey images repeated) when `color`, else
    H x W x 1 intensity (colour images by ITU-R 709 luma)."""
    Image = _image_module()
    with Image.open(filename) as img:
        img.load()
        pixels = _pixels(img)
    if color and pixels.ndim == 2:
        pixels = numpy.repeat(pixels[:, :, None], 3, axis=2)
    elif not color and pixels.ndim == 3:
        pixels = pixels @ _GREY_WEIGHTS
    return numpy.ascontiguousarray(pixels.reshape(pixels.shape[:2] + (-1,)), dtype=numpy.float32)


def oversample(images, crop_dims):
    """The 10 crops of each image (four corners, centre, then the same five mirrored left-right) as
    a (10 N) x h x w x K float32 array; all images share the first one's size."""
    images = [numpy.asarray(im) for im in images]
    height, width = images[0].shape[:2]
    h, w = (int(d) for d in crop_dims)
    if h > height or w > width:
        raise ValueError(f"oversample: crop {h} x {w} is larger than the images ({height} x {width})")
    corners = [(0, 0), (0, width - w), (height - h, 0), (height - h, width - w),
               (int((height - h) / 2.0), int((width - w) / 2.0))]
    crops = numpy.empty((10 * len(images), h, w, images[0].shape[-1]), dtype=numpy.float32)
    for i, im in enumerate(images):
        five = numpy.stack([im[y:y + h, x:x + w, :] for y, x in corners])
        crops[10 * i:10 * i + 5] = five
        crops[10 * i + 5:10 * i + 10] = five[:, :, ::-1, :]
    return crops


class Transformer:
    """Prepares images for the inputs of a net (pycaffe's caffe.io.Transformer).

    `Transformer({name: input blob shape (N, K, H, W)})`; per input, set any of transpose (e.g.
    (2, 0, 1): H x W x K -> K x H x W), channel_swap (e.g. (2, 1, 0): RGB -> BGR), raw_scale (e.g. 255
    for models trained on [0, 255] pixels), mean (K values or a K x H x W array) and input_scale.
    preprocess applies, in order: float32, resize to H x W, transpose, channel swap, raw scale, mean
    subtraction, input scale; deprocess undoes them.
    """

    def __init__(self, inputs):
        self.inputs = {name: tuple(int(d) for d in shape) for name, shape in dict(inputs).items()}
        self.transpose = {}
        self.channel_swap = {}
        self.raw_scale = {}
        self.mean = {}
        self.input_scale = {}

    def _check_input(self, in_):
        if in_ not in self.inputs:
            raise ValueError(f"{in_!r} is not one of the net inputs: {sorted(self.inputs)}")

    def preprocess(self, in_, data):
        """An H' x W' x K image as a K x H x W float32 input for `in_`."""
        self._check_input(in_)
        caffe_in = numpy.asarray(data).astype(numpy.float32, copy=True)
        in_dims = self.inputs[in_][2:]
        if caffe_in.shape[:2] != in_dims:
            caffe_in = resize_image(caffe_in, in_dims)
        if in_ in self.transpose:
            caffe_in = caffe_in.transpose(self.transpose[in_])
        if in_ in self.channel_swap:
            caffe_in = caffe_in[list(self.channel_swap[in_]), :, :]
        if in_ in self.raw_scale:
            caffe_in *= self.raw_scale[in_]
        if in_ in self.mean:
            caffe_in -= self.mean[in_]
        if in_ in self.input_scale:
            caffe_in *= self.input_scale[in_]
        return caffe_in

    def deprocess(self, in_, data):
        """A net input (or a batch of one) of `in_` back as an image: preprocess undone but the resize."""
        self._check_input(in_)
        image = numpy.array(data, dtype=numpy.float32).squeeze()
        if in_ in self.input_scale:
            image /= self.input_scale[in_]
        if in_ in self.mean:
            image += self.mean[in_]
        if in_ in self.raw_scale:
            image /= self.raw_scale[in_]
        if in_ in self.channel_swap:
            image = image[numpy.argsort(self.channel_swap[in_]), :, :]
        if in_ in self.transpose:
            image = image.transpose(numpy.argsort(self.transpose[in_]))
        return image

    def set_transpose(self, in_, order):
        """The axis order that turns the given images into the net's, e.g. (2, 0, 1) for H x W x K."""
        self._check_input(in_)
        if len(order) != len(self.inputs[in_]) - 1:
            raise ValueError(f"transpose order {tuple(order)} needs {len(self.inputs[in_]) - 1} axes, as input "
                             f"{in_!r} has after its batch axis")
        self.transpose[in_] = tuple(order)

    def set_channel_swap(self, in_, order):
        """The channel order to take, after the transpose: (2, 1, 0) turns RGB into BGR."""
        self._check_input(in_)
        if len(order) != self.inputs[in_][1]:
            raise ValueError(f"channel swap {tuple(order)} needs {self.inputs[in_][1]} channels, as input {in_!r} has")
        self.channel_swap[in_] = tuple(order)

    def set_raw_scale(self, in_, scale):
        """Scales raw pixels before the mean is subtracted (255 for models trained on [0, 255] images)."""
        self._check_input(in_)
        self.raw_scale[in_] = scale

    def set_mean(self, in_, mean):
        """The mean to subtract: K values (one per channel) or a K x H x W (or H x W) array, resized to
        the input's H x W when it differs (a mean image made from larger images, as ImageNet's)."""
        self._check_input(in_)
        mean = numpy.asarray(mean, dtype=numpy.float32)
        channels, height, width = self.inputs[in_][1:]
        if mean.ndim == 1:
            if mean.shape[0] != channels:
                raise ValueError(f"mean has {mean.shape[0]} values, input {in_!r} has {channels} channels")
            mean = mean[:, None, None]
        else:
            if mean.ndim == 2:
                mean = mean[None]
            if mean.ndim != 3 or mean.shape[0] != channels:
                raise ValueError(f"mean of shape {mean.shape} does not fit input {in_!r} of shape "
                                 f"{self.inputs[in_][1:]} (give K values or a K x H x W array)")
            if mean.shape[1:] != (height, width):
                mean = resize_image(mean.transpose(1, 2, 0), (height, width)).transpose(2, 0, 1)
        self.mean[in_] = mean

    def set_input_scale(self, in_, scale):
        """Scales the input after the mean is subtracted (e.g. 0.017 for a net trained on scaled data)."""
        self._check_input(in_)
        self.input_scale[in_] = scale
