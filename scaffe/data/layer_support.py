"""What data layers read from the net/trainer: their shard, their random seed, where relative paths live.

Optional attributes a net or trainer may set on a data layer before its first forward pass:
* `shard_rank`, `shard_count`, `shard_block` (default 0, 1, 1): this process's slice of the data
  (scaffe.data.sharding).
* `random_seed` (default: drawn from the layer's `rng` attribute if the net set one, else from
  numpy's global random state, so seeding numpy seeds the data): the seed of the layer's
  crop/mirror/shuffle stream; the shard rank is added to it so ranks differ.
* `data_root` (default None): a folder to try for relative sources that do not exist relative to
  the working directory (Caffe itself resolves them against the working directory only).
"""
import os

import numpy

from scaffe.data.sharding import ShardSpec
from scaffe.io import CaffeFormatError

__all__ = ["layer_shard", "layer_rng", "resolve_source", "copy_to_blob", "reading_error"]


def layer_shard(layer):
    return ShardSpec(getattr(layer, "shard_rank", 0), getattr(layer, "shard_count", 1),
                     getattr(layer, "shard_block", 1))


def layer_rng(layer):
    seed = getattr(layer, "random_seed", None)
    if seed is None:
        source = getattr(layer, "rng", None)
        source = numpy.random if source is None else source
        draw = source.randint if hasattr(source, "randint") else source.integers
        seed = int(draw(0, 2**31 - 1))
    return numpy.random.RandomState((int(seed) + getattr(layer, "shard_rank", 0)) % 2**32)


def resolve_source(layer, path):
    """`path` as given if it exists (or is absolute), else under layer.data_root when that exists."""
    root = getattr(layer, "data_root", None)
    if os.path.isabs(path) or os.path.exists(path) or not root:
        return path
    candidate = os.path.join(root, path)
    return candidate if os.path.exists(candidate) else path


def copy_to_blob(blob, array):
    """Reshapes `blob` to `array`'s shape and copies the host array in (to the device for cupy blobs)."""
    if tuple(blob.shape) != tuple(array.shape):
        blob.reshape(array.shape)
    if isinstance(blob.data, numpy.ndarray):
        blob.data[...] = array
    else:
        blob.data[...] = blob.xp.asarray(array)


def reading_error(where, err):
    """The error `err` met reading a layer's data, told with `where` (the layer) in front: a missing file stays
    a FileNotFoundError, anything else is a CaffeFormatError. (`type(err)(message)` cannot rebuild every
    kind: a UnicodeDecodeError takes five arguments.)"""
    kind = FileNotFoundError if isinstance(err, FileNotFoundError) else CaffeFormatError
    return kind(f"{where}: {' '.join(str(err).split())}")
