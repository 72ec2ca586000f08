"""Every CUDA kernel of the project, registered in one place so CI compiles all of them without a GPU.

CUDA C sources (what cupy.RawKernel compiles through NVRTC) are registered here by name, with their NVRTC
options; the code lives here too, so what CI compiles is byte for byte what runs. `raw_kernel(name)` is
the cached cupy.RawKernel of a registered source and `launch_elementwise` runs a one-thread-per-element
kernel over a grid-stride loop. numba.cuda kernels are listed by `numba_kernels()` with the signatures
they are compiled for; NVVM compiles them. tests/kernels/test_cuda_compile.py compiles every entry of both
for sm_80 and sm_90, and fails on a cupy kernel built anywhere else.

To add a CUDA C kernel (the collectives' fused K-input reduce among them): `register(CudaSource(...))` it
here, in this module (kernels sits below collectives and scaffe, so both can use it), and build it with
`raw_kernel(name)`. Sources are self-contained: NVRTC from the wheel has no <cfloat> or standard headers.
"""
import functools
import re
from dataclasses import dataclass

import numpy

from kernels import _reduce_raw
from kernels.backend import get_array_module
from kernels.grid import THREADS, blocks

# The C types a scalar kernel parameter may have, and the numpy type an argument is passed as (cupy passes
# a RawKernel's arguments by their own type, so a Python int would arrive as 64 bits for a 32-bit int).
SCALAR_TYPES = {"int": numpy.int32, "long long": numpy.int64, "float": numpy.float32, "double": numpy.float64}


@dataclass(frozen=True)
class CudaSource:
    """One NVRTC translation unit: `code` defines the extern "C" __global__ function `name`."""
    name: str
    code: str
    options: tuple = ()

    @property
    def parameters(self):
        """(C type, name) of each parameter of the kernel, read from its definition in `code`."""
        found = re.search(rf'extern "C" __global__ void {re.escape(self.name)}\(([^)]*)\)', self.code)
        if found is None:
            raise ValueError(f'CUDA source {self.name!r} defines no extern "C" __global__ void {self.name}(...)')
        return [tuple(p.strip().rsplit(None, 1)) for p in found.group(1).split(",")]


SOURCES = {}
ELEMENTWISE = {}  # base name -> the dtypes register_elementwise made a kernel of it for

_C_TYPES = {numpy.dtype(numpy.float32): "float", numpy.dtype(numpy.float64): "double"}


def register(source):
    if source.name in SOURCES:
        raise ValueError(f"CUDA source {source.name!r} is registered twice")
    SOURCES[source.name] = source
    return source


def elementwise_name(base, dtype):
    return f"{base}_{numpy.dtype(dtype).name}"


def register_elementwise(base, params, body, dtypes=tuple(_C_TYPES), options=()):
    """One kernel per dtype, named by `elementwise_name`: `body` runs once per index `i` of [0, total)
    (a grid-stride loop), with T the dtype's C type, compiled with NVRTC `options`; launch it with
    `launch_elementwise`."""
    ELEMENTWISE[base] = tuple(map(numpy.dtype, dtypes))
    for dtype in ELEMENTWISE[base]:
        c_type = _C_TYPES[dtype]
        code = (f"typedef {c_type} T;\n"
                f'extern "C" __global__ void {elementwise_name(base, dtype)}({params}, long long total) {{\n'
                "    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;\n"
                "         i += (long long)blockDim.x * gridDim.x) {\n"
                f"{body}\n"
                "    }\n"
                "}\n")
        register(CudaSource(elementwise_name(base, dtype), code, options))


_CONV = ("int n_img, int channels, int height, int width, int kh, int kw, int ph, int pw, int sh, int sw, "
         "int dh, int dw, int oh, int ow")

# One thread per column element; reading x is a gather, writing col is fully coalesced.
register_elementwise("scaffe_im2col", f"const T* x, {_CONV}, T* col", """
        const int positions = oh * ow;
        const int p = i % positions;
        const int n = (i / positions) % n_img;
        const int row = i / ((long long)positions * n_img);
        const int kj = row % kw;
        const int ki = (row / kw) % kh;
        const int c = row / (kw * kh);
        const int y = (p / ow) * sh - ph + ki * dh;
        const int xx = (p % ow) * sw - pw + kj * dw;
        col[i] = (y >= 0 && y < height && xx >= 0 && xx < width)
            ? x[((long long)(n * channels + c) * height + y) * width + xx] : (T)0;""")

