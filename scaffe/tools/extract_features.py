"""extract_features: runs a trained net forward and stores chosen blobs, one Datum per sample, like
Caffe's extract_features.

Each sample's values go into `float_data` of a Datum whose channels, height and width are the
blob's axes 1, 2 and 3 (1 where the blob has fewer axes); keys are the sample index as ten digits
("%010d"), counted over all mini-batches. The net is built in the TEST phase from the
feature-extraction prototxt, whose data layer supplies the samples. Under an MPI launcher the ranks
share the batches and the root writes the databases one process would (extract_features).

CLI (Caffe's arguments): extract_features PRETRAINED_NET_PARAM FEATURE_EXTRACTION_PROTO_FILE
    BLOB_NAME1[,NAME2,...] DATASET_NAME1[,NAME2,...] NUM_MINI_BATCHES DB_TYPE [CPU|GPU] [DEVICE_ID=0]
"""
import contextlib
import sys

import numpy

from collectives import settings
from scaffe.data.lmdb_writer import LMDBWriter
from scaffe.io import to_host
from scaffe.log import get_logger
from scaffe.net import Net, NetError
from scaffe.parallel.launch import launcher_local_rank, quiet_non_root, world
from scaffe.parallel.sharded_testing import ShardedTesting, shardable
from scaffe.proto import caffe_pb2
from scaffe.tools.gflags import run_tool

__all__ = ["main", "extract_features"]

log = get_logger(__name__)

_USAGE = ("usage: extract_features pretrained_net_param feature_extraction_proto_file "
          "extract_feature_blob_name1[,name2,...] save_feature_dataset_name1[,name2,...] num_mini_batches "
          "db_type [CPU/GPU] [DEVICE_ID=0]")


def extract_features(weights, model, blob_names, db_paths, num_mini_batches, xp=numpy, comm=None):
    """Writes `num_mini_batches` batches of each blob in `blob_names` to the new LMDB at the same
    position in `db_paths`; returns the number of samples written for each blob (None on ranks but the root).

    With `comm` of P ranks and a net whose samples come from databases (Data, HDF5Data), rank r runs
    batches r, r+P, ... of the stream and the root writes every batch in order: the databases are the
    ones one process writes. A net fed otherwise (Input, DummyData, ...) is run by the root alone.
    """
    if len(blob_names) != len(db_paths):
        raise ValueError(f"{len(blob_names)} blob names but {len(db_paths)} dataset names; give one dataset "
                         f"per blob")
    rank, size = (0, 1) if comm is None else (comm.Get_rank(), comm.Get_size())
    net = Net.from_file(model, "TEST", xp=xp)
    try:
        sharding = ShardedTesting(comm, [net]) if size > 1 and shardable(net) else None
        if size > 1 and sharding is None:
            log.warning("%s reads from a source that cannot be sharded: the root extracts alone", model)
            if rank != 0:
                return None
        net.copy_trained_layers_from(weights)
        for name in blob_names:
            if name not in net.blobs:
                raise NetError(f"unknown feature blob name {name!r} in the network {model}")

        def run_batch():
            net.forward()
            return [_batch_features(net, name) for name in blob_names]

        batches = ((run_batch() for _ in range(num_mini_batches)) if sharding is None
                   else sharding.rounds(0, num_mini_batches, run_batch))
        if rank != 0:
            for _ in batches:  # this rank's batches, and their rounds' gathers
                pass
            return None
        counts = _write_features(batches, blob_names, db_paths)
    finally:
        net.close()
    log.info("Successfully extracted the features!")
    return counts


def _batch_features(net, name):
    """Blob `name` of the batch just run, on the host, one sample per row of its first axis."""
    features = numpy.atleast_1d(to_host(net.blobs[name].data))  # a scalar loss: 1 sample
    if features.ndim > 4:
        raise NetError(f"blob {name!r} has {features.ndim} axes; a Datum holds at most 4")
    return features


def _write_features(batches, blob_names, db_paths):
    """Stores each batch's features (one array per blob) as Datums in the new LMDBs; returns the counts."""
    with contextlib.ExitStack() as stack:
        writers = []
        for path in db_paths:
            log.info("Opening dataset %s", path)
            writers.append(stack.enter_context(LMDBWriter(path)))
        log.info("Extracting Features")
        datum = caffe_pb2.Datum()
        counts = [0] * len(blob_names)  # samples stored per blob: the next key
        for batch in batches:
            for i, (features, writer) in enumerate(zip(batch, writers)):
                shape = tuple(features.shape[1:]) + (1, 1, 1)
                for sample in features.reshape(len(features), -1):
                    datum.Clear()
                    datum.channels, datum.height, datum.width = shape[:3]
                    datum.float_data.extend(sample.tolist())
                    writer.put(b"%010d" % counts[i], datum.SerializeToString())
                    counts[i] += 1
    for name, count in zip(blob_names, counts):
        log.info("Extracted features of %d query images for feature blob %s", count, name)
    return counts


def _array_module(mode, device_id):
    """numpy, or cupy on GPU `device_id`; None: under an MPI launcher the one of local rank r is r % GPUs."""
    if mode == "CPU":
        log.info("Using CPU")
        return numpy
    from kernels.backend import cupy_or_none
    cupy = cupy_or_none()
    if cupy is None:
        raise RuntimeError("GPU: no CUDA GPU is usable here (cupy missing or no device); give CPU instead")
    count = cupy.cuda.runtime.getDeviceCount()
    if device_id is None:
        device_id = settings.gpu_for(launcher_local_rank() or 0, range(count), count)
    if not 0 <= device_id < count:
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
    comm, rank, size = world()
    quiet_non_root(rank)

    def work():
        if mode not in ("CPU", "GPU"):
            raise ValueError(f"device {mode!r}: give CPU or GPU")
        numbers = [batches] + argv[7:]
        if not all(n.isdigit() for n in numbers):
            raise ValueError(f"num_mini_batches and DEVICE_ID must be integers >= 0, got {' '.join(numbers)}")
        device_id = int(argv[7]) if len(argv) > 7 else None
        extract_features(weights, model, blobs.split(","), datasets.split(","), int(batches),
                         xp=_array_module(mode, device_id), comm=comm)

    status = run_tool("extract_features", db_type, work)
    if status and size > 1:
        comm.Abort(status)  # the other ranks may be waiting for this one in a gather
    return status


if __name__ == "__main__":
    from scaffe.cli import tool_script  # glog's settings and lines, as for every command
    sys.exit(tool_script("extract_features"))
