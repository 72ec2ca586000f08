"""Every layer's cupy path (under the cupy stand-in) against its numpy path: same tops, same gradients,
and no host synchronisation inside forward or backward (loss layers included: their loss stays on the
device until the solver displays it)."""
import numpy
import pytest

from gradient_check import layer_param
from scaffe.blob import Blob
from scaffe.layer_impls import create_layer
from scaffe.proto import caffe_pb2
from test_layers_gradients import CASES, labels, normal

# Layers without a backward, which the gradient cases leave out.
FORWARD_ONLY_CASES = [
    ("accuracy-top3-ignore", 'type: "Accuracy" top: "acc" top: "per_class" accuracy_param { top_k: 2 ignore_label: 1 }',
     [normal(6, 4), labels(6, 4)], {"num_tops": 2, "check_bottoms": []}),
    ("argmax-axis", 'type: "ArgMax" argmax_param { axis: 1 top_k: 2 out_max_val: true }', [normal(2, 5, 3)],
     {"check_bottoms": []}),
    ("argmax-flat", 'type: "ArgMax" argmax_param { top_k: 2 }', [normal(3, 5)], {"check_bottoms": []}),
    ("threshold", 'type: "Threshold" threshold_param { threshold: 0.2 }', [normal(2, 3)], {"check_bottoms": []}),
    ("parameter", 'type: "Parameter" parameter_param { shape { dim: 2 dim: 3 } }', [], {"check_bottoms": []}),
]

# The fused SoftmaxWithLoss at a classifier's shape (few positions, many channels) and with more positions
# than kernels/_softmax_loss_gpu.py's MAX_PARTS (so each rows thread takes several).
LOSS_SHAPE_CASES = [
    ("softmax-loss-classifier", 'type: "SoftmaxWithLoss"', [normal(128, 1000), labels(128, 1000)],
     {"check_bottoms": [0]}),
    ("softmax-loss-chunked", 'type: "SoftmaxWithLoss" loss_param { ignore_label: 2 }',
     [normal(2, 5, 64, 70), labels(2 * 64 * 70, 5).reshape(2, 64, 70)], {"check_bottoms": [0]}),
]

# Layers whose cupy path still copies to the host: Embed checks its indices there, ArgMax sorts there,
# Accuracy's per-class top counts there, BatchReindex checks its indices there (as Caffe does) and Filter's
# top shapes depend on its selector's values. None of them is in a training iteration of the example nets.
READ_BACK_ON_THE_HOST = {"Embed", "ArgMax", "Accuracy", "BatchReindex", "Filter"}


def _to_host(array):
    return array.get() if hasattr(array, "get") and not isinstance(array, numpy.ndarray) else numpy.array(array)


def run_layer(xp, proto, bottoms, options, params=None, top_diffs=None):
    """Forward then backward of one layer on float32 blobs of module `xp`; returns host copies of the tops,
    bottom diffs and param (data, diff) after the pass, the params it started from, and the top diffs."""
    param = layer_param(proto)
    blobs = []
    for array in bottoms:
        blob = Blob(numpy.shape(array), dtype=numpy.float32, xp=xp)
        blob.data[...] = xp.asarray(numpy.asarray(array, dtype=numpy.float32))
        blobs.append(blob)
    num_tops = options.get("num_tops", max(len(param.top), 1))
    tops = [Blob((), dtype=numpy.float32, xp=xp) for _ in range(num_tops)]
    if options.get("in_place"):
        tops[0] = blobs[0]
    layer = create_layer(param, options.get("phase", caffe_pb2.TRAIN))
    layer.rng = numpy.random.default_rng(0)
    layer.setup(blobs, tops)
    layer.reshape(blobs, tops)
    for blob, array in zip(layer.blobs, params if params is not None else options.get("params", ())):
        blob.data[...] = xp.asarray(numpy.asarray(array, dtype=numpy.float32).reshape(blob.shape))
    initial_params = [_to_host(b.data) for b in layer.blobs]
    syncs = _host_syncs(xp)
    layer.forward(blobs, tops)
    syncs = _host_syncs(xp) - syncs
    top_values = [_to_host(t.data) for t in tops]
    if top_diffs is None:
        rng = numpy.random.default_rng(1)
        top_diffs = [rng.standard_normal(t.shape).astype(numpy.float32) for t in top_values]
    check = options.get("check_bottoms", range(len(bottoms)))
    propagate = [i in check for i in range(len(bottoms))]
    for t, d in zip(tops, top_diffs):
        t.diff[...] = xp.asarray(d)
    for blob in layer.blobs:
        blob.diff[...] = 0
    before = _host_syncs(xp)
    layer.backward(tops, propagate, blobs)
    syncs += _host_syncs(xp) - before
    bottom_diffs = [_to_host(b.diff) for b, p in zip(blobs, propagate) if p]
    return (top_values, bottom_diffs, [(_to_host(b.data), _to_host(b.diff)) for b in layer.blobs],
            initial_params, top_diffs, syncs)


def _host_syncs(xp):
    """How often the cupy stand-in made the host wait for its device (0 for numpy and for the real cupy,
    which cannot count them; the GPU tests that share run_layer check results only)."""
    stand_in = getattr(xp, "_stand_in", None)
    return 0 if stand_in is None else stand_in.host_syncs()


@pytest.mark.parametrize("proto,bottoms,options", [c[1:] for c in CASES + FORWARD_ONLY_CASES + LOSS_SHAPE_CASES],
                         ids=[c[0] for c in CASES + FORWARD_ONLY_CASES + LOSS_SHAPE_CASES])