# One thread per image element gathering every column entry that reads it: no atomics, deterministic.
register_elementwise("scaffe_col2im", f"const T* col, {_CONV}, T* dx", """
        const int xx = i % width;
        const int y = (i / width) % height;
        const int c = (i / ((long long)width * height)) % channels;
        const int n = i / ((long long)width * height * channels);
        const int positions = oh * ow;
        T acc = 0;
        for (int ki = 0; ki < kh; ++ki) {
            const int ys = y + ph - ki * dh;
            if (ys < 0 || ys % sh != 0) continue;
            const int oy = ys / sh;
            if (oy >= oh) continue;
            for (int kj = 0; kj < kw; ++kj) {
                const int xs = xx + pw - kj * dw;
                if (xs < 0 || xs % sw != 0) continue;
                const int ox = xs / sw;
                if (ox >= ow) continue;
                const int row = (c * kh + ki) * kw + kj;
                acc += col[((long long)row * n_img + n) * positions + oy * ow + ox];
            }
        }
        dx[i] = acc;""")

_POOL = "int height, int width, int kh, int kw, int ph, int pw, int sh, int sw, int oh, int ow"

# Pooling forward: one thread per output. Backward: one thread per input element that gathers from every
# window covering it, so there are no atomics and the result does not depend on scheduling.
register_elementwise("scaffe_max_pool_forward", f"const T* x, int channels, {_POOL}, T* top, int* mask", """
        const int px = i % ow;
        const int py = (i / ow) % oh;
        const long long plane = i / ((long long)ow * oh);
        int hs = py * sh - ph;
        int ws = px * sw - pw;
        const int he = min(hs + kh, height);
        const int we = min(ws + kw, width);
        hs = max(hs, 0);
        ws = max(ws, 0);
        T best = (T)-3.402823466e+38;  // -FLT_MAX, as Caffe starts
        int arg = -1;
        const T* src = x + plane * height * width;
        for (int h = hs; h < he; ++h) {
            for (int w = ws; w < we; ++w) {
                if (src[h * width + w] > best) {
                    best = src[h * width + w];
                    arg = h * width + w;
                }
            }
        }
        top[i] = best;
        mask[i] = arg;""")

register_elementwise("scaffe_max_pool_backward", f"const T* dtop, const int* mask, {_POOL}, T* dx", """
        const int w = i % width;
        const int h = (i / width) % height;
        const long long plane = i / ((long long)width * height);
        const int phs = (h + ph < kh) ? 0 : (h + ph - kh) / sh + 1;
        const int phe = min((h + ph) / sh + 1, oh);
        const int pws = (w + pw < kw) ? 0 : (w + pw - kw) / sw + 1;
        const int pwe = min((w + pw) / sw + 1, ow);
        const long long base = plane * oh * ow;
        const int self = h * width + w;
        T acc = 0;
        for (int py = phs; py < phe; ++py)
            for (int px = pws; px < pwe; ++px)
                if (mask[base + py * ow + px] == self) acc += dtop[base + py * ow + px];
        dx[i] = acc;""")

register_elementwise("scaffe_ave_pool_forward", f"const T* x, {_POOL}, T* top", """
        const int px = i % ow;
        const int py = (i / ow) % oh;
        const long long plane = i / ((long long)ow * oh);
        int hs = py * sh - ph;
        int ws = px * sw - pw;
        int he = min(hs + kh, height + ph);
        int we = min(ws + kw, width + pw);
        const int pool_size = (he - hs) * (we - ws);
        hs = max(hs, 0);
        ws = max(ws, 0);
        he = min(he, height);
        we = min(we, width);
        const T* src = x + plane * height * width;
        T acc = 0;
        for (int h = hs; h < he; ++h)
            for (int w = ws; w < we; ++w)
                acc += src[h * width + w];
        top[i] = acc / pool_size;""")

