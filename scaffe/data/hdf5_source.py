"""HDF5Source: rows of named datasets from a list of .h5 files, as Caffe's HDF5Data layer reads them.

One file is in memory at a time. Rows are served file after file (in list order, or in a shuffled
order with rows shuffled inside each file when `shuffle`), wrapping around forever. Sharding
follows scaffe.data.sharding over this row stream: rank r of P keeps rows r, r+P, r+2P, ...
"""
import os

import numpy

from scaffe.data.sharding import ShardSpec

__all__ = ["HDF5Source", "read_source_list"]


def read_source_list(path):
    """The non-empty, stripped lines of a list file (one .h5 path per line)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"HDF5 list file {path!r} does not exist")
    with open(path, "r", encoding="utf-8") as f:
        files = [line.strip() for line in f if line.strip()]
    if not files:
        raise ValueError(f"HDF5 list file {path!r} names no files")
    return files


class HDF5Source:
    def __init__(self, files, dataset_names, shuffle=False, rng=None, shard=None):
        import h5py  # noqa: F401  (fail here, early, when h5py is missing)

        self.files = list(files)
        self.dataset_names = list(dataset_names)
        self.shuffle = bool(shuffle)
        self.rng = numpy.random.RandomState() if rng is None else rng
        self.shard = shard or ShardSpec()
        self.file_order = numpy.arange(len(self.files))
        if self.shuffle:
            self.rng.shuffle(self.file_order)
        self._file_slot = 0
        self._global_row = 0  # position in the all-ranks row stream
        self._load(self.file_order[0])
        self.row_shapes = [d.shape[1:] for d in self.data]

    def _load(self, file_index):
        import h5py

        path = self.files[file_index]
        if not os.path.isfile(path):
            raise FileNotFoundError(f"HDF5 file {path!r} (listed in the source list) does not exist")
        data = []
        with h5py.File(path, "r") as f:
            for name in self.dataset_names:
                if name not in f:
                    raise ValueError(f"HDF5 file {path!r} has no dataset {name!r} "
                                   f"(it holds: {', '.join(sorted(f.keys()))})")
                arr = numpy.asarray(f[name][()], dtype=numpy.float32)
                if arr.ndim < 1:
                    raise ValueError(f"dataset {name!r} in {path!r} is a scalar; it needs a row axis")
                data.append(arr)
        rows = data[0].shape[0]
        for name, arr in zip(self.dataset_names, data):
            if arr.shape[0] != rows:
                raise ValueError(f"datasets in {path!r} differ in row count: "
                                 f"{self.dataset_names[0]!r} has {rows}, {name!r} has {arr.shape[0]}")
        if rows == 0:
            raise ValueError(f"HDF5 file {path!r} holds no rows")
        self.data = data
        self.row_order = numpy.arange(rows)
        if self.shuffle:
            self.rng.shuffle(self.row_order)
        self._row = 0

    def _advance(self):
        self._row += 1
        self._global_row += 1
        if self._row == len(self.row_order):
            self._file_slot += 1
            if self._file_slot == len(self.files):
                self._file_slot = 0
                if self.shuffle:
                    self.rng.shuffle(self.file_order)
            if len(self.files) > 1:
                self._load(self.file_order[self._file_slot])
            else:
                self._row = 0
                if self.shuffle:
                    self.rng.shuffle(self.row_order)

    def next_batch(self, batch_size):
        """One float32 array per dataset, each (batch_size,) + row shape."""
        out = [numpy.empty((batch_size,) + shape, dtype=numpy.float32) for shape in self.row_shapes]
        for i in range(batch_size):
            while not self.shard.owns(self._global_row):
                self._advance()
            r = self.row_order[self._row]
            for o, d in zip(out, self.data):
                if d.shape[1:] != o.shape[1:]:
                    raise ValueError(f"dataset rows change shape between files: {d.shape[1:]} vs {o.shape[1:]}")
                o[i] = d[r]
            self._advance()
        return out
