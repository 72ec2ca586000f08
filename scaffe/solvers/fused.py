"""A whole solver step over flat buffers, each the per-blob pipeline of scaffe.solvers.sgd per element:
on a GPU one kernel launch (`scaffe_<solver>_update`, registered in kernels/cuda_sources.py with the CUDA
source CI compiles); on the CPU its numba-compiled twin (kernels/solver_updates.py), one pass per blob, split
over threads where the blob is large. Scalars travel as kernel arguments, so a GPU step costs one launch
and no host synchronisation; in a captured CUDA graph, whose arguments are fixed, the kernel's twin reads
them from a device array written before each replay (scaffe.capture)."""
import numpy

from kernels import solver_updates
from kernels.cuda_sources import from_device, launch_elementwise


def fused_step(kernel, flat, segments, rate, grad_scale, weight_decay, l1, scalars, scalars_on_device=None):
    """Update `segments`, (learnable id, start, stop) element ranges that follow each other in FlatParams
    `flat`, with update kernel `kernel`; on a GPU on the current stream. `scalars`: the solver's own, in
    the order of the kernel's parameters. `scalars_on_device`: a float32 device array that holds rate,
    grad_scale, weight_decay and `scalars` by the time the kernel runs; the kernel then reads them there."""
    if flat.data.__class__ is numpy.ndarray:
        _cpu_step(kernel, flat, segments, rate, grad_scale, weight_decay, l1, scalars)
        return
    part = slice(*flat.elements(segments))
    arrays = (flat.data[part], flat.diff[part], flat.lr_mult[part], flat.decay_mult[part])
    histories = [h[part] for h in flat.history]
    if scalars_on_device is None:
        launch_elementwise(kernel, flat.dtype, part.stop - part.start, *arrays, rate, grad_scale, weight_decay,
                           int(l1), *scalars, *histories)
    else:
        launch_elementwise(from_device(kernel), flat.dtype, part.stop - part.start, *arrays, scalars_on_device,
                           int(l1), *histories)


def _cpu_step(kernel, flat, segments, rate, grad_scale, weight_decay, l1, scalars):
    """The GPU kernel's arithmetic: its float arguments rounded to float32, then to the blobs' type T."""
    cast = flat.dtype.type
    rate, grad_scale, weight_decay, *own = (cast(numpy.float32(value))
                                            for value in (rate, grad_scale, weight_decay, *scalars))
    for param_id, start, stop in segments:
        local_decay = weight_decay * cast(flat.decay_multipliers[param_id])
        local_rate = rate * cast(flat.lr_multipliers[param_id])
        part = slice(flat.bounds[param_id] + start, flat.bounds[param_id] + stop)
        solver_updates.update(kernel, flat.data[part], flat.diff[part], (cast(1), grad_scale, local_decay, local_rate,
                                                                        *own), l1, [h[part] for h in flat.history])
