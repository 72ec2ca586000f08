"""Training iterations replayed from CUDA graphs (scaffe.capture) on the cupy stand-in, whose captures compute
nothing until their graph runs and refuse what CUDA and cupy refuse: replayed training equals eager training
bit for bit, what cannot be captured runs between the graphs, and whatever goes wrong turns capture off with
one log line and leaves the training as the eager one."""
import logging

import numpy
import pytest

from scaffe.io import to_host
from scaffe.solvers import create_solver, read_solver_file
import test_cupy_cli

lenet_dir = test_cupy_cli.lenet_dir  # the fixture: LeNet at batch 8 on the bundled digits, solver_gpu.prototxt


def train(lenet_dir, cupy, monkeypatch, capture, iterations=6, patch=None, **fields):
    """LeNet (Data layers on the LMDB) trained `iterations` on the stand-in with SCAFFE_CAPTURE=`capture`;
    returns its weights and the solver."""
    monkeypatch.setenv("SCAFFE_CAPTURE", capture)
    path = lenet_dir / "solver_gpu.prototxt"
    param = read_solver_file(path)
    param.max_iter, param.snapshot, param.snapshot_after_train, param.test_interval = iterations, 0, False, 3
    for field, value in fields.items():
        setattr(param, field, value)
    solver = create_solver(param, source=str(path), net_kwargs={"xp": cupy})
    if patch is not None:
        patch(solver.net)
    try:
        solver.solve()
    finally:
        solver.close()
    weights = [to_host(blob.data) for blob in solver.net.learnable_params]
    weights += [to_host(history) for history in solver.history]
    return weights, solver


@pytest.mark.parametrize("fields", [{}, {"type": "Adam", "base_lr": 0.001, "momentum": 0.9, "momentum2": 0.999,
                                         "lr_policy": "fixed"}, {"iter_size": 2, "lr_policy": "step", "stepsize": 2,
                                                                 "gamma": 0.5}],
                         ids=["SGD-inv", "Adam", "iter_size-step"])
def test_replayed_training_equals_eager_training(cupy_stand_in, lenet_dir, monkeypatch, caplog, fields):
    """The rate (inv, step) and Adam's bias correction change every iteration and reach the captured update;
    the Data layer delivers a new batch at each replay; the test net reads the replayed weights."""
    eager, _ = train(lenet_dir, cupy_stand_in, monkeypatch, "0", **fields)
    counters = cupy_stand_in._stand_in.counters
    counters.clear()
    caplog.clear()  # what earlier runs logged
    with caplog.at_level(logging.INFO, logger="scaffe"):
        replayed, solver = train(lenet_dir, cupy_stand_in, monkeypatch, "1", **fields)
    for a, b in zip(replayed, eager):
        numpy.testing.assert_array_equal(a, b)
    log = caplog.text
    assert "CUDA graphs off" not in log
    # iterations 3..6 replayed; the GEMM layers run between the graphs, the Data layer first
    assert counters["graph_launches"] >= 4 * 3
    for layer in ("conv1", "conv2", "ip1", "ip2"):
        assert f"layer {layer} runs between the graphs" in log
    assert "layer mnist runs between the graphs (Data: it delivers a new batch each iteration)" in log
    assert solver.capture.recording is not None


def test_capture_is_off_by_setting(cupy_stand_in, lenet_dir, monkeypatch, caplog):
    caplog.clear()  # what earlier runs logged
    with caplog.at_level(logging.INFO, logger="scaffe"):
        _, solver = train(lenet_dir, cupy_stand_in, monkeypatch, "0", iterations=3)
    assert solver.capture.off == "SCAFFE_CAPTURE=0" and "CUDA graphs off (SCAFFE_CAPTURE=0)" in caplog.text
    assert cupy_stand_in._stand_in.counters["graph_launches"] == 0
    with pytest.raises(ValueError, match="SCAFFE_CAPTURE='yes'"):
        train(lenet_dir, cupy_stand_in, monkeypatch, "yes", iterations=1)