register_elementwise("scaffe_ave_pool_backward", f"const T* dtop, {_POOL}, T* dx", """
        const int w = i % width + pw;
        const int h = (i / width) % height + ph;
        const long long plane = i / ((long long)width * height);
        const int phs = (h < kh) ? 0 : (h - kh) / sh + 1;
        const int phe = min(h / sh + 1, oh);
        const int pws = (w < kw) ? 0 : (w - kw) / sw + 1;
        const int pwe = min(w / sw + 1, ow);
        const long long base = plane * oh * ow;
        T acc = 0;
        for (int py = phs; py < phe; ++py) {
            for (int px = pws; px < pwe; ++px) {
                const int hs = py * sh - ph;
                const int ws = px * sw - pw;
                const int he = min(hs + kh, height + ph);
                const int we = min(ws + kw, width + pw);
                acc += dtop[base + py * ow + px] / ((he - hs) * (we - ws));
            }
        }
        dx[i] = acc;""")


# ReLU's gradient (scaffe/layer_impls/relu.py, slope 0) in one launch where dy * (y > 0) takes two: the
# product with the comparison as a 0 or 1 of T, so a negative dy times 0 gives -0 as numpy's does.
register_elementwise("scaffe_relu_backward", "const T* y, const T* dy, T* dx", """
        dx[i] = dy[i] * (T)(y[i] > (T)0);""")


# SoftmaxWithLoss on the GPU in four launches (scaffe/layer_impls/softmax_loss.py, kernels/_softmax_loss_gpu.py)
# where the array routines take about thirty. The rows kernel: each thread takes `chunk` positions in turn
# (the channels' max, a NaN winning as in numpy, and the sum of exp(x - max) in T, kept for the prob
# kernel; the picked log-probability, clamped at FLT_MIN, summed in double; labels counted; the first bad
# label noted); the prob kernel writes exp(x - max) / sum, one thread per element, so that a classifier's
# few positions (one per image) do not leave the whole softmax to a few threads; the finish sums the
# chunks' parts in order (so the loss is the same bits every run), divides by the normalizer and keeps the
# first bad label seen for the host to raise when it reads results; the backward writes
# (prob - [c == label]) * loss_weight / norm.
register_elementwise("scaffe_softmax_loss_rows", "const T* x, const T* label, int channels, int inner, "
                     "long long positions, int chunk, int has_ignore, int ignore, T* row_max, T* row_sum, "
                     "double* part_loss, double* part_count, long long* part_bad", """
        const long long first = i * chunk;
        const long long last = min(first + (long long)chunk, positions);
        double loss = 0.0, counted = 0.0;
        long long bad_at = -1, bad_label = 0;
        for (long long p = first; p < last; ++p) {
            const long long base = (p / inner) * channels * inner + p % inner;
            T top = x[base];
            for (int c = 1; c < channels; ++c) {
                const T v = x[base + (long long)c * inner];
                top = (v > top || v != v) ? v : top;  // numpy's max: a NaN wins
            }
            T sum = (T)0;
            for (int c = 0; c < channels; ++c) sum += exp(x[base + (long long)c * inner] - top);
            row_max[p] = top;
            row_sum[p] = sum;
            const long long l = (long long)label[p];
            const bool valid = !(has_ignore && l == ignore);
            const bool bad = valid && (l < 0 || l >= channels);
            if (bad && bad_at < 0) {
                bad_at = p;
                bad_label = l;
            }
            if (valid) counted += 1.0;
            if (valid && !bad) {
                const T picked = exp(x[base + l * inner] - top) / sum;
                const T floor = (T)1.17549435082228751e-38;  // FLT_MIN, whatever T is, as Caffe clamps
                loss += (double)log(picked > floor ? picked : floor);
            }
        }
        part_loss[i] = loss;
        part_count[i] = counted;
        part_bad[2 * i] = bad_at;
        part_bad[2 * i + 1] = bad_label;""")
register_elementwise("scaffe_softmax_loss_prob", "const T* x, int channels, int inner, const T* row_max, "
                     "const T* row_sum, T* prob", """
        const long long p = (i / ((long long)inner * channels)) * inner + i % inner;
        prob[i] = exp(x[i] - row_max[p]) / row_sum[p];""")
