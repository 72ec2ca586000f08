"""SoftmaxWithLoss on cupy arrays in four launches (the CUDA C is in kernels/cuda_sources.py, where CI
compiles it): forward's rows, prob and finish kernels write the probabilities, the loss and its
normalizer, and note a bad label on the device; backward writes the gradient. The rows' max and sum, the
parts each rows thread sums and the normalizer stay in `Workspace`, grown once for the largest batch seen."""
import numpy

from kernels.backend import get_array_module
from kernels.cuda_sources import launch_elementwise

MAX_PARTS = 8192  # the most rows threads: the finish sums their parts in one thread, in order


class Workspace:
    """The device arrays of one layer's fused loss: the chunks' parts, the normalizer, and the first bad
    label seen (`check`: seen, label), which the host reads only when it reads results."""

    def __init__(self, xp):
        self.xp = xp
        self.parts = 0
        self.row_max = self.row_sum = None
        self.part_loss = self.part_count = self.part_bad = None
        self.norm = xp.zeros(1, dtype=numpy.float64)
        self.check = xp.zeros(2, dtype=numpy.int64)

    def grow(self, positions, parts, dtype):
        if self.row_max is None or positions > self.row_max.size or self.row_max.dtype != dtype:
            self.row_max, self.row_sum = self.xp.empty(positions, dtype), self.xp.empty(positions, dtype)
        if parts > self.parts:
            xp = self.xp
            self.part_loss, self.part_count = xp.empty(parts, numpy.float64), xp.empty(parts, numpy.float64)
            self.part_bad = xp.empty(2 * parts, numpy.int64)
            self.parts = parts


def forward(x3, labels, ignore_label, count_valid, fixed_norm, prob, top, work):
    """prob = softmax of (outer, channels, inner) `x3`; top[0] = the mean negative log-likelihood of the
    `labels` (outer * inner, x3's dtype) over the normalizer (the valid labels' count if `count_valid`,
    else `fixed_norm`, at least 1)."""
    outer, channels, inner = x3.shape
    positions = outer * inner
    chunk = -(-positions // MAX_PARTS)
    parts = -(-positions // chunk)
    work.grow(positions, parts, x3.dtype)
    has_ignore = ignore_label is not None
    launch_elementwise("scaffe_softmax_loss_rows", x3.dtype, parts, x3, labels, channels, inner, positions, chunk,
                       int(has_ignore), int(ignore_label) if has_ignore else 0, work.row_max, work.row_sum,
                       work.part_loss, work.part_count, work.part_bad)
    launch_elementwise("scaffe_softmax_loss_prob", x3.dtype, x3.size, x3, channels, inner, work.row_max,
                       work.row_sum, prob)
    launch_elementwise("scaffe_softmax_loss_finish", x3.dtype, 1, work.part_loss, work.part_count, work.part_bad,
                       parts, int(count_valid), float(fixed_norm), top, work.norm, work.check)


def backward(prob, labels, ignore_label, top_diff, work, dx):
    """dx = (prob - one-hot label) * loss weight (`top_diff`[0]) / the forward's normalizer, 0 where the
    label is ignored."""
    _, channels, inner = prob.shape
    has_ignore = ignore_label is not None
    launch_elementwise("scaffe_softmax_loss_backward", prob.dtype, prob.size, prob, labels, channels, inner,
                       int(has_ignore), int(ignore_label) if has_ignore else 0, top_diff, work.norm, dx)


def usable(x, labels):
    """Whether the fused kernels take these arrays: cupy's, float32 or float64, labels of x's dtype."""
    return (get_array_module(x) is not numpy and x.dtype in (numpy.float32, numpy.float64)
            and labels.dtype == x.dtype)
