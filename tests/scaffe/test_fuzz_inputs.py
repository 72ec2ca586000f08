"""Seeded damage to the bundled MNIST LMDB, a caffemodel, a solver state and an HDF5 data file, read through
scaffe's readers: each damaged file is refused with the project's error (CaffeFormatError, NetError or
SolverError) in one line naming it, or read in full and as it is stored; never a crash, a hang, another
exception or a short read (issue 33).

The damage is what a bad copy or disk does: bytes flipped, the file cut short, a range zeroed, a range
copied over another, bytes inserted, at places drawn by random.Random(SEED); half of an LMDB's are in page
headers and node pointers, where the damage can change what a scan reaches. The reads run in worker
processes (workers/read_mutants.py), one per kind, under a timeout: a crash in liblmdb or libhdf5 or a hang
fails the test with the file named instead of taking pytest down. An LMDB is read through py-lmdb and
through scaffe's own reader (scaffe.data.lmdb_file), which must agree.
"""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import h5py
import numpy
import pytest

from scaffe import io as sio
from scaffe.net import Net
from scaffe.proto import caffe_pb2
from scaffe.solvers import create_solver
from scaffe.tools import convert_mnist

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("workers") / "read_mutants.py"
# The workers import this tree's scaffe, whatever else is installed.
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
SEED = 33
PAGE = 4096
MUTANTS = {"lmdb": 30, "caffemodel": 40, "solverstate": 40, "hdf5": 40}
# Small enough that most damage lands in structure rather than in the values of a blob.
SMALL_NET = ('name: "small" input: "data" input_shape { dim: 2 dim: 1 dim: 6 dim: 6 } '
             'layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { '
             'num_output: 2 kernel_size: 3 weight_filler { type: "gaussian" std: 0.1 } '
             'bias_filler { type: "gaussian" std: 0.1 } } } '
             'layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip" inner_product_param { '
             'num_output: 3 weight_filler { type: "gaussian" std: 0.1 } bias_filler { type: "gaussian" std: 0.1 } } }')
TRAIN_NET = SMALL_NET.replace('input: "data" input_shape { dim: 2 dim: 1 dim: 6 dim: 6 } ', """
    layer { name: "in" type: "DummyData" top: "data" top: "target" dummy_data_param {
            shape { dim: 2 dim: 1 dim: 6 dim: 6 } shape { dim: 2 dim: 3 }
            data_filler { type: "gaussian" } data_filler { type: "gaussian" } } } """) + \
    ' layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "target" top: "loss" }'


# ---------------------------------------------------------------- damage

def damage(data, rng, spots=None):
    """(what was done, the damaged bytes): one of five kinds of damage at an offset `rng` draws, from `spots`
    (a sequence of offsets) half the time when given."""
    at = rng.choice(spots) if spots is not None and rng.random() < 0.5 else rng.randrange(len(data))
    what = rng.choice(["flip", "truncate", "zero", "copy", "insert"])
    if what == "flip":
        size = rng.choice([1, 1, 2, 8])
        damaged = bytes(b ^ rng.randrange(1, 256) for b in data[at:at + size])
    elif what == "truncate":
        return what, data[:at]
    elif what == "zero":
        size = rng.choice([1, 8, 64, PAGE])
        damaged = bytes(len(data[at:at + size]))
    elif what == "copy":
        size = rng.choice([4, 64, PAGE])
        source = rng.randrange(len(data))
        damaged = data[source:source + size][:len(data) - at]
    else:
        return what, data[:at] + bytes(rng.randrange(256) for _ in range(rng.choice([1, 4, 16]))) + data[at:]
    return what, data[:at] + damaged + data[at + len(damaged):]


# ---------------------------------------------------------------- the originals

@pytest.fixture(scope="module")
def originals(tmp_path_factory):
    """{kind: (the original file's bytes, the worker's folder, offsets where damage matters most or None)}."""
    folder = tmp_path_factory.mktemp("originals")
    return {"lmdb": mnist_lmdb(folder / "lmdb"), "caffemodel": small_caffemodel(folder / "caffemodel"),
            "solverstate": small_solverstate(folder / "solverstate"), "hdf5": small_hdf5(folder / "hdf5")}


