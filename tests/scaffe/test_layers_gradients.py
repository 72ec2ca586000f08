"""Every layer's backward against finite differences (float64), over the options that change its math."""
import numpy
import pytest

from gradient_check import check_gradients
from scaffe.proto import caffe_pb2


def normal(*shape, seed=1):
    return numpy.random.default_rng(seed).standard_normal(shape)


def away_from(x, points, gap=0.05):
    """x nudged so no element is within `gap` of a kink (finite differences straddle kinks otherwise)."""
    x = x.copy()
    for p in points:
        close = numpy.abs(x - p) < gap
        x[close] = p + numpy.where(x[close] >= p, gap, -gap) * 2
    return x


def labels(n, classes, seed=2):
    return numpy.random.default_rng(seed).integers(0, classes, size=n).astype(numpy.float64)


def distinct(*shape, seed=3):
    """Values with no near-ties (max pooling and Eltwise MAX are not differentiable at ties)."""
    count = int(numpy.prod(shape))
    values = numpy.random.default_rng(seed).permutation(count) * 0.1 - count * 0.05
    return values.reshape(shape)


CONV = ('type: "Convolution" convolution_param { weight_filler { type: "gaussian" std: 0.3 } '
        'bias_filler { type: "gaussian" std: 0.3 } ')
DECONV = CONV.replace('"Convolution"', '"Deconvolution"')

RECURRENT = ('recurrent_param { num_output: 3 weight_filler { type: "gaussian" std: 0.5 } '
             'bias_filler { type: "gaussian" std: 0.3 } }')
SEQUENCE_CONT = numpy.array([[0, 0], [1, 0], [1, 1.0]])
CARRIED_CONT = numpy.array([[1, 0], [1, 1], [0, 1.0]])   # with exposed initial states, cont 1 at t = 0