def _host_counter(net):
    """ReLU's forward adds whether it ran an odd number of times: a host value a graph keeps from its capture (a
    layer's mistake). The capture and the self-check's eager pass are two more calls, so the parity of the
    later ones, and the training, stay those of an eager run."""
    layer = net.layer("relu1")
    forward, calls = layer.forward, [0]

    def counted(bottom, top):
        forward(bottom, top)
        calls[0] += 1
        top[0].data[...] += numpy.float32(1e-3 * (calls[0] % 2))
    layer.forward = counted


def _host_read(net):
    """ReLU's forward reads a value back to the host: a host sync, which a capture refuses."""
    layer = net.layer("relu1")
    forward = layer.forward

    def reading(bottom, top):
        forward(bottom, top)
        float(top[0].data.max())
    layer.forward = reading


def test_a_failed_self_check_leaves_eager_training(cupy_stand_in, lenet_dir, monkeypatch, caplog):
    eager, _ = train(lenet_dir, cupy_stand_in, monkeypatch, "0", patch=_host_counter)
    caplog.clear()  # what earlier runs logged
    with caplog.at_level(logging.INFO, logger="scaffe"):
        replayed, solver = train(lenet_dir, cupy_stand_in, monkeypatch, "1", patch=_host_counter)
    assert "a replayed iteration differs from an eager one" in caplog.text and solver.capture.recording is None
    assert [r.levelname for r in caplog.records if "CUDA graphs off" in r.getMessage()] == ["WARNING"]
    for a, b in zip(replayed, eager):
        numpy.testing.assert_array_equal(a, b)


def test_a_layer_whose_capture_fails_runs_between_the_graphs(cupy_stand_in, lenet_dir, monkeypatch, caplog):
    """A host read in ReLU's forward invalidates the capture: ReLU runs between the graphs, the rest is captured."""
    eager, _ = train(lenet_dir, cupy_stand_in, monkeypatch, "0", patch=_host_read)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="scaffe"):
        replayed, solver = train(lenet_dir, cupy_stand_in, monkeypatch, "1", patch=_host_read)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings == ["CUDA graphs: layer relu1 could not be captured (CUDARuntimeError: "
                        "cudaErrorStreamCaptureUnsupported: operation not permitted when stream is capturing); "
                        "it runs between the graphs"], warnings
    assert "layer relu1 runs between the graphs (ReLU: its capture failed: CUDARuntimeError" in caplog.text
    assert solver.capture.recording is not None and "CUDA graphs off" not in caplog.text
    for a, b in zip(replayed, eager):
        numpy.testing.assert_array_equal(a, b)


def test_uncaptured_solver_settings_say_why(cupy_stand_in, lenet_dir, monkeypatch, caplog):
    caplog.clear()  # what earlier runs logged
    with caplog.at_level(logging.INFO, logger="scaffe"):
        _, solver = train(lenet_dir, cupy_stand_in, monkeypatch, "1", iterations=4, clip_gradients=10.0)
    assert "CUDA graphs off (clip_gradients reads the gradients' norm on the host)" in caplog.text


def test_with_nvmath_the_gemm_layers_are_captured_too(nvmath_stand_in, lenet_dir, monkeypatch, caplog):
    """With nvmath-python's cuBLAS bindings the GEMMs of InnerProduct and Convolution go into the graphs: an
    iteration is the Data layer's step and one graph (one launch in place of dozens)."""
    cupy = __import__("cupy")
    eager, _ = train(lenet_dir, cupy, monkeypatch, "0")
    counters = cupy._stand_in.counters
    caplog.clear()  # what earlier runs logged
    with caplog.at_level(logging.INFO, logger="scaffe"):
        counters.clear()
        replayed, solver = train(lenet_dir, cupy, monkeypatch, "1")
    assert "CUDA graphs: an iteration is 1 graphs and 1 steps between them" in caplog.text, caplog.text
    assert "CUDA graphs off" not in caplog.text
    for a, b in zip(replayed, eager):  # cuBLAS through nvmath, column-major: the same products, rounded alike
        numpy.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_replays_wait_for_the_device_only_to_fetch_the_loss_and_a_timeline_turns_capture_off(cupy_stand_in, caplog):
    from mpi4py import MPI

    from perf.bench_train import make_solver
    from scaffe import timeline
    solver, _ = make_solver("lenet", cupy_stand_in)
    solver.step(3)  # two eager iterations, then the capture and its self-check
    stand_in = cupy_stand_in._stand_in
    stand_in.reset()
    solver.step(3)
    # as eager iterations: only a step's last one fetches its loss and the labels' check
    assert stand_in.host_syncs() == 2 and stand_in.counters["graph_launches"] >= 3
    recorder = timeline.Timeline(solver, MPI.COMM_WORLD)
    recorder.start()
    caplog.clear()  # what earlier runs logged
    with caplog.at_level(logging.INFO, logger="scaffe"):
        solver.step(1)
    recorder.stop()
    assert "CUDA graphs off (the timeline records CUDA events around every layer)" in caplog.text
    forward = [e["name"] for e in recorder.trace_events() if e.get("cat") == "forward"]
    assert forward == [layer.name for layer in solver.net.layers]


