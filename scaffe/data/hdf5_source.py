"""HDF5Source: rows of named datasets from a list of .h5 files, as Caffe's HDF5Data layer reads them.

One file is open at a time, and only the rows a batch takes are read from it: a small file may declare a
dataset of gigabytes (its rows are then the fill value), and Caffe's way of reading whole files would
allocate all of it. Rows are served file after file (in list order, or in a shuffled order with rows
shuffled inside each file when `shuffle`), wrapping around forever. Sharding follows scaffe.data.sharding
over this row stream: rank r of P keeps rows r, r+P, r+2P, ...
Every problem with a file raises CaffeFormatError naming it (a missing one, FileNotFoundError).
"""
import os

import numpy

from scaffe.data.sharding import ShardSpec
from scaffe.io import CaffeFormatError, check_hdf5_numbers, hdf5_errors

__all__ = ["HDF5Source", "read_source_list"]


def read_source_list(path):
    """The non-empty, stripped lines of a list file (one .h5 path per line)."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"HDF5 list file {path!r} does not exist")
    try:
        with open(path, "r", encoding="utf-8") as f:
            files = [line.strip() for line in f if line.strip()]
    except UnicodeDecodeError as e:
        raise CaffeFormatError(f"HDF5 list file {path!r} is not UTF-8 text (byte {e.start}: {e.reason}); it should "
                               "name one .h5 file per line") from None
    if not files:
        raise CaffeFormatError(f"HDF5 list file {path!r} names no files")
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
        self._file = None
        self.row_shapes = None
        self._load(self.file_order[0])
        self._next_file = None  # the file to open before the next row, once the current one is used up

    def _load(self, file_index):
        import h5py

        path = self.files[file_index]
        if not os.path.isfile(path):
            raise FileNotFoundError(f"HDF5 file {path!r} (listed in the source list) does not exist")
        if self._file is not None:
            self._file.close()
        with hdf5_errors(f"HDF5 file {path!r}: cannot open"):
            self._file = h5py.File(path, "r")
        self.path = path
        with hdf5_errors(f"HDF5 file {path!r}: cannot read"):
            self.data = [self._dataset(name) for name in self.dataset_names]
        rows = self.data[0].shape[0]
        for name, dataset in zip(self.dataset_names, self.data):
            if dataset.shape[0] != rows:
                raise CaffeFormatError(f"datasets in {path!r} differ in row count: "
                                       f"{self.dataset_names[0]!r} has {rows}, {name!r} has {dataset.shape[0]}")
        if rows == 0:
            raise CaffeFormatError(f"HDF5 file {path!r} holds no rows")
        shapes = [dataset.shape[1:] for dataset in self.data]
        if self.row_shapes is not None and shapes != self.row_shapes:
            raise CaffeFormatError(f"HDF5 file {path!r}: rows of shapes {shapes}, earlier files' {self.row_shapes}")
        self.row_shapes = shapes
        self.row_order = numpy.arange(rows)
        if self.shuffle:
            self.rng.shuffle(self.row_order)
        self._row = 0

    def _dataset(self, name):
        """The dataset `name` of the open file, unread, after checking what Caffe checks of it."""
        if name not in self._file:
            raise CaffeFormatError(f"HDF5 file {self.path!r} has no dataset {name!r} "
                                   f"(it holds: {', '.join(sorted(self._file.keys()))})")
        dataset = self._file[name]
        if not hasattr(dataset, "dtype"):
            raise CaffeFormatError(f"HDF5 file {self.path!r}: {name!r} is a group, not a dataset")
        check_hdf5_numbers(dataset, f"HDF5 file {self.path!r}")
        if dataset.ndim < 1:
            raise CaffeFormatError(f"dataset {name!r} in {self.path!r} is a scalar; it needs a row axis")
        return dataset

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
                self._next_file = self.file_order[self._file_slot]
            else:
                self._row = 0
                if self.shuffle:
                    self.rng.shuffle(self.row_order)

    def _take_rows(self, limit):
        """Up to `limit` of this shard's rows of the open file, in serving order (opening the next file first
        if the last call used this one up); fewer when the file ends."""
        if self._next_file is not None:
            self._load(self._next_file)
            self._next_file = None
        rows = []
        while len(rows) < limit and self._next_file is None:
            if self.shard.owns(self._global_row):
                rows.append(self.row_order[self._row])
            self._advance()
        return rows

    def _read_rows(self, dataset, rows):
        # h5py reads a selection of increasing, distinct rows in one call.
        distinct, back = numpy.unique(rows, return_inverse=True)
        with hdf5_errors(f"HDF5 file {self.path!r}: cannot read dataset {dataset.name!r}"):
            return numpy.asarray(dataset[distinct], dtype=numpy.float32)[back]

    def next_batch(self, batch_size):
        """One float32 array per dataset, each (batch_size,) + row shape."""
        out = [numpy.empty((batch_size,) + shape, dtype=numpy.float32) for shape in self.row_shapes]
        filled = 0
        while filled < batch_size:
            rows = self._take_rows(batch_size - filled)
            if rows:
                for o, dataset in zip(out, self.data):
                    o[filled:filled + len(rows)] = self._read_rows(dataset, rows)
            filled += len(rows)
        return out
