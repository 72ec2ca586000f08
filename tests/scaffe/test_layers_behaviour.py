"""Layer behaviour the gradient and reference checks do not pin down: randomness, running statistics,
tie rules, normalization modes, shared blobs, batching of the convolution, and error messages."""
import numpy
import pytest

import scaffe.layer_impls.convolution as convolution
from gradient_check import LayerHarness, layer_param
from scaffe.blob import Blob
from scaffe.layer_impls import create_layer
from scaffe.proto import caffe_pb2


def run(text, bottoms, phase=caffe_pb2.TRAIN, num_tops=None):
    harness = LayerHarness(text, bottoms, phase, num_tops)
    return harness, harness.forward()


def test_dropout_train_scales_kept_values_and_reuses_the_mask_in_backward():
    x = numpy.ones((200, 50))
    harness, (y,) = run('type: "Dropout" dropout_param { dropout_ratio: 0.3 }', [x])
    harness.layer.rng = numpy.random.default_rng(3)
    y = harness.forward()[0]
    kept = y != 0
    assert abs(kept.mean() - 0.7) < 0.02
    numpy.testing.assert_allclose(y[kept], 1 / 0.7)
    dy = numpy.random.default_rng(4).standard_normal(x.shape)
    (dx,), _ = harness.backward([dy], [True])
    numpy.testing.assert_allclose(dx, dy * y)


def test_dropout_is_reproducible_with_a_seeded_rng_and_identity_at_test():
    x = numpy.random.default_rng(0).standard_normal((4, 8))
    outs = []
    for _ in range(2):
        harness = LayerHarness('type: "Dropout"', [x])
        harness.layer.rng = numpy.random.default_rng(11)
        outs.append(harness.forward()[0])
    numpy.testing.assert_array_equal(outs[0], outs[1])
    _, (y,) = run('type: "Dropout"', [x], phase=caffe_pb2.TEST)
    numpy.testing.assert_array_equal(y, x)


def test_batchnorm_running_statistics_follow_caffe():
    rng = numpy.random.default_rng(1)
    x1, x2 = rng.standard_normal((4, 3, 2, 2)), rng.standard_normal((4, 3, 2, 2)) * 2 + 1
    harness = LayerHarness('type: "BatchNorm" batch_norm_param { moving_average_fraction: 0.9 }', [x1])
    layer = harness.layer
    assert [p.lr_mult for p in layer.param.param] == [0, 0, 0]
    harness.forward()
    harness.inputs[0][...] = x2
    harness.forward()
    m = 16
    mean = lambda a: a.mean(axis=(0, 2, 3))
    var = lambda a: a.var(axis=(0, 2, 3)) * m / (m - 1)
    numpy.testing.assert_allclose(layer.blobs[0].data, 0.9 * mean(x1) + mean(x2))
    numpy.testing.assert_allclose(layer.blobs[1].data, 0.9 * var(x1) + var(x2))
    numpy.testing.assert_allclose(layer.blobs[2].data, [1.9])
    # TEST uses the statistics divided by their weight.
    test = LayerHarness('type: "BatchNorm"', [x2], phase=caffe_pb2.TEST)
    for dst, src in zip(test.layer.blobs, layer.blobs):
        dst.data[...] = src.data
    y = test.forward()[0]
    mu = (layer.blobs[0].data / 1.9).reshape(1, 3, 1, 1)
    sigma = numpy.sqrt(layer.blobs[1].data / 1.9 + 1e-5).reshape(1, 3, 1, 1)
    numpy.testing.assert_allclose(y, (x2 - mu) / sigma, rtol=1e-6, atol=1e-9)


def test_batchnorm_refuses_learned_statistics():
    with pytest.raises(ValueError, match="lr_mult"):
        LayerHarness('type: "BatchNorm" param { lr_mult: 1 }', [numpy.ones((2, 3))])


