"""Reads damaged copies of one kind of input through scaffe's readers and prints what happened, one JSON line
a read.

argv: KIND FOLDER MUTANT [MUTANT ...]; KIND and what FOLDER holds (tests/scaffe/test_fuzz_inputs.py writes it):
* lmdb: records (the original's number of records); each MUTANT (an LMDB folder) is read by a Data layer of a
  net taking that many records in one batch, then scanned in full; the scan must hold as many records as the
  database's header counts. It is read twice: through py-lmdb, then through scaffe.data.lmdb_file, py-lmdb
  being made to refuse it by an Environment this process holds open on it (as a pycaffe script's would).
* caffemodel: net.prototxt; each MUTANT is copied into that net, whose weights must then equal the file's.
* solverstate: solver.prototxt; each MUTANT is restored into that solver, whose iteration and history must
  then equal the file's.
* hdf5: rows (the original's number of rows); each MUTANT (an .h5 file) is read by an HDF5Data layer of a net
  taking that many rows in one batch, which must equal what h5py reads from it.

A line {"start": mutant, "reader"} comes before each read, so a crash or a hang names the mutant. Then
{"mutant", "reader"} and "error" (the message of a CaffeFormatError, NetError or SolverError), "raw" (any
other exception) or "read": the problem with what was read, null when it is what the file holds.
"""
import json
import sys
from pathlib import Path

import h5py
import lmdb
import numpy
from google.protobuf.message import DecodeError

from scaffe import io as sio
from scaffe.data.lmdb_file import LMDBFile
from scaffe.net import Net
from scaffe.net_filter import NetError
from scaffe.proto import caffe_pb2
from scaffe.solvers import SolverError, create_solver, read_solver_file

PROJECT_ERRORS = (sio.CaffeFormatError, NetError, SolverError)


def net(text):
    return Net(sio.parse_net_text(text), caffe_pb2.TEST)


def lmdb_reader(folder):
    records = int((folder / "records").read_text())

    def read(mutant):
        data = net(f'layer {{ name: "mnist" type: "Data" top: "data" top: "label" data_param {{ source: "{mutant}" '
                   f'batch_size: {records} backend: LMDB }} }}')
        try:
            data.forward()
            scanned = sum(1 for _ in data.layer("mnist").database.items())
        finally:
            data.layer("mnist").close()
        entries = _header_entries(mutant)
        return None if scanned == entries else f"scanned {scanned} records, the header counts {entries}"

    def read_held(mutant):
        holder = _held_open(mutant)
        try:
            return read(mutant)
        finally:
            if holder is not None:
                holder.close()
    return {"py-lmdb": read, "lmdb_file": read_held}


def _held_open(path):
    """py-lmdb's Environment on `path`, or None where py-lmdb refuses the file (scaffe must refuse it too)."""
    try:
        return lmdb.open(path, readonly=True, lock=False)
    except lmdb.Error:
        return None


def _header_entries(mutant):
    structure = LMDBFile(mutant)
    structure.close()
    return structure.entries


def caffemodel_reader(folder):
    target = Net.from_file(folder / "net.prototxt", caffe_pb2.TEST)

    def read(mutant):
        target.copy_trained_layers_from(mutant)
        stored = _parse(mutant, caffe_pb2.NetParameter)
        for layer in stored.layer:
            for j, blob in enumerate(layer.blobs):
                held = target.layer(layer.name).blobs[j].data
                if not numpy.array_equal(held, sio.blobproto_to_array(blob).reshape(held.shape), equal_nan=True):
                    return f"layer {layer.name!r} blob {j} differs from the file's"
        return None
    return {"copy_trained_layers_from": read}


def solverstate_reader(folder):
    path = folder / "solver.prototxt"
    solver = create_solver(read_solver_file(path), source=str(path))

    def read(mutant):
        solver.restore(mutant)
        stored = _parse(mutant, caffe_pb2.SolverState)
        if solver.iter != stored.iter:
            return f"iteration {solver.iter}, the file's {stored.iter}"
        held = solver.history
        if any(not numpy.array_equal(numpy.ravel(h), sio.blobproto_to_array(b).ravel(), equal_nan=True)
               for h, b in zip(held, stored.history)):
            return "history differs from the file's"
        return None
    return {"restore": read}


def hdf5_reader(folder):
    rows = int((folder / "rows").read_text())

    def read(mutant):
        listing = Path(f"{mutant}.txt")
        listing.write_text(f"{mutant}\n")
        data = net(f'layer {{ name: "h5" type: "HDF5Data" top: "data" top: "label" hdf5_data_param {{ '
                   f'source: "{listing}" batch_size: {rows} }} }}')
        data.forward()
        with h5py.File(mutant, "r") as f:
            stored = [numpy.asarray(f[name][()], numpy.float32) for name in ("data", "label")]
        got = [data.blobs_list[data.blob_names.index(name)].data for name in ("data", "label")]
        if any(s.shape != g.shape or not numpy.array_equal(s, g, equal_nan=True) for s, g in zip(stored, got)):
            return "the batch differs from the file's rows"
        return None
    return {"HDF5Data": read}


def _parse(path, message_class):
    msg = message_class()
    try:
        msg.ParseFromString(Path(path).read_bytes())
    except DecodeError:
        return None
    return msg


READERS = {"lmdb": lmdb_reader, "caffemodel": caffemodel_reader, "solverstate": solverstate_reader,
           "hdf5": hdf5_reader}


def outcome(read, mutant):
    try:
        return {"read": read(mutant)}
    except PROJECT_ERRORS as e:
        return {"error": str(e)}
    except Exception as e:  # what the test is there to catch
        return {"raw": f"{type(e).__name__}: {e}"}


def main(kind, folder, *mutants):
    readers = READERS[kind](Path(folder))
    for mutant in mutants:
        for reader, read in readers.items():
            print(json.dumps({"start": mutant, "reader": reader}), flush=True)
            print(json.dumps({"mutant": mutant, "reader": reader, **outcome(read, mutant)}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
