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
from dataclasses import dataclass

import numpy

from kernels import _reduce_raw


@dataclass(frozen=True)
class CudaSource:
    """One NVRTC translation unit: `code` defines the extern "C" __global__ function `name`."""
    name: str
    code: str
    options: tuple = ()


SOURCES = {}

_C_TYPES = {numpy.dtype(numpy.float32): "float", numpy.dtype(numpy.float64): "double"}


def register(source):
    if source.name in SOURCES:
        raise ValueError(f"CUDA source {source.name!r} is registered twice")
    SOURCES[source.name] = source
    return source


def elementwise_name(base, dtype):
    return f"{base}_{numpy.dtype(dtype).name}"


def _register_elementwise(base, params, body):
    """One kernel per floating dtype: `body` runs once per index `i` of [0, total), T being the dtype."""
    for dtype, c_type in _C_TYPES.items():
        code = (f"typedef {c_type} T;\n"
                f'extern "C" __global__ void {elementwise_name(base, dtype)}({params}, long long total) {{\n'
                "    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;\n"
                "         i += (long long)blockDim.x * gridDim.x) {\n"
                f"{body}\n"
                "    }\n"
                "}\n")
        register(CudaSource(elementwise_name(base, dtype), code))


_CONV = ("int n_img, int channels, int height, int width, int kh, int kw, int ph, int pw, int sh, int sw, "
         "int dh, int dw, int oh, int ow")

# One thread per column element; reading x is a gather, writing col is fully coalesced.
_register_elementwise("scaffe_im2col", f"const T* x, {_CONV}, T* col", """
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
_register_elementwise("scaffe_col2im", f"const T* col, {_CONV}, T* dx", """
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
_register_elementwise("scaffe_max_pool_forward", f"const T* x, {_POOL}, T* top, int* mask", """
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

_register_elementwise("scaffe_max_pool_backward", f"const T* dtop, const int* mask, {_POOL}, T* dx", """
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

_register_elementwise("scaffe_ave_pool_forward", f"const T* x, {_POOL}, T* top", """
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

_register_elementwise("scaffe_ave_pool_backward", f"const T* dtop, {_POOL}, T* dx", """
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


# The one-kernel bound of the GPU acceptance (perf/gpu_acceptance.py): the least a 4-rank float32 Reduce
# on one GPU can cost is one pass that reads four buffers and writes one.
register(CudaSource("scaffe_bound_sum4_float32", """
extern "C" __global__ void scaffe_bound_sum4_float32(const float* a, const float* b, const float* c,
                                                     const float* d, float* out, long long total) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x)
        out[i] = ((a[i] + b[i]) + c[i]) + d[i];
}
"""))


# The collectives' fused K-input reduce: one source, a variant per (op, dtype, inputs, outputs); these cover
# every line of it for every op and dtype, and _reduce_raw.raw_kernel registers the others on first use.
for _name, _code, _options in _reduce_raw.variants():
    register(CudaSource(_name, _code, _options))


# ---------------------------------------------------------------- cupy side (imports cupy when called)

_THREADS = 256
_MAX_BLOCKS = 1 << 16  # a grid-stride loop covers the rest; far more resident blocks than any GPU holds
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


def launch_elementwise(base, dtype, total, arrays_before, ints, arrays_after):
    """Runs kernel `base` for `dtype` over `total` elements: (arrays_before, ints as int32, arrays_after, total).

    Every array must be C-contiguous: the kernels index flat memory.
    """
    name = elementwise_name(base, dtype)
    if numpy.dtype(dtype) not in _C_TYPES:
        raise TypeError(f"{base}: no GPU kernel for {numpy.dtype(dtype).name}; "
                        f"only {', '.join(d.name for d in _C_TYPES)} are compiled")
    for a in (*arrays_before, *arrays_after):
        if not a.flags.c_contiguous:
            raise ValueError(f"{base}: arrays must be C-contiguous")
    if total == 0:
        return
    blocks = min(_MAX_BLOCKS, -(-total // _THREADS))
    args = (*arrays_before, *(numpy.int32(v) for v in ints), *arrays_after, numpy.int64(total))
    raw_kernel(name)((blocks,), (_THREADS,), args)


# ---------------------------------------------------------------- numba.cuda kernels

@dataclass(frozen=True)
class NumbaKernel:
    """A numba.cuda kernel (its Python function) and one signature it is compiled for."""
    name: str
    module: str
    py_func: object
    signature: tuple


def numba_kernels():
    """Every numba.cuda kernel with the signatures it runs with (imports numba.cuda: not under the simulator)."""
    from numba import types
    from numba.np.numpy_support import from_dtype

    from kernels import _reduce_cuda
    from kernels.reduce import supports
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
