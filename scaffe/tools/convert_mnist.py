"""convert_mnist: MNIST idx files -> LMDB of Datum, record for record what Caffe's convert_mnist_data writes.

Keys are the record index as 8 ASCII digits ("%08d"); each value is a Datum with channels 1,
height/width from the idx header, the raw pixel bytes and the label. Inputs may be gzipped.

CLI (Caffe's argument order): convert_mnist_data IMAGE_FILE LABEL_FILE OUTPUT_DB [--backend=lmdb]
"""
import argparse
import gzip
import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path

import numpy

from scaffe.data.lmdb_reader import database_kind
from scaffe.data.lmdb_writer import LMDBWriter
from scaffe.log import get_logger
from scaffe.proto import caffe_pb2
from scaffe.tools.gflags import run_tool

__all__ = ["main", "read_idx_images", "read_idx_labels", "convert_mnist", "ensure_mnist_lmdb",
           "bundled_mnist_dir"]

log = get_logger(__name__)

IMAGE_MAGIC = 2051
LABEL_MAGIC = 2049


def _read_bytes(path):
    path = os.fspath(path)
    with open(path, "rb") as f:
        head = f.read(2)
    opener = gzip.open if head == b"\x1f\x8b" else open
    with opener(path, "rb") as f:
        return f.read()


def read_idx_images(path):
    """uint8 array (N, rows, cols) from an idx3 image file (plain or gzipped)."""
    data = _read_bytes(path)
    if len(data) < 16:
        raise ValueError(f"{path}: too short for an idx image file")
    magic, count, rows, cols = struct.unpack(">iiii", data[:16])
    if magic != IMAGE_MAGIC:
        raise ValueError(f"{path}: wrong magic number {magic} (an idx image file has {IMAGE_MAGIC})")
    if len(data) != 16 + count * rows * cols:
        raise ValueError(f"{path}: header says {count} images of {rows}x{cols}, file size disagrees")
    return numpy.frombuffer(data, dtype=numpy.uint8, offset=16).reshape(count, rows, cols)


def read_idx_labels(path):
    """uint8 array (N,) from an idx1 label file (plain or gzipped)."""
    data = _read_bytes(path)
    if len(data) < 8:
        raise ValueError(f"{path}: too short for an idx label file")
    magic, count = struct.unpack(">ii", data[:8])
    if magic != LABEL_MAGIC:
        raise ValueError(f"{path}: wrong magic number {magic} (an idx label file has {LABEL_MAGIC})")
    if len(data) != 8 + count:
        raise ValueError(f"{path}: header says {count} labels, file size disagrees")
    return numpy.frombuffer(data, dtype=numpy.uint8, offset=8)


def convert_mnist(image_file, label_file, db_path):
    """Writes the LMDB; returns the number of records."""
    images = read_idx_images(image_file)
    labels = read_idx_labels(label_file)
    if len(images) != len(labels):
        raise ValueError(f"{image_file} holds {len(images)} images but {label_file} holds {len(labels)} labels")
    rows, cols = images.shape[1:]
    datum = caffe_pb2.Datum(channels=1, height=rows, width=cols)
    with LMDBWriter(db_path) as db:
        for i in range(len(images)):
            datum.data = images[i].tobytes()
            datum.label = int(labels[i])
            db.put(b"%08d" % i, datum.SerializeToString())
    return len(images)


def bundled_mnist_dir():
    """examples/mnist/data of this source tree (the shipped 4,000 + 1,000 digit subset)."""
    return Path(__file__).resolve().parents[2] / "examples" / "mnist" / "data"


def _build_once(images, labels, final):
    # Build beside the target and rename into place: a crash leaves no half-written database,
    # and of several ranks racing to build it one rename wins and the others discard theirs.
    parent = os.path.dirname(os.path.abspath(final))
    work = tempfile.mkdtemp(prefix="." + os.path.basename(final) + ".", dir=parent)
    try:
        convert_mnist(images, labels, os.path.join(work, "db"))
        try:
            os.rename(os.path.join(work, "db"), final)
        except OSError:
            if database_kind(final) != "lmdb":
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def ensure_mnist_lmdb(dest_dir, data_dir=None):
    """Builds dest_dir/mnist_train_lmdb and dest_dir/mnist_test_lmdb from the idx files if absent.

    `data_dir` defaults to the bundled subset (`bundled_mnist_dir()`); it must hold
    train-/t10k-images-idx3-ubyte and -labels-idx1-ubyte, gzipped (.gz) or not.
    Returns (train_db_path, test_db_path).
    """
    dest_dir = os.fspath(dest_dir)
    data_dir = Path(data_dir) if data_dir is not None else bundled_mnist_dir()
    os.makedirs(dest_dir, exist_ok=True)
    out = []
    for prefix, name in (("train", "mnist_train_lmdb"), ("t10k", "mnist_test_lmdb")):
        final = os.path.join(dest_dir, name)
        out.append(final)
        if database_kind(final) == "lmdb":
            continue
        if os.path.exists(final):
            raise FileExistsError(f"{final!r} exists but is not an LMDB; remove it to rebuild")
        files = []
        for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
            base = data_dir / f"{prefix}-{kind}"
            found = next((p for p in (base.with_name(base.name + ".gz"), base) if p.exists()), None)
            if found is None:
                raise FileNotFoundError(f"MNIST file {base}(.gz) not found")
            files.append(found)
        _build_once(files[0], files[1], final)
    return tuple(out)


def _parser():
    p = argparse.ArgumentParser(prog="convert_mnist_data", description="Convert MNIST idx files to an LMDB of Datum.")
    p.add_argument("image_file")
    p.add_argument("label_file")
    p.add_argument("db_path")
    p.add_argument("--backend", "-backend", default="lmdb", help="only lmdb is supported")
    return p


def main(argv=None):
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)

    def work():
        log.info("A total of %d items.", convert_mnist(args.image_file, args.label_file, args.db_path))

    return run_tool("convert_mnist_data", args.backend, work)


if __name__ == "__main__":
    from scaffe.cli import tool_script  # glog's settings and lines, as for every command
    sys.exit(tool_script("convert_mnist_data"))
