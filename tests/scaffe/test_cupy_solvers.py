"""Every solver type on the cupy path (under the cupy stand-in) against the numpy path, snapshots written
from the device and restored onto it (.caffemodel/.solverstate and HDF5), no host sync in an iteration
that displays nothing, and label errors found on the device still raised."""
import numpy
import pytest

from scaffe import io as sio
from scaffe.io import to_host
from scaffe.parallel.pieces import layer_pieces
from scaffe.proto import caffe_pb2
from scaffe.solvers import create_solver
from scaffe.solvers.callbacks import SolverCallback
from test_solvers import TINY, _solver_param

# Softmax on top so the label path (checks kept on the device) is in every step.
CLASSIFIER = TINY.replace('"EuclideanLoss"', '"SoftmaxWithLoss"').replace("shape { dim: 6 dim: 3 }", "shape { dim: 6 }")
INPUTS = numpy.random.default_rng(3).standard_normal((6, 4)).astype(numpy.float32)
LABELS = numpy.array([0, 2, 1, 1, 0, 2], dtype=numpy.float32)

SOLVERS = [("SGD", {"momentum": 0.9, "weight_decay": 0.01}), ("Nesterov", {"momentum": 0.9}),
           ("AdaGrad", {}), ("RMSProp", {"rms_decay": 0.9}), ("AdaDelta", {"momentum": 0.9, "delta": 1e-6}),
           ("Adam", {"momentum": 0.9, "momentum2": 0.999}), ("SGD", {"momentum": 0.9, "clip_gradients": 0.5}),
           ("SGD", {"regularization_type": "L1", "weight_decay": 0.01, "iter_size": 2})]
IDS = [s[0] + "".join(f"-{k}" for k in s[1] if k in ("clip_gradients", "regularization_type")) for s in SOLVERS]


def solver_on(xp, solver_type, fields, tmp_path, labels=LABELS, **overrides):
    settings = dict(type=solver_type, base_lr=0.05, lr_policy="step", gamma=0.5, stepsize=2, max_iter=4, display=0,
                    random_seed=7, snapshot_after_train=False, snapshot_prefix=str(tmp_path / solver_type),
                    regularization_type="L2")
    settings.update(fields)
    settings.update(overrides)
    p = _solver_param(**settings)
    p.net_param.CopyFrom(sio.parse_net_text(CLASSIFIER))
    solver = create_solver(p, net_kwargs={"xp": xp})
    x, t = solver.net.input_blobs
    x.data[...] = xp.asarray(INPUTS)
    t.data[...] = xp.asarray(labels)
    return solver


def weights(solver):
    return [to_host(b.data) for b in solver.net.learnable_params]


@pytest.mark.parametrize("solver_type,fields", SOLVERS, ids=IDS)
def test_solver_on_the_device_matches_numpy(cupy_stand_in, monkeypatch, tmp_path, solver_type, fields):
    monkeypatch.setenv("SCAFFE_CAPTURE", "0")  # eager iterations; replayed ones: tests/scaffe/test_capture.py
    host = solver_on(numpy, solver_type, fields, tmp_path)
    host.step(4)
    device = solver_on(cupy_stand_in, solver_type, fields, tmp_path)
    device.step(1)
    syncs = cupy_stand_in._stand_in.host_syncs()
    device.step(3)
    syncs = cupy_stand_in._stand_in.host_syncs() - syncs
    for got, want in zip(weights(device), weights(host)):
        numpy.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)
    if "clip_gradients" not in fields:
        # No display: only step()'s last iteration fetches its loss and the labels' check.
        assert syncs == 2


def test_gradient_clipping_makes_no_host_sync(cupy_stand_in, tmp_path):
    """The norm and the scale stay on the device (the log line waits for a display iteration)."""
    device = solver_on(cupy_stand_in, "SGD", {"clip_gradients": 0.5}, tmp_path)
    device.step(1)
    syncs = cupy_stand_in._stand_in.host_syncs()
    device.step(3)
    assert cupy_stand_in._stand_in.host_syncs() - syncs == 2


def test_snapshots_from_the_device_restore_onto_it(cupy_stand_in, tmp_path):
    for fmt, ext in ((caffe_pb2.SolverParameter.BINARYPROTO, ""), (caffe_pb2.SolverParameter.HDF5, ".h5")):
        full = solver_on(cupy_stand_in, "Adam", dict(SOLVERS)["Adam"], tmp_path, snapshot_format=fmt)
        full.step(2)
        full.snapshot()
        full.step(2)
        resumed = solver_on(cupy_stand_in, "Adam", dict(SOLVERS)["Adam"], tmp_path, snapshot_format=fmt,
                            random_seed=99)
        resumed.restore(str(tmp_path / f"Adam_iter_2.solverstate{ext}"))
        assert isinstance(resumed.net.learnable_params[0].data, cupy_stand_in.ndarray)
        resumed.step(2)
        for got, want in zip(weights(resumed), weights(full)):
            numpy.testing.assert_array_equal(got, want)
        on_host = solver_on(numpy, "Adam", dict(SOLVERS)["Adam"], tmp_path, snapshot_format=fmt, random_seed=99)
        on_host.restore(str(tmp_path / f"Adam_iter_2.solverstate{ext}"))
        on_host.step(2)
        for got, want in zip(weights(on_host), weights(full)):
            numpy.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6)


def test_a_bad_label_on_the_device_is_raised_when_the_loss_is_fetched(cupy_stand_in, tmp_path):
    bad = LABELS.copy()
    bad[3] = 7
    solver = solver_on(cupy_stand_in, "SGD", {}, tmp_path, labels=bad)
    with pytest.raises(ValueError, match=r"layer 'loss': label 7 is outside 0\.\.2"):
        solver.step(2)
    assert solver.iter == 1  # the first iteration fetched nothing, the second found it


class _PieceByPiece(SolverCallback):
    """Updates the net in pieces of 3 elements, layer after layer from the top, as the scaffe schedule's
    root does (scaffe.parallel.scaffe_schedule), in place of the solver's whole update."""

    def __init__(self, solver):
        self.solver = solver
        solver.applies_update = False
        solver.callbacks.append(self)

    def on_gradients_ready(self):
        solver = self.solver
        rate = solver.get_learning_rate()
        for layer_id in reversed(range(len(solver.net.layers))):
            for piece in layer_pieces(solver, solver.net.grads_ready_at(layer_id), 3 * 4):
                solver.update_elements(piece.segments, rate)


@pytest.mark.parametrize("device", [False, True], ids=["numpy", "device"])
@pytest.mark.parametrize("solver_type,fields", [s for s in SOLVERS if "clip_gradients" not in s[1]],
                         ids=[i for i, s in zip(IDS, SOLVERS) if "clip_gradients" not in s[1]])
def test_update_in_pieces_equals_the_whole_update(cupy_stand_in, tmp_path, device, solver_type, fields):
    """Pieces of 3 elements (across a weight's end and its bias on the device's flat buffers) updated one
    by one give the whole update's weights: history, lr_mult, decay_mult and iter_size included."""
    xp = cupy_stand_in if device else numpy
    whole = solver_on(xp, solver_type, fields, tmp_path)
    whole.step(4)
    pieces = solver_on(xp, solver_type, fields, tmp_path)
    _PieceByPiece(pieces)
    assert any(len(layer_pieces(pieces, pieces.net.grads_ready_at(i), 12)) > 2 for i in range(len(pieces.net.layers)))
    pieces.step(4)
    for got, want in zip(weights(pieces), weights(whole)):
        numpy.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