def test_accuracy_ties_count_against_the_true_class_and_per_class_top():
    scores = numpy.array([[1.0, 1.0, 0.0], [0.0, 2.0, 1.0], [3.0, 0.0, 0.0], [0.0, 0.0, 5.0]])
    labels = numpy.array([0, 1, 0, 0.0])
    _, (acc, per_class) = run('type: "Accuracy" top: "a" top: "b"', [scores, labels], num_tops=2)
    assert acc == pytest.approx(0.5)        # sample 0 ties with class 1: wrong
    numpy.testing.assert_allclose(per_class, [1 / 3, 1.0, 0.0])
    _, (top2,) = run('type: "Accuracy" accuracy_param { top_k: 2 }', [scores, labels])
    assert top2 == pytest.approx(0.75)
    _, (ignored,) = run('type: "Accuracy" accuracy_param { ignore_label: 0 }', [scores, labels])
    assert ignored == pytest.approx(1.0)


def test_argmax_ties_rank_the_larger_index_first():
    x = numpy.array([[1.0, 3.0, 3.0, 0.5], [2.0, 2.0, 2.0, 2.0]])
    _, (y,) = run('type: "ArgMax" argmax_param { top_k: 2 out_max_val: true }', [x])
    numpy.testing.assert_array_equal(y, [[[2, 1], [3, 3]], [[3, 2], [2, 2]]])
    _, (y,) = run('type: "ArgMax" argmax_param { axis: 0 }', [x])
    numpy.testing.assert_array_equal(y, [[1, 0, 0, 1]])


@pytest.mark.parametrize("settings,divisor", [
    ("", 2),                                      # VALID: the 2 labels that are not ignored
    ("normalization: VALID", 2),
    ("normalization: FULL", 4),
    ("normalization: BATCH_SIZE", 4),
    ("normalization: NONE", 1),
    ("normalize: false", 4),                      # the legacy bool: false means BATCH_SIZE
    ("normalize: true", 2),
])
def test_softmax_loss_normalization(settings, divisor):
    x = numpy.random.default_rng(2).standard_normal((4, 3))
    labels = numpy.array([0, 2, 1, 2.0])
    _, (loss,) = run(f'type: "SoftmaxWithLoss" loss_param {{ ignore_label: 2 {settings} }}', [x, labels])
    p = numpy.exp(x) / numpy.exp(x).sum(1, keepdims=True)
    expected = -(numpy.log(p[0, 0]) + numpy.log(p[2, 1])) / divisor
    assert float(loss) == pytest.approx(expected)


def test_loss_gradient_scales_with_the_loss_weight_in_the_top_diff():
    x = numpy.random.default_rng(3).standard_normal((3, 4))
    harness, _ = run('type: "SoftmaxWithLoss"', [x, numpy.array([0, 1, 3.0])])
    (g1, _), _ = harness.backward([numpy.array(1.0)], [True, False])
    (g2, _), _ = harness.backward([numpy.array(0.25)], [True, False])
    numpy.testing.assert_allclose(g2, 0.25 * g1)


def test_softmax_loss_rejects_out_of_range_labels():
    with pytest.raises(ValueError, match="label 7"):
        run('type: "SoftmaxWithLoss"', [numpy.zeros((2, 3)), numpy.array([0, 7.0])])


def test_pooling_mask_top_holds_flat_argmax_indices():
    x = numpy.arange(16.0).reshape(1, 1, 4, 4)
    _, (y, mask) = run('type: "Pooling" top: "y" top: "m" pooling_param { pool: MAX kernel_size: 2 stride: 2 }',
                       [x], num_tops=2)
    numpy.testing.assert_array_equal(y.reshape(-1), [5, 7, 13, 15])
    numpy.testing.assert_array_equal(mask.reshape(-1), [5, 7, 13, 15])


def test_parameter_top_is_the_parameter_blob():
    lp = layer_param('name: "p" type: "Parameter" parameter_param { shape { dim: 2 dim: 3 } }')
    layer = create_layer(lp, caffe_pb2.TRAIN)
    top = [Blob(())]
    layer.setup([], top)
    layer.reshape([], top)
    layer.blobs[0].data[...] = 4
    assert top[0].shape == (2, 3) and (top[0].data == 4).all()
    top[0].diff[...] = 7
    assert (layer.blobs[0].diff == 7).all()


def test_split_backward_sums_the_copies():
    x = numpy.random.default_rng(4).standard_normal((2, 3))
    harness, tops = run('type: "Split" top: "a" top: "b" top: "c"', [x], num_tops=3)
    for t in tops:
        numpy.testing.assert_array_equal(t, x)
    diffs = [numpy.full(x.shape, v) for v in (1.0, 2.0, 4.0)]
    (dx,), _ = harness.backward(diffs, [True])
    numpy.testing.assert_array_equal(dx, numpy.full(x.shape, 7.0))


