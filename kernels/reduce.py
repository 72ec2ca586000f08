"""Fused K-input elementwise reduce: out = in_0 op in_1 op ... op in_{K-1}, in that fixed order.

CPU path: numpy ufuncs applied block by block. A plain chain of K-1 whole-array ufunc calls streams the
output through memory K-1 times; working in blocks that fit in the L2 cache makes the chain cost about
one pass over the inputs, which is what a hand-fused kernel achieves, without a JIT compile per dtype.
GPU path (device arrays: numba's, cupy's, anything with `__cuda_array_interface__`): the fused numba.cuda
kernel in `_reduce_cuda`, same signature, imported only when a device array arrives.
"""
import numpy

# op name -> numpy ufunc. The names are the collectives' vocabulary (MPI.SUM -> "sum", ...).
UFUNCS = {
    "sum": numpy.add,
    "prod": numpy.multiply,
    "min": numpy.minimum,
    "max": numpy.maximum,
    "land": numpy.logical_and,
    "lor": numpy.logical_or,
    "lxor": numpy.logical_xor,
    "band": numpy.bitwise_and,
    "bor": numpy.bitwise_or,
    "bxor": numpy.bitwise_xor,
}

# 256 KiB of output per block: the block and one input block stay in a 1 MiB L2 while K inputs stream by.
BLOCK_BYTES = 1 << 18


def reduce_into(out, inputs, op, stream=0):
    """out[:] = inputs[0] op inputs[1] op ... (left to right). `out` may be one of the inputs.

    All arrays are 1-D, of one dtype and length, and all in host memory or all on the device. With a
    single input this is a copy. `stream` orders the device kernel (ignored on the CPU).
    """
    if isinstance(out, numpy.ndarray):
        _reduce_cpu(out, inputs, UFUNCS[op])
        return
    from kernels import _reduce_cuda
    from kernels.numba_cuda import as_device_array
    _reduce_cuda.reduce_into(as_device_array(out), [as_device_array(a) for a in inputs], op, stream)


def _reduce_cpu(out, inputs, ufunc):
    n = out.shape[0]
    if len(inputs) == 1:
        if inputs[0] is not out:
            numpy.copyto(out, inputs[0])
        return
    if ufunc.__name__.startswith("logical_"):
        _reduce_logical(out, inputs, ufunc)
        return
    if len(inputs) == 2:  # one ufunc pass already; numpy itself guards an `out` that overlaps an input
        ufunc(inputs[0], inputs[1], out=out)
        return
    block = max(1, BLOCK_BYTES // max(out.itemsize, 1))
    first, second, rest = inputs[0], inputs[1], inputs[2:]
    # Writing into `out` early would destroy a later input that lives in the same memory (an
    # in-place reduce whose buffer is not input 0); then each block is built aside and copied over.
    aliased = any(numpy.may_share_memory(out, a) for a in inputs[1:])
    scratch = numpy.empty(min(block, n), dtype=out.dtype) if aliased else None
    for start in range(0, n, block):
        stop = min(n, start + block)
        o = scratch[:stop - start] if aliased else out[start:stop]
        ufunc(first[start:stop], second[start:stop], out=o)
        for a in rest:
            ufunc(o, a[start:stop], out=o)
        if aliased:
            out[start:stop] = o


def _reduce_logical(out, inputs, ufunc):
    # MPI's logical ops yield 0/1 in the operand type; the bool intermediate keeps that exact.
    acc = ufunc(inputs[0], inputs[1])
    for a in inputs[2:]:
        ufunc(acc, a, out=acc)
    numpy.copyto(out, acc, casting="unsafe")
