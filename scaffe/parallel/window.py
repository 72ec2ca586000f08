"""At most SCAFFE_REQUESTS_IN_FLIGHT of a schedule's collectives in flight on each communicator.

A schedule may start hundreds of small collectives in one backward (a layer cut into small pieces, messages
of one piece): MPICH over UCX hung with about 200 small Ibcasts outstanding whose root posted late
(plain mpi4py reproduces it). So each communicator gets a window: a collective beyond it waits in a FIFO
queue and starts, in the order it was asked for, when an earlier one of its communicator has completed.
Starting never blocks: a rank that blocked there could be the one another rank waits for (the S-Caffe
root posts a piece's broadcast only after its update, which needs the reduces of the others, who may be
waiting for room on their propagation communicator).

Every wait of a schedule goes through `Windows.wait`: while what it waits for is not complete, it starts
whatever has room on any communicator and blocks until the oldest collective of some communicator
completes. A rank blocked on one communicator with a collective queued on another could otherwise wait
for a rank that waits for that queued one. Completion within a communicator is in start order
(collectives.progress runs each communicator's calls in turn), so the oldest is the one to watch. While a
modelled device computes, its waits keep the windows moving too (`advance`): a queued collective left until
the next layer's hook would leave the wire idle through that layer's compute.
"""
import collections

from collectives import waiting
from collectives.settings import positive_int
from scaffe.parallel.streams import Started

# The least that was as fast as no bound for LeNet cut into 20000-byte messages (perf/RESULTS.md,
# "Requests in flight").
REQUESTS_IN_FLIGHT = 32


def requests_in_flight():
    """SCAFFE_REQUESTS_IN_FLIGHT: the most collectives a schedule has started and not seen complete, per
    communicator (default 32)."""
    return positive_int("SCAFFE_REQUESTS_IN_FLIGHT", REQUESTS_IN_FLIGHT)


class Posted:
    """A collective asked of a window: `handle` is its request (MPI's, or a streams.Started) once started."""
    __slots__ = ("handle", "_start", "_window")

    def __init__(self, start, window):
        self._start, self._window, self.handle = start, window, None

    def Test(self):
        """MPI's Test, starting what has room first: False while this one is queued."""
        self._window.advance()
        return self.handle is not None and self.handle.Test()


class Window:
    """One communicator's collectives: the started ones not yet seen complete, then the queued ones."""
    __slots__ = ("limit", "flight", "queued")

    def __init__(self, limit):
        self.limit = limit
        self.flight = collections.deque()
        self.queued = collections.deque()

    def advance(self):
        """Forget the completed collectives at the front; start queued ones while there is room."""
        flight, queued = self.flight, self.queued
        while flight and flight[0].handle.Test():
            flight.popleft()
        while queued and len(flight) < self.limit:
            posted = queued.popleft()
            posted.handle = posted._start()
            flight.append(posted)

    def oldest(self):
        """The MPI request of the oldest collective still in flight, or None."""
        if not self.flight:
            return None
        handle = self.flight[0].handle
        return handle.request() if isinstance(handle, Started) else handle


class Windows:
    """A schedule's windows, one per communicator, over `order` (scaffe.parallel.streams), which starts
    each collective after the events it must follow."""

    def __init__(self, order, limit=None):
        self.order = order
        self.limit = requests_in_flight() if limit is None else limit
        self._windows = {}  # id of a communicator (kept alive by its schedule) -> Window

    def start(self, comm, work, after=None, label=None):
        """`order.start(work, after, label)` (a collective on `comm`) now, or once `comm` has room; returns
        its Posted. Every nonblocking collective of `comm` must come through here, so that all start in program
        order; the schedules' blocking ones (the first broadcast, sharded tests) come when everything asked for
        has been waited for, so nothing is queued."""
        window = self._windows.get(id(comm))  # mpi4py communicators are not hashable
        if window is None:
            window = self._windows[id(comm)] = Window(self.limit)
        posted = Posted(lambda: self.order.start(work, after, label), window)
        window.queued.append(posted)
        window.advance()
        return posted

    def advance(self):
        """Start, on every communicator, the queued collectives that have room now: called at each wait, and
        while a modelled device computes, as a GPU's host thread waits in `wait` while it does."""
        for window in self._windows.values():
            window.advance()

    def wait(self, handles):
        """Until every request of `handles` (Posted, MPI requests or Started) has completed, keeping every
        window moving."""
        handles = [handle for handle in handles if handle is not None]
        while True:
            self.advance()
            if not any(window.queued for window in self._windows.values()):
                break  # everything asked for has started: MPI's own Waitall suffices
            if all(_started(handle) and _request(handle).Test() for handle in handles):
                return
            oldest = [window.oldest() for window in self._windows.values() if window.flight]
            # A null one completed in the Tests just above (they free what they see complete): the next
            # `advance` gives its room to a queued collective.
            if all(oldest):
                waiting.wait_any(oldest)
        waiting.wait_all([_request(handle) for handle in handles])


def _started(handle):
    return not isinstance(handle, Posted) or handle.handle is not None


def _request(handle):
    """The MPI request behind a started handle."""
    if isinstance(handle, Posted):
        handle = handle.handle
    return handle.request() if isinstance(handle, Started) else handle
