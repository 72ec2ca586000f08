"""How much of an iteration's gradients the S-Caffe and allreduce schedules send during backward: the budget.

The pieces of gradients that fit in `budget` bytes, taken in backward order (the top layers first), start
as their layer's backward ends; the rest start when backward is over, lowest layer first, and finish while the next
iteration's forward runs: conv1's parameters, needed first, then travel ahead of fc6's tail instead
of behind it, and that tail's reduce, update and broadcast hide behind the next forward's lower layers.

SCAFFE_BACKWARD_BYTES sets the budget. Unset, there is none: nothing is held back (on the bed no budget
made AlexNet's iteration faster: perf/RESULTS.md, "Held buckets for the allreduce schedule, and the
budget's default"). SCAFFE_BACKWARD_BYTES=measured has rank 0 (the S-Caffe schedule's root) measure it
each iteration from the collectives started during backward: if they had all arrived when backward
ended, the wire kept up and the budget doubles (nothing is held once it covers every gradient); if not, the wire
carried them at the rate `bytes / (last arrival - first start)`, and the budget is what that rate carries
during the backward. Rank 0's budget reaches the other ranks (with the stop/snapshot flags), so every
rank holds back the same pieces and posts its collectives in the same order.
"""
import os
import time

from collectives.settings import positive_int

UNLIMITED = -1  # the budget's value on the wire when nothing is held back
GROWTH_FLOOR = 1 << 20  # a budget that kept up grows to at least this many bytes, even from 0


def backward_bytes():
    """SCAFFE_BACKWARD_BYTES: the budget set by the user; None to measure it ("measured"); UNLIMITED unset."""
    if os.environ.get("SCAFFE_BACKWARD_BYTES", "").strip().lower() == "measured":
        return None
    value = positive_int("SCAFFE_BACKWARD_BYTES")
    return UNLIMITED if value is None else value


class Budget:
    """Rank 0's budget of bytes for each backward, set or measured."""

    def __init__(self, fixed, holds=True):
        """`fixed`: the user's budget, None to measure it; `holds` False: nothing is ever held back."""
        self.fixed = fixed if holds else UNLIMITED
        self.value = UNLIMITED if self.fixed is None else self.fixed
        self._first = self._backward_end = None

    def started(self):
        """A gradient reduce of this backward started."""
        if self._first is None:
            self._first = time.perf_counter()

    def backward_done(self):
        self._backward_end = time.perf_counter()

    def measure(self, sent, total, kept_up):
        """Every reduce started during backward (`sent` bytes of this iteration's `total`) has arrived;
        `kept_up`: they had all arrived when backward ended. Sets the budget of the iterations to come."""
        first, self._first = self._first, None
        if self.fixed is not None or first is None or self._backward_end is None:
            return
        if kept_up:
            grown = max(2 * sent, GROWTH_FLOOR)
            self.value = UNLIMITED if self.value == UNLIMITED or grown >= total else grown
        else:
            wire = time.perf_counter() - first
            self.value = max(0, int(sent * (self._backward_end - first) / wire)) if wire > 0 else UNLIMITED
