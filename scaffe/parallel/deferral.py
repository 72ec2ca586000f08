"""How much of an iteration's gradients the S-Caffe and allreduce schedules send during backward: the budget.

The pieces of gradients that fit in `budget` bytes, taken in backward order (the top layers first), start
as their layer's backward ends; the rest start when backward is over, lowest layer first, and finish while the next
iteration's forward runs: conv1's parameters, needed first, then travel ahead of fc6's tail instead
of behind it, and that tail's reduce, update and broadcast hide behind the next forward's lower layers.

SCAFFE_BACKWARD_BYTES sets the budget: a number of bytes, `measured`, or `none` (nothing held back). Unset, it is
measured where a device computes (a GPU, or the compute model of scaffe.modelled), and none on the CPU: there the
collectives share the cores with the layers, the wire's rate measured during backward is the CPU's, and no budget
made AlexNet's iteration faster on the bed (perf/RESULTS.md, "Held buckets for the allreduce schedule, and the
budget's default"), while on the modelled bed, whose compute leaves the CPU idle as a GPU does, the measured budget
made it faster ("Queued collectives started while the device computes"). Measured, rank 0 (the S-Caffe schedule's
root) measures it each iteration from the collectives started during backward, seen as they arrive. If they had not
all arrived when backward ended, the wire was the bottleneck: the budget is what the wire's rate carries in as long
as the backward lasted from the first of them (the other ranks, whose backward may end later, have as long). If they
had, the wire kept up: the budget grows by what that rate carries in the rest of the backward, and at least by the
largest collective (nothing is held once it covers every gradient).

That budget fills the backward, which suits the S-Caffe schedule, whose iteration waits for what it sent. The
allreduce schedule's goes on into the next forward instead (`carried`), where whatever is still in flight delays
the held pieces that forward waits for first, so its budget aims to leave nothing in flight: the first one's bytes
and what the rate carries from its arrival to the backward's end (before that arrival the wire filled: the
collective's way through the nodes and hosts, or a late rank, carrying no more than the first one), and, having
kept up, one collective more. Counted from the first start it left buckets in flight after backward, and grown by
the idle end of the backward it swung between a wire left idle and a large tail; on the S-Caffe schedule the same two
were slower (perf/RESULTS.md, "Nothing but the flags at the end of backward"). Without a rate (fewer than two arrivals) it
doubles, or is what the bytes sent took: `sent * (backward end - first start) / (last arrival - first start)`. The
wire's rate is their bytes over the time the wire spent on each, from when it could begin (it had been started and
the one before had arrived) to its arrival, the first left out. A measurement can only see the wire slower than it
is (a gap it cannot tell from the wire's own time), so the rate used is the largest measured, less RATE_DECAY of it
per iteration since (a link that became slower is believed within tens of iterations; perf/RESULTS.md gives how far
single measurements of one link spread). On a GPU the host queues the backward ahead of the device: the backward is
then timed by events on the compute stream, the latest whose events have completed (the host never waits for them).
Rank 0's budget reaches the other ranks (with the stop/snapshot flags), so every rank holds back the same pieces and
posts its collectives in the same order.
"""
import os
import time

from collectives.settings import positive_int

UNLIMITED = -1  # the budget's value on the wire when nothing is held back
GROWTH_FLOOR = 1 << 20  # a budget that kept up grows to at least this many bytes, even from 0 (doubling)
RATE_DECAY = 0.02  # what the largest wire rate measured loses each iteration it is not measured again


def backward_bytes(on_device):
    """SCAFFE_BACKWARD_BYTES: the budget set by the user; None to measure it ("measured"); UNLIMITED for
    "none". Unset: measured where a device computes (`on_device`), else UNLIMITED."""
    word = os.environ.get("SCAFFE_BACKWARD_BYTES", "").strip().lower()
    if not word:
        return None if on_device else UNLIMITED
    if word == "measured":
        return None
    return UNLIMITED if word == "none" else positive_int("SCAFFE_BACKWARD_BYTES")


