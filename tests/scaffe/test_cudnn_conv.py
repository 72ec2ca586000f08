"""Convolution through cuDNN (kernels.cudnn_conv): which path a layer takes, and, on a GPU with the binding,
the same tops and gradients as im2col + GEMM (grouped, strided, padded, dilated, with and without bias)."""
import sys

import numpy
import pytest

from kernels import cudnn_conv
from test_cupy_layers import run_layer

CASES = [
    ("plain", "kernel_size: 3 num_output: 4", (2, 3, 7, 7)),
    ("grouped-strided", "kernel_size: 3 num_output: 6 group: 3 stride: 2 pad: 1", (2, 6, 9, 8)),
    ("dilated-no-bias", "kernel_size: 3 num_output: 4 dilation: 2 pad: 2 bias_term: false", (3, 2, 8, 8)),
    ("alexnet-conv1-like", "kernel_size: 11 num_output: 8 stride: 4", (2, 3, 35, 35)),
]


def conv_layer(param):
    return f'type: "Convolution" convolution_param {{ {param} weight_filler {{ type: "gaussian" std: 0.1 }} ' \
           f'bias_filler {{ type: "gaussian" std: 0.1 }} }}'


@pytest.fixture
def no_binding(monkeypatch):
    monkeypatch.setitem(sys.modules, "cudnn", None)  # `import cudnn` raises ImportError, as where it is absent
    cudnn_conv.binding.cache_clear()
    yield
    cudnn_conv.binding.cache_clear()


def test_without_the_binding_convolution_takes_im2col(cupy_stand_in, no_binding):
    from scaffe.blob import Blob
    from gradient_check import layer_param
    from scaffe.layer_impls import create_layer
    from scaffe.proto import caffe_pb2
    assert cudnn_conv.binding() is None
    bottom = Blob((2, 3, 7, 7), dtype=numpy.float32, xp=cupy_stand_in)
    top = Blob((), dtype=numpy.float32, xp=cupy_stand_in)
    layer = create_layer(layer_param(conv_layer("kernel_size: 3 num_output: 4")), caffe_pb2.TRAIN)
    layer.rng = numpy.random.default_rng(0)
    layer.setup([bottom], [top])
    assert layer.conv is layer.engine


def test_cudnn_needs_a_binding_float32_and_device_pointers(cupy_stand_in, monkeypatch):
    """Only cupy's arrays (which name their device pointer) in float32, with the binding, and not switched off."""
    class DevicePointer:
        ptr = 1 << 20

    class CupyLike:
        data, dtype = DevicePointer(), numpy.dtype(numpy.float32)

    monkeypatch.setattr(cudnn_conv, "binding", lambda: object())
    monkeypatch.delenv("SCAFFE_CUDNN", raising=False)
    assert cudnn_conv.usable(CupyLike())
    assert not cudnn_conv.usable(numpy.zeros(3, numpy.float32))
    assert not cudnn_conv.usable(cupy_stand_in.zeros(3, numpy.float32))  # the CI stand-in keeps im2col
    monkeypatch.setattr(CupyLike, "dtype", numpy.dtype(numpy.float64))
    assert not cudnn_conv.usable(CupyLike())
    monkeypatch.setattr(CupyLike, "dtype", numpy.dtype(numpy.float32))
    monkeypatch.setenv("SCAFFE_CUDNN", "0")
    assert not cudnn_conv.usable(CupyLike())


@pytest.mark.gpu
@pytest.mark.parametrize("param, shape", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_cudnn_equals_im2col_on_a_gpu(monkeypatch, param, shape):
    import cupy
    if cudnn_conv.binding() is None:
        pytest.skip("nvidia-cudnn-frontend (or the cuDNN library) is not installed")
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal(shape).astype(numpy.float32)
    runs = {}
    calls = []
    run = cudnn_conv.CudnnConv._run
    monkeypatch.setattr(cudnn_conv.CudnnConv, "_run", lambda self, plan, *args: calls.append(plan) or run(self, plan, *args))
    for path in ("1", "0"):
        monkeypatch.setenv("SCAFFE_CUDNN", path)
        runs[path] = run_layer(cupy, conv_layer(param), [x], {}, params=runs["1"][3] if runs else None,
                               top_diffs=runs["1"][4] if runs else None)
    assert len({id(graph) for graph, _, _ in calls}) == 3  # forward, data and filter gradients through cuDNN
    (tops, bottom_diffs, params, _, _, _), (tops0, bottom_diffs0, params0, _, _, _) = runs["1"], runs["0"]
    for got, want in zip(tops + bottom_diffs + [d for _, d in params], tops0 + bottom_diffs0 + [d for _, d in params0]):
        # fp32 engines only: agreement to fp32 rounding of differently ordered sums (TF32 gave 1.3e-4)
        numpy.testing.assert_allclose(got, want, rtol=0, atol=2e-5 * max(1.0, float(numpy.abs(want).max())))


def test_shapes_without_an_fp32_engine_go_to_im2col_whole(monkeypatch, caplog):
    """Where cuDNN declines a graph of a set of shapes (no engine left once TF32 is excluded), forward and
    backward of those shapes both run through the im2col engine, with one warning."""
    import types

    from kernels.geometry import conv_output_size
    from scaffe.layer_impls.convolution import ConvEngine

    class Declined(Exception):
        pass

    def decline(self, operation, *shapes):
        raise Declined(f"no engine for {operation}")
    monkeypatch.setattr(cudnn_conv, "binding", lambda: types.SimpleNamespace(cudnnGraphNotSupportedError=Declined))
    monkeypatch.setattr(cudnn_conv.CudnnConv, "_build", decline)
    geometry = ((3, 3), (1, 1), (2, 2), (1, 1))
    conv = cudnn_conv.CudnnConv(*geometry[1:], fallback=ConvEngine(*geometry, group=1))
    reference = ConvEngine(*geometry, group=1)
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((2, 3, 7, 7)).astype(numpy.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(numpy.float32)
    bias = rng.standard_normal(4).astype(numpy.float32)
    side = conv_output_size(7, 3, 1, 2, 1)
    dy = rng.standard_normal((2, 4, side, side)).astype(numpy.float32)
    results = []
    for engine in (conv, reference):
        y, w_diff, b_diff, dx = numpy.empty_like(dy), numpy.ones_like(w), numpy.ones_like(bias), numpy.empty_like(x)
        engine.forward(x, w, bias, y)
        engine.backward(x, w, dy, w_diff, b_diff, dx)
        results.append((y, w_diff, b_diff, dx))
    for got, want in zip(*results):
        numpy.testing.assert_array_equal(got, want)
    assert len([r for r in caplog.records if "no fp32 engine" in r.getMessage()]) == 1
