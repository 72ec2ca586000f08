"""scaffe's pycaffe-shaped API: Net, its blobs/params/forward/backward, solvers, modes, and the example."""
import collections
import subprocess
import sys
from pathlib import Path

import lmdb
import numpy as np
import pytest

import scaffe
from scaffe.data.datum import datum_to_array
from scaffe.tools.convert_mnist import ensure_mnist_lmdb

ROOT = Path(__file__).resolve().parents[2]
MNIST = ROOT / "examples" / "mnist"
DEPLOY = str(MNIST / "lenet_deploy.prototxt")
TRAIN_TEST = str(MNIST / "lenet_train_test.prototxt")

# y = W x + b on a 2 x 3 input, with gradients to the input (force_backward), for numpy oracles.
LINEAR = """name: "linear" force_backward: true
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "fc" type: "InnerProduct" bottom: "x" top: "y"
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 1 } bias_filler { type: "gaussian" std: 1 } } }
layer { name: "act" type: "TanH" bottom: "y" top: "z" }
"""


@pytest.fixture(scope="module")
def mnist_lmdbs():
    return ensure_mnist_lmdb(MNIST)


@pytest.fixture
def linear(tmp_path):
    path = tmp_path / "linear.prototxt"
    path.write_text(LINEAR)
    return str(path)


@pytest.fixture
def lenet_weights(tmp_path):
    path = str(tmp_path / "lenet.caffemodel")
    scaffe.Net(DEPLOY, scaffe.TEST).save(path)
    return path


def test_import_scaffe_exposes_pycaffe_names():
    for name in ("Net", "get_solver", "SGDSolver", "AdamSolver", "set_mode_cpu", "set_mode_gpu", "set_device",
                 "TRAIN", "TEST", "layer_type_list"):
        assert hasattr(scaffe, name), name
    assert (scaffe.TRAIN, scaffe.TEST) == (0, 1)
    assert "Convolution" in scaffe.layer_type_list()


def test_net_constructor_forms_load_the_same_weights(lenet_weights):
    nets = [scaffe.Net(DEPLOY, lenet_weights, scaffe.TEST), scaffe.Net(DEPLOY, lenet_weights),
            scaffe.Net(DEPLOY, weights=lenet_weights, phase=scaffe.TEST),
            scaffe.Net(DEPLOY, scaffe.TEST, weights=lenet_weights)]
    saved = scaffe.Net(DEPLOY, scaffe.TEST)
    saved.copy_from(lenet_weights)
    fresh = scaffe.Net(DEPLOY, scaffe.TEST)  # fillers: other values
    for name, blobs in saved.params.items():
        for i, blob in enumerate(blobs):
            for net in nets:
                np.testing.assert_array_equal(net.params[name][i].data, blob.data)
    assert not np.array_equal(fresh.params["ip1"][0].data, saved.params["ip1"][0].data)
    with pytest.raises(TypeError, match="both as a positional and as a keyword"):
        scaffe.Net(DEPLOY, scaffe.TEST, phase=scaffe.TRAIN)


def test_blobs_params_inputs_outputs_in_net_order(lenet_weights):
    net = scaffe.Net(DEPLOY, lenet_weights, scaffe.TEST)
    assert isinstance(net.blobs, collections.OrderedDict)
    assert list(net.blobs) == ["data", "conv1", "pool1", "conv2", "pool2", "ip1", "ip2", "prob"]
    assert list(net.params) == ["conv1", "conv2", "ip1", "ip2"]
    assert [b.data.shape for b in net.params["ip1"]] == [(500, 800), (500,)]
    assert net.inputs == ["data"] and net.outputs == ["prob"]
    assert net._layer_names == ["data", "conv1", "pool1", "conv2", "pool2", "ip1", "relu1", "ip2", "prob"]
    assert [layer.type for layer in net.layers][:2] == ["Input", "Convolution"]
    assert net.top_names["relu1"] == ["ip1"] and net.bottom_names["ip2"] == ["ip1"]
    blob = net.blobs["data"]
    assert (blob.num, blob.channels, blob.height, blob.width, blob.count) == (64, 1, 28, 28, 64 * 28 * 28)