@pytest.mark.gpu
def test_on_a_gpu_replayed_training_equals_eager_training(lenet_dir, monkeypatch, caplog):
    """cuDNN's filter gradients may sum in another order from one run to the next: equal to float rounding."""
    import cupy
    eager, _ = train(lenet_dir, cupy, monkeypatch, "0", iterations=8)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="scaffe"):
        replayed, solver = train(lenet_dir, cupy, monkeypatch, "1", iterations=8)
    assert "CUDA graphs off" not in caplog.text and solver.capture.recording is not None, caplog.text
    for a, b in zip(replayed, eager):
        numpy.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


RESIDUAL_NET = """
layer { name: "feed" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 4 dim: 3 dim: 8 dim: 8 } shape { dim: 4 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv"
        convolution_param { num_output: 4 kernel_size: 3 pad: 1 weight_filler { type: "xavier" } } }
layer { name: "bn" type: "BatchNorm" bottom: "conv" top: "bn" }
layer { name: "scale" type: "Scale" bottom: "bn" top: "scale" scale_param { bias_term: true } }
layer { name: "relu" type: "ReLU" bottom: "scale" top: "scale" }
layer { name: "drop" type: "Dropout" bottom: "scale" top: "scale" dropout_param { dropout_ratio: 0.3 } }
layer { name: "sum" type: "Eltwise" bottom: "scale" bottom: "conv" top: "sum" }
layer { name: "both" type: "Concat" bottom: "sum" bottom: "conv" top: "both" }
layer { name: "pool" type: "Pooling" bottom: "both" top: "pool" pooling_param { pool: AVE kernel_size: 2 stride: 2 } }
layer { name: "fc" type: "InnerProduct" bottom: "pool" top: "fc"
        inner_product_param { num_output: 5 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "fc" bottom: "label" top: "loss" }
"""


@pytest.mark.parametrize("solver_type", ["SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam"])
def test_every_solver_and_batch_norm_replay_as_they_train_eagerly(nvmath_stand_in, monkeypatch, caplog, solver_type):
    """BatchNorm's statistics, Scale, Eltwise, Concat, AVE pooling and Dropout in the graph, with each solver's
    update: a replayed Dropout draws new masks from its generator's state on the device, the same ones as
    eager training, and the self-check puts that state back after its eager half."""
    from scaffe import io as sio
    from scaffe.proto import caffe_pb2
    cupy = __import__("cupy")
    rng = numpy.random.default_rng(4)
    images = rng.uniform(0, 1, (4, 3, 8, 8)).astype(numpy.float32)
    labels = rng.integers(0, 5, 4).astype(numpy.float32)
    results = []
    for capture in ("0", "1"):
        monkeypatch.setenv("SCAFFE_CAPTURE", capture)
        param = caffe_pb2.SolverParameter(type=solver_type, base_lr=0.01, lr_policy="fixed", max_iter=6, display=0,
                                          random_seed=2, snapshot_after_train=False, weight_decay=0.001,
                                          **({"momentum": 0.9} if solver_type in ("SGD", "Nesterov", "Adam")
                                             else {"momentum": 0.95} if solver_type == "AdaDelta" else {}))
        param.net_param.CopyFrom(sio.parse_net_text(RESIDUAL_NET))
        solver = create_solver(param, net_kwargs={"xp": cupy})
        solver.net.blobs["data"].data[...] = cupy.asarray(images)
        solver.net.blobs["label"].data[...] = cupy.asarray(labels)
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="scaffe"):
            solver.step(6)
        results.append([to_host(blob.data) for layer in solver.net.layers for blob in layer.blobs])
    assert "CUDA graphs: an iteration is 1 graphs and 1 steps between them" in caplog.text, caplog.text
    assert "CUDA graphs off" not in caplog.text
    for a, b in zip(*results):
        numpy.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def _layer_cases():
    from test_layers_gradients import CASES
    return CASES


