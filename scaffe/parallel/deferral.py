"""How much of an iteration's gradients the S-Caffe schedule reduces during backward: the budget.

The first `budget` bytes of gradients, in backward order (the top layers), start as their layer's
backward ends; the rest start when backward is over, lowest layer first, and finish while the next
iteration's forward runs: conv1's parameters, needed first, then travel ahead of fc6's tail instead
of behind it, and that tail's reduce, update and broadcast hide behind the next forward's lower layers.

SCAFFE_BACKWARD_BYTES sets the budget; unset, the root measures it each iteration: the bytes the wire
carried per second from the first gradient reduce to the last sum's arrival, times the backward's
duration over that span (what the wire can carry while backward runs). While the wire keeps up with
backward nothing is held back. The root sends the budget with the stop/snapshot flags' Ibcast, so every
rank posts its collectives in the same order.
"""
import time

from collectives.settings import positive_int

UNLIMITED = -1  # the budget's value on the wire when nothing is held back


def backward_bytes():
    """SCAFFE_BACKWARD_BYTES: the budget set by the user, None to measure it."""
    return positive_int("SCAFFE_BACKWARD_BYTES")


class Budget:
    """The root's measure of one iteration's gradient traffic, and the budget it gives the next ones."""

    def __init__(self, fixed, holds=True):
        """`fixed`: the user's budget, None to measure it; `holds` False: nothing is ever held back."""
        self.fixed = fixed if holds else UNLIMITED
        self.value = UNLIMITED if self.fixed is None else self.fixed
        self._first = self._backward_end = None
        self._bytes = 0

    def posted(self, nbytes):
        """A gradient reduce of `nbytes` of the current iteration started."""
        if self._first is None:
            self._first = time.perf_counter()
        self._bytes += nbytes

    def backward_done(self):
        self._backward_end = time.perf_counter()

    def all_arrived(self):
        """Every sum of the iteration is in: its span gives the budget of the iterations to come."""
        if self._first is None or self._backward_end is None:
            return
        wire = time.perf_counter() - self._first
        backward = self._backward_end - self._first
        if self.fixed is None:
            self.value = UNLIMITED if wire <= backward or wire <= 0 else int(self._bytes * backward / wire)
        self._first = self._backward_end = None
        self._bytes = 0
