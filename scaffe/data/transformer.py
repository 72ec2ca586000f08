"""DataTransformer: Caffe's per-sample preprocessing (crop, mirror, mean subtraction, scale).

Semantics kept from Caffe's DataTransformer:
* out = (pixel - mean) * scale, computed in float32; the mean is a mean_file (a BlobProto of the
  full, uncropped C x H x W sample, cropped together with the sample) or mean_value (one value for
  all channels or one per channel); giving both is an error.
* crop_size > 0: a random crop_size x crop_size window in TRAIN, the centre window
  ((H - crop) // 2, (W - crop) // 2) in TEST.
* mirror: true flips each sample left-right with probability 1/2. Like Caffe, this is random in
  every phase where it is set (Caffe's prototxts normally set it only for the TRAIN layer).
* force_color / force_gray pick the channel count when decoding encoded Datums.
Random choices come from the `rng` given (a numpy RandomState/Generator); Caffe's own random
stream is not reproduced.
"""
import numpy

from scaffe.data.datum import datum_to_array
from scaffe.proto import caffe_pb2

__all__ = ["DataTransformer"]


class DataTransformer:
    """Applies one TransformationParameter to C x H x W samples (numpy arrays or Datums)."""

    def __init__(self, param=None, phase=caffe_pb2.TRAIN, rng=None, mean_loader=None):
        self.param = caffe_pb2.TransformationParameter() if param is None else param
        self.phase = phase
        self.rng = numpy.random.RandomState() if rng is None else rng
        self.scale = numpy.float32(self.param.scale)
        self.crop_size = int(self.param.crop_size)
        if self.param.HasField("mean_file") and len(self.param.mean_value):
            raise ValueError("transform_param: mean_file and mean_value cannot both be given")
        self.mean_image = None
        if self.param.HasField("mean_file"):
            if mean_loader is None:
                from scaffe.io import read_mean_file as mean_loader
            self.mean_image = numpy.asarray(mean_loader(self.param.mean_file), dtype=numpy.float32)
        self.mean_values = numpy.array(self.param.mean_value, dtype=numpy.float32)
        if self.param.force_color and self.param.force_gray:
            raise ValueError("transform_param: force_color and force_gray cannot both be true")
        self.color = True if self.param.force_color else (False if self.param.force_gray else None)

    def decode(self, value):
        """(C x H x W array, label) of a Datum or its serialized bytes, honouring force_color/gray."""
        return datum_to_array(value, color=self.color)

    def output_shape(self, sample_shape):
        """The C x H x W shape one sample of `sample_shape` becomes (Caffe's InferBlobShape)."""
        c, h, w = sample_shape
        if self.crop_size:
            if h < self.crop_size or w < self.crop_size:
                raise ValueError(f"crop_size {self.crop_size} is larger than the {h}x{w} input")
            return (c, self.crop_size, self.crop_size)
        return (c, h, w)

    def _offsets(self, h, w):
        crop = self.crop_size
        if not crop:
            return 0, 0, h, w
        if h < crop or w < crop:
            raise ValueError(f"crop_size {crop} is larger than the {h}x{w} input")
        if self.phase == caffe_pb2.TRAIN:
            return int(self.rng.randint(h - crop + 1)), int(self.rng.randint(w - crop + 1)), crop, crop
        return (h - crop) // 2, (w - crop) // 2, crop, crop

    def transform(self, sample, out=None):
        """One C x H x W sample (uint8 or float) -> float32 C x H' x W' (written into `out` if given)."""
        sample = numpy.asarray(sample)
        c, h, w = sample.shape
        # Same draw order as Caffe: the mirror coin, then the crop offsets.
        do_mirror = bool(self.param.mirror) and bool(self.rng.randint(2))
        h_off, w_off, oh, ow = self._offsets(h, w)
        window = sample[:, h_off:h_off + oh, w_off:w_off + ow].astype(numpy.float32)
        if self.mean_image is not None:
            if self.mean_image.shape != (c, h, w):
                raise ValueError(f"mean_file holds shape {self.mean_image.shape}, the data is {(c, h, w)}")
            window -= self.mean_image[:, h_off:h_off + oh, w_off:w_off + ow]
        elif self.mean_values.size:
            if self.mean_values.size not in (1, c):
                raise ValueError(f"transform_param has {self.mean_values.size} mean_value entries "
                                 f"for {c} channels (give 1 or {c})")
            window -= self.mean_values.reshape(-1, 1, 1)
        if self.scale != 1:
            window *= self.scale
        if do_mirror:
            window = window[:, :, ::-1]
        if out is None:
            return numpy.ascontiguousarray(window)
        out[...] = window
        return out

    def transform_batch(self, samples, out=None):
        """A list of same-shaped C x H x W samples -> float32 N x C x H' x W'."""
        if out is None:
            out = numpy.empty((len(samples),) + self.output_shape(numpy.shape(samples[0])), dtype=numpy.float32)
        for i, s in enumerate(samples):
            self.transform(s, out=out[i])
        return out
