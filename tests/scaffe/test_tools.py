"""Caffe's tools through the `scaffe` command: Caffe's flags in gflags spelling, the LMDB-only
backend, extract_features, and the runtime dependencies convert imageset needs."""
import importlib.metadata
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from scaffe import io as sio
from scaffe.cli import main
from scaffe.data.datum import datum_to_array
from scaffe.data.lmdb_reader import LMDBDatabase
from scaffe.net import Net
from scaffe.proto import caffe_pb2
from scaffe.tools.convert_mnist import bundled_mnist_dir, ensure_mnist_lmdb
from image_folder import write_image_folder
from test_cli import GLOG, messages
from training_job import Job


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_error_line(err, *words):
    """The failure is told in the last line of stderr (after any log lines), without a traceback."""
    last = err.strip().splitlines()[-1]
    assert "Traceback" not in err, err
    for word in words:
        assert word in last, last


def test_pillow_is_a_runtime_dependency():
    # `pip install -e .` (the README's set-up) must bring what `scaffe convert imageset` needs.
    runtime = [r for r in importlib.metadata.requires("scaffe") if "extra ==" not in r]
    assert any(re.match(r"pillow\b", r, re.IGNORECASE) for r in runtime), runtime


def test_convert_imageset_takes_caffes_flags(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_image_folder(tmp_path, 4)
    code, out, err = run(capsys, "convert", "imageset", "-gray", "-shuffle=true", "-backend=lmdb", "--resize_width",
                         "4", "-resize_height=3", "-check_size", "--encoded=false", "-encode_type=png",
                         "img/", "list.txt", "gray_png")
    assert code == 0, err
    assert not out and "encode_type specified, assuming encoded=true." in messages(err)
    with LMDBDatabase(tmp_path / "gray_png") as db:
        values = [caffe_pb2.Datum.FromString(v) for _, v in db.items()]
    assert len(values) == 4 and all(d.encoded and d.data.startswith(b"\x89PNG") for d in values)
    assert datum_to_array(values[0])[0].shape == (1, 3, 4)
    code, _, err = run(capsys, "convert", "imageset", "--backend", "leveldb", "img/", "list.txt", "out")
    assert code == 1
    one_error_line(err, "leveldb", "LMDB")
    assert not (tmp_path / "out").exists()


def test_compute_image_mean_and_convert_mnist_take_caffes_flags(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    data = bundled_mnist_dir()
    # The flag before the positional arguments, as Caffe's create_*.sh scripts write it.
    code, _, err = run(capsys, "convert", "mnist", "-backend=lmdb", data / "t10k-images-idx3-ubyte.gz",
                       data / "t10k-labels-idx1-ubyte.gz", "test_lmdb")
    assert code == 0, err
    code, _, err = run(capsys, "compute_image_mean", "-backend=lmdb", "test_lmdb", "mean.binaryproto")
    assert code == 0, err
    mean = sio.read_mean_file(tmp_path / "mean.binaryproto")
    with LMDBDatabase(tmp_path / "test_lmdb") as db:
        images = np.stack([datum_to_array(v)[0] for _, v in db.items()]).astype(np.float64)
    np.testing.assert_allclose(mean, images.mean(axis=0), rtol=1e-6)
    code, out, err = run(capsys, "compute_image_mean", "--backend", "lmdb", "test_lmdb")
    assert code == 0 and not out, err
    assert "Number of channels: 1" in messages(err)
    assert any(re.fullmatch(r"mean_value channel \[0\]: [\d.]+", m) for m in messages(err)), err
    code, _, err = run(capsys, "compute_image_mean", "-backend=leveldb", "test_lmdb", "m2.binaryproto")
    assert code == 1
    one_error_line(err, "compute_image_mean", "leveldb")
    code, _, err = run(capsys, "convert", "mnist", "--backend=leveldb", data / "t10k-images-idx3-ubyte.gz",
                       data / "t10k-labels-idx1-ubyte.gz", "other")
    assert code == 1
    one_error_line(err, "convert_mnist", "leveldb")


FEATURE_NET = """
name: "features"
layer { name: "mnist" type: "Data" top: "data" top: "label" transform_param { scale: 0.00390625 }
        data_param { source: "%s" batch_size: 7 backend: LMDB } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 3 kernel_size: 4 stride: 4
                            weight_filler { type: "gaussian" std: 0.1 } bias_filler { type: "uniform" } } }
layer { name: "ip" type: "InnerProduct" bottom: "conv" top: "ip"
        inner_product_param { num_output: 5 weight_filler { type: "xavier" } bias_filler { type: "uniform" } } }
"""


@pytest.fixture(scope="module")
def feature_net(tmp_path_factory):
    """A prototxt reading the bundled MNIST test digits, and a caffemodel of its filler weights."""
    folder = tmp_path_factory.mktemp("features")
    _, test_db = ensure_mnist_lmdb(folder)
    (folder / "net.prototxt").write_text(FEATURE_NET % test_db)
    with Net.from_file(folder / "net.prototxt", "TEST") as net:
        net.save(folder / "net.caffemodel")
    return folder


def test_extract_features_stores_the_forward_pass(feature_net, tmp_path, capsys):
    blobs = ("conv", "ip", "label")
    code, _, err = run(capsys, "extract_features", feature_net / "net.caffemodel", feature_net / "net.prototxt",
                       ",".join(blobs), ",".join(str(tmp_path / f"{b}_lmdb") for b in blobs), 3, "lmdb", "CPU")
    assert code == 0, err
    assert "Successfully extracted the features!" in err
    expected = {b: [] for b in blobs}
    with Net.from_file(feature_net / "net.prototxt", "TEST") as net:
        net.copy_trained_layers_from(feature_net / "net.caffemodel")
        for _ in range(3):
            net.forward()
            for b in blobs:
                expected[b].extend(np.array(net.blobs[b].data))
    for b, shape in zip(blobs, ((3, 7, 7), (5, 1, 1), (1, 1, 1))):
        with LMDBDatabase(tmp_path / f"{b}_lmdb") as db:
            items = list(db.items())
        assert [k for k, _ in items] == [b"%010d" % i for i in range(21)]
        for (_, value), want in zip(items, expected[b]):
            datum = caffe_pb2.Datum.FromString(value)
            assert (datum.channels, datum.height, datum.width) == shape and not datum.data
            np.testing.assert_array_equal(np.array(datum.float_data, np.float32), np.ravel(want))


def test_extract_features_errors(feature_net, tmp_path, capsys):
    weights, model = feature_net / "net.caffemodel", feature_net / "net.prototxt"
    for args, words in (((weights, model, "ip", tmp_path / "a", 1, "leveldb"), ("leveldb",)),
                        ((weights, model, "fc7", tmp_path / "b", 1, "lmdb"), ("fc7",)),
                        ((weights, model, "ip,conv", tmp_path / "c", 1, "lmdb"), ("2 blob names", "1 dataset")),
                        ((weights, model, "ip", tmp_path / "d", "many", "lmdb"), ("integers",)),
                        ((weights, model, "ip", tmp_path / "e", 1, "lmdb", "TPU"), ("TPU",))):
        code, _, err = run(capsys, "extract_features", *args)
        assert code == 1
        one_error_line(err, "extract_features", *words)
    code, _, err = run(capsys, "extract_features", weights, model)
    assert code == 1 and "usage: extract_features pretrained_net_param" in err


def test_caffes_tool_names_are_installed_commands(tmp_path):
    """setup.py installs each of Caffe's tool names as a command taking Caffe's arguments and logging
    in glog's format on stderr, as the `scaffe` command of that name does."""
    from scaffe.cli import COMMANDS, TOOL_SCRIPTS
    scripts = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts")
               if ep.value.startswith("scaffe.")}
    assert scripts == {"scaffe": "scaffe.cli:main", **{name: "scaffe.cli:tool_script" for name in TOOL_SCRIPTS}}
    assert set(TOOL_SCRIPTS) <= set(COMMANDS)
    data = bundled_mnist_dir()
    bin_dir = Path(sys.executable).parent
    for argv in ([bin_dir / "convert_mnist_data", "-backend", "lmdb", data / "t10k-images-idx3-ubyte.gz",
                  data / "t10k-labels-idx1-ubyte.gz", tmp_path / "digits"],
                 [bin_dir / "compute_image_mean", tmp_path / "digits", tmp_path / "mean.binaryproto"]):
        proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and not proc.stdout, proc.stderr
        assert messages(proc.stderr) and all(GLOG.match(line) for line in proc.stderr.splitlines()), proc.stderr
    # The modules run as scripts (the MNIST README's way) log the same way.
    proc = subprocess.run([sys.executable, "-m", "scaffe.tools.convert_mnist", data / "t10k-images-idx3-ubyte.gz",
                           data / "t10k-labels-idx1-ubyte.gz", tmp_path / "again"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and not proc.stdout and "A total of 1000 items." in messages(proc.stderr), proc.stderr
    assert sio.read_mean_file(tmp_path / "mean.binaryproto").shape == (1, 28, 28)


def test_extract_features_under_mpiexec_writes_what_one_process_writes(feature_net, tmp_path, capsys):
    """Two ranks share the batches (rank 0 runs 0 and 2, rank 1 runs 1) and the root writes the databases
    that one process writes, record for record."""
    blobs = ("ip", "label")
    args = [feature_net / "net.caffemodel", feature_net / "net.prototxt", ",".join(blobs)]
    code, _, err = run(capsys, "extract_features", *args, ",".join(str(tmp_path / f"one_{b}") for b in blobs),
                       3, "lmdb", "CPU")
    assert code == 0, err
    with Job(2, ["extract_features"] + [str(a) for a in args] +
             [",".join(str(tmp_path / f"two_{b}") for b in blobs), "3", "lmdb", "CPU"]) as job:
        assert job.finish(240) == 0, job.log[-3000:]
    assert job.log.count("Successfully extracted the features!") == 1, job.log[-3000:]
    for b in blobs:
        with LMDBDatabase(tmp_path / f"one_{b}") as one, LMDBDatabase(tmp_path / f"two_{b}") as two:
            assert list(two.items()) == list(one.items()) and len(one) == 21
