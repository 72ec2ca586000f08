"""ImageData layer (Caffe's "ImageData"): images named in a "path label" list file, read with Pillow,
optionally resized to new_height x new_width, transformed by transform_param, in batches of batch_size.

As in Caffe: paths are root_folder + path (plain concatenation); the list is shuffled at the first
batch and at every wrap-around when `shuffle` is set; rand_skip skips a random number (below it) of
lines at the start; each batch is shaped by its first image. Tops: data (N, C, H, W), label (N,).
Sharding (shard_rank/shard_count) splits the line stream round-robin, as scaffe.data.sharding does;
with shuffle each rank shuffles with its own seed, as HDF5Data does, so ranks draw independently.
"""
import numpy

from scaffe.data.datum import load_image
from scaffe.data.layer_support import copy_to_blob, layer_rng, layer_shard, resolve_source
from scaffe.data.transformer import DataTransformer
from scaffe.layer_impls import register
from scaffe.layer_impls.layer import Layer
from scaffe.tools.convert_imageset import read_image_list


@register
class ImageDataLayer(Layer):
    type = "ImageData"
    exact_num_bottom = 0
    exact_num_top = 2

    def setup(self, bottom, top):
        p = self.param.image_data_param
        self.where = f"layer {self.name!r} (ImageData)"
        if (p.new_height > 0) != (p.new_width > 0):
            raise ValueError(f"{self.where}: give new_height and new_width together, or neither")
        if p.batch_size < 1:
            raise ValueError(f"{self.where}: image_data_param.batch_size must be positive")
        self.batch_size = int(p.batch_size)
        source = resolve_source(self, p.source)
        try:
            self.lines = read_image_list(source)
        except OSError as e:
            raise FileNotFoundError(f"{self.where}: cannot read the image list {source!r}: {e.strerror}") from None
        except ValueError as e:
            raise ValueError(f"{self.where}: {e}") from None
        if not self.lines:
            raise ValueError(f"{self.where}: the image list {source!r} is empty")
        if p.rand_skip > len(self.lines):
            # Caffe skips rand() % rand_skip lines and needs that many to exist.
            raise ValueError(f"{self.where}: rand_skip {p.rand_skip} exceeds the {len(self.lines)} listed images")
        self.transformer = DataTransformer(self.param.transform_param, self.phase)
        first = self._read(0)
        self.transformer.transform(first)
        top[0].reshape((self.batch_size,) + self.transformer.output_shape(first.shape))
        top[1].reshape((self.batch_size,))
        self.order = None

    def _read(self, line):
        p = self.param.image_data_param
        path = p.root_folder + self.lines[line][0]
        try:
            return load_image(path, color=p.is_color, height=p.new_height, width=p.new_width)
        except OSError as e:
            raise FileNotFoundError(f"{self.where}: could not load {path!r}: {e}") from None

    def _start(self):
        p = self.param.image_data_param
        self.rng = self.transformer.rng = layer_rng(self)
        self.shard = layer_shard(self)
        self.order = numpy.arange(len(self.lines))
        if p.shuffle:
            self.rng.shuffle(self.order)
        self.slot = int(self.rng.randint(p.rand_skip)) if p.rand_skip else 0
        self.position = 0   # in the all-ranks stream of lines

    def _next_line(self):
        """The next line of this shard's stream (reshuffling at each wrap-around when asked)."""
        while True:
            line, owned = self.order[self.slot], self.shard.owns(self.position)
            self.position += 1
            self.slot += 1
            if self.slot == len(self.order):
                self.slot = 0
                if self.param.image_data_param.shuffle:
                    self.rng.shuffle(self.order)
            if owned:
                return line

    def reshape(self, bottom, top):
        # Tops are shaped by setup and by each forward (from the batch itself).
        pass

    def forward(self, bottom, top):
        if self.order is None:
            self._start()
        images, labels = [], numpy.empty(self.batch_size, dtype=numpy.float32)
        for i in range(self.batch_size):
            line = self._next_line()
            image = self._read(line)
            if images and image.shape != images[0].shape:
                raise ValueError(f"{self.where}: image {self.lines[line][0]!r} has shape {image.shape} in a batch "
                                 f"whose first image has shape {images[0].shape}; set new_height and new_width")
            images.append(image)
            labels[i] = self.lines[line][1]
        copy_to_blob(top[0], self.transformer.transform_batch(images))
        copy_to_blob(top[1], labels)

    def backward(self, top, propagate_down, bottom):
        pass