class _OneLayer:
    """One layer of a gradient case on the cupy stand-in: new bottoms and top diffs fed, forward and backward run."""

    def __init__(self, cp, proto, bottoms, options):
        from gradient_check import layer_param
        from scaffe.blob import Blob
        from scaffe.layer_impls import create_layer
        from scaffe.proto import caffe_pb2
        param = layer_param(proto)
        self.cp, self.values = cp, bottoms
        self.bottoms = [Blob(numpy.shape(array), dtype=numpy.float32, xp=cp) for array in bottoms]
        self.tops = [Blob((), dtype=numpy.float32, xp=cp)
                     for _ in range(options.get("num_tops", max(len(param.top), 1)))]
        if options.get("in_place"):
            self.tops[0] = self.bottoms[0]
        self.layer = create_layer(param, options.get("phase", caffe_pb2.TRAIN))
        self.layer.rng = numpy.random.default_rng(0)
        self.layer.setup(self.bottoms, self.tops)
        self.layer.reshape(self.bottoms, self.tops)
        check = options.get("check_bottoms", range(len(bottoms)))
        self.propagate = [i in check for i in range(len(bottoms))]
        self.rng = numpy.random.default_rng(5)

    def feed(self):
        """New bottoms (labels kept) and top diffs; the parameters' gradients cleared."""
        for blob, array, wanted in zip(self.bottoms, self.values, self.propagate):
            values = numpy.asarray(array, dtype=numpy.float32)
            noise = self.rng.standard_normal(values.shape).astype(numpy.float32) * 0.1 if wanted else 0
            blob.data[...] = self.cp.asarray(values + noise)
        for top in self.tops:
            top.diff[...] = self.cp.asarray(self.rng.standard_normal(top.shape).astype(numpy.float32))
        self.clear()

    def clear(self):
        for blob in self.layer.blobs:
            blob.diff[...] = 0

    def inputs(self):
        return [b.data for b in self.bottoms] + [t.diff for t in self.tops] + self.layer.random_state()

    def passes(self):
        self.layer.forward(self.bottoms, self.tops)
        self.layer.backward(self.tops, self.propagate, self.bottoms)

    def results(self):
        return ([t.data.get() for t in self.tops] + [b.diff.get() for b, p in zip(self.bottoms, self.propagate) if p]
                + [b.diff.get() for b in self.layer.blobs])


@pytest.mark.parametrize("proto, bottoms, options", [c[1:] for c in _layer_cases()], ids=[c[0] for c in _layer_cases()])
def test_every_layer_that_says_it_can_be_captured_replays_as_it_runs(nvmath_stand_in, proto, bottoms, options):
    """What `capture_refusal() is None` promises: the layer's forward and backward, captured once, replayed on
    new bottoms and top diffs (and its random state, for Dropout), give what they give when run eagerly."""
    cp = __import__("cupy")
    one = _OneLayer(cp, proto, bottoms, options)
    one.feed()
    one.passes()  # warm-up: buffers, masks, the fused loss's workspace
    if one.layer.capture_refusal() is not None:
        pytest.skip(f"{one.layer.type} refuses capture: {one.layer.capture_refusal()}")
    stream = cp.cuda.Stream(non_blocking=True)
    with stream, cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc):
        stream.begin_capture()
        one.passes()
        graph = stream.end_capture()
    one.feed()
    inputs = [array.copy() for array in one.inputs()]
    graph.launch(stream)
    replayed = one.results()
    for array, saved in zip(one.inputs(), inputs):
        array[...] = saved
    one.clear()
    one.passes()
    for got, want in zip(replayed, one.results()):
        numpy.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


