"""The "Python" layer type and scaffe.Layer (pycaffe's caffe.Layer): layers written in Python, as Caffe
documents them, in nets, in a Solver and under `mpiexec -n 2 scaffe train`."""
import os
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

import scaffe
from gradient_check import check_gradients
from scaffe import io as sio
from scaffe.net_filter import NetError

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
MPIEXEC = Path(sys.executable).with_name("mpiexec")


def python_layer(name, layer, bottoms, tops, param_str=None, extra=""):
    tops_text = " ".join(f'top: "{t}"' for t in tops)
    bottoms_text = " ".join(f'bottom: "{b}"' for b in bottoms)
    param = f' param_str: "{param_str}"' if param_str is not None else ""
    return (f'layer {{ name: "{name}" type: "Python" {bottoms_text} {tops_text} {extra}\n'
            f'  python_param {{ module: "python_layers" layer: "{layer}"{param} }} }}\n')


def write_net(tmp_path, body, name="net.prototxt"):
    path = tmp_path / name
    path.write_text(body)
    return str(path)


INPUT = 'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 4 dim: 3 dim: 2 } } }\n'


def test_forward_backward_param_str_and_reshape(tmp_path):
    body = ("force_backward: true\n" + INPUT + python_layer("times3", "MultiplyLayer", ["data"], ["a"], "3")
            + python_layer("times_minus2", "MultiplyLayer", ["a"], ["b"], "-2"))
    net = scaffe.Net(write_net(tmp_path, body), scaffe.TRAIN)
    x = numpy.random.default_rng(0).standard_normal((4, 3, 2)).astype(numpy.float32)
    out = net.forward(data=x)
    numpy.testing.assert_allclose(out["b"], -6 * x, rtol=1e-6)
    grads = net.backward(b=numpy.ones_like(x))
    numpy.testing.assert_allclose(grads["data"], numpy.full_like(x, -6), rtol=1e-6)
    # reshape runs before every forward, as in Caffe: a new input shape flows through the Python layers.
    net.blobs["data"].reshape(2, 5)
    net.blobs["data"].data[...] = 1
    net.forward()
    assert net.blobs["b"].data.shape == (2, 5) and (net.blobs["b"].data == -6).all()
    assert "Python" in scaffe.layer_type_list()
    assert net.layers[1].type == "Python" and net.layers[1].param_str == "3"


def test_phase_and_user_object_in_net_layers(tmp_path):
    path = write_net(tmp_path, python_layer("phase", "PhaseLayer", [], ["phase"]))
    for phase in (scaffe.TRAIN, scaffe.TEST):
        net = scaffe.Net(path, phase)
        assert float(net.forward()["phase"]) == phase
        assert net.layers[0].phase == phase and net.layer_dict["phase"] is net.layers[0]


def test_python_loss_matches_builtin_forward_backward(tmp_path):
    rng = numpy.random.default_rng(1)
    a, b = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    head = ('layer { name: "in" type: "Input" top: "a" top: "b" input_param { shape { dim: 5 dim: 3 } '
            'shape { dim: 5 dim: 3 } } }\nforce_backward: true\n')
    builtin = scaffe.Net(write_net(tmp_path, head + 'layer { name: "loss" type: "EuclideanLoss" bottom: "a" '
                                   'bottom: "b" top: "loss" loss_weight: 2 }', "builtin.prototxt"), scaffe.TRAIN)
    mirror = scaffe.Net(write_net(tmp_path, head + python_layer("loss", "EuclideanLossLayer", ["a", "b"], ["loss"],
                                                                 extra="loss_weight: 2"), "mirror.prototxt"),
                        scaffe.TRAIN)
    for net in (builtin, mirror):
        net.blobs["a"].data[...], net.blobs["b"].data[...] = a, b
        net.forward()
        net.backward()
    # loss = sum((a - b)^2) / (2 N), its gradient (a - b) / N times the loss weight.
    numpy.testing.assert_allclose(mirror.blobs["loss"].data, ((a - b) ** 2).sum() / 10, rtol=1e-5)
    for name in ("a", "b"):
        numpy.testing.assert_allclose(mirror.blobs[name].diff, builtin.blobs[name].diff, rtol=1e-6)
    numpy.testing.assert_allclose(mirror.blobs["a"].diff, 2 * (a - b) / 5, rtol=1e-5)