class Budget:
    """Rank 0's budget of bytes for each backward, set or measured."""

    def __init__(self, fixed, holds=True, order=None, carried=False):
        """`fixed`: the user's budget, None to measure it; `holds` False: nothing is ever held back; `carried`:
        what is still in flight when backward ends goes on into the next forward (the allreduce schedule's), ahead
        of the held pieces, instead of being waited for (see the module's docstring); `order`:
        the schedule's scaffe.parallel.streams order, whose marks time the backward where the host queues
        ahead of the device (a GPU)."""
        self.fixed = fixed if holds else UNLIMITED
        self.value = UNLIMITED if self.fixed is None else self.fixed
        self.carried = carried
        self._order = order
        self._backward_end = None
        self._marks = [None, None]  # the device's (first start, backward end), where it has marks
        self._timed = []     # such pairs of earlier backwards, not yet completed on the device
        self._window = None  # the latest backward's length as the device ran it
        self._starts = []    # when this backward's collectives started, in order
        self._arrivals = []  # (when seen, bytes) of the same collectives, in the same order
        self.rate = None     # the wire's bytes per second, as measured (see the module's docstring)

    def started(self):
        """A gradient collective of this backward started."""
        if not self._starts and self._order is not None and self.fixed is None:
            self._marks[0] = self._order.mark()
        self._starts.append(time.perf_counter())

    def arrived(self, nbytes):
        """The oldest collective `started` and not yet seen arrived, of `nbytes` of gradients, is complete."""
        self._arrivals.append((time.perf_counter(), nbytes))

    def backward_done(self):
        self._backward_end = time.perf_counter()
        if self._order is not None and self.fixed is None and self._starts:
            self._marks[1] = self._order.mark()

    def measure(self, sent, total, kept_up):
        """Every reduce started during backward (`sent` bytes of this iteration's `total`) has arrived;
        `kept_up`: they had all arrived when backward ended. Sets the budget of the iterations to come."""
        starts, arrivals, self._starts, self._arrivals = self._starts, self._arrivals, [], []
        if self.fixed is not None or self._backward_end is None or (kept_up and self.value == UNLIMITED):
            return
        if not arrivals:  # nothing fitted: the wire waited for the held pieces
            self.value = max(2 * self.value, GROWTH_FLOOR)
            return
        rate = self._believed_rate(_wire_rate(starts, arrivals))
        end = self._backward_end
        if kept_up:
            largest = max(nbytes for _, nbytes in arrivals)
            if rate is None:
                more = max(sent, largest)
            elif self.carried:
                more = largest
            else:
                more = max(int(rate * max(0.0, end - arrivals[-1][0])), largest)
            grown = sent + more
            self.value = UNLIMITED if grown >= total else max(grown, GROWTH_FLOOR)
        elif rate is not None:
            window = self._device_window()
            if self.carried:
                first_at, first_bytes = arrivals[0]
                filling = first_at - starts[0]  # the first one's way through: latency, or a late rank
                carrying = max(0.0, end - first_at if window is None else window - filling)
                self.value = int(first_bytes + rate * carrying)
            else:
                self.value = int(rate * (end - starts[0] if window is None else window))
        else:
            wire = arrivals[-1][0] - starts[0]
            self.value = int(sent * (end - starts[0]) / wire) if wire > 0 else UNLIMITED

    def _device_window(self):
        """The backward's length from its first collective's start, as the device ran it: the latest one
        whose marks have completed (the device runs behind the host: an earlier iteration's, or this one's
        where it has finished); None without marks or before any completed (the host's times then)."""
        marks, self._marks = self._marks, [None, None]
        if None not in marks:
            self._timed = self._timed[-1:] + [marks]  # a device that never reports completion holds two
        while self._timed:
            window = self._order.elapsed(*self._timed[0])
            if window is None:
                break
            self._window = window
            self._timed.pop(0)
        return self._window

    def _believed_rate(self, measured):
        """The largest rate measured, decayed by RATE_DECAY an iteration, or `measured` where larger."""
        if self.rate is not None:
            self.rate *= 1 - RATE_DECAY
        if measured is not None and (self.rate is None or measured > self.rate):
            self.rate = measured
        return self.rate


def _wire_rate(starts, arrivals):
    """Bytes per second on the wire: the collectives' bytes (the first's left out) over the time the wire
    spent on each, from the later of its start and the previous arrival to its own; None without such time."""
    carried = spent = 0.0
    for k in range(1, min(len(starts), len(arrivals))):
        began = max(starts[k], arrivals[k - 1][0])
        if arrivals[k][0] > began:
            carried += arrivals[k][1]
            spent += arrivals[k][0] - began
    return carried / spent if spent > 0 else None
