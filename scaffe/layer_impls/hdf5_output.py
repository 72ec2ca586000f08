"""HDF5Output layer (Caffe's "HDF5Output"): writes its two bottoms to the datasets "data" and "label" of
hdf5_output_param.file_name, as float arrays in Caffe's legacy 4-axis shape (num, channels, height, width).

Setup creates (truncates) the file, as Caffe does; each forward writes that batch, replacing the last
one (Caffe writes once and fails on a second forward, as its datasets already exist).
"""
import h5py
import numpy

from scaffe.io import to_host
from scaffe.layer_impls import register
from scaffe.layer_impls.layer import Layer

DATASET_NAMES = ("data", "label")


def legacy_shape(shape, where):
    """(num, channels, height, width): the shape padded with 1s, as Caffe's Blob::num()... read it."""
    if len(shape) > 4:
        raise ValueError(f"{where}: a blob of shape {shape} has more than the 4 axes HDF5Output writes")
    return tuple(shape) + (1,) * (4 - len(shape))


@register
class HDF5OutputLayer(Layer):
    type = "HDF5Output"
    exact_num_bottom = 2
    exact_num_top = 0

    def setup(self, bottom, top):
        self.file_name = self.param.hdf5_output_param.file_name
        self.where = f"layer {self.name!r} (HDF5Output)"
        if not self.file_name:
            raise ValueError(f"{self.where}: hdf5_output_param.file_name is not set")
        try:
            h5py.File(self.file_name, "w").close()
        except OSError as e:
            raise OSError(f"{self.where}: cannot create {self.file_name!r}: {e}") from None

    def reshape(self, bottom, top):
        if bottom[0].shape[:1] != bottom[1].shape[:1]:
            raise ValueError(f"{self.where}: data {bottom[0].shape} and label {bottom[1].shape} must have the "
                             f"same number of items")

    def forward(self, bottom, top):
        with h5py.File(self.file_name, "a") as f:
            for name, blob in zip(DATASET_NAMES, bottom):
                if name in f:
                    del f[name]
                values = numpy.asarray(to_host(blob.data)).reshape(legacy_shape(blob.shape, self.where))
                f.create_dataset(name, data=values)

    def backward(self, top, propagate_down, bottom):
        pass
