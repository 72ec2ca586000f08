"""extract_features: runs a trained net forward and stores chosen blobs, one Datum per sample, like
Caffe's extract_features.

Each sample's values go into `float_data` of a Datum whose channels, height and width are the
blob's axes 1, 2 and 3 (1 where the blob has fewer axes); keys are the sample index as ten digits
("%010d"), counted over all mini-batches. The net is built in the TEST phase from the
feature-extraction prototxt, whose data layer supplies the samples.

CLI (Caffe's arguments): extract_features PRETRAINED_NET_PARAM FEATURE_EXTRACTION_PROTO_FILE
    BLOB_NAME1[,NAME2,...] DATASET_NAME1[,NAME2,...] NUM_MINI_BATCHES DB_TYPE [CPU|GPU] [DEVICE_ID=0]
"""
import contextlib
import sys

import numpy

from scaffe.data.lmdb_writer import LMDBWriter
from scaffe.io import to_host
from scaffe.log import get_logger
from scaffe.net import Net, NetError
from scaffe.proto import caffe_pb2
from scaffe.tools.gflags import run_tool

__all__ = ["main", "extract_features"]

log = get_logger(__name__)

_USAGE = ("usage: extract_features pretrained_net_param feature_extraction_proto_file "
          "extract_feature_blob_name1[,name2,...] save_feature_dataset_name1[,name2,...] num_mini_batches "
          "db_type [CPU/GPU] [DEVICE_ID=0]")


def extract_features(weights, model, blob_names, db_paths, num_mini_batches, xp=numpy):
    """Writes `num_mini_batches` batches of each blob in `blob_names` to the new LMDB at the same
    position in `db_paths`; returns the number of samples written for each blob."""
    if len(blob_names) != len(db_paths):
        raise ValueError(f"{len(blob_names)} blob names but {len(db_paths)} dataset names; give one dataset "
                         f"per blob")
    net = Net.from_file(model, "TEST", xp=xp)
    try:
        net.copy_trained_layers_from(weights)
        for name in blob_names:
            if name not in net.blobs:
                raise NetError(f"unknown feature blob name {name!r} in the network {model}")
        with contextlib.ExitStack() as stack:
            writers = []
            for path in db_paths:
                log.info("Opening dataset %s", path)
                writers.append(stack.enter_context(LMDBWriter(path)))
            log.info("Extracting Features")
            datum = caffe_pb2.Datum()
            counts = [0] * len(blob_names)  # samples stored per blob: the next key
            for _ in range(num_mini_batches):
                net.forward()
                for i, (name, writer) in enumerate(zip(blob_names, writers)):
                    features = numpy.atleast_1d(to_host(net.blobs[name].data))  # a scalar loss: 1 sample
                    if features.ndim > 4:
                        raise NetError(f"blob {name!r} has {features.ndim} axes; a Datum holds at most 4")
                    shape = tuple(features.shape[1:]) + (1, 1, 1)
                    for sample in features.reshape(len(features), -1):
                        datum.Clear()
                        datum.channels, datum.height, datum.width = shape[:3]
                        datum.float_data.extend(sample.tolist())
                        writer.put(b"%010d" % counts[i], datum.SerializeToString())
                        counts[i] += 1
        for name, count in zip(blob_names, counts):
            log.info("Extracted features of %d query images for feature blob %s", count, name)
    finally:
        net.close()
    log.info("Successfully extracted the features!")
    return counts


def _array_module(mode, device_id):
    if mode == "CPU":
        log.info("Using CPU")
        return numpy
    from kernels.backend import cupy_or_none
    cupy = cupy_or_none()
    if cupy is None:
        raise RuntimeError("GPU: no CUDA GPU is usable here (cupy missing or no device); give CPU instead")
    if not 0 <= device_id < cupy.cuda.runtime.getDeviceCount():
        raise RuntimeError(f"GPU device {device_id} does not exist")
    cupy.cuda.Device(device_id).use()
    log.info("Using GPU, device id %d", device_id)
    return cupy


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if not 6 <= len(argv) <= 8 or any(a.startswith("-") for a in argv):
        print(_USAGE, file=sys.stderr)
        return 1
    weights, model, blobs, datasets, batches, db_type = argv[:6]
    mode = argv[6] if len(argv) > 6 else "CPU"

    def work():
        if mode not in ("CPU", "GPU"):
            raise ValueError(f"device {mode!r}: give CPU or GPU")
        numbers = [batches] + argv[7:]
        if not all(n.isdigit() for n in numbers):
            raise ValueError(f"num_mini_batches and DEVICE_ID must be integers >= 0, got {' '.join(numbers)}")
        device_id = int(argv[7]) if len(argv) > 7 else 0
        extract_features(weights, model, blobs.split(","), datasets.split(","), int(batches),
                         xp=_array_module(mode, device_id))

    return run_tool("extract_features", db_type, work)


if __name__ == "__main__":
    sys.exit(main())
