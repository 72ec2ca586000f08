"""The rest of pycaffe's surface (BVLC Caffe's python/caffe/_caffe.cpp): Solver.max_iter, add_callback,
share_weights and lr, get_solver's typed classes, Net's per-layer callbacks, caffe.Timer, init_log and log,
set_multiprocess."""
import itertools
import time

import numpy
import pytest

import scaffe

# z = W x + b against a constant target, one InnerProduct between a DummyData and a EuclideanLoss,
# so the gradients and updates are a few lines of numpy.
TINY_NET = """name: "tiny"
layer { name: "data" type: "DummyData" top: "x" top: "y"
  dummy_data_param { shape { dim: 4 dim: 3 } shape { dim: 4 dim: 2 }
                     data_filler { type: "gaussian" std: 1 } data_filler { type: "constant" value: 0.5 } } }
layer { name: "fc" type: "InnerProduct" bottom: "x" top: "z"
  inner_product_param { num_output: 2 weight_filler { type: "gaussian" std: 0.5 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "z" bottom: "y" top: "loss" }
"""
LAYERS = ["data", "fc", "loss"]
# The same fc on an input, as a deploy net that shares the trained weights.
DEPLOY_NET = """name: "tiny_deploy"
layer { name: "x" type: "Input" top: "x" input_param { shape { dim: 4 dim: 3 } } }
layer { name: "fc" type: "InnerProduct" bottom: "x" top: "z" inner_product_param { num_output: 2 } }
"""
SOLVER = 'net: "{net}" {type_line} base_lr: 0.1 lr_policy: "fixed" max_iter: {max_iter} random_seed: 3 ' \
         'snapshot_after_train: false\n'


@pytest.fixture
def tiny(tmp_path):
    net = tmp_path / "tiny.prototxt"
    net.write_text(TINY_NET)
    return net


def write_solver(tmp_path, net, type_line="", max_iter=7, name="solver.prototxt"):
    path = tmp_path / name
    path.write_text(SOLVER.format(net=net, type_line=type_line, max_iter=max_iter))
    return str(path)


def fc_gradients(net):
    """dW, db of the Euclidean loss sum((z - y)^2) / (2 N) at the net's current blobs."""
    x, z, y = (net.blobs[name].data for name in ("x", "z", "y"))
    dz = (z - y) / x.shape[0]
    return dz.T @ x, dz.sum(axis=0)


# ---------------------------------------------------------------- solvers

def test_max_iter_and_typed_solvers(tmp_path, tiny):
    solver = scaffe.get_solver(write_solver(tmp_path, tiny, max_iter=7))
    assert solver.max_iter == 7 == solver.param.max_iter
    assert type(solver) is scaffe.SGDSolver
    typed = {"SGD": scaffe.SGDSolver, "Nesterov": scaffe.NesterovSolver, "AdaGrad": scaffe.AdaGradSolver,
             "RMSProp": scaffe.RMSPropSolver, "AdaDelta": scaffe.AdaDeltaSolver, "Adam": scaffe.AdamSolver}
    for type_name, cls in typed.items():
        path = write_solver(tmp_path, tiny, f'type: "{type_name}"', name=f"{type_name}.prototxt")
        solver = scaffe.get_solver(path)
        assert type(solver) is cls and isinstance(solver, scaffe.SGDSolver), type_name  # as in Caffe
        assert solver._solver.type == type_name
        forced = cls(write_solver(tmp_path, tiny, name="untyped.prototxt"))  # AdamSolver(file) ... still work
        assert type(forced) is cls and forced._solver.type == type_name
    # The deprecated enum names the same classes.
    legacy = scaffe.get_solver(write_solver(tmp_path, tiny, "solver_type: ADADELTA", name="legacy.prototxt"))
    assert isinstance(legacy, scaffe.AdaDeltaSolver)