register_elementwise("scaffe_softmax_loss_finish", "const double* part_loss, const double* part_count, "
                     "const long long* part_bad, long long parts, int count_valid, double fixed_norm, T* top, "
                     "double* norm, long long* check", """
        double loss = 0.0, counted = 0.0;
        for (long long k = 0; k < parts; ++k) {
            loss += part_loss[k];
            counted += part_count[k];
        }
        double n = count_valid ? counted : fixed_norm;
        n = n < 1.0 ? 1.0 : n;
        norm[0] = n;
        top[0] = (T)(-loss / n);
        for (long long k = 0; check[0] == 0 && k < parts; ++k) {
            if (part_bad[2 * k] >= 0) {
                check[0] = 1;
                check[1] = part_bad[2 * k + 1];
            }
        }""")
register_elementwise("scaffe_softmax_loss_backward", "const T* prob, const T* label, int channels, int inner, "
                     "int has_ignore, int ignore, const T* top_diff, const double* norm, T* dx", """
        const int c = (int)((i / inner) % channels);
        const long long l = (long long)label[(i / ((long long)inner * channels)) * inner + i % inner];
        const bool valid = !(has_ignore && l == ignore) && l >= 0 && l < channels;
        const T scale = (T)((double)top_diff[0] / norm[0]);
        dx[i] = valid ? (prob[i] - (c == l ? (T)1 : (T)0)) * scale : (T)0;""")


# LRN across channels (kernels/lrn.py) in one launch each way where its array routines take about fifteen,
# each with whole-tensor temporaries: one thread per image and pixel walks the channels, summing each
# channel's window of `size` neighbours in order (as the host's shifted slices do), so the scale, the top and
# the gradient round as the host's do but for pow; no contraction into fused multiply-adds, for that reason.
_LRN_WINDOWS = """
        const long long base = (i / inner) * channels * inner + i % inner;
        const int pre = (size - 1) / 2;
        for (int c = 0; c < channels; ++c) {{
            T window = (T)0;
            for (int j = 0; j < size; ++j) {{
                const int cc = c - pre + j;
                if (cc >= 0 && cc < channels) {{
                    const long long at = base + (long long)cc * inner;
                    window += {term};
                }}
            }}
            const long long at = base + (long long)c * inner;
{finish}
        }}"""
register_elementwise("scaffe_lrn_forward", "const T* x, int channels, int inner, int size, double alpha_over, "
                     "double k, double beta, T* scale, T* y", _LRN_WINDOWS.format(term="x[at] * x[at]", finish="""
            const T s = window * (T)alpha_over + (T)k;
            scale[at] = s;
            y[at] = pow(s, (T)(-beta)) * x[at];"""), options=("--fmad=false",))
register_elementwise("scaffe_lrn_backward", "const T* x, const T* y, const T* scale, const T* dy, int channels, "
                     "int inner, int size, double ratio_coef, double beta, T* dx",
                     _LRN_WINDOWS.format(term="dy[at] * y[at] / scale[at]", finish="""
            dx[at] = pow(scale[at], (T)(-beta)) * dy[at] - window * x[at] * (T)ratio_coef;"""),
                     options=("--fmad=false",))


# The solvers' fused update steps (scaffe/solvers/fused.py), one kernel per solver type: per element, the
# per-blob pipeline of scaffe.solvers.sgd in its order: scale the gradient (1/iter_size, a schedule's 1/P),
# add the weight decay (L2, or L1 with l1), turn it into the solver's step with the blob's lr_mult (h0, h1:
# the solver's history), keep the step in diff and subtract it from data.
# Compiled so that every operation rounds as numpy's float32 does: no a * b + c contracted into one fused
# multiply-add, IEEE division and square root, no flushing of subnormals. The kernels then compute bit for
# bit what the per-blob pipeline computes from the same gradients; with contraction, AdaGrad, RMSProp,
# AdaDelta and Adam, which divide by the gradient's own size, differ by up to 1e-3 relative at small values.
_IEEE_ROUNDING = ("--fmad=false", "--prec-div=true", "--prec-sqrt=true", "--ftz=false")
_UPDATE = ("T* data, T* diff, const T* lr_mult, const T* decay_mult, float rate, float grad_scale, "
           "float weight_decay, int l1")
_UPDATE_PROLOGUE = """
        const T x = data[i];
        T g = diff[i] * (T)grad_scale;
        const T local_decay = (T)weight_decay * decay_mult[i];
        if (local_decay != (T)0) {
            g += local_decay * (l1 ? (T)((x > (T)0) - (x < (T)0)) : x);
        }
        const T local_rate = (T)rate * lr_mult[i];"""
