"""A whole solver step as one kernel launch over flat buffers (GPU): the kernels are registered in
kernels/cuda_sources.py (`scaffe_<solver>_update`, with the CUDA source CI compiles), each the per-blob
pipeline of scaffe.solvers.sgd per element. Scalars travel as kernel arguments, so a step costs one
launch and no host synchronisation."""
from kernels.cuda_sources import launch_elementwise


def fused_step(kernel, flat, span, rate, grad_scale, weight_decay, l1, scalars):
    """Update elements span[0]:span[1] of FlatParams `flat` with update kernel `kernel` on the current stream;
    `scalars`: the solver's own, in the order of the kernel's parameters."""
    part = slice(*span)
    launch_elementwise(kernel, flat.dtype, span[1] - span[0], flat.data[part], flat.diff[part], flat.lr_mult[part],
                       flat.decay_mult[part], rate, grad_scale, weight_decay, int(l1), *scalars,
                       *[h[part] for h in flat.history])
