"""pycaffe's Detector: a deploy net that classifies windows of images (caffe.Detector, R-CNN style)."""
import os

import numpy

from scaffe import io as sio
from scaffe.classifier import input_transformer
from scaffe.pycaffe import TEST, Net


class Detector(Net):
    """`Detector(model_file, pretrained_file, mean=None, input_scale=None, raw_scale=None,
    channel_swap=None, context_pad=None)`: the net in TEST phase with its weights and a Transformer
    for its first input. Each window (ymin, xmin, ymax, xmax) of an image is cropped and warped to
    the input's size; with `context_pad`, a border of that many input pixels around the warped
    window shows the image around it (as in R-CNN), filled with the mean where it leaves the image.
    """

    def __init__(self, model_file, pretrained_file, mean=None, input_scale=None, raw_scale=None,
                 channel_swap=None, context_pad=None):
        super().__init__(model_file, TEST, weights=pretrained_file)
        self.transformer = input_transformer(self, mean, input_scale, raw_scale, channel_swap)
        self.configure_crop(context_pad)

    def detect_windows(self, images_windows):
        """[{"filename", "window", "prediction"}] for each window of each (image file, windows) pair,
        the prediction being the net's first output for that window."""
        images_windows = [(name, list(windows)) for name, windows in images_windows]
        crops = []
        for name, windows in images_windows:
            image = sio.load_image(name)
            crops.extend(self.crop(image, window) for window in windows)
        if not crops:
            return []
        in_ = self.inputs[0]
        caffe_in = numpy.stack([self.transformer.preprocess(in_, crop) for crop in crops])
        predictions = self.forward_all(**{in_: caffe_in})[self.outputs[0]]
        pairs = [(name, window) for name, windows in images_windows for window in windows]
        return [{"window": window, "prediction": prediction, "filename": name}
                for (name, window), prediction in zip(pairs, predictions)]

    def detect_selective_search(self, image_fnames):
        """detect_windows over Selective Search proposals, made by the external
        selective_search_ijcv_with_python package (it runs MATLAB), as in Caffe."""
        try:
            import selective_search_ijcv_with_python as selective_search
        except ImportError:
            raise RuntimeError("detect_selective_search needs the selective_search_ijcv_with_python package "
                               "(github.com/sergeyk/selective_search_ijcv_with_python, with MATLAB); without it, "
                               "pass your own windows to detect_windows") from None
        image_fnames = [os.path.abspath(name) for name in image_fnames]
        windows = selective_search.get_windows(image_fnames, cmd="selective_search_rcnn")
        return self.detect_windows(zip(image_fnames, windows))

    def configure_crop(self, context_pad):
        """Crop size (the input's H x W x K) and context padding; with padding, the mean in the
        images' own space (before transpose, channel swap and raw scale) fills what leaves the image."""
        in_ = self.inputs[0]
        to_image = numpy.argsort(self.transformer.transpose[in_])
        self.crop_dims = tuple(int(d) for d in numpy.array(self.blobs[in_].shape[1:])[to_image])
        self.context_pad = context_pad
        if not context_pad:
            return
        mean = self.transformer.mean.get(in_)
        if mean is None:
            self.crop_mean = numpy.zeros(self.crop_dims, dtype=numpy.float32)
            return
        crop_mean = numpy.array(mean, dtype=numpy.float32).transpose(to_image)
        if in_ in self.transformer.channel_swap:
            crop_mean = crop_mean[:, :, numpy.argsort(self.transformer.channel_swap[in_])]
        self.crop_mean = crop_mean / self.transformer.raw_scale.get(in_, 1)

    def crop(self, im, window):
        """The window (ymin, xmin, ymax, xmax) of H x W x K image `im`, with context when configured."""
        ymin, xmin, ymax, xmax = (int(v) for v in window)
        if not self.context_pad:
            return im[ymin:ymax, xmin:xmax]
        out = numpy.ones(self.crop_dims, dtype=numpy.float32) * self.crop_mean
        spans = [_context_span(lo, hi, size, crop, self.context_pad)
                 for lo, hi, size, crop in ((ymin, ymax, im.shape[0], self.crop_dims[0]),
                                            (xmin, xmax, im.shape[1], self.crop_dims[1]))]
        (y0, y1, pad_y, crop_h), (x0, x1, pad_x, crop_w) = spans
        out[pad_y:pad_y + crop_h, pad_x:pad_x + crop_w] = sio.resize_image(im[y0:y1, x0:x1], (crop_h, crop_w))
        return out


def _context_span(lo, hi, size, crop, context_pad):
    """Along one axis: the image span [start, stop) of the window grown by the context, clipped to the
    image, where it lands in the crop (offset) and how many crop pixels it fills (R-CNN's warp)."""
    scale = crop / (crop - 2.0 * context_pad)
    half = (hi - lo + 1) / 2.0
    centre = lo + half
    start, stop = round(centre - scale * half), round(centre + scale * half)
    crop_scale = crop / (stop - start + 1.0)
    offset = round(max(0, -start) * crop_scale)
    start, stop = min(max(start, 0), size), min(max(stop, 0), size)
    length = min(round((stop - start + 1) * crop_scale), crop - offset)
    if stop <= start or length <= 0:
        raise ValueError(f"window [{lo}, {hi}) lies outside the image (size {size})")
    return start, stop, offset, length