_UPDATE_EPILOGUE = """
        diff[i] = step;
        data[i] = x - step;"""


_UPDATE_FROM_DEVICE = "T* data, T* diff, const T* lr_mult, const T* decay_mult, const float* scalars, int l1"


def from_device(base):
    """The twin of update kernel `base` that reads its float scalars (rate, grad_scale, weight_decay, then the
    solver's own) from a device array, so that a captured CUDA graph takes each iteration's values."""
    return base + "_from_device"


def _register_update(base, scalars, histories, body):
    params = (_UPDATE + "".join(f", float {scalar}" for scalar in scalars)
              + "".join(f", T* {history}" for history in histories))
    register_elementwise(base, params, _UPDATE_PROLOGUE + body + _UPDATE_EPILOGUE, options=_IEEE_ROUNDING)
    names = ("rate", "grad_scale", "weight_decay") + tuple(scalars)
    reads = "".join(f"\n        const float {name} = scalars[{k}];" for k, name in enumerate(names))
    register_elementwise(from_device(base), _UPDATE_FROM_DEVICE + "".join(f", T* {h}" for h in histories),
                         reads + _UPDATE_PROLOGUE + body + _UPDATE_EPILOGUE, options=_IEEE_ROUNDING)


_register_update("scaffe_sgd_update", ("momentum",), ("h0",), """
        const T step = (T)momentum * h0[i] + local_rate * g;
        h0[i] = step;""")
_register_update("scaffe_nesterov_update", ("momentum",), ("h0",), """
        const T previous = h0[i];
        const T h = (T)momentum * previous + local_rate * g;
        h0[i] = h;
        const T step = ((T)1 + (T)momentum) * h - (T)momentum * previous;""")
_register_update("scaffe_adagrad_update", ("delta",), ("h0",), """
        const T h = h0[i] + g * g;
        h0[i] = h;
        const T step = local_rate * (g / (sqrt(h) + (T)delta));""")
_register_update("scaffe_rmsprop_update", ("rms_decay", "delta"), ("h0",), """
        const T h = (T)rms_decay * h0[i] + ((T)1 - (T)rms_decay) * (g * g);
        h0[i] = h;
        const T step = local_rate * (g / (sqrt(h) + (T)delta));""")
_register_update("scaffe_adadelta_update", ("momentum", "delta"), ("h0", "h1"), """
        const T gh = (T)momentum * h0[i] + ((T)1 - (T)momentum) * (g * g);
        const T scaled = g * sqrt((h1[i] + (T)delta) / (gh + (T)delta));
        h0[i] = gh;
        h1[i] = (T)momentum * h1[i] + ((T)1 - (T)momentum) * (scaled * scaled);
        const T step = local_rate * scaled;""")
_register_update("scaffe_adam_update", ("beta1", "beta2", "correction", "delta"), ("h0", "h1"), """
        const T m = (T)beta1 * h0[i] + ((T)1 - (T)beta1) * g;
        const T v = (T)beta2 * h1[i] + ((T)1 - (T)beta2) * (g * g);
        h0[i] = m;
        h1[i] = v;
        const T step = (local_rate * (T)correction) * (m / (sqrt(v) + (T)delta));""")


# The one-kernel bounds of the GPU acceptance (perf/gpu_acceptance.py): the least a 4-rank float32 Reduce
# on one GPU can cost is one pass that reads four buffers and writes one; an Allreduce, one pass that reads
# four and writes the sum to all four.
register(CudaSource("scaffe_bound_sum4_float32", """
extern "C" __global__ void scaffe_bound_sum4_float32(const float* a, const float* b, const float* c,
                                                     const float* d, float* out, long long total) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x)
        out[i] = ((a[i] + b[i]) + c[i]) + d[i];
}
"""))
register(CudaSource("scaffe_bound_allreduce4_float32", """
extern "C" __global__ void scaffe_bound_allreduce4_float32(const float* a, const float* b, const float* c,
                                                          const float* d, float* out_a, float* out_b,
                                                          float* out_c, float* out_d, long long total) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        const float sum = ((a[i] + b[i]) + c[i]) + d[i];
        out_a[i] = sum;
        out_b[i] = sum;
        out_c[i] = sum;
        out_d[i] = sum;
    }
}
"""))


