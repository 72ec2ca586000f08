"""One elementwise kernel per solver type that does a whole update step over flat buffers (GPU).

The kernel applies, per element, exactly the per-blob pipeline of scaffe.solvers.sgd in the same order:
scale the gradient (1/iter_size, and a schedule's 1/P), add the weight decay (L2 or L1, times the blob's
decay_mult), turn it into the solver's step with the blob's lr_mult, keep the step in diff and subtract
it from data. Each solver's file holds its kernel body beside its per-blob code. Scalars travel as kernel
arguments, so a step costs one launch and no host synchronisation.
"""
import numpy

COMMON_IN = "T lr_mult, T decay_mult, float32 rate, float32 grad_scale, float32 weight_decay, int32 l1"
PROLOGUE = """
    T g = diff * (T)grad_scale;
    const T local_decay = (T)weight_decay * decay_mult;
    if (local_decay != (T)0) {
        g += local_decay * (l1 ? (T)((data > (T)0) - (data < (T)0)) : data);
    }
    const T local_rate = (T)rate * lr_mult;
"""
EPILOGUE = """
    diff = step;
    data -= step;
"""

UPDATES = []  # every FusedUpdate, for the CUDA compile check


class FusedUpdate:
    """The update kernel `name`: `body` computes `step` from g, local_rate, the histories h0, h1, ... and
    the solver's float32 `scalars` (names, in the order the solver passes them)."""

    def __init__(self, name, scalars, histories, body):
        self.name = name
        self.in_params = COMMON_IN + "".join(f", float32 {scalar}" for scalar in scalars)
        self.out_params = "T data, T diff" + "".join(f", T h{k}" for k in range(histories))
        self.source = PROLOGUE + body + EPILOGUE
        self._kernels = {}  # array module -> compiled kernel
        UPDATES.append(self)

    def kernel(self, cupy):
        kernel = self._kernels.get(cupy)
        if kernel is None:
            kernel = self._kernels[cupy] = cupy.ElementwiseKernel(self.in_params, self.out_params, self.source,
                                                                  self.name)
        return kernel

    def __call__(self, cupy, flat, span, rate, grad_scale, weight_decay, l1, scalars):
        """Update elements span[0]:span[1] of FlatParams `flat` with one launch on the current stream."""
        part = slice(*span)
        self.kernel(cupy)(flat.lr_mult[part], flat.decay_mult[part], numpy.float32(rate),
                          numpy.float32(grad_scale), numpy.float32(weight_decay), numpy.int32(l1),
                          *[numpy.float32(s) for s in scalars], flat.data[part], flat.diff[part],
                          *[h[part] for h in flat.history])
