"""pycaffe's Classifier: a deploy net that turns images into class probabilities (caffe.Classifier)."""
import numpy

from scaffe import io as sio
from scaffe.pycaffe import TEST, Net


def input_transformer(net, mean=None, input_scale=None, raw_scale=None, channel_swap=None):
    """A Transformer for the net's first input that takes H x W x K images, with the settings given."""
    in_ = net.inputs[0]
    transformer = sio.Transformer({in_: net.blobs[in_].shape})
    transformer.set_transpose(in_, (2, 0, 1))
    for setting, value in (("mean", mean), ("input_scale", input_scale), ("raw_scale", raw_scale),
                           ("channel_swap", channel_swap)):
        if value is not None:
            getattr(transformer, f"set_{setting}")(in_, value)
    return transformer


class Classifier(Net):
    """`Classifier(model_file, pretrained_file, image_dims=None, mean=None, input_scale=None,
    raw_scale=None, channel_swap=None)`: the net in TEST phase with its weights, and a Transformer
    for its first input (images are H x W x K, RGB in [0, 1] as caffe.io.load_image gives them).

    Images are resized to `image_dims` (default: the input's size), then cropped to the input's
    size: the centre, or the ten crops of caffe.io.oversample whose predictions are averaged.
    """

    def __init__(self, model_file, pretrained_file, image_dims=None, mean=None, input_scale=None,
                 raw_scale=None, channel_swap=None):
        super().__init__(model_file, TEST, weights=pretrained_file)
        self.transformer = input_transformer(self, mean, input_scale, raw_scale, channel_swap)
        self.crop_dims = numpy.array(self.blobs[self.inputs[0]].shape[2:])
        self.image_dims = self.crop_dims if image_dims is None or not len(image_dims) else numpy.array(image_dims)

    def predict(self, inputs, oversample=True):
        """(N x classes) probabilities (the net's first output) for N images (H x W x K arrays)."""
        if not len(inputs):
            raise ValueError("Classifier.predict: no images given")
        resized = numpy.stack([sio.resize_image(image, self.image_dims) for image in inputs])
        if oversample:
            crops = sio.oversample(resized, self.crop_dims)
        else:
            top, left = ((self.image_dims - self.crop_dims) / 2.0).astype(int)
            crops = resized[:, top:top + self.crop_dims[0], left:left + self.crop_dims[1], :]
        in_ = self.inputs[0]
        caffe_in = numpy.stack([self.transformer.preprocess(in_, crop) for crop in crops])
        predictions = self.forward_all(**{in_: caffe_in})[self.outputs[0]]
        if oversample:
            predictions = predictions.reshape((len(predictions) // 10, 10, -1)).mean(axis=1)
        return predictions
