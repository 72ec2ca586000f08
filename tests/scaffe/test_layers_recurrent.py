"""RNN, LSTM and LSTMUnit against numpy references written from Caffe's documented equations, plus the
behaviour Caffe's tests expect: a whole sequence equals the same sequence fed one step at a time, cont = 0
restarts it, exposed hidden states chain batches, and a caffemodel in Caffe's parameter layout loads.
(Finite-difference gradients of these layers are in test_layers_gradients.py.)"""
import numpy
import pytest
from google.protobuf import text_format

from gradient_check import LayerHarness
from scaffe.net import Net
from scaffe.solvers import create_solver
from scaffe.proto import caffe_pb2

FILLERS = 'weight_filler { type: "gaussian" std: 0.5 } bias_filler { type: "gaussian" std: 0.3 }'


def recurrent(kind, num_output, expose_hidden=False):
    expose = " expose_hidden: true" if expose_hidden else ""
    return f'type: "{kind}" recurrent_param {{ num_output: {num_output} {FILLERS}{expose} }}'


def sigmoid(x):
    return 1 / (1 + numpy.exp(-x))


def lstm_reference(x, cont, weights, h0=None, c0=None, x_static=None):
    """Caffe's LSTM equations, one stream and one step at a time; weights in Caffe's blob order."""
    if x_static is None:
        w_xc, b_c, w_hc = weights
    else:
        w_xc, b_c, w_static, w_hc = weights
    steps, streams = cont.shape
    dim = w_hc.shape[1]
    h_out, c_last = numpy.zeros((steps, streams, dim)), numpy.zeros((streams, dim))
    for n in range(streams):
        h = numpy.zeros(dim) if h0 is None else h0[0, n]
        c = numpy.zeros(dim) if c0 is None else c0[0, n]
        for t in range(steps):
            gates = w_hc @ (cont[t, n] * h) + w_xc @ x[t, n].reshape(-1) + b_c
            if x_static is not None:
                gates = gates + w_static @ x_static[n].reshape(-1)
            i, f, o, g = numpy.split(gates, 4)
            c = cont[t, n] * sigmoid(f) * c + sigmoid(i) * numpy.tanh(g)
            h = sigmoid(o) * numpy.tanh(c)
            h_out[t, n] = h
        c_last[n] = c
    return h_out, c_last


def rnn_reference(x, cont, weights, h0=None, x_static=None):
    if x_static is None:
        w_xh, b_h, w_hh, w_ho, b_o = weights
    else:
        w_xh, b_h, w_static, w_hh, w_ho, b_o = weights
    steps, streams = cont.shape
    dim = w_hh.shape[0]
    out = numpy.zeros((steps, streams, dim))
    for n in range(streams):
        h = numpy.zeros(dim) if h0 is None else h0[0, n]
        for t in range(steps):
            pre = w_hh @ (cont[t, n] * h) + w_xh @ x[t, n].reshape(-1) + b_h
            if x_static is not None:
                pre = pre + w_static @ x_static[n].reshape(-1)
            h = numpy.tanh(pre)
            out[t, n] = numpy.tanh(w_ho @ h + b_o)
    return out


def inputs(steps=4, streams=3, seed=0):
    rng = numpy.random.default_rng(seed)
    x = rng.uniform(-1, 1, (steps, streams, 3, 2))
    # Stream 0 runs on, stream 1 restarts at step 2, stream 2 restarts every step.
    cont = numpy.ones((steps, streams))
    cont[0] = 0
    cont[2, 1] = 0
    cont[:, 2] = 0
    return x, cont, rng.uniform(-1, 1, (streams, 2, 3))


def weights_of(harness):
    return [b.data.copy() for b in harness.layer.blobs]


@pytest.mark.parametrize("static", [False, True])
def test_lstm_forward_matches_the_equations(static):
    x, cont, x_static = inputs()
    bottoms = [x, cont] + ([x_static] if static else [])
    harness = LayerHarness(recurrent("LSTM", 5), bottoms)
    assert [b.shape for b in harness.layer.blobs] == [(20, 6), (20,)] + [(20, 6)] * static + [(20, 5)]
    (h,) = harness.forward()
    assert h.shape == (4, 3, 5)
    expected, _ = lstm_reference(x, cont, weights_of(harness), x_static=x_static if static else None)
    numpy.testing.assert_allclose(h, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("static", [False, True])
def test_rnn_forward_matches_the_equations(static):
    x, cont, x_static = inputs()
    bottoms = [x, cont] + ([x_static] if static else [])
    harness = LayerHarness(recurrent("RNN", 4), bottoms)
    assert [b.shape for b in harness.layer.blobs] == [(4, 6), (4,)] + [(4, 6)] * static + [(4, 4), (4, 4), (4,)]
    (out,) = harness.forward()
    expected = rnn_reference(x, cont, weights_of(harness), x_static=x_static if static else None)
    numpy.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["LSTM", "RNN"])