def mnist_lmdb(folder):
    data_dir = convert_mnist.bundled_mnist_dir()
    convert_mnist.convert_mnist(data_dir / "t10k-images-idx3-ubyte.gz", data_dir / "t10k-labels-idx1-ubyte.gz",
                                folder / "db")
    (folder / "records").write_text("1000")
    data = (folder / "db" / "data.mdb").read_bytes()
    headers = [page + i for page in range(0, len(data), PAGE) for i in range(64)]
    return data, folder, headers


def small_caffemodel(folder):
    folder.mkdir()
    (folder / "net.prototxt").write_text(SMALL_NET)
    numpy.random.seed(SEED)
    Net.from_file(folder / "net.prototxt", caffe_pb2.TEST).save(folder / "small.caffemodel")
    return (folder / "small.caffemodel").read_bytes(), folder, None


def small_solverstate(folder):
    """A momentum solver's state after one step, naming its caffemodel by absolute path."""
    folder.mkdir()
    (folder / "net.prototxt").write_text(TRAIN_NET)
    (folder / "solver.prototxt").write_text(f'net: "{folder / "net.prototxt"}" base_lr: 0.01 momentum: 0.9 '
                                            f'lr_policy: "fixed" max_iter: 10 snapshot_prefix: "{folder / "snap"}"')
    numpy.random.seed(SEED)
    solver = create_solver(sio.read_solver_prototxt(folder / "solver.prototxt"), source="solver.prototxt")
    solver.step(1)
    solver.snapshot()
    return (folder / "snap_iter_1.solverstate").read_bytes(), folder, None


def small_hdf5(folder):
    folder.mkdir()
    rng = numpy.random.RandomState(SEED)
    with h5py.File(folder / "data.h5", "w") as f:
        f["data"] = rng.rand(20, 1, 4, 4).astype(numpy.float32)
        f["label"] = rng.randint(0, 10, 20).astype(numpy.float32)
    (folder / "rows").write_text("20")
    return (folder / "data.h5").read_bytes(), folder, None


def write_mutant(kind, data, path):
    if kind == "lmdb":
        path.mkdir()
        (path / "data.mdb").write_bytes(data)
    else:
        path.write_bytes(data)
    return path


# ---------------------------------------------------------------- the reads

def start_worker(kind, folder, mutants):
    argv = [sys.executable, str(WORKER), kind, str(folder), *map(str, mutants)]
    return subprocess.Popen(argv, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def outcomes(kind, worker, timeout=120):
    """The worker's outcome lines; a crash, a hang or a missing line fails the test with the mutant named."""
    try:
        out, err = worker.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        worker.kill()
        out, err = worker.communicate()
        pytest.fail(f"{kind}: the reads hung; last lines: {out[-300:]!r}")
    lines = [json.loads(line) for line in out.splitlines()]
    assert worker.returncode == 0, f"{kind}: exit {worker.returncode} reading {lines[-1] if lines else None}: {err[-2000:]}"
    return [line for line in lines if "start" not in line]


def test_damaged_inputs_are_refused_in_one_line_or_read_as_stored(originals, tmp_path):
    rng = random.Random(SEED)
    made, workers = {}, {}
    for kind, (data, folder, spots) in originals.items():
        made[kind] = []
        for i in range(MUTANTS[kind]):
            what, damaged = damage(data, rng, spots)
            made[kind].append(str(write_mutant(kind, damaged, tmp_path / f"{kind}_{i:02d}_{what}")))
        workers[kind] = start_worker(kind, folder, made[kind])
    for kind, worker in workers.items():
        reads = outcomes(kind, worker)
        assert {read["mutant"] for read in reads} == set(made[kind])
        assert [read for read in reads if not (refused_in_one_line(read) or read_as_stored(read))] == []
        verdicts = {}
        for read in reads:  # the same from each reader of a kind (py-lmdb's and scaffe's own for an LMDB)
            verdicts.setdefault(read["mutant"], set()).add("error" in read)
        assert [mutant for mutant, verdict in verdicts.items() if len(verdict) > 1] == []
        refused = sum("error" in read for read in reads)
        # Both verdicts occur, so the damage reaches the checks and the comparisons of full reads run.
        assert 0 < refused < len(reads), (kind, refused)


def refused_in_one_line(read):
    return "error" in read and read["mutant"] in read["error"] and "\n" not in read["error"]


def read_as_stored(read):
    return "read" in read and read["read"] is None
