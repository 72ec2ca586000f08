"""Convolution through NVIDIA's cuDNN frontend (`nvidia-cudnn-frontend`, its Python graph API): forward, data
gradient and filter gradient, grouped, of cupy arrays in NCHW, with Caffe's fp32 arithmetic.

scaffe's Convolution layer takes this path when `usable(x)`: the binding imports, the arrays are float32
cupy arrays on a GPU, and SCAFFE_CUDNN is not 0; kernels.im2col + GEMM is the path everywhere else (CPU,
no binding, the CI stand-in). Engines that compute in TF32 or down-convert their inputs carry cuDNN's
TENSOR_CORE / DOWN_CONVERT_INPUTS numerical notes and are excluded, as PyTorch does with TF32 off (left in,
the frontend's results on an H100 differed from PyTorch's fp32 by up to 1.3e-4 of the largest value, as
TF32's would). Every tensor, the output
included, is declared with its NCHW strides, or cuDNN may write another layout. Groups are implied by
the filter's shape (M, C / group, kh, kw), as in cuDNN's graph API.

The three graphs of a set of shapes are built together at first use and replayed; where cuDNN has no fp32
engine for one of them, those shapes go to the im2col engine whole (one warning), so that a forward's
columns never meet another path's backward. The workspace grows and is reused. The graphs run on the
current cupy stream, through one cuDNN handle per device.
"""
import functools
import logging
import os

import numpy

_EXCLUDED_NOTES = ("TENSOR_CORE", "DOWN_CONVERT_INPUTS")  # TF32 and reduced-precision engines
_OPERATIONS = ("fprop", "dgrad", "wgrad")

log = logging.getLogger(__name__)


@functools.cache
def binding():
    """The `cudnn` module of nvidia-cudnn-frontend, or None where it (or the cuDNN library) is missing."""
    try:
        import cudnn
        cudnn.backend_version()  # loads libcudnn: an installed frontend without the library is no binding
        return cudnn
    except Exception:
        return None


def usable(x):
    """Whether convolutions of arrays like `x` run through cuDNN (see the module's docstring)."""
    if os.environ.get("SCAFFE_CUDNN", "1").strip() == "0" or x.dtype != numpy.float32:
        return False
    # cupy's arrays name their device memory (x.data.ptr); numpy's and the stand-in's do not.
    return hasattr(getattr(x, "data", None), "ptr") and binding() is not None


def _nchw_strides(shape):
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= extent
    return strides[::-1]


_handles = {}  # device id -> cuDNN handle


def _cupy():
    import cupy  # only cupy arrays come here (usable)
    return cupy


def _handle():
    device = _cupy().cuda.Device().id
    handle = _handles.get(device)
    if handle is None:
        handle = _handles[device] = binding().create_handle()
    return handle


class CudnnConv:
    """cuDNN's convolution for one geometry, with ConvEngine's forward / backward (kernels.im2col's path):
    forward overwrites y, backward accumulates weight_diff and bias_diff and overwrites dx (each may be None).
    `fallback` (a kernels.im2col engine of the same geometry) takes the shapes cuDNN has no fp32 engine for."""

    def __init__(self, pad, stride, dilation, fallback):
        self.geometry = {"padding": list(pad), "stride": list(stride), "dilation": list(dilation)}
        self.fallback = fallback
        self._plans = {}  # (x, w, y shapes) -> {operation: (graph, its three tensors, workspace bytes)} or None
        self._workspace = self._weight_grad = None

    def forward(self, x, weight, bias, y):
        plans = self._plans_for((x.shape, weight.shape, y.shape))
        if plans is None:
            return self.fallback.forward(x, weight, bias, y)
        self._run(plans["fprop"], x, weight, y)
        if bias is not None:
            y += bias.reshape(1, -1, 1, 1)

    def backward(self, x, weight, dy, weight_diff, bias_diff, dx):
        plans = self._plans_for((x.shape, weight.shape, dy.shape))
        if plans is None:
            return self.fallback.backward(x, weight, dy, weight_diff, bias_diff, dx)
        if bias_diff is not None:
            bias_diff += dy.sum(axis=(0, 2, 3), dtype=dy.dtype)
        if weight_diff is not None:
            # cuDNN overwrites its output; Caffe's parameter gradients accumulate.
            if self._weight_grad is None or self._weight_grad.shape != weight.shape:
                self._weight_grad = _cupy().empty_like(weight)
            self._run(plans["wgrad"], x, dy, self._weight_grad)
            weight_diff += self._weight_grad
        if dx is not None:
            self._run(plans["dgrad"], dy, weight, dx)

    def _plans_for(self, shapes):
        if shapes not in self._plans:
            cudnn = binding()
            try:
                self._plans[shapes] = {operation: self._build(operation, *shapes) for operation in _OPERATIONS}
            except (cudnn.cudnnGraphNotSupportedError, NotImplementedError, RuntimeError) as error:
                log.warning("convolution of %s by %s: cuDNN has no fp32 engine (%s); im2col + GEMM runs it",
                            shapes[0], shapes[1], error)
                self._plans[shapes] = None
        return self._plans[shapes]

    def _run(self, plan, a, b, out):
        cupy = _cupy()
        graph, tensors, size = plan
        handle = _handle()
        binding().set_stream(handle, cupy.cuda.get_current_stream().ptr)
        if size and (self._workspace is None or self._workspace.nbytes < size):
            self._workspace = cupy.empty(size, dtype=cupy.uint8)
        pointers = {tensor: array.data.ptr for tensor, array in zip(tensors, (a, b, out))}
        graph.execute(pointers, self._workspace.data.ptr if size else None, handle=handle)

    def _build(self, operation, x_shape, w_shape, y_shape):
        cudnn = binding()
        fp32 = cudnn.data_type.FLOAT
        graph = cudnn.pygraph(io_data_type=fp32, intermediate_data_type=fp32, compute_data_type=fp32,
                              handle=_handle())

        def tensor(name, shape):
            return graph.tensor(name=name, dim=list(shape), stride=_nchw_strides(shape), data_type=fp32)
        if operation == "fprop":
            a, b = tensor("x", x_shape), tensor("w", w_shape)
            out, out_shape = graph.conv_fprop(image=a, weight=b, compute_data_type=fp32, **self.geometry), y_shape
        elif operation == "dgrad":
            a, b = tensor("dy", y_shape), tensor("w", w_shape)
            out, out_shape = graph.conv_dgrad(loss=a, filter=b, compute_data_type=fp32, **self.geometry), x_shape
        else:
            a, b = tensor("x", x_shape), tensor("dy", y_shape)
            out, out_shape = graph.conv_wgrad(image=a, loss=b, compute_data_type=fp32, **self.geometry), w_shape
        out.set_output(True).set_dim(list(out_shape)).set_stride(_nchw_strides(out_shape)).set_data_type(fp32)
        graph.validate()
        graph.build_operation_graph()
        graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        graph.deselect_numeric_notes([getattr(cudnn.numerical_note, note) for note in _EXCLUDED_NOTES])
        graph.check_support()
        graph.build_plans()
        return graph, (a, b, out), graph.get_workspace_size()