def test_a_sequence_fed_step_by_step_matches_the_whole_and_cont_zero_restarts(kind):
    steps, streams = 3, 2
    x = numpy.random.default_rng(1).standard_normal((steps, streams, 3))
    cont = (numpy.arange(steps) > 0)[:, None].repeat(streams, axis=1).astype(float)
    whole = LayerHarness(recurrent(kind, 4), [x, cont])
    (expected,) = whole.forward()
    stepper = LayerHarness(recurrent(kind, 4), [x[:1], cont[:1]])
    for mine, theirs in zip(stepper.layer.blobs, whole.layer.blobs):
        mine.data[...] = theirs.data
    restarted = LayerHarness(recurrent(kind, 4), [x[:1], cont[:1] * 0])
    for mine, theirs in zip(restarted.layer.blobs, whole.layer.blobs):
        mine.data[...] = theirs.data
    for t in range(steps):
        stepper.inputs = [x[t:t + 1], cont[t:t + 1]]
        numpy.testing.assert_allclose(stepper.forward()[0][0], expected[t], rtol=1e-12, atol=1e-12)
        restarted.inputs = [x[t:t + 1], numpy.zeros((1, streams))]
        differs = numpy.abs(restarted.forward()[0][0] - expected[t]) > 1e-9
        assert differs.all() if t > 0 else not differs.any()


def test_exposed_hidden_states_chain_two_batches_into_one_sequence():
    x, cont, _ = inputs()
    h0, c0 = numpy.random.default_rng(2).uniform(-1, 1, (2, 1, 3, 5))
    whole = LayerHarness(recurrent("LSTM", 5, expose_hidden=True), [x, cont, h0, c0], num_tops=3)
    h_all, h_last, c_last = whole.forward()
    expected, c_ref = lstm_reference(x, cont, weights_of(whole), h0, c0)
    numpy.testing.assert_allclose(h_all, expected, rtol=1e-12, atol=1e-12)
    numpy.testing.assert_allclose(h_last[0], expected[-1], rtol=1e-12, atol=1e-12)
    numpy.testing.assert_allclose(c_last[0], c_ref, rtol=1e-12, atol=1e-12)
    half = LayerHarness(recurrent("LSTM", 5, expose_hidden=True), [x[:2], cont[:2], h0, c0], num_tops=3)
    for mine, theirs in zip(half.layer.blobs, whole.layer.blobs):
        mine.data[...] = theirs.data
    first, h_mid, c_mid = half.forward()
    half.inputs = [x[2:], cont[2:], h_mid, c_mid]
    second, _, c_end = half.forward()
    numpy.testing.assert_allclose(numpy.concatenate([first, second]), h_all, rtol=1e-12, atol=1e-12)
    numpy.testing.assert_allclose(c_end, c_last, rtol=1e-12, atol=1e-12)


def test_without_exposed_hidden_the_state_carries_into_the_next_batch():
    x, cont, _ = inputs(steps=4, streams=3)
    whole = LayerHarness(recurrent("RNN", 3), [x, cont])
    (expected,) = whole.forward()
    halves = LayerHarness(recurrent("RNN", 3), [x[:2], cont[:2]])
    for mine, theirs in zip(halves.layer.blobs, whole.layer.blobs):
        mine.data[...] = theirs.data
    (first,) = halves.forward()
    halves.inputs = [x[2:], cont[2:]]
    (second,) = halves.forward()
    numpy.testing.assert_allclose(numpy.concatenate([first, second]), expected, rtol=1e-12, atol=1e-12)


def test_lstm_unit_matches_the_equations():
    rng = numpy.random.default_rng(3)
    c_prev, gates, cont = rng.uniform(-1, 1, (1, 3, 2)), rng.uniform(-2, 2, (1, 3, 8)), numpy.array([[1, 0, 1.0]])
    c, h = LayerHarness('type: "LSTMUnit"', [c_prev, gates, cont], num_tops=2).forward()
    i, f, o, g = numpy.split(gates[0], 4, axis=1)
    c_ref = cont[0][:, None] * sigmoid(f) * c_prev[0] + sigmoid(i) * numpy.tanh(g)
    numpy.testing.assert_allclose(c[0], c_ref, rtol=1e-12)
    numpy.testing.assert_allclose(h[0], sigmoid(o) * numpy.tanh(c_ref), rtol=1e-12)


NET = """
layer { name: "in" type: "Input" top: "x" top: "cont" top: "static"
        input_param { shape { dim: 3 dim: 2 dim: 4 } shape { dim: 3 dim: 2 } shape { dim: 2 dim: 3 } } }
layer { name: "lstm" type: "LSTM" bottom: "x" bottom: "cont" bottom: "static" top: "h"
        recurrent_param { num_output: 5 } }
"""


