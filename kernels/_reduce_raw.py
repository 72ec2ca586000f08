"""The collectives' fused reduce on the GPU as CUDA C for cupy's RawKernel: K inputs, M outputs, one pass.

out_m[i] = in_0[i] op in_1[i] op ... op in_{K-1}[i] for every output m, combined left to right as
kernels.reduce does on the CPU, so exact ops give the same bits on both. One kernel reads every local
rank's buffer through CUDA IPC and writes the result where it is needed (the Reduce root's buffer, or
every rank's for an Allreduce): one pass, where a chain of pairwise adds moves 2-3x more memory.

The source is one string; a variant is chosen by -D options (element type, op, K, M) and ends with its
own kernel, whose K + M pointer parameters are written out for it, so each (op, dtype, K, M) compiles
once per process. `variant` gives (name, source, options) for
one of them and `variants` a set that compiles every line of the source for every op and every dtype;
kernels.cuda_sources registers that set for the sm_80/sm_90 compile check, and its `reduce_kernel` registers
any other variant there when it is first needed.
float16 is handled as its bits with PTX conversions, and complex numbers as pairs, so the source needs
no header beyond what NVRTC has built in. Floating point is compiled without fused multiply-add, like
numpy's arithmetic.
"""
import numpy

SOURCE = r"""
// Selected by the options: SCAFFE_T (element type), SCAFFE_OP (one of the op numbers below),
// SCAFFE_K inputs and SCAFFE_M outputs.
#define SCAFFE_COPY 0
#define SCAFFE_SUM 1
#define SCAFFE_PROD 2
#define SCAFFE_MIN 3
#define SCAFFE_MAX 4
#define SCAFFE_LAND 5
#define SCAFFE_LOR 6
#define SCAFFE_LXOR 7
#define SCAFFE_BAND 8
#define SCAFFE_BOR 9
#define SCAFFE_BXOR 10

// One name per numpy dtype, so that each -DSCAFFE_T is a single word.
typedef signed char scaffe_int8;
typedef short scaffe_int16;
typedef int scaffe_int32;
typedef long long scaffe_int64;
typedef unsigned char scaffe_uint8;
typedef unsigned short scaffe_uint16;
typedef unsigned int scaffe_uint32;
typedef unsigned long long scaffe_uint64;
struct scaffe_float16 { unsigned short bits; };
typedef float scaffe_float32;
typedef double scaffe_float64;
template <typename F> struct scaffe_complex { F re, im; };
typedef scaffe_complex<float> scaffe_complex64;
typedef scaffe_complex<double> scaffe_complex128;

// Signed overflow is undefined in C++; MPI and numpy wrap, so int and long long add and multiply unsigned.
template <typename T> struct wrapping { typedef T type; };
template <> struct wrapping<int> { typedef unsigned int type; };
template <> struct wrapping<long long> { typedef unsigned long long type; };

template <typename T> __device__ __forceinline__ T op_add(T a, T b) {
    typedef typename wrapping<T>::type W;
    return (T)((W)a + (W)b);
}
template <typename T> __device__ __forceinline__ T op_mul(T a, T b) {
    typedef typename wrapping<T>::type W;
    return (T)((W)a * (W)b);
}
// numpy.minimum / maximum propagate a NaN from either side; a != a only for NaN.
template <typename T> __device__ __forceinline__ T op_min(T a, T b) { return (a < b || a != a) ? a : b; }
template <typename T> __device__ __forceinline__ T op_max(T a, T b) { return (a > b || a != a) ? a : b; }

// float16 arithmetic as numpy does it: in float32, rounded back to half after every op.
__device__ __forceinline__ float half_value(scaffe_float16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h.bits));
    return f;
}
__device__ __forceinline__ scaffe_float16 half_of(float f) {
    scaffe_float16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
    return h;
}
template <> __device__ __forceinline__ scaffe_float16 op_add(scaffe_float16 a, scaffe_float16 b) {
    return half_of(half_value(a) + half_value(b));
}
template <> __device__ __forceinline__ scaffe_float16 op_mul(scaffe_float16 a, scaffe_float16 b) {
    return half_of(half_value(a) * half_value(b));
}
template <> __device__ __forceinline__ scaffe_float16 op_min(scaffe_float16 a, scaffe_float16 b) {
    const float x = half_value(a), y = half_value(b);
    return (x < y || x != x) ? a : b;
}
template <> __device__ __forceinline__ scaffe_float16 op_max(scaffe_float16 a, scaffe_float16 b) {
    const float x = half_value(a), y = half_value(b);
    return (x > y || x != x) ? a : b;
}

template <typename F> __device__ __forceinline__ scaffe_complex<F> op_add(scaffe_complex<F> a, scaffe_complex<F> b) {
    scaffe_complex<F> c = {a.re + b.re, a.im + b.im};
    return c;
}
template <typename F> __device__ __forceinline__ scaffe_complex<F> op_mul(scaffe_complex<F> a, scaffe_complex<F> b) {
    scaffe_complex<F> c = {a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re};
    return c;
}

typedef SCAFFE_T T;

// The running value: the element itself, or a truth value for the logical ops (which give 0 or 1).
#if SCAFFE_OP == SCAFFE_LAND || SCAFFE_OP == SCAFFE_LOR || SCAFFE_OP == SCAFFE_LXOR
typedef bool Acc;
__device__ __forceinline__ Acc start(T x) { return x != 0; }
__device__ __forceinline__ T finish(Acc acc) { return (T)(acc ? 1 : 0); }
#else
typedef T Acc;
__device__ __forceinline__ Acc start(T x) { return x; }
__device__ __forceinline__ T finish(Acc acc) { return acc; }
#endif

__device__ __forceinline__ Acc combine(Acc acc, T x) {
#if SCAFFE_OP == SCAFFE_SUM
    return op_add(acc, x);
#elif SCAFFE_OP == SCAFFE_PROD
    return op_mul(acc, x);
#elif SCAFFE_OP == SCAFFE_MIN
    return op_min(acc, x);
#elif SCAFFE_OP == SCAFFE_MAX
    return op_max(acc, x);
#elif SCAFFE_OP == SCAFFE_LAND
    return acc && (x != 0);
#elif SCAFFE_OP == SCAFFE_LOR
    return acc || (x != 0);
#elif SCAFFE_OP == SCAFFE_LXOR
    return acc != (x != 0);
#elif SCAFFE_OP == SCAFFE_BAND
    return (T)(acc & x);
#elif SCAFFE_OP == SCAFFE_BOR
    return (T)(acc | x);
#elif SCAFFE_OP == SCAFFE_BXOR
    return (T)(acc ^ x);
#else
    return x;  // SCAFFE_COPY has one input: never combined
#endif
}

// The loop of every variant; its kernel (see _kernel below) names the inputs in[] and the outputs out[].
// Every thread reads element i of all inputs before writing it, so an output may be one of the inputs.
#define SCAFFE_REDUCE_LOOP                                                                           \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;                     \
         i += (long long)blockDim.x * gridDim.x) {                                                  \
        Acc acc = start(in[0][i]);                                                                  \
        _Pragma("unroll") for (int k = 1; k < SCAFFE_K; ++k) acc = combine(acc, in[k][i]);          \
        const T result = finish(acc);                                                               \
        _Pragma("unroll") for (int m = 0; m < SCAFFE_M; ++m) out[m][i] = result;                    \
    }
"""