# (id, prototxt, bottoms, options)
CASES = [
    ("conv", CONV + 'num_output: 4 kernel_size: 3 }', [normal(2, 3, 5, 5)], {}),
    ("conv-pad-stride", CONV + 'num_output: 3 kernel_size: 3 pad: 1 stride: 2 }', [normal(2, 2, 6, 5)], {}),
    ("conv-group-dilation", CONV + 'num_output: 4 kernel_size: 2 group: 2 dilation: 2 pad: 1 }',
     [normal(2, 4, 5, 5)], {}),
    ("conv-rect-nobias", CONV + 'num_output: 2 kernel_h: 1 kernel_w: 3 pad_h: 0 pad_w: 1 stride_h: 2 stride_w: 1 '
     'bias_term: false }', [normal(2, 3, 5, 4)], {}),
    ("conv-two-bottoms", CONV + 'num_output: 2 kernel_size: 2 } top: "a" top: "b"',
     [normal(2, 2, 3, 3), normal(2, 2, 3, 3, seed=4)], {}),
    ("deconv", DECONV + 'num_output: 2 kernel_size: 3 stride: 2 pad: 1 }', [normal(2, 3, 3, 3)], {}),
    ("deconv-group", DECONV + 'num_output: 4 kernel_size: 2 stride: 1 group: 2 }', [normal(2, 2, 3, 3)], {}),
    ("pool-max", 'type: "Pooling" pooling_param { pool: MAX kernel_size: 3 stride: 2 }', [distinct(2, 2, 7, 7)], {}),
    ("pool-max-pad", 'type: "Pooling" pooling_param { pool: MAX kernel_size: 3 stride: 2 pad: 1 }',
     [distinct(2, 2, 6, 6)], {}),
    ("pool-max-mask-top", 'type: "Pooling" top: "p" top: "mask" pooling_param { pool: MAX kernel_size: 2 stride: 2 }',
     [distinct(1, 2, 4, 4)], {"num_tops": 2}),
    ("pool-ave-pad", 'type: "Pooling" pooling_param { pool: AVE kernel_size: 3 stride: 2 pad: 1 }',
     [normal(2, 2, 7, 7)], {}),
    ("pool-ave-floor", 'type: "Pooling" pooling_param { pool: AVE kernel_size: 2 stride: 2 round_mode: FLOOR }',
     [normal(2, 2, 5, 5)], {}),
    ("pool-global-ave", 'type: "Pooling" pooling_param { pool: AVE global_pooling: true }', [normal(2, 3, 4, 5)], {}),
    ("pool-global-max", 'type: "Pooling" pooling_param { pool: MAX global_pooling: true }', [distinct(2, 3, 4, 5)], {}),
    ("ip", 'type: "InnerProduct" inner_product_param { num_output: 3 weight_filler { type: "gaussian" } '
     'bias_filler { type: "gaussian" } }', [normal(2, 3, 2, 2)], {}),
    ("ip-axis2-transpose", 'type: "InnerProduct" inner_product_param { num_output: 3 axis: 2 transpose: true '
     'weight_filler { type: "gaussian" } bias_filler { type: "gaussian" } }', [normal(2, 3, 2, 2)], {}),
    ("relu", 'type: "ReLU"', [away_from(normal(2, 3, 4), [0])], {}),
    ("relu-leaky-inplace", 'type: "ReLU" relu_param { negative_slope: 0.1 }', [away_from(normal(2, 3, 4), [0])],
     {"in_place": True}),
    ("sigmoid", 'type: "Sigmoid"', [normal(2, 3, 4)], {}),
    ("sigmoid-inplace", 'type: "Sigmoid"', [normal(2, 3, 4)], {"in_place": True}),
    ("tanh", 'type: "TanH"', [normal(2, 3, 4)], {"in_place": True}),
    ("dropout-test", 'type: "Dropout" dropout_param { dropout_ratio: 0.3 }', [normal(2, 5)],
     {"phase": caffe_pb2.TEST}),
    ("lrn-across", 'type: "LRN" lrn_param { local_size: 3 alpha: 0.5 beta: 0.75 k: 2 }', [normal(2, 5, 3, 3)], {}),
    ("lrn-within", 'type: "LRN" lrn_param { norm_region: WITHIN_CHANNEL local_size: 3 alpha: 0.5 beta: 0.75 }',
     [normal(2, 2, 4, 4)], {}),
    ("batchnorm-train", 'type: "BatchNorm"', [normal(3, 2, 2, 2)], {"check_params": False}),
    ("batchnorm-train-inplace-2d", 'type: "BatchNorm"', [normal(4, 3)], {"check_params": False, "in_place": True}),
    ("batchnorm-global", 'type: "BatchNorm" batch_norm_param { use_global_stats: true }', [normal(2, 2, 3)],
     {"check_params": False, "params": [numpy.array([0.5, -1.0]), numpy.array([2.0, 3.0]), numpy.array([2.0])]}),
    ("scale-param-bias", 'type: "Scale" scale_param { bias_term: true filler { type: "gaussian" } '
     'bias_filler { type: "gaussian" } }', [normal(2, 3, 2, 2)], {}),
    ("scale-param-inplace", 'type: "Scale" scale_param { axis: 1 num_axes: 2 filler { type: "gaussian" } }',
     [normal(2, 3, 2, 2)], {"in_place": True}),
    ("scale-two-bottoms-axis0", 'type: "Scale" scale_param { axis: 0 }',
     [normal(2, 3, 2, 2), normal(2, 3, seed=5)], {}),
    ("scale-two-bottoms-bias", 'type: "Scale" scale_param { axis: 1 bias_term: true bias_filler { type: "gaussian" } }',
     [normal(2, 3, 2), normal(3, seed=5)], {}),
    ("scale-scalar", 'type: "Scale"', [normal(2, 3), normal(seed=6).reshape(())], {}),
    ("bias-param", 'type: "Bias" bias_param { filler { type: "gaussian" } }', [normal(2, 3, 2)], {}),
    ("bias-two-bottoms-axis0", 'type: "Bias" bias_param { axis: 0 }', [normal(2, 3, 2, 2), normal(2, 3, seed=5)], {}),
    ("eltwise-sum-coeff", 'type: "Eltwise" eltwise_param { operation: SUM coeff: 1 coeff: -0.5 coeff: 2 }',
     [normal(2, 3), normal(2, 3, seed=4), normal(2, 3, seed=5)], {}),
    ("eltwise-prod", 'type: "Eltwise" eltwise_param { operation: PROD }',
     [normal(2, 3), normal(2, 3, seed=4), normal(2, 3, seed=5)], {}),
    ("eltwise-prod-unstable", 'type: "Eltwise" eltwise_param { operation: PROD stable_prod_grad: false }',
     [away_from(normal(2, 3), [0]), away_from(normal(2, 3, seed=4), [0])], {}),
    ("eltwise-max", 'type: "Eltwise" eltwise_param { operation: MAX }',
     [distinct(2, 3), distinct(2, 3, seed=4) + 0.05, distinct(2, 3, seed=5) + 0.025], {}),
    ("concat", 'type: "Concat"', [normal(2, 1, 3), normal(2, 2, 3, seed=4)], {}),
    ("concat-axis-last", 'type: "Concat" concat_param { axis: -1 }', [normal(2, 1, 3), normal(2, 1, 2, seed=4)], {}),
    ("split", 'type: "Split" top: "a" top: "b" top: "c"', [normal(2, 3)], {"num_tops": 3}),
    ("slice-points", 'type: "Slice" top: "a" top: "b" top: "c" slice_param { axis: 1 slice_point: 1 slice_point: 3 }',
     [normal(2, 4, 2)], {"num_tops": 3}),
    ("slice-even", 'type: "Slice" top: "a" top: "b" slice_param { axis: 0 }', [normal(4, 3)], {"num_tops": 2}),
    ("flatten", 'type: "Flatten" flatten_param { axis: 1 end_axis: 2 }', [normal(2, 3, 2, 2)], {}),
    ("reshape", 'type: "Reshape" reshape_param { shape { dim: 0 dim: -1 } }', [normal(2, 3, 2)], {}),
    ("softmax", 'type: "Softmax"', [normal(2, 4, 3)], {}),
    ("softmax-axis2", 'type: "Softmax" softmax_param { axis: 2 }', [normal(2, 2, 4)], {}),
    ("softmax-loss", 'type: "SoftmaxWithLoss"', [normal(4, 5), labels(4, 5)], {"check_bottoms": [0]}),
    ("softmax-loss-ignore-full", 'type: "SoftmaxWithLoss" loss_param { ignore_label: 1 normalization: FULL }',
     [normal(4, 3), numpy.array([0, 1, 2, 1.0])], {"check_bottoms": [0]}),
    ("softmax-loss-spatial-prob-top", 'type: "SoftmaxWithLoss" top: "loss" top: "prob" loss_param { normalize: false }',
     [normal(2, 3, 2, 2), labels(8, 3).reshape(2, 1, 2, 2)],
     {"check_bottoms": [0], "num_tops": 2, "outputs_only": [1]}),
    ("euclidean", 'type: "EuclideanLoss"', [normal(3, 4), normal(3, 4, seed=4)], {}),
    ("sigmoid-ce", 'type: "SigmoidCrossEntropyLoss"',
     [normal(3, 4) * 3, numpy.random.default_rng(7).uniform(size=(3, 4))],
     {"check_bottoms": [0]}),
    ("sigmoid-ce-ignore-valid", 'type: "SigmoidCrossEntropyLoss" loss_param { ignore_label: -1 normalization: VALID }',
     [normal(2, 3), numpy.array([[1, 0, -1], [0, -1, 1.0]])], {"check_bottoms": [0]}),
    ("multinomial-logistic", 'type: "MultinomialLogisticLoss"',
     [numpy.random.default_rng(8).uniform(0.1, 1.0, size=(3, 4)), labels(3, 4)], {"check_bottoms": [0]}),
    ("infogain-bottom-h", 'type: "InfogainLoss"',
     [normal(3, 4), labels(3, 4), numpy.random.default_rng(9).uniform(size=(4, 4))], {"check_bottoms": [0]}),
    ("hinge-l1", 'type: "HingeLoss"', [away_from(normal(3, 4), [-1, 1]), labels(3, 4)], {"check_bottoms": [0]}),
    ("hinge-l2", 'type: "HingeLoss" hinge_loss_param { norm: L2 }', [away_from(normal(3, 4), [-1, 1]), labels(3, 4)],
     {"check_bottoms": [0]}),
    # Caffe divides by (distance + 1e-4), so its gradient is off by about 1e-4 relative: tolerance 1e-3.
    ("contrastive", 'type: "ContrastiveLoss" contrastive_loss_param { margin: 2.0 }',
     [normal(4, 3, 1, 1) * 0.6, normal(4, 3, 1, 1, seed=4) * 0.6, numpy.array([1, 0, 0, 1.0])],
     {"check_bottoms": [0, 1], "tolerance": 1e-3}),
    ("contrastive-legacy", 'type: "ContrastiveLoss" contrastive_loss_param { margin: 2.0 legacy_version: true }',
     [normal(4, 3, 1, 1) * 0.6, normal(4, 3, 1, 1, seed=4) * 0.6, numpy.array([1, 0, 0, 1.0])],
     {"check_bottoms": [0, 1]}),
    ("absval", 'type: "AbsVal"', [away_from(normal(2, 3), [0])], {"in_place": True}),
    ("bnll", 'type: "BNLL"', [normal(2, 3) * 3], {}),
    ("power", 'type: "Power" power_param { power: 2 scale: 0.5 shift: 0.1 }', [normal(2, 3)], {}),
    ("power-general", 'type: "Power" power_param { power: 1.7 scale: 0.5 shift: 2 }', [normal(2, 3)],
     {"in_place": True}),
    ("power-zero", 'type: "Power" power_param { power: 0 }', [normal(2, 3)], {}),
    ("exp", 'type: "Exp" exp_param { base: 2 scale: -1 shift: 0.5 }', [normal(2, 3)], {"in_place": True}),
    ("log", 'type: "Log" log_param { base: 2 scale: 2 shift: 5 }', [normal(2, 3)], {"in_place": True}),
    ("elu", 'type: "ELU" elu_param { alpha: 0.5 }', [away_from(normal(2, 3, 2), [0])], {"in_place": True}),
    ("prelu", 'type: "PReLU" prelu_param { filler { type: "gaussian" } }', [away_from(normal(2, 3, 2, 2), [0])], {}),
    ("prelu-shared-inplace", 'type: "PReLU" prelu_param { channel_shared: true }', [away_from(normal(2, 3, 2), [0])],
     {"in_place": True}),
    ("swish", 'type: "Swish" swish_param { beta: 1.5 }', [normal(2, 3)], {"in_place": True}),
    ("clip", 'type: "Clip" clip_param { min: -0.5 max: 0.7 }', [away_from(normal(2, 4), [-0.5, 0.7])], {}),
    ("crop", 'type: "Crop" crop_param { axis: 2 offset: 1 offset: 0 }', [normal(2, 2, 4, 3), normal(2, 2, 2, 2)],
     {"check_bottoms": [0]}),
    ("mvn", 'type: "MVN" mvn_param { eps: 0 }', [normal(2, 3, 2, 2)], {}),
    ("mvn-across-mean-only", 'type: "MVN" mvn_param { across_channels: true normalize_variance: false }',
     [normal(2, 3, 2)], {}),
    ("reduction-sum", 'type: "Reduction" reduction_param { operation: SUM axis: 1 coeff: 2 }', [normal(2, 3, 2)], {}),
    ("reduction-asum", 'type: "Reduction" reduction_param { operation: ASUM axis: -1 }',
     [away_from(normal(2, 3, 2), [0])], {}),
    ("reduction-sumsq", 'type: "Reduction" reduction_param { operation: SUMSQ }', [normal(2, 3)], {}),
    ("reduction-mean", 'type: "Reduction" reduction_param { operation: MEAN axis: 1 coeff: 0.5 }', [normal(2, 3)], {}),
    ("tile", 'type: "Tile" tile_param { axis: 1 tiles: 3 }', [normal(2, 2, 2)], {}),
    ("embed", 'type: "Embed" embed_param { num_output: 3 input_dim: 5 weight_filler { type: "gaussian" } '
     'bias_filler { type: "gaussian" } }', [numpy.array([[0, 4, 4], [2, 0, 1.0]])], {"check_bottoms": []}),
    ("spp-max", 'type: "SPP" spp_param { pyramid_height: 3 pool: MAX }', [distinct(2, 2, 8, 7)], {}),
    ("spp-one-level", 'type: "SPP" spp_param { pyramid_height: 1 pool: MAX }', [distinct(2, 2, 3, 3)], {}),
    ("spp-ave", 'type: "SPP" spp_param { pyramid_height: 2 pool: AVE }', [normal(2, 2, 7, 6)], {}),
    ("im2col", 'type: "Im2col" convolution_param { kernel_size: 3 pad: 1 stride: 2 }', [normal(2, 2, 5, 5)], {}),
    ("silence", 'type: "Silence"', [normal(2, 3), normal(3)], {"num_tops": 0}),
    ("batch-reindex", 'type: "BatchReindex"', [normal(3, 2, 2), numpy.array([2, 0, 2, 1, 2.0])],
     {"check_bottoms": [0]}),
    ("filter", 'type: "Filter" top: "a" top: "b"',
     [normal(4, 2), normal(4, 3, 2, seed=4), numpy.array([[1], [0], [1], [1.0]])],
     {"check_bottoms": [0, 1], "num_tops": 2}),
    # Recurrent cases start every stream with cont 0, as Caffe's tests do: the state a layer carries from
    # its previous forward (the harness runs many) then has no effect.
    ("lstm-unit", 'type: "LSTMUnit"', [normal(1, 3, 2), normal(1, 3, 8, seed=4), numpy.array([[1, 0, 1.0]])],
     {"check_bottoms": [0, 1], "num_tops": 2}),
    ("lstm", 'type: "LSTM" ' + RECURRENT, [normal(3, 2, 3, 2) * 0.5, SEQUENCE_CONT], {"check_bottoms": [0]}),
    ("lstm-static", 'type: "LSTM" ' + RECURRENT, [normal(3, 2, 3) * 0.5, SEQUENCE_CONT, normal(2, 2, 2, seed=4)],
     {"check_bottoms": [0, 2]}),
    ("lstm-expose-hidden", 'type: "LSTM" ' + RECURRENT.replace("{", "{ expose_hidden: true", 1),
     [normal(3, 2, 2) * 0.5, CARRIED_CONT, normal(2, 3, seed=4), normal(1, 2, 3, seed=5), normal(1, 2, 3, seed=6)],
     {"check_bottoms": [0, 2, 3, 4], "num_tops": 3}),
    ("rnn", 'type: "RNN" ' + RECURRENT, [normal(3, 2, 3, 2) * 0.5, SEQUENCE_CONT], {"check_bottoms": [0]}),
    ("rnn-static-expose-hidden", 'type: "RNN" ' + RECURRENT.replace("{", "{ expose_hidden: true", 1),
     [normal(3, 2, 2) * 0.5, CARRIED_CONT, normal(2, 3, seed=4), normal(1, 2, 3, seed=5)],
     {"check_bottoms": [0, 2, 3], "num_tops": 2}),
]


@pytest.mark.parametrize("proto,bottoms,options", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_gradient_matches_finite_differences(proto, bottoms, options):
    check_gradients(proto, bottoms, **options)


def test_every_layer_with_a_backward_is_checked():
    from scaffe.layer_impls import _REGISTRY, known_types
    assert "Convolution" in known_types()   # imports every layer module, filling the registry
    checked = {c[1].split('"')[1] for c in CASES}
    no_gradient = {"Accuracy", "ArgMax", "Threshold", "Parameter", "Dropout"}   # Dropout TRAIN: see behaviour tests
    no_gradient.add("Python")  # the user's backward: test_python_layer.py checks one by finite differences
    # Input and output layers (data readers, Input, HDF5Output...) live in other modules and have no gradient.
    io_modules = {"data", "hdf5_data", "input", "dummy_data", "memory_data", "hdf5_output", "image_data"}
    compute = {t for t, cls in _REGISTRY.items() if cls.__module__.rsplit(".", 1)[-1] not in io_modules
               and not t.endswith(("Data", "Output"))}
    assert compute - no_gradient - checked == set()