# The collectives' fused K-input reduce: one source, a variant per (op, dtype, inputs, outputs); these cover
# every line of it for every op and dtype, and _reduce_raw.raw_kernel registers the others on first use.
for _name, _code, _options in _reduce_raw.variants():
    register(CudaSource(_name, _code, _options))


# ---------------------------------------------------------------- cupy side (imports cupy when called)

_raw_kernels = {}


def raw_kernel(name):
    """The cupy.RawKernel of registered source `name`, built once (cupy compiles it on first launch)."""
    if name not in _raw_kernels:
        import cupy
        source = SOURCES.get(name)
        if source is None:
            raise KeyError(f"no CUDA source {name!r} is registered in kernels.cuda_sources")
        _raw_kernels[name] = cupy.RawKernel(source.code, source.name, options=source.options)
    return _raw_kernels[name]


@functools.cache
def reduce_kernel(op, dtype, inputs, outputs):
    """The cupy RawKernel of the collectives' fused reduce `_reduce_raw.variant(...)`, registered here on
    first use when it is not one of the variants registered above."""
    name, source, options = _reduce_raw.variant(op, dtype, inputs, outputs)
    if name not in SOURCES:
        register(CudaSource(name, source, options))
    return raw_kernel(name)


def launch_elementwise(base, dtype, total, *args):
    """Runs kernel `base` for `dtype` (see `register_elementwise`) over `total` elements with `args`."""
    if numpy.dtype(dtype) not in ELEMENTWISE[base]:
        raise TypeError(f"{base}: no GPU kernel for {numpy.dtype(dtype).name}; there are kernels for "
                        f"{', '.join(d.name for d in ELEMENTWISE[base])}")
    if total:
        launch(elementwise_name(base, dtype), blocks(total), THREADS, *args, total)


def launch(name, blocks, threads, *args):
    """Launches registered kernel `name` on cupy's current stream, each argument checked against the
    kernel's parameters: arrays for pointers (C-contiguous, as the kernels index flat memory), scalars
    converted to the parameter's C type. A wrong count or kind would otherwise corrupt memory silently."""
    parameters = SOURCES[name].parameters
    if len(args) != len(parameters):
        raise TypeError(f"{name} takes {len(parameters)} arguments ({', '.join(p for _, p in parameters)}), "
                        f"got {len(args)}")
    bound = []
    for (c_type, parameter), value in zip(parameters, args):
        if c_type.endswith("*"):
            if get_array_module(value) is numpy or not value.flags.c_contiguous:
                raise ValueError(f"{name}: {parameter} must be a C-contiguous cupy array")
            bound.append(value)
        elif c_type in SCALAR_TYPES:
            bound.append(SCALAR_TYPES[c_type](value))
        else:
            raise TypeError(f"{name}: cannot pass a scalar as {c_type} {parameter}")
    raw_kernel(name)((blocks,), (threads,), tuple(bound))


# ---------------------------------------------------------------- numba.cuda kernels

@dataclass(frozen=True)
class NumbaKernel:
    """A numba.cuda kernel (its Python function) and one signature it is compiled for."""
    name: str
    module: str
    py_func: object
    signature: tuple


def numba_kernels(supports):
    """Every numba.cuda kernel with the signatures it runs with (imports numba.cuda: not under the simulator).

    supports(op, dtype) says which dtypes a reduce op is defined for: the collectives' table
    (collectives.ops.supports), passed in because kernels sits below collectives.
    """
    from numba import types
    from numba.np.numpy_support import from_dtype

    from kernels import _reduce_cuda
    kernels = []
    # The reduce kernel is built per op; each op is compiled for the dtypes of every kind it accepts,
    # with K = 4 inputs (the 4 ranks of the acceptance runs; K only sets the unrolled count).
    for op in _reduce_cuda.OPS:
        for dtype in (numpy.float32, numpy.float64, numpy.int32, numpy.uint8, numpy.complex64):
            if not supports(op, dtype):
                continue
            array = types.Array(from_dtype(numpy.dtype(dtype)), 1, "C")
            kernels.append(NumbaKernel(f"reduce_{op}_{numpy.dtype(dtype).name}", _reduce_cuda.__name__,
                                       _reduce_cuda.kernel(op).py_func, (array, types.UniTuple(array, 4))))
    return kernels