@pytest.mark.parametrize("group", [1, 2])
def test_convolution_in_chunks_matches_one_chunk(monkeypatch, group):
    rng = numpy.random.default_rng(5)
    x = rng.standard_normal((5, 4, 6, 6)).astype(numpy.float32)
    dy_shape = (5, 6, 3, 3)
    dy = rng.standard_normal(dy_shape).astype(numpy.float32)
    text = (f'type: "Convolution" convolution_param {{ num_output: 6 kernel_size: 3 stride: 2 pad: 1 group: {group} '
            'weight_filler { type: "gaussian" } bias_filler { type: "gaussian" } }')

    def once():
        numpy.random.seed(0)
        harness = LayerHarness(text, [x])
        y = harness.forward()[0]
        (dx,), grads = harness.backward([dy], [True])
        return y, dx, grads

    whole = once()
    monkeypatch.setattr(convolution, "COL_BUDGET_BYTES", 1)   # one image per chunk, columns recomputed
    chunked = once()
    for a, b in zip(whole[:2] + tuple(whole[2]), chunked[:2] + tuple(chunked[2])):
        numpy.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10)


def test_parameters_take_the_bottom_dtype():
    lp = layer_param('name: "c" type: "Convolution" convolution_param { num_output: 2 kernel_size: 1 }')
    for dtype in (numpy.float32, numpy.float64):
        layer = create_layer(lp, caffe_pb2.TRAIN)
        bottom, top = [Blob((1, 3, 2, 2), dtype=dtype)], [Blob((), dtype=dtype)]
        layer.setup(bottom, top)
        layer.reshape(bottom, top)
        layer.forward(bottom, top)
        assert all(b.dtype == dtype for b in layer.blobs) and top[0].data.dtype == dtype


@pytest.mark.parametrize("text,bottoms,message", [
    ('type: "Convolution" convolution_param { num_output: 3 kernel_size: 1 group: 2 }', [numpy.ones((1, 4, 2, 2))],
     "multiples of group"),
    ('type: "Convolution" convolution_param { num_output: 3 }', [numpy.ones((1, 4, 2, 2))], "kernel_size"),
    ('type: "Convolution" convolution_param { num_output: 3 kernel_size: 5 }', [numpy.ones((1, 1, 2, 2))], "too small"),
    ('type: "Pooling" pooling_param { global_pooling: true kernel_size: 2 }', [numpy.ones((1, 1, 2, 2))],
     "global_pooling"),
    ('type: "Pooling" pooling_param { pool: STOCHASTIC kernel_size: 2 }', [numpy.ones((1, 1, 2, 2))], "STOCHASTIC"),
    ('type: "LRN" lrn_param { local_size: 4 }', [numpy.ones((1, 1, 2, 2))], "odd"),
    ('type: "Eltwise" eltwise_param { operation: PROD coeff: 1 coeff: 2 }', [numpy.ones(2), numpy.ones(2)], "SUM"),
    ('type: "Slice" top: "a" top: "b" slice_param { slice_point: 5 }', [numpy.ones((1, 3))], "slice points"),
    ('type: "Reshape" reshape_param { shape { dim: 5 } }', [numpy.ones((2, 3))], "does not hold"),
    ('type: "Clip" clip_param { min: 0 }', [numpy.ones(2)], "min and max"),
    ('type: "InnerProduct" inner_product_param { num_output: 0 }', [numpy.ones((2, 3))], "num_output"),
    ('type: "Embed" embed_param { num_output: 2 input_dim: 3 }', [numpy.array([0.5])], "integers"),
    ('type: "SPP" spp_param { pyramid_height: 3 }', [numpy.ones((1, 1, 5, 5))], "pyramid level 2"),
])
def test_bad_settings_raise_errors_naming_the_problem(text, bottoms, message):
    with pytest.raises(ValueError, match=message):
        harness = LayerHarness("name: \"bad\" " + text, bottoms,
                               num_tops=2 if "Slice" in text else None)
        harness.forward()