def test_learnable_blobs_gradients_against_finite_differences():
    param = ('name: "bias" type: "Python" bottom: "x" top: "y" '
             'python_param { module: "python_layers" layer: "BiasLayer" }')
    x = numpy.random.default_rng(2).standard_normal((2, 3, 4))
    harness = check_gradients(param, [x])
    assert harness.layer.blobs[0].dtype == numpy.float64  # add_blob follows the net's dtype


def test_blobs_saved_loaded_and_shared(tmp_path):
    path = write_net(tmp_path, "force_backward: true\n" + INPUT + python_layer("bias", "BiasLayer", ["data"], ["y"]))
    net = scaffe.Net(path, scaffe.TRAIN)
    layer = net.layers[list(net._layer_names).index("bias")]
    assert list(net.params) == ["bias"] and layer.blobs[0].shape == (3,)
    layer.blobs[0].data[...] = [1, 2, 3]
    net.save(str(tmp_path / "w.caffemodel"))
    net.save_hdf5(str(tmp_path / "w.h5"))
    for load in (lambda n: n.copy_from(str(tmp_path / "w.caffemodel")), lambda n: n.load_hdf5(str(tmp_path / "w.h5")),
                 lambda n: n.share_with(net)):
        other = scaffe.Net(path, scaffe.TRAIN)
        numpy.testing.assert_array_equal(other.params["bias"][0].data, [0.5, 0.5, 0.5])
        load(other)
        numpy.testing.assert_array_equal(other.params["bias"][0].data, [1, 2, 3])
    stored = sio.net_weights(sio.read_net_binary(str(tmp_path / "w.caffemodel")))
    numpy.testing.assert_array_equal(stored["bias"][0], [1, 2, 3])


def test_errors(tmp_path):
    # The layer's own exception reaches the caller unchanged (pycaffe raises it too).
    with pytest.raises(KeyError, match="raised by the layer's own setup"):
        scaffe.Net(write_net(tmp_path, INPUT + python_layer("bad", "FailingSetupLayer", ["data"], ["y"])))
    bad_module = INPUT + ('layer { name: "m" type: "Python" bottom: "data" top: "y" '
                          'python_param { module: "no_such_layers_module" layer: "X" } }')
    with pytest.raises(NetError, match="layer 'm'.*no_such_layers_module.*PYTHONPATH"):
        scaffe.Net(write_net(tmp_path, bad_module, "m.prototxt"))
    with pytest.raises(NetError, match="has no 'Missing'"):
        scaffe.Net(write_net(tmp_path, INPUT + python_layer("x", "Missing", ["data"], ["y"]), "x.prototxt"))
    with pytest.raises(NetError, match="derived from caffe.Layer"):
        scaffe.Net(write_net(tmp_path, INPUT + python_layer("x", "NotALayer", ["data"], ["y"]), "n.prototxt"))
    with pytest.raises(NetError, match="must call the base class's __init__"):
        scaffe.Net(write_net(tmp_path, INPUT + python_layer("x", "ForgetsBaseInitLayer", ["data"], ["y"]), "f.prototxt"))


# A linear regression of the digit's label from its pixels, so the loss is a Euclidean one.
REGRESSION_NET = """
name: "regression"
layer {{ name: "mnist" type: "Data" top: "data" top: "label"
  transform_param {{ scale: 0.00390625 }} data_param {{ source: "{source}" batch_size: {batch} backend: LMDB }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param {{ num_output: 1 weight_filler {{ type: "xavier" }} }} }}
{loss}
"""
BUILTIN_LOSS = 'layer { name: "loss" type: "EuclideanLoss" bottom: "ip" bottom: "label" top: "loss" }'
PYTHON_LOSS = python_layer("loss", "EuclideanLossLayer", ["ip", "label"], ["loss"], extra="loss_weight: 1")
SOLVER = """net: "{net}"
base_lr: 0.001 momentum: 0.9 weight_decay: 0.0005 lr_policy: "fixed"
max_iter: {iters} display: 1 random_seed: 7 snapshot_prefix: "{prefix}"
"""