def test_cupy_path_matches_numpy(cupy_stand_in, proto, bottoms, options):
    host_tops, host_bottom_diffs, host_params, params, top_diffs, _ = run_layer(numpy, proto, bottoms, options)
    tops, bottom_diffs, device_params, _, _, syncs = run_layer(cupy_stand_in, proto, bottoms, options, params,
                                                               top_diffs)
    if proto.split('"')[1] not in READ_BACK_ON_THE_HOST:
        assert syncs == 0, "the cupy path made the host wait for the device"
    for got, want in zip(tops + bottom_diffs, host_tops + host_bottom_diffs):
        numpy.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    for (got_data, got_diff), (want_data, want_diff) in zip(device_params, host_params):
        numpy.testing.assert_allclose(got_data, want_data, rtol=2e-5, atol=2e-6)
        numpy.testing.assert_allclose(got_diff, want_diff, rtol=2e-5, atol=2e-6)


def dropout_on_device(cupy, x, seed):
    blob, top = Blob(x.shape, xp=cupy), Blob((), xp=cupy)
    blob.data[...] = cupy.asarray(x)
    layer = create_layer(layer_param('type: "Dropout" dropout_param { dropout_ratio: 0.3 }'), caffe_pb2.TRAIN)
    layer.rng = numpy.random.default_rng(seed)
    layer.setup([blob], [top])
    layer.reshape([blob], [top])
    return layer, blob, top


def test_dropout_draws_its_mask_on_the_device(cupy_stand_in):
    x = numpy.random.default_rng(0).uniform(1, 2, (200, 50)).astype(numpy.float32)
    layer, blob, top = dropout_on_device(cupy_stand_in, x, seed=3)
    uploads = cupy_stand_in._stand_in.counters["host_to_device"]
    layer.forward([blob], [top])
    assert cupy_stand_in._stand_in.counters["host_to_device"] == uploads  # nothing drawn on the host
    assert isinstance(layer.mask, cupy_stand_in.ndarray) and layer.mask.dtype == numpy.float32
    y = top.data.get()
    kept = y != 0
    assert abs(kept.mean() - 0.7) < 0.02
    numpy.testing.assert_allclose(y[kept], x[kept] / numpy.float32(0.7), rtol=1e-6)
    dy = numpy.random.default_rng(4).standard_normal(x.shape).astype(numpy.float32)
    top.diff[...] = cupy_stand_in.asarray(dy)
    layer.backward([top], [True], [blob])
    numpy.testing.assert_allclose(blob.diff.get(), numpy.where(kept, dy / numpy.float32(0.7), 0), rtol=1e-6)
    again, blob2, top2 = dropout_on_device(cupy_stand_in, x, seed=3)  # the layer's seed decides the masks
    again.forward([blob2], [top2])
    numpy.testing.assert_array_equal(top2.data.get(), y)


def test_convolution_on_the_gpu_takes_the_batch_in_one_chunk(cupy_stand_in):
    """Columns of 11 MiB: over the CPU's cache-sized chunks, one chunk on a GPU (one im2col launch in
    forward, columns reused by backward)."""
    from scaffe.layer_impls.convolution import COL_BUDGET_BYTES
    proto = ('type: "Convolution" convolution_param { num_output: 2 kernel_size: 5 pad: 2 '
             'weight_filler { type: "gaussian" std: 0.1 } }')
    x = numpy.random.default_rng(0).standard_normal((6, 8, 48, 48)).astype(numpy.float32)
    assert 8 * 25 * 48 * 48 * 6 * 4 > COL_BUDGET_BYTES
    run_layer(cupy_stand_in, proto, [x], {})
    assert cupy_stand_in._stand_in.counters["launch:scaffe_im2col"] == 1


def test_lrn_across_channels_is_one_launch_each_way(cupy_stand_in):
    proto = 'type: "LRN" lrn_param { local_size: 5 alpha: 0.0001 beta: 0.75 }'  # AlexNet's norm1
    run_layer(cupy_stand_in, proto, [numpy.random.default_rng(0).standard_normal((2, 12, 5, 5))], {})
    counters = cupy_stand_in._stand_in.counters
    assert counters["launch:scaffe_lrn_forward"] == 1 and counters["launch:scaffe_lrn_backward"] == 1


GPU_OWN_PATHS = [c for c in CASES + LOSS_SHAPE_CASES if c[0].startswith(("softmax-loss", "ip", "relu", "lrn"))]


@pytest.mark.gpu
@pytest.mark.parametrize("proto,bottoms,options", [c[1:] for c in GPU_OWN_PATHS], ids=[c[0] for c in GPU_OWN_PATHS])
def test_gpu_only_paths_on_a_gpu_match_numpy(proto, bottoms, options):
    """What only the GPU runs, on a real one, against the numpy path: the four fused SoftmaxWithLoss kernels
    (kernels/_softmax_loss_gpu.py), LRN's two, ReLU's gradient kernel and the accumulating cuBLAS calls of
    InnerProduct's backward (kernels.blas); the same tops, gradients and parameter gradients to float32
    rounding."""
    import cupy
    host = run_layer(numpy, proto, bottoms, options)
    device = run_layer(cupy, proto, bottoms, options, host[3], host[4])
    for got, want in zip(device[0] + device[1], host[0] + host[1]):
        numpy.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
    for (_, got), (_, want) in zip(device[2], host[2]):
        numpy.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
