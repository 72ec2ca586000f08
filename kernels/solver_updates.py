"""The solvers' fused update steps on the CPU (kernels/_solver_updates_cpu.py, the twins of the
`scaffe_<solver>_update` CUDA kernels), loaded without numba and split over threads, for
scaffe.solvers.fused."""
import numpy

from kernels import native
from kernels._threads import run_split

_CPU = "kernels._solver_updates_cpu"
SCALARS = 8  # one, scale, local_decay, local_rate and at most four of the solver's own


def update(name, data, diff, scalars, l1, histories):
    """The step of CUDA kernel `name` on every element of data, diff and histories (contiguous runs of one
    blob's elements, of one dtype T); scalars: one, scale, local_decay, local_rate, then the solver's own,
    each a T."""
    values = numpy.zeros(SCALARS, data.dtype)
    values[:len(scalars)] = scalars
    if any(a.size != data.size for a in (diff, *histories)):
        raise ValueError(f"{name}: data, diff and histories must be runs of one size")
    data_at, diff_at, *history_at = (native.address(a, data.dtype, f"{name}: {what}")
                                     for a, what in zip((data, diff, *histories), ("data", "diff", "h0", "h1")))
    args = (data_at, diff_at, values.ctypes.data, SCALARS, int(l1), history_at[0], history_at[-1], data.size)
    run_split(native.load(_CPU, "update", name, data.dtype), args, data.size, data.size)


def native_calls():
    """What `python -m kernels.native` compiles ahead: every step in float32 and float64."""
    from kernels._solver_updates_cpu import STEPS  # numba's: only what compiles them needs it
    return [(_CPU, "update", (name, dtype)) for name in STEPS for dtype in native.FLOATS]
