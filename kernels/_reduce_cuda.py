"""GPU twin of kernels.reduce.reduce_into: one fused pass over K inputs, written once with numba.cuda.

out[i] = in_0[i] op in_1[i] op ... op in_{K-1}[i], in that order (the same order as the CPU path, so
results match it bit for bit for the exact ops and within rounding of the device's arithmetic for
floating point). The inputs come as one tuple, so a single compiled kernel per (op, dtype, K) serves
every call; threads stride over the grid, so any length runs on a bounded grid.

The simulator (NUMBA_ENABLE_CUDASIM=1) runs every CUDA thread as a Python thread, so there the grid is
kept to one small block.
"""
from kernels.grid import THREADS, blocks
from kernels.numba_cuda import SIMULATED, cuda

# The combining functions are inlined into the kernel in Numba's IR (inline="always"), so compiling the
# kernel for a named compute capability needs no device: a called device function would ask the current
# device for its compute capability (kernels/cuda_sources.py lists the kernel for CI's compile check).


@cuda.jit(device=True, inline="always")
def _sum(x, y):
    return x + y


@cuda.jit(device=True, inline="always")
def _prod(x, y):
    return x * y


@cuda.jit(device=True, inline="always")
def _min(x, y):
    # numpy.minimum propagates NaN from either side; x != x is true only for NaN.
    return x if (x < y or x != x) else y


@cuda.jit(device=True, inline="always")
def _max(x, y):
    return x if (x > y or x != x) else y


@cuda.jit(device=True, inline="always")
def _band(x, y):
    return x & y


@cuda.jit(device=True, inline="always")
def _bor(x, y):
    return x | y


@cuda.jit(device=True, inline="always")
def _bxor(x, y):
    return x ^ y


# MPI's logical ops yield 0 or 1 in the operand type; the result is stored through `out`'s dtype.
@cuda.jit(device=True, inline="always")
def _land(x, y):
    return 1 if (x != 0 and y != 0) else 0


@cuda.jit(device=True, inline="always")
def _lor(x, y):
    return 1 if (x != 0 or y != 0) else 0


@cuda.jit(device=True, inline="always")
def _lxor(x, y):
    return 1 if ((x != 0) != (y != 0)) else 0


OPS = {"sum": _sum, "prod": _prod, "min": _min, "max": _max, "band": _band, "bor": _bor,
        "bxor": _bxor, "land": _land, "lor": _lor, "lxor": _lxor}
_kernels = {}



def kernel(op):
    """The fused reduce kernel for `op`, one per op (numba specialises it per dtype and K)."""
    if op not in _kernels:
        combine = OPS[op]

        @cuda.jit
        def reduce_kernel(out, inputs):
            start = cuda.grid(1)
            step = cuda.gridsize(1)
            for i in range(start, out.size, step):
                acc = inputs[0][i]
                for k in range(1, len(inputs)):
                    acc = combine(acc, inputs[k][i])
                out[i] = acc

        _kernels[op] = reduce_kernel
    return _kernels[op]


def _grid(n):
    if SIMULATED:
        return 1, 32
    return blocks(n), THREADS


def reduce_into(out, inputs, op, stream=0):
    """out[:] = inputs[0] op inputs[1] op ... on the device (numba device arrays, 1-D, one dtype and length)."""
    n = out.shape[0]
    if n == 0:
        return
    if len(inputs) == 1:
        if inputs[0] is not out:
            out.copy_to_device(inputs[0], stream=stream)
        return
    blocks, threads = _grid(n)
    kernel(op)[blocks, threads, stream](out, tuple(inputs))