def write_regression(folder, loss, batch, iters, tag):
    from scaffe.tools.convert_mnist import ensure_mnist_lmdb
    train, _ = ensure_mnist_lmdb(str(ROOT / "examples" / "mnist"))
    net = folder / f"{tag}_net.prototxt"
    net.write_text(REGRESSION_NET.format(source=os.path.abspath(train), batch=batch, loss=loss))
    solver = folder / f"{tag}_solver.prototxt"
    solver.write_text(SOLVER.format(net=net, iters=iters, prefix=folder / tag))
    return solver


def test_solver_trains_python_loss_like_builtin(tmp_path, monkeypatch):
    weights = {}
    for tag, loss in (("builtin", BUILTIN_LOSS), ("python", PYTHON_LOSS)):
        solver = scaffe.SGDSolver(write_regression(tmp_path, loss, 16, 5, tag))
        solver.step(5)
        weights[tag] = [p.data.copy() for p in solver.net.params["ip"]]
        solver.close()
    for built, mirrored in zip(weights["builtin"], weights["python"]):
        numpy.testing.assert_allclose(mirrored, built, rtol=1e-5, atol=1e-7)
    assert numpy.abs(weights["python"][1]).max() > 0  # training moved the bias off its 0 filler


def test_mpiexec_scaffe_train_python_loss_equals_builtin(tmp_path):
    """`mpiexec -n 2 scaffe train` with the Python Euclidean loss (batch 8 per rank) reaches the weights
    of the built-in EuclideanLoss trained by one process on batch 16: the same samples, the same steps."""
    iters = 4
    builtin = scaffe.SGDSolver(write_regression(tmp_path, BUILTIN_LOSS, 16, iters, "builtin"))
    builtin.solve()
    expected = [p.data.copy() for p in builtin.net.params["ip"]]
    builtin.close()
    solver = write_regression(tmp_path, PYTHON_LOSS, 8, iters, "python")
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", NUMBA_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    cmd = [str(MPIEXEC), "-n", "2", sys.executable, "-m", "scaffe", "train", f"--solver={solver}"]
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
                          start_new_session=True)
    assert done.returncode == 0, f"{' '.join(cmd)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "Data-parallel training on 2 ranks" in done.stdout + done.stderr
    trained = sio.net_weights(sio.read_net_binary(str(tmp_path / f"python_iter_{iters}.caffemodel")))["ip"]
    for got, want in zip(trained, expected):
        numpy.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
    assert numpy.abs(trained[1]).max() > 0


def test_python_layers_on_the_cupy_path(cupy_stand_in):
    """In GPU mode a Python layer's blobs, and those it adds, are device arrays like the rest of the net."""
    from scaffe.io import to_host
    from scaffe.net import Net as CoreNet
    param = sio.parse_net_text("force_backward: true\n" + INPUT
                               + python_layer("bias", "BiasLayer", ["data"], ["y"])
                               + python_layer("times", "MultiplyLayer", ["y"], ["z"], "2"))
    x = numpy.random.default_rng(3).standard_normal((4, 3, 2)).astype(numpy.float32)
    results = []
    for xp in (numpy, cupy_stand_in):
        net = CoreNet(param, scaffe.TRAIN, xp=xp)
        net.blobs["data"].data[...] = xp.asarray(x)
        net.forward()
        net.blobs["z"].diff[...] = 1
        net.backward()
        blob = net.layer("bias").blobs[0]
        assert isinstance(blob.data, xp.ndarray)
        results.append([to_host(a) for a in (net.blobs["z"].data, net.blobs["data"].diff, blob.diff)])
    for host, device in zip(*results):
        numpy.testing.assert_allclose(device, host, rtol=1e-6)
    numpy.testing.assert_allclose(results[0][0], 2 * (x + 0.5), rtol=1e-6)
    numpy.testing.assert_allclose(results[0][2], [16, 16, 16])  # d(sum of z)/db = 2 per element, 8 per channel