def test_lr_follows_the_policy(tmp_path, tiny):
    path = tmp_path / "step.prototxt"
    path.write_text(f'net: "{tiny}" base_lr: 0.1 lr_policy: "step" gamma: 0.5 stepsize: 2 max_iter: 5\n')
    solver = scaffe.SGDSolver(str(path))
    rates = []
    for _ in range(5):
        rates.append(solver.lr)
        solver.step(1)
    # Caffe's "step" policy: base_lr * gamma ^ floor(iter / stepsize)
    numpy.testing.assert_allclose(rates, [0.1 * 0.5 ** (i // 2) for i in range(5)], rtol=1e-6)


def test_add_callback_runs_around_each_update(tmp_path, tiny):
    solver = scaffe.get_solver(write_solver(tmp_path, tiny, max_iter=5))
    weights, bias = solver.net.params["fc"]
    events = []

    def on_start():
        events.append(("start", solver.iter, weights.data.copy(), weights.diff.copy()))

    def on_gradients_ready():
        events.append(("grads", solver.iter, weights.data.copy(), weights.diff.copy()))
        numpy.testing.assert_allclose(weights.diff, fc_gradients(solver.net)[0], rtol=1e-5, atol=1e-7)

    solver.add_callback(on_start, on_gradients_ready)
    solver.step(3)
    solver.solve()  # on to max_iter: two more iterations
    assert [(kind, it) for kind, it, _, _ in events] == [(kind, it) for it in range(5) for kind in ("start", "grads")]
    for (_, _, w_start, g_start), (_, _, w_ready, g_ready) in zip(events[::2], events[1::2]):
        assert not g_start.any() and g_ready.any()  # cleared before on_start, filled before on_gradients_ready
        numpy.testing.assert_array_equal(w_ready, w_start)  # no update yet
    for (_, _, w_ready, g_ready), (_, _, w_next, _) in zip(events[1::2], events[2::2]):
        numpy.testing.assert_allclose(w_next, w_ready - 0.1 * g_ready, rtol=1e-5, atol=1e-7)  # plain SGD
    with pytest.raises(TypeError, match="on_gradients_ready must be callable"):
        solver.add_callback(on_start, None)


def test_share_weights_sees_training(tmp_path, tiny):
    deploy = tmp_path / "deploy.prototxt"
    deploy.write_text(DEPLOY_NET)
    solver = scaffe.get_solver(write_solver(tmp_path, tiny))
    net = scaffe.Net(str(deploy), scaffe.TEST)
    solver.share_weights(net)
    before = net.params["fc"][0].data.copy()
    solver.step(2)
    trained_w, trained_b = (p.data for p in solver.net.params["fc"])
    assert not numpy.array_equal(trained_w, before)
    for mine, theirs in zip(net.params["fc"], solver.net.params["fc"]):
        assert numpy.shares_memory(mine.data, theirs.data)
    x = numpy.random.default_rng(0).standard_normal((4, 3)).astype(numpy.float32)
    numpy.testing.assert_allclose(net.forward(x=x)["z"], x @ trained_w.T + trained_b, rtol=1e-5, atol=1e-6)
    with pytest.raises(TypeError, match="takes a caffe.Net"):
        solver.share_weights(solver._solver.net)


# ---------------------------------------------------------------- net callbacks

def test_net_callbacks_wrap_each_layer_in_order(tiny):
    net = scaffe.Net(str(tiny), scaffe.TRAIN)
    calls = []
    z_seen = {}
    net.before_forward(lambda i: calls.append(("before_forward", i)))
    net.after_forward(lambda i: calls.append(("after_forward", i)))
    net.before_backward(lambda i: calls.append(("before_backward", i)))
    net.after_backward(lambda i: calls.append(("after_backward", i)))
    # Each callback sees the layer's work not done yet (before_*) or done (after_*).
    net.before_forward(lambda i: z_seen.setdefault(("before", i), net.blobs["z"].data.copy()))
    net.after_forward(lambda i: z_seen.setdefault(("after", i), net.blobs["z"].data.copy()))
    grads_seen = {}
    net.before_backward(lambda i: grads_seen.setdefault(("before", i), net.params["fc"][0].diff.copy()))
    net.after_backward(lambda i: grads_seen.setdefault(("after", i), net.params["fc"][0].diff.copy()))
    net.clear_param_diffs()
    net.forward()
    z = net.blobs["z"].data.copy()
    net.backward()
    n = len(LAYERS)
    expected = [(kind, i) for i in range(n) for kind in ("before_forward", "after_forward")]
    expected += [(kind, i) for i in reversed(range(n)) for kind in ("before_backward", "after_backward")]
    assert calls == expected  # every layer, the data layer (which skips backward) included, as in Caffe
    fc = LAYERS.index("fc")
    assert not z_seen[("before", fc)].any()
    numpy.testing.assert_array_equal(z_seen[("after", fc)], z)
    assert not grads_seen[("before", fc)].any()
    numpy.testing.assert_allclose(grads_seen[("after", fc)], fc_gradients(net)[0], rtol=1e-5, atol=1e-7)
    calls.clear()
    net.forward(start="fc", end="fc")  # a part of the net: its layers' callbacks only
    assert calls == [("before_forward", fc), ("after_forward", fc)]
    with pytest.raises(TypeError, match=r"after_backward\(run\): run must be callable"):
        net.after_backward("not a function")


def test_net_callbacks_run_in_training(tmp_path, tiny):
    solver = scaffe.get_solver(write_solver(tmp_path, tiny))
    forwards, backwards = [], []
    solver.net.after_forward(forwards.append)
    solver.net.before_backward(backwards.append)
    solver.step(2)
    assert forwards == [0, 1, 2] * 2 and backwards == [2, 1, 0] * 2


# ---------------------------------------------------------------- process-wide helpers

@pytest.fixture
def fake_clock(monkeypatch):
    """time.perf_counter returning the given seconds one after the other, then the last one again (the cupy
    stand-in's events read it too)."""
    def install(*seconds):
        monkeypatch.setattr(time, "perf_counter", itertools.chain(seconds, itertools.repeat(seconds[-1])).__next__)
    return install


def test_timer_start_stop_ms(fake_clock):
    timer = scaffe.Timer()
    assert timer.ms == 0  # never started: Caffe warns and gives 0
    fake_clock(1.0, 1.5, 3.0)
    timer.start()
    timer.start()  # running already: no restart
    timer.stop()
    timer.stop()  # stopped already: the stop time stays
    assert timer.ms == 500
    fake_clock(10.0, 10.25)
    timer.start()
    assert timer.ms == 250  # reading a running timer stops it
    assert timer.ms == 250 and not timer.running


def test_timer_in_gpu_mode_times_device_events(cupy_stand_in, fake_clock):
    scaffe.set_mode_gpu()
    try:
        timer = scaffe.Timer()
    finally:
        scaffe.set_mode_cpu()
    fake_clock(2.0, 2.125)
    timer.start()
    timer.stop()
    cupy_stand_in._stand_in.reset()
    assert timer.ms == 125
    assert cupy_stand_in._stand_in.counters["synchronize"] == 1  # waited for the stop event


def test_init_log_and_log(capsys):
    try:
        scaffe.init_log()
        scaffe.log("from pycaffe")
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("I") and lines[0].endswith("] from pycaffe")
        scaffe.init_log(1)  # WARNING and above
        scaffe.log("dropped")
        assert capsys.readouterr().err == ""
        scaffe.init_log(0, True)
        scaffe.log("again")
        assert capsys.readouterr().err.endswith("] again\n")
    finally:
        from scaffe.log import setup_logging
        setup_logging()


def test_set_multiprocess_accepts_caffes_flag():
    assert scaffe.set_multiprocess(True) is None and scaffe.set_multiprocess(False) is None
    with pytest.raises(TypeError, match="takes True or False"):
        scaffe.set_multiprocess("yes")