HINGE_NET = """
layer { name: "feed" type: "Input" top: "data" top: "label"
        input_param { shape { dim: 4 dim: 6 } shape { dim: 4 } } }
layer { name: "fc" type: "InnerProduct" bottom: "data" top: "fc"
        inner_product_param { num_output: 3 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "HingeLoss" bottom: "fc" bottom: "label" top: "loss" }
"""


def hinge_solver(cupy):
    """An SGD solver of HINGE_NET on cupy, capturing (SCAFFE_CAPTURE=1 is the caller's)."""
    from scaffe import io as sio
    from scaffe.proto import caffe_pb2
    param = caffe_pb2.SolverParameter(base_lr=0.01, lr_policy="fixed", max_iter=100, display=0,
                                      snapshot_after_train=False)
    param.net_param.CopyFrom(sio.parse_net_text(HINGE_NET))
    return create_solver(param, net_kwargs={"xp": cupy})


def test_a_bad_label_in_a_replayed_iteration_is_reported_at_the_next_fetch(nvmath_stand_in, monkeypatch):
    """The labels' check stays on the device (DeferredLabelCheck) and a graph adds to it in place: a label out of
    range two replays before the step's fetch is still the error the fetch raises."""
    from scaffe.solvers.callbacks import SolverCallback
    cupy = __import__("cupy")
    monkeypatch.setenv("SCAFFE_CAPTURE", "1")
    solver = hinge_solver(cupy)
    data, label = solver.net.blobs["data"], solver.net.blobs["label"]
    data.data[...] = cupy.asarray(numpy.random.default_rng(0).standard_normal((4, 6)).astype(numpy.float32))
    batches = {}  # iteration -> its labels, fed by a callback (it runs at every replay, between the graphs)

    class Labels(SolverCallback):
        def on_start(self):
            label.data[...] = cupy.asarray(numpy.array(batches.get(solver.iter, [0, 1, 2, 1]), numpy.float32))
    solver.callbacks.append(Labels())
    solver.step(4)  # two eager iterations, the capture, one replay
    assert solver.capture.recording is not None and solver.net.layer("loss").capture_refusal() is None
    batches[4] = [0, 7, 2, 1]
    with pytest.raises(ValueError, match="layer 'loss': label 7 is outside 0..2"):
        solver.step(3)  # fetches the loss, and the labels' check, at its last iteration only


def test_net_callbacks_added_after_the_capture_run_at_every_replay(nvmath_stand_in, monkeypatch, caplog):
    """pycaffe's after_forward and before_backward callbacks, added once an iteration is captured, make it
    capture again with them, and then run between the graphs at every replayed iteration."""
    from scaffe.pycaffe import Net
    cupy = __import__("cupy")
    monkeypatch.setenv("SCAFFE_CAPTURE", "1")
    solver = hinge_solver(cupy)
    solver.net.blobs["data"].data[...] = cupy.asarray(numpy.random.default_rng(0).standard_normal((4, 6)),
                                                      numpy.float32)
    solver.net.blobs["label"].data[...] = cupy.asarray([0, 1, 2, 1], numpy.float32)
    solver.step(4)  # two eager iterations, the capture, one replay
    assert solver.capture.recording is not None
    calls = []
    net = Net._wrap(solver.net)
    net.after_forward(lambda i: calls.append(("after_forward", i)))
    net.before_backward(lambda i: calls.append(("before_backward", i)))
    with caplog.at_level(logging.INFO, logger="scaffe"):
        solver.step(3)
    assert "hooks or callbacks were added since the capture; capturing again" in caplog.text
    assert solver.capture.recording is not None
    one_iteration = [("after_forward", i) for i in range(3)] + [("before_backward", i) for i in (2, 1, 0)]
    assert calls[-2 * len(one_iteration):] == one_iteration * 2  # the last two iterations were replays