# A layer module written for BVLC Caffe: it imports `caffe`, which nobody put on PYTHONPATH.
CAFFE_STYLE_MODULE = """
import caffe
{extra_import}

class TimesTwo(caffe.Layer):
    def setup(self, bottom, top):
        pass

    def reshape(self, bottom, top):
        top[0].reshape(*bottom[0].data.shape)

    def forward(self, bottom, top):
        top[0].data[...] = 2 * bottom[0].data

    def backward(self, top, propagate_down, bottom):
        if propagate_down[0]:
            bottom[0].diff[...] = 2 * top[0].diff
"""
# z = 2 (W x + b) against the target y, x and y constant, W and b from constant fillers: a numpy loop is the oracle.
CAFFE_STYLE_NET = """name: "times_two"
layer {{ name: "data" type: "DummyData" top: "x" top: "y"
  dummy_data_param {{ shape {{ dim: 2 dim: 3 }} shape {{ dim: 2 dim: 2 }}
                     data_filler {{ type: "constant" value: 1 }} data_filler {{ type: "constant" value: 3 }} }} }}
layer {{ name: "fc" type: "InnerProduct" bottom: "x" top: "fc"
  inner_product_param {{ num_output: 2 weight_filler {{ type: "constant" value: 0.25 }} }} }}
layer {{ name: "double" type: "Python" bottom: "fc" top: "z" python_param {{ module: "{module}" layer: "TimesTwo" }} }}
layer {{ name: "loss" type: "EuclideanLoss" bottom: "z" bottom: "y" top: "loss" }}
"""
CAFFE_STYLE_SOLVER = 'net: "{net}" base_lr: 0.05 lr_policy: "fixed" max_iter: 3 snapshot_prefix: "{prefix}"\n'


def run_scaffe_train(tmp_path, module, extra_import=""):
    """`python -m scaffe train` on the TimesTwo net whose layer module is `module`, with only the repository
    and the module's folder on PYTHONPATH."""
    layers = tmp_path / "layers"
    layers.mkdir(exist_ok=True)
    (layers / "caffe_style_layers.py").write_text(CAFFE_STYLE_MODULE.format(extra_import=extra_import))
    net = tmp_path / "net.prototxt"
    net.write_text(CAFFE_STYLE_NET.format(module=module))
    solver = tmp_path / "solver.prototxt"
    solver.write_text(CAFFE_STYLE_SOLVER.format(net=net, prefix=tmp_path / "times_two"))
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join([str(ROOT), str(layers)]),
           "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "scaffe", "train", f"--solver={solver}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=240, start_new_session=True)


def test_scaffe_train_loads_a_layer_module_that_imports_caffe(tmp_path):
    done = run_scaffe_train(tmp_path, "caffe_style_layers")
    assert done.returncode == 0, done.stderr[-3000:]
    x, y = numpy.ones((2, 3)), numpy.full((2, 2), 3.0)
    w, b = numpy.full((2, 3), 0.25), numpy.zeros(2)
    for _ in range(3):  # SGD on sum((2 (W x + b) - y)^2) / (2 N)
        dz = (2 * (x @ w.T + b) - y) / 2
        w, b = w - 0.05 * 2 * dz.T @ x, b - 0.05 * 2 * dz.sum(axis=0)
    trained = sio.net_weights(sio.read_net_binary(str(tmp_path / "times_two_iter_3.caffemodel")))["fc"]
    numpy.testing.assert_allclose(trained[0], w, rtol=1e-5)
    numpy.testing.assert_allclose(trained[1], b, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("module,extra_import,missing", [
    ("no_such_layers_module", "", "no_such_layers_module"),
    ("caffe_style_layers", "import no_such_dependency", "no_such_dependency")])
def test_scaffe_train_names_a_missing_layer_module_in_one_line(tmp_path, module, extra_import, missing):
    done = run_scaffe_train(tmp_path, module, extra_import)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("scaffe train: ") and "layer 'double' (Python)" in last, last
    assert f"python_param.module '{module}' cannot be imported" in last and f"'{missing}'" in last, last