def test_a_caffemodel_in_caffes_parameter_layout_loads(tmp_path):
    rng = numpy.random.default_rng(4)
    # Caffe's unrolled net owns W_xc (4D, 4), b_c (4D), W_xc_static (4D, 3), W_hc (4D, D), in this order.
    weights = [rng.uniform(-0.5, 0.5, shape) for shape in [(20, 4), (20,), (20, 3), (20, 5)]]
    model = caffe_pb2.NetParameter()
    layer = model.layer.add(name="lstm", type="LSTM")
    for array in weights:
        blob = layer.blobs.add()
        blob.shape.dim.extend(array.shape)
        blob.data.extend(array.reshape(-1).astype(numpy.float32))
    path = tmp_path / "lstm.caffemodel"
    path.write_bytes(model.SerializeToString())
    net = Net(text_format.Parse(NET, caffe_pb2.NetParameter()), caffe_pb2.TEST)
    net.copy_trained_layers_from(str(path))
    x, cont = rng.uniform(-1, 1, (3, 2, 4)), numpy.array([[0, 0], [1, 1], [1, 0.0]])
    x_static = rng.uniform(-1, 1, (2, 3))
    for name, value in (("x", x), ("cont", cont), ("static", x_static)):
        net.blobs_list[net.blob_names_index[name]].data[...] = value
    net.forward()
    f32 = [w.astype(numpy.float32).astype(numpy.float64) for w in weights]
    expected, _ = lstm_reference(x.astype(numpy.float32), cont, f32, x_static=x_static.astype(numpy.float32))
    numpy.testing.assert_allclose(net.blobs_list[net.blob_names_index["h"]].data, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bottoms,message", [
    ([numpy.zeros((3, 2, 4)), numpy.zeros((3, 3))], "cont"),
    ([numpy.zeros((3,)), numpy.zeros((3, 1))], "at least 2 axes"),
    ([numpy.zeros((3, 2, 4)), numpy.zeros((3, 2)), numpy.zeros((3, 4))], "x_static"),
])
def test_bad_recurrent_inputs_are_named(bottoms, message):
    with pytest.raises(ValueError, match=message):
        LayerHarness(recurrent("LSTM", 3), bottoms)


def test_recurrent_layers_refuse_a_changed_sequence_length_and_zero_outputs():
    with pytest.raises(ValueError, match="num_output must be positive"):
        LayerHarness('type: "RNN"', [numpy.zeros((2, 1, 3)), numpy.zeros((2, 1))])
    harness = LayerHarness(recurrent("RNN", 3), [numpy.zeros((2, 1, 3)), numpy.zeros((2, 1))])
    harness.bottoms[0].reshape((3, 1, 3))
    harness.bottoms[1].reshape((3, 1))
    with pytest.raises(ValueError, match="timesteps changed from 2 to 3"):
        harness.layer.reshape(harness.bottoms, harness.tops)


TRAIN_NET = """
layer { name: "in" type: "Input" top: "x" top: "cont" top: "target"
        input_param { shape { dim: 6 dim: 8 dim: 1 } shape { dim: 6 dim: 8 } shape { dim: 6 dim: 8 dim: 1 } } }
layer { name: "lstm" type: "LSTM" bottom: "x" bottom: "cont" top: "h"
        recurrent_param { num_output: 8 weight_filler { type: "uniform" min: -0.3 max: 0.3 } } }
layer { name: "ip" type: "InnerProduct" bottom: "h" top: "y"
        inner_product_param { num_output: 1 axis: 2 weight_filler { type: "gaussian" std: 0.3 } } }
layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "target" top: "loss" }
"""


def test_an_lstm_net_learns_a_running_sum():
    param = caffe_pb2.SolverParameter(type="Adam", base_lr=0.02, lr_policy="fixed", max_iter=200, display=0,
                                      random_seed=7, snapshot_after_train=False, momentum=0.9, momentum2=0.999)
    param.net_param.CopyFrom(text_format.Parse(TRAIN_NET, caffe_pb2.NetParameter()))
    solver = create_solver(param)
    net = solver.net
    x = numpy.random.RandomState(0).uniform(-1, 1, (6, 8, 1))
    cont = numpy.ones((6, 8))
    cont[0] = 0
    # The target at step t is half the sum of x up to t: it needs the memory across steps.
    for name, value in (("x", x), ("cont", cont), ("target", numpy.cumsum(x, axis=0) * 0.5)):
        net.blobs_list[net.blob_names_index[name]].data[...] = value
    net.forward()
    first = float(net.blobs_list[net.blob_names_index["loss"]].data)
    solver.step(200)
    net.forward()
    assert float(net.blobs_list[net.blob_names_index["loss"]].data) < 0.02 * first
