"""WindowData layer (Caffe's "WindowData", R-CNN's fine-tuning input): crops of image windows listed in a
window file, warped to crop_size x crop_size, a fixed fraction of them foreground.

The window file repeats, whitespace-separated:  # image_index  image_path  channels height width
num_windows, then num_windows lines "label overlap x1 y1 x2 y2" (pixel coordinates, inclusive).
Windows with overlap >= fg_threshold are foreground (label > 0 required); those with overlap <
bg_threshold are background (label 0); the rest are unused. Each batch holds batch_size -
int(batch_size * fg_fraction) background windows, then the foreground ones, each drawn at random with
replacement. context_pad widens the window so that, once warped, crop_size - 2 * context_pad pixels
hold the window; crop_mode "square" first makes the window square. Parts outside the image stay 0.
The mean (transform_param mean_file or mean_value) is subtracted and window_data_param.scale applied
(transform_param.scale when that is unset), as in Caffe; crop_size and mirror come from transform_param. Windows are
warped with OpenCV's bilinear resize, as in Caffe (scaffe.data.resize).
"""
import math

import numpy

from scaffe.data.datum import load_image
from scaffe.data.layer_support import copy_to_blob, layer_rng, resolve_source
from scaffe.data.resize import resize_linear
from scaffe.data.transformer import DataTransformer
from scaffe.layer_impls import register
from scaffe.layer_impls.layer import Layer

_FIELDS_PER_WINDOW = 6   # label overlap x1 y1 x2 y2


def c_round(x):
    """C's round(): halves away from zero (Python's round() goes to even)."""
    return int(math.copysign(math.floor(abs(x) + 0.5), x))


def read_window_file(path, root_folder, fg_threshold, bg_threshold):
    """({image_index: (path, (c, h, w))}, foreground windows, background windows); a window is
    (image_index, label, x1, y1, x2, y2)."""
    with open(path, "r", encoding="utf-8") as f:
        tokens = f.read().split()
    images, foreground, background = {}, [], []
    at = 0
    while at < len(tokens):
        if tokens[at] != "#" or at + 7 > len(tokens):
            raise ValueError(f"{path}: expected '# image_index path channels height width num_windows' "
                             f"at token {at + 1}")
        index, image_path = int(tokens[at + 1]), root_folder + tokens[at + 2]
        images[index] = (image_path, tuple(int(t) for t in tokens[at + 3:at + 6]))
        num_windows = int(tokens[at + 6])
        at += 7
        if at + num_windows * _FIELDS_PER_WINDOW > len(tokens):
            raise ValueError(f"{path}: image {index} lists {num_windows} windows but the file ends first")
        for _ in range(num_windows):
            label, overlap = int(tokens[at]), float(tokens[at + 1])
            box = tuple(int(t) for t in tokens[at + 2:at + 6])
            at += _FIELDS_PER_WINDOW
            if overlap >= fg_threshold:
                if label <= 0:
                    raise ValueError(f"{path}: image {index} has a foreground window (overlap {overlap}) "
                                     f"with label {label}; foreground labels must be positive")
                foreground.append((index, label) + box)
            elif overlap < bg_threshold:
                background.append((index, 0) + box)
    if not images:
        raise ValueError(f"{path}: the window file is empty")
    return images, foreground, background


def window_geometry(box, image_hw, crop_size, context_pad, square, mirror):
    """Caffe's window arithmetic: ((x1, y1, x2, y2) clipped to the image, (height, width) to warp the
    clipped region to, (pad_h, pad_w) where it goes in the crop_size x crop_size output)."""
    x1, y1, x2, y2 = box
    if not (context_pad > 0 or square):
        return box, (crop_size, crop_size), (0, 0)
    context_scale = crop_size / (crop_size - 2 * context_pad)
    half_h, half_w = (y2 - y1 + 1) / 2.0, (x2 - x1 + 1) / 2.0
    center_x, center_y = x1 + half_w, y1 + half_h
    if square:
        half_h = half_w = max(half_h, half_w)
    x1, x2 = c_round(center_x - half_w * context_scale), c_round(center_x + half_w * context_scale)
    y1, y2 = c_round(center_y - half_h * context_scale), c_round(center_y + half_h * context_scale)
    scale_x, scale_y = crop_size / (x2 - x1 + 1), crop_size / (y2 - y1 + 1)
    height, width = image_hw
    pad_x1, pad_y1 = max(0, -x1), max(0, -y1)
    pad_x2, pad_y2 = max(0, x2 - width + 1), max(0, y2 - height + 1)
    x1, x2, y1, y2 = x1 + pad_x1, x2 - pad_x2, y1 + pad_y1, y2 - pad_y2
    out_w, out_h = c_round((x2 - x1 + 1) * scale_x), c_round((y2 - y1 + 1) * scale_y)
    pad_h = c_round(pad_y1 * scale_y)
    pad_w = c_round((pad_x2 if mirror else pad_x1) * scale_x)
    return (x1, y1, x2, y2), (min(out_h, crop_size - pad_h), min(out_w, crop_size - pad_w)), (pad_h, pad_w)