_OP_NUMBERS = {"copy": 0, "sum": 1, "prod": 2, "min": 3, "max": 4, "land": 5, "lor": 6, "lxor": 7,
               "band": 8, "bor": 9, "bxor": 10}
_C_TYPES = {name: f"scaffe_{name}" for name in (
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", "complex64", "complex128")}
# The ops each kind of element has (MPI's rules, as collectives.ops.supports says them; kernels sits below
# collectives and keeps its own copy).
_OPS_OF_KIND = {"i": ("sum", "prod", "min", "max", "land", "lor", "lxor", "band", "bor", "bxor"),
                "f": ("sum", "prod", "min", "max"), "c": ("sum", "prod")}
_OPS_OF_KIND["u"] = _OPS_OF_KIND["i"]


def dtypes():
    """The element types the kernel handles: those of the host path."""
    return [numpy.dtype(name) for name in _C_TYPES]


def variant(op, dtype, inputs, outputs):
    """(name, source, options) of the kernel combining `inputs` arrays with `op` ("copy" for one input)
    into `outputs` arrays of `dtype`: scaffe_reduce_<op>_<dtype>_k<inputs>_m<outputs>(in0, ..., out0, ..., n)."""
    dtype = numpy.dtype(dtype)
    if dtype.name not in _C_TYPES or op != "copy" and op not in _OPS_OF_KIND[dtype.kind]:
        raise ValueError(f"the fused device reduce has no kernel for {op} on {dtype}")
    if (op == "copy") != (inputs == 1) or inputs < 1 or outputs < 1:
        raise ValueError(f"no reduce kernel for op {op!r} with {inputs} inputs and {outputs} outputs")
    name = f"scaffe_reduce_{op}_{dtype.name}_k{inputs}_m{outputs}"
    options = (f"-DSCAFFE_T={_C_TYPES[dtype.name]}", f"-DSCAFFE_OP={_OP_NUMBERS[op]}",
               f"-DSCAFFE_K={inputs}", f"-DSCAFFE_M={outputs}", "--fmad=false")
    return name, SOURCE + _kernel(name, inputs, outputs), options


def _kernel(name, inputs, outputs):
    """The variant's kernel: each array a pointer parameter of its own (the registry's launch checks every
    parameter), gathered into the in[] and out[] the shared loop reads."""
    ins, outs = [f"in{k}" for k in range(inputs)], [f"out{m}" for m in range(outputs)]
    parameters = ", ".join([f"const T* {a}" for a in ins] + [f"T* {a}" for a in outs] + ["long long n"])
    return (f'extern "C" __global__ void {name}({parameters}) {{\n'
            f"    const T* const in[{inputs}] = {{{', '.join(ins)}}};\n"
            f"    T* const out[{outputs}] = {{{', '.join(outs)}}};\n"
            "    SCAFFE_REDUCE_LOOP\n"
            "}\n")


def variants():
    """Variants that together compile every line of the source, every op and every dtype at least once
    (each integer op on its own integer type, float16's own arithmetic for each op), with 3 inputs and 2
    outputs, and a copy. All 96 (op, dtype) pairs and a copy of each dtype compiled cleanly for sm_80 and
    sm_90 (NVRTC 12.9) when this was written; the compile check builds only these, to keep CI short."""
    pairs = [("land", "int8"), ("lor", "int16"), ("lxor", "int32"), ("band", "int64"), ("bor", "uint8"),
             ("bxor", "uint16"), ("min", "uint32"), ("max", "uint64"), ("prod", "int32"), ("sum", "int64"),
             ("sum", "float16"), ("prod", "float16"), ("min", "float16"), ("max", "float16"),
             ("min", "float32"), ("max", "float64"), ("prod", "float32"),
             ("sum", "complex64"), ("prod", "complex64"), ("prod", "complex128")]
    return [variant(op, dtype, 3, 2) for op, dtype in pairs] + [variant("copy", "float32", 1, 2)]