def test_forward_with_inputs_matches_numpy(linear):
    net = scaffe.Net(linear, scaffe.TEST)
    x = np.random.RandomState(0).randn(2, 3).astype(np.float32)
    out = net.forward(x=x)
    w, b = (p.data for p in net.params["fc"])
    assert list(out) == ["z"]
    np.testing.assert_allclose(out["z"], np.tanh(x @ w.T + b), rtol=1e-5, atol=1e-6)
    assert out["z"] is net.blobs["z"].data  # pycaffe returns the blobs' own arrays
    partial = net.forward(end="fc", blobs=["x"])
    assert set(partial) == {"y", "x"}
    np.testing.assert_allclose(partial["y"], x @ w.T + b, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="the net needs exactly"):
        net.forward(y=x)
    with pytest.raises(ValueError, match="batch of 2"):
        net.forward(x=np.zeros((3, 3), np.float32))
    with pytest.raises(ValueError, match="no layer of that name"):
        net.forward(start="nope")


def test_backward_with_top_diffs_matches_numpy(linear):
    net = scaffe.Net(linear, scaffe.TEST)
    rng = np.random.RandomState(1)
    x = rng.randn(2, 3).astype(np.float32)
    dz = rng.randn(2, 4).astype(np.float32)
    net.forward(x=x)
    grads = net.backward(z=dz, diffs=["y"])
    w, b = (p.data for p in net.params["fc"])
    dy = dz * (1 - np.tanh(x @ w.T + b) ** 2)
    np.testing.assert_allclose(grads["y"], dy, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(grads["x"], dy @ w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(net.params["fc"][0].diff, dy.T @ x, rtol=1e-4, atol=1e-5)


def test_reshape_input_then_forward(lenet_weights):
    net = scaffe.Net(DEPLOY, lenet_weights, scaffe.TEST)
    images = np.random.RandomState(2).rand(3, 1, 28, 28).astype(np.float32)
    net.blobs["data"].reshape(3, 1, 28, 28)
    net.reshape()
    assert net.blobs["prob"].data.shape == (3, 10)
    prob = net.forward(data=images)["prob"].copy()
    # The same images inside a batch of 64 give the same probabilities.
    full = scaffe.Net(DEPLOY, lenet_weights, scaffe.TEST)
    batch = np.zeros((64, 1, 28, 28), np.float32)
    batch[:3] = images
    np.testing.assert_allclose(full.forward(data=batch)["prob"][:3], prob, rtol=1e-5, atol=1e-7)


def test_save_and_copy_from_round_trip(tmp_path, linear):
    a = scaffe.Net(linear, scaffe.TRAIN)
    a.params["fc"][0].data[...] = 0.5
    a.save(str(tmp_path / "a.caffemodel"))
    b = scaffe.Net(linear, scaffe.TRAIN)
    b.copy_from(str(tmp_path / "a.caffemodel"))
    np.testing.assert_array_equal(b.params["fc"][0].data, 0.5)
    np.testing.assert_array_equal(b.params["fc"][1].data, a.params["fc"][1].data)


def test_solvers_train_the_net_they_expose(tmp_path):
    (tmp_path / "target.prototxt").write_text("""
layer { name: "x" type: "DummyData" top: "x" top: "t" dummy_data_param {
  shape { dim: 2 dim: 3 } shape { dim: 2 dim: 4 } data_filler { type: "constant" value: 1 } } }
layer { name: "fc" type: "InnerProduct" bottom: "x" top: "y"
  inner_product_param { num_output: 4 weight_filler { type: "gaussian" std: 1 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "t" top: "loss" }
""")
    solver_file = tmp_path / "solver.prototxt"
    solver_file.write_text('net: "target.prototxt" type: "Adam" base_lr: 0.01 lr_policy: "fixed" max_iter: 5 '
                           'momentum: 0.9 momentum2: 0.999 snapshot_after_train: false\n')
    solver = scaffe.get_solver(str(solver_file))
    assert solver._solver.type == "Adam"
    assert scaffe.SGDSolver(str(solver_file))._solver.type == "SGD"
    before = solver.net.params["fc"][0].data.copy()
    first = float(solver.net.forward()["loss"])
    solver.step(3)
    assert solver.iter == 3
    assert not np.array_equal(solver.net.params["fc"][0].data, before)
    assert float(solver.net.forward()["loss"]) < first
    solver.solve()
    assert solver.iter == 5


def test_solver_test_nets_share_training_weights(mnist_lmdbs, monkeypatch):
    monkeypatch.chdir(ROOT)
    solver = scaffe.get_solver(str(MNIST / "lenet_solver.prototxt"))
    try:
        assert len(solver.test_nets) == 1
        test_net = solver.test_nets[0]
        assert test_net.params["ip2"][0].data is solver.net.params["ip2"][0].data
        assert set(test_net.forward()) == {"accuracy", "loss"}
        assert test_net.blobs["data"].data.shape == (100, 1, 28, 28)
    finally:
        solver.close()


def test_net_opens_a_database_that_a_solver_has_open(mnist_lmdbs, monkeypatch):
    monkeypatch.chdir(ROOT)
    solver = scaffe.get_solver(str(MNIST / "lenet_solver.prototxt"))
    try:
        with scaffe.Net(TRAIN_TEST, scaffe.TEST) as net:
            first = net.forward()["accuracy"]
        assert 0 <= float(first) <= 1
        solver.step(1)
    finally:
        solver.close()


def test_net_opens_a_database_that_the_script_opened_with_py_lmdb(mnist_lmdbs, monkeypatch):
    monkeypatch.chdir(ROOT)
    env = lmdb.open(mnist_lmdbs[1], readonly=True)  # as pycaffe scripts do to look at the data
    try:
        with env.begin() as txn:
            first = txn.get(b"00000000")
        with scaffe.Net(TRAIN_TEST, scaffe.TEST) as net:
            net.forward()
            image, label = datum_to_array(first)
            np.testing.assert_array_equal(net.blobs["data"].data[0], image * np.float32(0.00390625))
            assert net.blobs["label"].data[0] == label
    finally:
        env.close()


def test_set_mode_gpu_without_a_gpu_is_a_clear_error():
    from kernels.backend import cupy_or_none
    if cupy_or_none() is not None:
        pytest.skip("a GPU is usable here")
    with pytest.raises(RuntimeError, match=r"set_mode_gpu\(\): no CUDA GPU is usable"):
        scaffe.set_mode_gpu()
    with pytest.raises(RuntimeError, match="no CUDA GPU is usable"):
        scaffe.set_device(0)


def test_gpu_mode_makes_cupy_nets(linear):
    from kernels.backend import cupy_or_none
    cupy = cupy_or_none()
    if cupy is None:
        pytest.skip("no GPU")
    scaffe.set_device(0)
    scaffe.set_mode_gpu()
    try:
        net = scaffe.Net(linear, scaffe.TEST)
    finally:
        scaffe.set_mode_cpu()
    x = np.random.RandomState(3).randn(2, 3).astype(np.float32)
    z = net.forward(x=x)["z"]
    assert isinstance(z, cupy.ndarray)
    w, b = (cupy.asnumpy(p.data) for p in net.params["fc"])
    np.testing.assert_allclose(cupy.asnumpy(z), np.tanh(x @ w.T + b), rtol=1e-5, atol=1e-6)
    assert isinstance(scaffe.Net(linear, scaffe.TEST).blobs["z"].data, np.ndarray)


def test_python_api_example_trains_lenet(mnist_lmdbs):
    proc = subprocess.run([sys.executable, "examples/python_api.py", "100"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    accuracy = float(next(line for line in proc.stdout.splitlines() if line.startswith("test accuracy: ")).split()[-1])
    assert accuracy > 0.85, proc.stdout
    predicted = [line for line in proc.stdout.splitlines() if line.startswith("predicted: ")]
    assert len(predicted) == 1 and len(eval(predicted[0].split(":", 1)[1])) == 8