@register
class WindowDataLayer(Layer):
    type = "WindowData"
    exact_num_bottom = 0
    exact_num_top = 2

    def setup(self, bottom, top):
        p = self.param.window_data_param
        where = f"layer {self.name!r} (WindowData)"
        self.crop_size = int(self.param.transform_param.crop_size)
        if self.crop_size <= 0:
            raise ValueError(f"{where}: transform_param.crop_size must be positive")
        if p.batch_size < 1:
            raise ValueError(f"{where}: window_data_param.batch_size must be positive")
        if p.crop_mode not in ("warp", "square"):
            raise ValueError(f"{where}: crop_mode {p.crop_mode!r} is neither 'warp' nor 'square'")
        if 2 * p.context_pad >= self.crop_size:
            raise ValueError(f"{where}: context_pad {p.context_pad} leaves no room in crop_size {self.crop_size}")
        source = resolve_source(self, p.source)
        try:
            self.images, self.foreground, self.background = read_window_file(
                source, p.root_folder, p.fg_threshold, p.bg_threshold)
        except OSError as e:
            raise FileNotFoundError(f"{where}: cannot read the window file {source!r}: {e.strerror}") from None
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
        if not self.foreground or not self.background:
            raise ValueError(f"{where}: {source} has {len(self.foreground)} foreground and {len(self.background)} "
                             f"background windows; both kinds are needed")
        self.batch_size = int(p.batch_size)
        # Caffe reads window_data_param.scale; scaffe's loader moves a data param's scale into
        # transform_param (Caffe's upgrade of V1 nets), so that one counts when the other is unset.
        self.scale = numpy.float32(p.scale if p.HasField("scale") else self.param.transform_param.scale)
        self.num_foreground = int(self.batch_size * p.fg_fraction)
        # Caffe takes the channel count from the window file (its last image) and reads images in colour.
        self.channels = list(self.images.values())[-1][1][0]
        self.mean = self._mean(DataTransformer(self.param.transform_param, self.phase), where)
        self.cache = {i: self._load(i) for i in self.images} if p.cache_images else None
        top[0].reshape((self.batch_size, self.channels, self.crop_size, self.crop_size))
        top[1].reshape((self.batch_size,))
        self.rng = None

    def _mean(self, transformer, where):
        """A function (rows, cols of the output) -> the mean to subtract there, or None."""
        if transformer.mean_image is not None:
            mean = transformer.mean_image
            offset = (mean.shape[2] - self.crop_size) // 2   # Caffe centres by the mean's width on both axes
            return lambda rows, cols: mean[:, offset + rows.start:offset + rows.stop,
                                           offset + cols.start:offset + cols.stop]
        if transformer.mean_values.size:
            if transformer.mean_values.size not in (1, self.channels):
                raise ValueError(f"{where}: give 1 mean_value or {self.channels} (one per channel)")
            values = numpy.broadcast_to(transformer.mean_values, (self.channels,)).reshape(-1, 1, 1)
            return lambda rows, cols: values
        return None

    def _load(self, index):
        path = self.images[index][0]
        try:
            return load_image(path, color=self.channels != 1)
        except OSError as e:
            raise FileNotFoundError(f"layer {self.name!r} (WindowData): could not load {path!r}: {e}") from None

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        if self.rng is None:
            self.rng = layer_rng(self)
        data = numpy.zeros((self.batch_size, self.channels, self.crop_size, self.crop_size), dtype=numpy.float32)
        labels = numpy.empty(self.batch_size, dtype=numpy.float32)
        draws = [self.background] * (self.batch_size - self.num_foreground) + [self.foreground] * self.num_foreground
        for item, windows in enumerate(draws):
            window = windows[self.rng.randint(len(windows))]
            labels[item] = window[1]
            self._crop_into(data[item], window)
        copy_to_blob(top[0], data)
        copy_to_blob(top[1], labels)

    def _crop_into(self, out, window):
        p = self.param.window_data_param
        mirror = bool(self.param.transform_param.mirror) and bool(self.rng.randint(2))
        index = window[0]
        image = self.cache[index] if self.cache is not None else self._load(index)
        (x1, y1, x2, y2), size, (pad_h, pad_w) = window_geometry(
            window[2:], image.shape[1:], self.crop_size, p.context_pad, p.crop_mode == "square", mirror)
        if not (0 <= x1 <= x2 < image.shape[2] and 0 <= y1 <= y2 < image.shape[1]):
            raise ValueError(f"layer {self.name!r} (WindowData): window {window[2:]} of image {index} lies outside "
                             f"its {image.shape[1]}x{image.shape[2]} pixels")
        pixels = resize_linear(image[:, y1:y2 + 1, x1:x2 + 1], *size).astype(numpy.float32)
        if mirror:
            pixels = pixels[:, :, ::-1]
        rows, cols = slice(pad_h, pad_h + size[0]), slice(pad_w, pad_w + size[1])
        if self.mean is not None:
            pixels -= self.mean(rows, cols)
        out[:, rows, cols] = pixels * self.scale

    def backward(self, top, propagate_down, bottom):
        pass
