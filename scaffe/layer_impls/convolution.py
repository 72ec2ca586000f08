"""Convolution layer (Caffe's "Convolution"): im2col over the whole batch, then one GEMM per group.

Caffe runs im2col and a GEMM per image. Here the column buffer holds a chunk of images side by side,
(C*kh*kw, images, positions), so forward, the weight gradient and the data gradient are each one
large GEMM per chunk, which is what a 2-core BLAS (or a GPU) needs to run near peak. Chunks are sized
so the column buffer stays around COL_BUDGET_BYTES (cache-sized, and bounded memory for big nets) on
the CPU and GPU_COL_BUDGET_BYTES on a GPU;
when the whole batch fits in one chunk the columns from forward are reused by backward instead of
being recomputed. Buffers grow once and are reused across iterations.

`ConvEngine` is shared with Deconvolution, whose forward is this layer's data-gradient pass. On a GPU with
NVIDIA's cuDNN frontend installed, Convolution runs through cuDNN instead (kernels.cudnn_conv).
"""
import numpy

from kernels import blas, cudnn_conv
from kernels.backend import get_array_module
from kernels.blas import product
from kernels.geometry import conv_output_size
from kernels.im2col import col2im, im2col
from scaffe.layer_impls import register
from scaffe.layer_impls._helpers import filled_blob, param_grad_wanted, spatial_geometry
from scaffe.layer_impls.layer import Layer

# Columns per chunk. Measured on a 2-core EPYC (32 MiB L3) with cifar10_quick and LeNet, 4 to 128 MiB
# were within noise of each other once im2col was fast; 8 MiB keeps the GEMM's operand cache-resident,
# bounds memory for big nets (AlexNet's conv1 would need 1.1 GB of columns at batch 256) and still
# holds LeNet's conv2 at batch 64 in one chunk, so its backward reuses the forward's columns.
COL_BUDGET_BYTES = 8 << 20
# On a GPU a chunk costs an im2col launch and a GEMM per group, and a GEMM needs far more columns than
# a CPU cache holds to fill the device: 8 MiB chunks made about 7,400 launches of an AlexNet iteration at
# batch 256. 512 MiB takes AlexNet's conv1 (1.1 GB of columns at batch 256) in 3 chunks and leaves
# the rest of a 16 GB or larger device to the net.
GPU_COL_BUDGET_BYTES = 512 << 20


