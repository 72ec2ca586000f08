"""HDF5Data layer: rows of the datasets named like its tops, from the .h5 files listed in a text file."""
import os

from scaffe.data.hdf5_source import HDF5Source, read_source_list
from scaffe.data.layer_support import copy_to_blob, layer_rng, layer_shard, reading_error, resolve_source
from scaffe.data.sharding import ShardSpec
from scaffe.layer_impls import register
from scaffe.layer_impls.layer import Layer


@register
class HDF5DataLayer(Layer):
    """Top i is dataset top[i] of each file, batch_size rows at a time, as float32.

    Paths in the list file are used as written (relative ones against the working directory, as
    in Caffe, then against the list file's folder). Sharding (shard_rank/shard_count) splits the
    row stream round-robin; see scaffe.data.sharding.
    """

    type = "HDF5Data"
    exact_num_bottom = 0
    min_num_top = 1

    def setup(self, bottom, top):
        p = self.param.hdf5_data_param
        where = f"layer {self.name!r} (HDF5Data)"
        if p.batch_size < 1:
            raise ValueError(f"{where}: hdf5_data_param.batch_size must be positive")
        self.batch_size = int(p.batch_size)
        self.list_path = resolve_source(self, p.source)
        try:
            names = read_source_list(self.list_path)
        except (OSError, ValueError) as e:
            raise reading_error(where, e) from None
        folder = os.path.dirname(os.path.abspath(self.list_path))
        self.files = [f if os.path.exists(f) or os.path.isabs(f) else os.path.join(folder, f) for f in names]
        # All of them now, naming the list, rather than the first missing one when its turn comes, hours in.
        missing = next((i for i, f in enumerate(self.files) if not os.path.isfile(f)), None)
        if missing is not None:
            raise FileNotFoundError(f"{where}: HDF5 list file {self.list_path!r} names {names[missing]!r} (file "
                                    f"{missing + 1} of {len(names)}), which does not exist")
        self.dataset_names = list(self.param.top)
        try:
            # A first, unsharded look at the first file gives the top shapes; the real reader is
            # made at the first forward, once the net has set the shard.
            probe = HDF5Source(self.files[:1], self.dataset_names, shuffle=False, shard=ShardSpec())
        except (OSError, ValueError) as e:
            raise reading_error(where, e) from None
        for blob, shape in zip(top, probe.row_shapes):
            blob.reshape((self.batch_size,) + tuple(shape))
        self.source = None

    def reshape(self, bottom, top):
        pass

    def forward(self, bottom, top):
        try:
            # With shuffle, the first file opened may not be the one the probe read.
            if self.source is None:
                self.source = HDF5Source(self.files, self.dataset_names, shuffle=self.param.hdf5_data_param.shuffle,
                                         rng=layer_rng(self), shard=layer_shard(self))
            batch = self.source.next_batch(self.batch_size)
        except (OSError, ValueError) as e:
            raise reading_error(f"layer {self.name!r} (HDF5Data)", e) from None
        for blob, arr in zip(top, batch):
            copy_to_blob(blob, arr)

    def backward(self, top, propagate_down, bottom):
        pass
