"""compute_image_mean: the mean image of an LMDB of Datum, written as a Caffe mean file (BlobProto).

The output is what Caffe's compute_image_mean writes: a BlobProto with the legacy 4-d shape
num=1, channels, height, width and float data, which `transform_param { mean_file: ... }` reads.
Sums are accumulated in float64 (Caffe accumulates in float32, which drifts on large databases).

CLI (Caffe's argument order): compute_image_mean INPUT_DB [OUTPUT_FILE] [--backend=lmdb]
"""
import argparse
import sys

import numpy

from scaffe.data.datum import datum_to_array
from scaffe.data.lmdb_reader import open_database
from scaffe.io import CaffeFormatError, array_to_blobproto, write_blobproto
from scaffe.log import get_logger
from scaffe.tools.gflags import run_tool

__all__ = ["main", "compute_image_mean"]

log = get_logger(__name__)


def compute_image_mean(db_path):
    """(mean as float32 C x H x W array, number of records) over every record of the LMDB."""
    db = open_database(db_path)
    try:
        total = None
        count = 0
        for key, value in db.items():
            record = f"{db_path}: record {key.decode(errors='replace')!r}"
            try:
                sample, _ = datum_to_array(value)
            except ValueError as e:
                raise CaffeFormatError(f"{record}: {e}") from None
            if total is None:
                total = numpy.zeros(sample.shape, dtype=numpy.float64)
            elif sample.shape != total.shape:
                raise ValueError(f"{record} has shape {sample.shape}, earlier records {total.shape}: a mean needs "
                                 "equal sizes")
            total += sample
            count += 1
    finally:
        db.close()
    if not count:
        raise ValueError(f"{db_path}: the database is empty")
    return (total / count).astype(numpy.float32), count


def _parser():
    p = argparse.ArgumentParser(prog="compute_image_mean", description="Mean image of an LMDB of Datum.")
    p.add_argument("input_db")
    p.add_argument("output_file", nargs="?")
    p.add_argument("--backend", "-backend", default="lmdb", help="only lmdb is supported")
    return p


def main(argv=None):
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    return run_tool("compute_image_mean", args.backend, lambda: _write_mean(args.input_db, args.output_file))


def _write_mean(input_db, output_file):
    mean, count = compute_image_mean(input_db)
    log.info("Processed %d files.", count)
    if output_file:
        # Caffe's mean files carry the legacy 4-d header (1, C, H, W), not `shape`.
        write_blobproto(array_to_blobproto(mean[None], legacy_4d=True), output_file)
        log.info("Write to %s", output_file)
    log.info("Number of channels: %d", mean.shape[0])
    for c, v in enumerate(mean.reshape(mean.shape[0], -1).mean(axis=1)):
        log.info("mean_value channel [%d]: %g", c, v)


if __name__ == "__main__":
    from scaffe.cli import tool_script  # glog's settings and lines, as for every command
    sys.exit(tool_script("compute_image_mean"))