class ConvEngine:
    """Batched im2col + GEMM for one geometry; owns the reusable column and transpose buffers.

    Shapes: x (N, C, H, W) with C = channels; y (N, M, oh, ow) with M = num_output; weights
    (M, C/group, kh, kw). `columns_cached` remembers whether `col` still holds im2col of the last
    forward's whole batch.
    """

    def __init__(self, kernel, pad, stride, dilation, group):
        self.kernel, self.pad, self.stride, self.dilation = kernel, pad, stride, dilation
        self.group = group
        self._buffers = {}
        self.columns_cached = False

    def output_hw(self, height, width):
        (kh, kw), (ph, pw), (sh, sw), (dh, dw) = self.kernel, self.pad, self.stride, self.dilation
        return conv_output_size(height, kh, ph, sh, dh), conv_output_size(width, kw, pw, sw, dw)

    def _buffer(self, name, size, like):
        xp = get_array_module(like)
        buf = self._buffers.get(name)
        if buf is None or buf.size < size or buf.dtype != like.dtype or get_array_module(buf) is not xp:
            buf = xp.empty(size, dtype=like.dtype)
            self._buffers[name] = buf
        return buf[:size]

    def _chunk(self, n_img, rows, positions, like):
        per_image = max(rows * positions * like.dtype.itemsize, 1)
        budget = COL_BUDGET_BYTES if get_array_module(like) is numpy else GPU_COL_BUDGET_BYTES
        return max(1, min(n_img, budget // per_image))

    def _gemm(self, a, b, out, trans_a=False, trans_b=False):
        """out[g] = op(a[g]) @ op(b[g]) for each group g; a, b, out are (group, r, c) views."""
        for g in range(self.group):
            product(out[g], a[g], b[g], trans_a, trans_b)

    def forward(self, x, weight, bias, y):
        """y = conv(x, weight) + bias (bias may be None); y is overwritten."""
        xp = get_array_module(x)
        n_img = x.shape[0]
        m_out = weight.shape[0]
        oh, ow = y.shape[2], y.shape[3]
        positions = oh * ow
        rows = weight[0].size * self.group
        g = self.group
        w3 = weight.reshape(g, m_out // g, rows // g)
        chunk = self._chunk(n_img, rows, positions, x)
        self.columns_cached = chunk >= n_img
        y3 = y.reshape(n_img, m_out, positions)
        bias3 = None if bias is None else bias.reshape(1, m_out, 1)
        for n0 in range(0, n_img, chunk):
            nb = min(chunk, n_img - n0)
            col = self._buffer("col", rows * nb * positions, x).reshape(rows, nb, positions)
            im2col(x[n0:n0 + nb], self.kernel, self.pad, self.stride, self.dilation, out=col)
            out = self._buffer("out", m_out * nb * positions, x).reshape(g, m_out // g, nb * positions)
            self._gemm(w3, col.reshape(g, rows // g, nb * positions), out)
            out_nmp = out.reshape(m_out, nb, positions).transpose(1, 0, 2)
            if bias3 is None:
                y3[n0:n0 + nb] = out_nmp
            else:
                xp.add(out_nmp, bias3, out=y3[n0:n0 + nb])

    def backward(self, x, weight, dy, weight_diff, bias_diff, dx):
        """Accumulates into weight_diff / bias_diff (either may be None) and overwrites dx (or None)."""
        n_img = x.shape[0]
        m_out = weight.shape[0]
        positions = dy.shape[2] * dy.shape[3]
        rows = weight[0].size * self.group
        g = self.group
        dy3 = dy.reshape(n_img, m_out, positions)
        if bias_diff is not None:
            bias_diff += dy3.sum(axis=(0, 2), dtype=dy.dtype)
        if weight_diff is None and dx is None:
            return
        w3 = weight.reshape(g, m_out // g, rows // g)
        chunk = self._chunk(n_img, rows, positions, x)
        reuse = self.columns_cached and chunk >= n_img
        for n0 in range(0, n_img, chunk):
            nb = min(chunk, n_img - n0)
            dyt = self._buffer("dyt", m_out * nb * positions, x).reshape(m_out, nb, positions)
            dyt[...] = dy3[n0:n0 + nb].transpose(1, 0, 2)
            dyt_g = dyt.reshape(g, m_out // g, nb * positions)
            col = self._buffer("col", rows * nb * positions, x).reshape(rows, nb, positions)
            if weight_diff is not None:
                if not reuse:
                    im2col(x[n0:n0 + nb], self.kernel, self.pad, self.stride, self.dilation, out=col)
                wgrad = self._buffer("wgrad", weight.size, x).reshape(w3.shape)
                self._gemm(dyt_g, col.reshape(g, rows // g, nb * positions), wgrad, trans_b=True)
                weight_diff += wgrad.reshape(weight_diff.shape)
            if dx is not None:
                # The columns are dead once the weight gradient has them, so the data gradient reuses the buffer.
                self._gemm(w3, dyt_g, col.reshape(g, rows // g, nb * positions), trans_a=True)
                col2im(col, dx[n0:n0 + nb].shape, self.kernel, self.pad, self.stride, self.dilation,
                       out=dx[n0:n0 + nb])
        self.columns_cached = False


def _check_spatial(layer, bottom):
    for b in bottom:
        if len(b.shape) != 4:
            raise ValueError(f"layer {layer.name!r}: {layer.type} needs 4-d (N, C, H, W) input, got {b.shape}")
        if b.shape != bottom[0].shape:
            raise ValueError(f"layer {layer.name!r}: all bottoms must have the same shape, "
                             f"got {bottom[0].shape} and {b.shape}")


class _ConvolutionBase(Layer):
    """Parameters, weights and shape checks common to Convolution and Deconvolution."""

    min_num_bottom = 1
    min_num_top = 1

    def setup(self, bottom, top):
        cp = self.param.convolution_param
        if cp.axis not in (1, -3):
            raise ValueError(f"layer {self.name!r}: only axis 1 (N, C, H, W) is supported, got axis {cp.axis}")
        if len(bottom) != len(top):
            raise ValueError(f"layer {self.name!r}: needs one top per bottom, got {len(bottom)} bottoms "
                             f"and {len(top)} tops")
        _check_spatial(self, bottom)
        kernel, pad, stride, dilation = spatial_geometry(cp, self)
        self.num_output = int(cp.num_output)
        self.group = int(cp.group)
        self.bias_term = bool(cp.bias_term)
        channels = bottom[0].shape[1]
        if self.num_output <= 0:
            raise ValueError(f"layer {self.name!r}: num_output must be positive")
        if channels % self.group or self.num_output % self.group:
            raise ValueError(f"layer {self.name!r}: channels ({channels}) and num_output ({self.num_output}) "
                             f"must both be multiples of group ({self.group})")
        self.channels = channels
        self.engine = ConvEngine(kernel, pad, stride, dilation, self.group)
        kh, kw = kernel
        self.blobs = [filled_blob(self, self.weight_shape(channels) + (kh, kw), bottom[0], cp.weight_filler)]
        if self.bias_term:
            self.blobs.append(filled_blob(self, (self.num_output,), bottom[0], cp.bias_filler))

    def reshape(self, bottom, top):
        _check_spatial(self, bottom)
        if bottom[0].shape[1] != self.channels:
            raise ValueError(f"layer {self.name!r}: input has {bottom[0].shape[1]} channels, the weights "
                             f"expect {self.channels}")
        out_hw = self.output_hw(*bottom[0].shape[2:])
        if min(out_hw) <= 0:
            raise ValueError(f"layer {self.name!r}: input {bottom[0].shape} is too small for the kernel")
        for b, t in zip(bottom, top):
            t.reshape((b.shape[0], self.num_output) + out_hw)


@register
class ConvolutionLayer(_ConvolutionBase):
    type = "Convolution"

    def weight_shape(self, channels):
        return (self.num_output, channels // self.group)

    def setup(self, bottom, top):
        super().setup(bottom, top)
        engine = self.engine
        # What computes: cuDNN where it is usable, im2col + GEMM elsewhere (same forward / backward).
        self.conv = (cudnn_conv.CudnnConv(engine.pad, engine.stride, engine.dilation, engine)
                     if cudnn_conv.usable(bottom[0].data) else engine)

    def output_hw(self, height, width):
        return self.engine.output_hw(height, width)

    def capture_refusal(self):
        return None if isinstance(self.conv, cudnn_conv.CudnnConv) else blas.capture_refusal()

    def forward(self, bottom, top):
        weight = self.blobs[0].data
        bias = self.blobs[1].data if self.bias_term else None
        for b, t in zip(bottom, top):
            self.conv.forward(b.data, weight, bias, t.data)

    def backward(self, top, propagate_down, bottom):
        weight_diff = self.blobs[0].diff if param_grad_wanted(self, 0) else None
        bias_diff = self.blobs[1].diff if self.bias_term and param_grad_wanted(self, 1) else None
        for i, (b, t) in enumerate(zip(bottom, top)):
            dx = b.diff if propagate_down[i] else None
            if len(bottom) > 1:
                # Each bottom's columns overwrite the last one's, so only a single bottom can reuse them.
                self.engine.columns_cached = False
            self.conv.backward(b.data, self.blobs[0].data, t.diff, weight_diff, bias_diff, dx)
