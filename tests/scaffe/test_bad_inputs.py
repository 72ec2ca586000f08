"""Damaged or wrong input files: every reader refuses them with CaffeFormatError (or the net's and solver's
errors) naming the file, and the command line prints that one line and exits 1, never a traceback.
Impossible sizes are refused at set-up, before anything is allocated, and nothing is read silently.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import h5py
import numpy
import pytest

from scaffe import blob as blob_module
from scaffe import io as sio
from scaffe.data.datum import array_to_datum
from scaffe.data.lmdb_writer import LMDBWriter
from scaffe.net import Net
from scaffe.net_filter import NetError
from scaffe.proto import caffe_pb2
from scaffe.solvers import SolverError

ROOT = Path(__file__).resolve().parents[2]
# The subprocesses import this tree's scaffe, whatever else is installed.
ENV = dict(os.environ, PYTHONPATH=str(ROOT))
SAMPLE = array_to_datum(numpy.arange(16, dtype=numpy.uint8).reshape(1, 4, 4), 1).SerializeToString()
# A Datum whose bytes end inside a field: protobuf's DecodeError.
DAMAGED = SAMPLE[:-4] + b"\x2a\xff\xff"
IP_NET = ('name: "ip" layer { name: "in" type: "DummyData" top: "x" top: "y" dummy_data_param { '
          'shape { dim: 2 dim: 3 } shape { dim: 2 dim: 1 } } } '
          'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "out" inner_product_param { num_output: 1 } } '
          'layer { name: "loss" type: "EuclideanLoss" bottom: "out" bottom: "y" top: "loss" }')


def run_scaffe(folder, *argv):
    """The one stderr line of a `scaffe` command that must fail (glog's INFO and WARNING lines left out)."""
    proc = subprocess.run([sys.executable, "-m", "scaffe", *argv, "--minloglevel=2"], cwd=folder,
                          capture_output=True, text=True, timeout=60, env=ENV)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    return proc.stderr.strip()


def write_lmdb(path, records):
    with LMDBWriter(path, commit_every=100) as db:
        for i, value in enumerate(records):
            db.put(b"%08d" % i, value)
    return path


def net_from_text(text, phase="TEST"):
    return Net(sio.parse_net_text(text), phase)


# ---------------------------------------------------------------- one line naming the file

def test_a_damaged_datum_names_the_database_and_the_record(tmp_path):
    write_lmdb(tmp_path / "db", [SAMPLE, DAMAGED, SAMPLE])
    line = run_scaffe(tmp_path, "compute_image_mean", "db")
    assert line.startswith("compute_image_mean: db: record '00000001': not a Caffe Datum"), line
    with pytest.raises(sio.CaffeFormatError, match="not a Caffe Datum"):
        sio.datum_to_array(DAMAGED)  # pycaffe's caffe.io
    numpy.testing.assert_array_equal(sio.datum_to_array(SAMPLE), numpy.arange(16).reshape(1, 4, 4))


def test_an_hdf5_file_that_is_no_caffemodel_as_weights(tmp_path):
    (tmp_path / "net.prototxt").write_text(IP_NET)
    with h5py.File(tmp_path / "w.h5", "w") as f:
        f["data"] = numpy.zeros((3, 3))  # a dataset where Caffe keeps a group of layers
    line = run_scaffe(tmp_path, "test", "--model=net.prototxt", "--weights=w.h5", "--iterations=1")
    assert line == "scaffe test: error: w.h5: HDF5 file has no 'data' group (not a Caffe .caffemodel.h5)"


def test_a_list_file_that_is_not_utf8(tmp_path):
    (tmp_path / "list.txt").write_bytes(b"a.h5\n\xff\xfe.h5\n")
    (tmp_path / "net.prototxt").write_text('layer { name: "h" type: "HDF5Data" top: "data" '
                                           'hdf5_data_param { source: "list.txt" batch_size: 2 } }')
    line = run_scaffe(tmp_path, "time", "--model=net.prototxt", "--iterations=1")
    assert line.startswith("scaffe time: error: net.prototxt: layer 'h' (HDF5Data): HDF5 list file 'list.txt' is "
                           "not UTF-8 text (byte 5"), line


def test_a_solverstate_whose_learned_net_is_not_utf8(tmp_path):
    solver_with_state(tmp_path, b"\xff\xfe.caffemodel")
    line = run_scaffe(tmp_path, "train", "--solver=solver.prototxt", "--snapshot=s.solverstate")
    assert line == ("scaffe train: error: s.solverstate: learned_net b'\\xff\\xfe.caffemodel' is not UTF-8 text; "
                    "the file is damaged")


def test_infinite_weights_end_training_in_one_line_with_numpys_warnings_as_log_lines(tmp_path):
    # Infinite weights times IP_NET's zero data: numpy warns "invalid value encountered in matmul".
    model = caffe_pb2.NetParameter()
    sio.set_layer_blobs(model.layer.add(name="ip"), [numpy.full((1, 3), numpy.inf, numpy.float32),
                                                     numpy.ones(1, numpy.float32)])
    sio.write_net_binary(model, tmp_path / "nan.caffemodel")
    solver_with_state(tmp_path, b"")
    line = run_scaffe(tmp_path, "train", "--solver=solver.prototxt", "--weights=nan.caffemodel")
    assert line.startswith("scaffe train: error: solver.prototxt: iteration 0: the loss is nan (diverged)"), line
    proc = subprocess.run([sys.executable, "-m", "scaffe", "train", "--solver=solver.prototxt",
                           "--weights=nan.caffemodel", "--minloglevel=1"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env=ENV)
    warnings = [line for line in proc.stderr.splitlines() if re.match(r"W\d{8} ", line)]
    assert re.search(r"\] nan.caffemodel: layer 'ip' blob 0 holds 3 NaN or infinite value\(s\) of 3; the file may be "
                     "damaged$", warnings[0]), proc.stderr
    assert re.search(r"\] RuntimeWarning: invalid value encountered in \w+ \(\w+\.py:\d+\)$", warnings[1]), proc.stderr


def test_a_kernel_size_past_int_max(tmp_path):
    (tmp_path / "net.prototxt").write_text('input: "data" input_shape { dim: 1 dim: 1 dim: 8 dim: 8 } '
                                           'layer { name: "c" type: "Convolution" bottom: "data" top: "c" '
                                           'convolution_param { num_output: 2 kernel_size: 2147483648 } }')
    line = run_scaffe(tmp_path, "time", "--model=net.prototxt", "--iterations=1")
    assert line == ("scaffe time: error: net.prototxt: layer 'c' (Convolution): a blob of shape "
                    "(2, 1, 2147483648, 2147483648) has 9,223,372,036,854,775,808 elements, more than Caffe's "
                    "limit of 2,147,483,647 (INT_MAX)")


def test_a_caffemodel_blob_short_of_values_names_the_file_and_layer(tmp_path):
    net = net_from_text(IP_NET)
    model = caffe_pb2.NetParameter()
    layer = model.layer.add(name="ip")
    layer.blobs.add().shape.dim.extend([1, 3])
    layer.blobs[0].data.extend([1.0, 2.0])
    layer.blobs.add().shape.dim.append(1)
    layer.blobs[1].data.append(0.5)
    sio.write_net_binary(model, tmp_path / "short.caffemodel")
    with pytest.raises(NetError, match=r"short.caffemodel: layer 'ip' blob 0: blob of shape \(1, 3\) needs 3 data "
                                       r"values, the file holds 2"):
        net.copy_trained_layers_from(str(tmp_path / "short.caffemodel"))
    with pytest.raises(sio.CaffeFormatError, match=r"short.caffemodel: layer 'ip': blob of shape \(1, 3\)"):
        sio.read_weights(tmp_path / "short.caffemodel")


def test_a_mean_file_short_of_values_names_the_file(tmp_path):
    blob = caffe_pb2.BlobProto(num=1, channels=1, height=2, width=2, data=[1, 2, 3])
    sio.write_blobproto(blob, tmp_path / "mean.binaryproto")
    with pytest.raises(sio.CaffeFormatError, match=r"mean.binaryproto: blob of shape \(1, 1, 2, 2\) needs 4"):
        sio.read_mean_file(tmp_path / "mean.binaryproto")


def hdf5_layer(tmp_path, files, batch_size=2):
    (tmp_path / "list.txt").write_text("".join(f"{name}\n" for name in files))
    return net_from_text(f'layer {{ name: "h" type: "HDF5Data" top: "data" top: "label" hdf5_data_param {{ '
                         f'source: "{tmp_path / "list.txt"}" batch_size: {batch_size} }} }}')


def test_an_hdf5_data_file_that_is_no_hdf5_names_the_file(tmp_path):
    (tmp_path / "a.h5").write_bytes(b"not an HDF5 file")
    with pytest.raises(NetError, match=r"layer 'h' \(HDF5Data\): HDF5 file '.*a.h5': cannot open"):
        hdf5_layer(tmp_path, [tmp_path / "a.h5"])


def test_a_damaged_datum_met_by_a_forward_pass_names_the_layer_database_and_record(tmp_path):
    write_lmdb(tmp_path / "db", [SAMPLE, DAMAGED, SAMPLE])
    net = net_from_text(f'layer {{ name: "d" type: "Data" top: "data" data_param {{ source: "{tmp_path / "db"}" '
                        'batch_size: 3 backend: LMDB } }')
    with pytest.raises(sio.CaffeFormatError, match=rf"^layer 'd' \(Data\) reading '{tmp_path / 'db'}': record "
                                                   r"'00000001': not a Caffe Datum \(Error parsing"):
        net.forward()


def test_an_hdf5_list_naming_a_missing_file_is_refused_at_set_up_naming_the_list(tmp_path):
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["data"] = numpy.ones((4, 2), numpy.float32)
        f["label"] = numpy.ones(4, numpy.float32)
    with pytest.raises(NetError, match=r"layer 'h' \(HDF5Data\): HDF5 list file '.*list.txt' names 'gone.h5' \(file 2 "
                                       r"of 2\), which does not exist$"):
        hdf5_layer(tmp_path, [tmp_path / "a.h5", "gone.h5"])


def damaged_heap(path):
    """`path`, an HDF5 file, with the signature of its first local heap (the root group's) damaged: h5py raises
    RuntimeError looking up a name."""
    data = path.read_bytes()
    assert b"HEAP" in data
    path.write_bytes(data.replace(b"HEAP", b"XXXX", 1))
    return path


def test_hdf5_files_whose_structure_is_damaged_name_the_file(tmp_path):
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["data"] = numpy.ones((4, 2), numpy.float32)
        f["label"] = numpy.ones(4, numpy.float32)
    damaged_heap(tmp_path / "a.h5")
    with pytest.raises(NetError, match=r"layer 'h' \(HDF5Data\): HDF5 file '.*a.h5': cannot read: Unable to "
                                       r"synchronously check link existence \(bad local heap signature\)$"):
        hdf5_layer(tmp_path, [tmp_path / "a.h5"])
    with h5py.File(tmp_path / "w.caffemodel.h5", "w") as f:
        f["data/ip/0"] = numpy.ones((1, 3), numpy.float32)
    damaged_heap(tmp_path / "w.caffemodel.h5")
    with pytest.raises(sio.CaffeFormatError, match=r"w.caffemodel.h5: cannot read as a Caffe HDF5 model: Unable to "
                                                   r"synchronously check link existence \(bad local heap signature\)$"):
        sio.read_weights(tmp_path / "w.caffemodel.h5")


# ---------------------------------------------------------------- nothing silent

def solver_with_state(folder, learned_net, weights=None):
    """A solver for IP_NET and a solver state at iteration 500 whose learned_net is `learned_net`, with its
    history (momentum) blobs, so that only learned_net can stop the resume."""
    (folder / "net.prototxt").write_text(IP_NET)
    (folder / "solver.prototxt").write_text('net: "net.prototxt" base_lr: 0.01 momentum: 0.9 max_iter: 501 '
                                            'lr_policy: "fixed" snapshot_after_train: false'
                                            + (f' weights: "{weights}"' if weights else ""))
    state = caffe_pb2.SolverState(iter=500)
    for shape in ((1, 3), (1,)):
        sio.array_to_blobproto(numpy.zeros(shape, numpy.float32), blob=state.history.add())
    raw = state.SerializeToString()
    # Field 2 (learned_net) as bytes, which may be no UTF-8; a parser reads fields in any order.
    raw += b"\x12" + bytes([len(learned_net)]) + learned_net
    (folder / "s.solverstate").write_bytes(raw)


@pytest.mark.parametrize("learned_net", ["", "gone.caffemodel"])
def test_a_solverstate_without_its_weights_does_not_resume(tmp_path, monkeypatch, learned_net):
    from scaffe import pycaffe
    solver_with_state(tmp_path, learned_net.encode())
    monkeypatch.chdir(tmp_path)
    solver = pycaffe.get_solver("solver.prototxt")
    problem = f"learned_net '{learned_net}': no such file" if learned_net else "names no learned_net"
    with pytest.raises(SolverError) as err:
        solver.restore("s.solverstate")
    assert str(err.value) == (f"s.solverstate: {problem}, so there are no weights to resume from; give the "
                              ".caffemodel snapshotted with it")
    assert solver.iter == 0


def test_a_solverstate_without_learned_net_resumes_from_the_solvers_weights(tmp_path, monkeypatch, caplog):
    from scaffe import pycaffe
    model = caffe_pb2.NetParameter()
    sio.set_layer_blobs(model.layer.add(name="ip"), [numpy.full((1, 3), 2, numpy.float32), numpy.ones(1, numpy.float32)])
    sio.write_net_binary(model, tmp_path / "w.caffemodel")
    solver_with_state(tmp_path, b"", weights="w.caffemodel")
    monkeypatch.chdir(tmp_path)
    solver = pycaffe.get_solver("solver.prototxt")
    solver.restore("s.solverstate")
    assert solver.iter == 500 and "names no learned_net; the weights given to the solver stand" in caplog.text
    numpy.testing.assert_array_equal(solver.net.params["ip"][0].data, [[2, 2, 2]])


def test_a_solverstate_with_infinite_history_is_said_in_the_log(tmp_path, monkeypatch, caplog):
    from scaffe import pycaffe
    model = caffe_pb2.NetParameter()
    sio.set_layer_blobs(model.layer.add(name="ip"), [numpy.ones((1, 3), numpy.float32), numpy.ones(1, numpy.float32)])
    sio.write_net_binary(model, tmp_path / "w.caffemodel")
    solver_with_state(tmp_path, b"w.caffemodel")
    state = sio.read_solverstate(tmp_path / "s.solverstate")
    sio.array_to_blobproto(numpy.array([[1, numpy.inf, -numpy.inf]], numpy.float32), blob=state.history[0])
    sio.write_solverstate(state, tmp_path / "s.solverstate")
    monkeypatch.chdir(tmp_path)
    pycaffe.get_solver("solver.prototxt").restore("s.solverstate")
    assert "s.solverstate: history blob 0 holds 2 NaN or infinite value(s) of 3; the file may be damaged" in caplog.text


@pytest.mark.parametrize("values", [numpy.array([b"a", b"b", b"c", b"d"]), numpy.ones(4, numpy.complex64),
                                    numpy.ones(4, bool)], ids=["string", "complex", "bool"])
def test_hdf5_data_of_a_type_caffe_refuses(tmp_path, values):
    with h5py.File(tmp_path / "a.h5", "w") as f:
        f["data"] = numpy.ones((4, 2), numpy.float32)
        f["label"] = values
    with pytest.raises(NetError, match=r"a.h5': dataset '/label' holds .* values: unsupported datatype class"):
        hdf5_layer(tmp_path, [tmp_path / "a.h5"])


def test_a_complex_caffemodel_h5_is_refused(tmp_path):
    with h5py.File(tmp_path / "w.caffemodel.h5", "w") as f:
        f["data/ip/0"] = numpy.ones((1, 3), numpy.complex64)
    with pytest.raises(sio.CaffeFormatError, match=r"w.caffemodel.h5: dataset '/data/ip/0' holds complex64 values: "
                                                   "unsupported datatype class"):
        sio.read_weights(tmp_path / "w.caffemodel.h5")


def test_an_empty_net_is_an_error(tmp_path):
    (tmp_path / "empty.prototxt").write_text('name: "empty"\n')
    assert run_scaffe(tmp_path, "time", "--model=empty.prototxt") == \
        "scaffe time: error: empty.prototxt: the net has no layers; nothing to run"
    with pytest.raises(NetError, match="the net has no layers in phase TEST"):
        net_from_text('layer { name: "x" type: "Input" top: "x" include { phase: TRAIN } '
                      'input_param { shape { dim: 1 } } }')


# ---------------------------------------------------------------- impossible sizes

@pytest.mark.parametrize("layer, shape", [
    ('type: "InnerProduct" bottom: "data" top: "out" inner_product_param { num_output: 1500000 }', "(1500000, 150528)"),
    ('type: "Convolution" bottom: "data" top: "out" convolution_param { num_output: 2 kernel_size: 3 pad: 4294967295 }',
     "(64, 2, 8589934812, 8589934812)"),
], ids=["num_output", "pad"])
def test_a_blob_past_int_max_is_refused_before_allocating(layer, shape):
    with pytest.raises(NetError, match=rf"layer 'big' \(\w+\): a blob of shape {re.escape(shape)} has"):
        net_from_text(f'input: "data" input_shape {{ dim: 64 dim: 3 dim: 224 dim: 224 }} layer {{ name: "big" {layer} }}')


def test_a_batch_size_past_int_max_is_refused_before_allocating(tmp_path):
    write_lmdb(tmp_path / "db", [SAMPLE])
    with pytest.raises(NetError, match=r"layer 'd' \(Data\): a blob of shape \(2147483647, 1, 4, 4\) has"):
        net_from_text(f'layer {{ name: "d" type: "Data" top: "data" data_param {{ source: "{tmp_path / "db"}" '
                      'batch_size: 2147483647 backend: LMDB } }')


def test_a_blob_larger_than_the_memory_is_refused(monkeypatch):
    monkeypatch.setattr(blob_module, "_memory_bytes", lambda xp: 2 ** 30)
    with pytest.raises(NetError, match=r"layer 'ip' \(InnerProduct\): a blob of shape \(100000, 3000\) needs 2.2 GiB "
                                       r"\(data and diff\), more than the 1.0 GiB of memory this machine has"):
        net_from_text('input: "data" input_shape { dim: 1 dim: 3000 } layer { name: "ip" type: "InnerProduct" '
                      'bottom: "data" top: "out" inner_product_param { num_output: 100000 } }')


def test_a_layer_that_runs_out_of_memory_is_one_line_naming_it(tmp_path):
    # 250,000,000 weights (1.9 GiB with their diff) pass the size checks on any machine this runs on, but not
    # into an address space of 1.6 GiB. No GPU is made visible: a CUDA context reserves more than that.
    (tmp_path / "net.prototxt").write_text('input: "data" input_shape { dim: 1 dim: 1000 } layer { name: "ip" '
                                           'type: "InnerProduct" bottom: "data" top: "ip" '
                                           'inner_product_param { num_output: 250000 } }')
    script = ("import resource, sys\n"
              "resource.setrlimit(resource.RLIMIT_AS, (1600 << 20, 1600 << 20))\n"
              "from scaffe.cli import main\n"
              "sys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run([sys.executable, "-c", script, "time", "--model=net.prototxt", "--minloglevel=2"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env=dict(ENV, OPENBLAS_NUM_THREADS="1", CUDA_VISIBLE_DEVICES=""))
    assert proc.returncode == 1 and re.fullmatch(r"scaffe time: error: net.prototxt: layer 'ip' \(InnerProduct\): out "
                                                 r"of memory setting it up: Unable to allocate .*\n", proc.stderr), \
        proc.stderr


def test_a_small_hdf5_file_declaring_gigabytes_is_read_a_batch_at_a_time(tmp_path):
    with h5py.File(tmp_path / "big.h5", "w") as f:
        f.create_dataset("data", shape=(1_000_000, 1, 28, 28), dtype=numpy.float32)  # never written: no storage
        f.create_dataset("label", shape=(1_000_000,), dtype=numpy.float32)
    assert os.path.getsize(tmp_path / "big.h5") < 4096
    with h5py.File(tmp_path / "small.h5", "w") as f:
        f.create_dataset("data", data=numpy.zeros((64, 1, 28, 28), numpy.float32))
        f.create_dataset("label", data=numpy.zeros(64, numpy.float32))
    for name in ("small", "big"):
        (tmp_path / f"{name}.txt").write_text(f"{name}.h5\n")
        (tmp_path / f"{name}.prototxt").write_text(
            f'layer {{ name: "h" type: "HDF5Data" top: "data" top: "label" '
            f'hdf5_data_param {{ source: "{name}.txt" batch_size: 64 }} }}')
    # The peak memory the big file adds over a batch's worth (the first run pays for imports and compiles).
    script = ("import resource\n"
              "from scaffe.cli import main\n"
              "def run(name):\n"
              "    code = main(['time', f'--model={name}.prototxt', '--iterations=2', '--minloglevel=2'])\n"
              "    return code, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024\n"
              "(small, before), (big, after) = run('small'), run('big')\n"
              "print(small, big, after - before)\n")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env=ENV)
    small, big, added_mb = map(int, proc.stdout.split())
    assert small == big == 0 and added_mb < 100, (proc.stdout, proc.stderr)
