"""Runs a communicator's collectives in call order, on a helper thread when they are nonblocking.

Every rank executes its collectives in the order it called them, which MPI requires anyway, so one
FIFO thread per communicator keeps all ranks in step. A nonblocking call returns an `MPI.Grequest`
that the thread completes, so the caller's `Wait`/`Test`/`Waitall` are MPI's own; work that raises
completes its request with the error, which `Wait`/`Test` raise (and `Waitall` reports as an MPI error),
and the thread goes on with the next call. A nonblocking call that MPI runs itself (`follow`) returns
MPI's own request when it is small (DIRECT_BYTES); a larger one is waited for by whichever comes first: the
caller's own `Wait`, in the caller's thread, or the helper thread in turn; handing a call to another thread
and back costs 100-200 us on a small VM (perf/RESULTS.md, "Nonblocking calls MPI runs, waited for by their
caller"). A blocking call runs right in the caller's thread when nothing is queued (no hand-off latency),
else it queues behind the pending nonblocking ones and waits. Each call is reported to
`collectives.events` from the thread that runs it, when it starts running and when it has finished.

The helper thread works on the GPU of the thread that started it (`current_device`): a new thread has
no current device, and CUDA would give it GPU 0's context, another rank's GPU on a multi-GPU host.
"""
import os
import queue
import sys
import threading

from mpi4py import MPI

from collectives import waiting
from collectives.events import listeners, reported, started_unwaited

# The largest nonblocking call MPI runs that goes back to its caller as MPI's own request, waited for by the
# caller's own MPI calls: a generalized request and a helper thread's wake-up cost 40-120 us a call on a small VM
# (perf/RESULTS.md, "Small nonblocking calls: MPI's own request"). A larger one is waited for by the helper
# thread, whose waits move MPI's schedule while the caller computes.
DIRECT_BYTES = 64 << 10


def handed_back(nbytes):
    """Whether a nonblocking call MPI runs on `nbytes` goes back to its caller as MPI's own request (where no
    listener waits to hear of its end)."""
    return nbytes <= DIRECT_BYTES


class Progress:
    def __init__(self, threaded=True):
        self.threaded = threaded
        self._queue = queue.Queue()
        self._pending = 0
        self._lock = threading.Lock()  # guards _pending
        self._thread = None

    def run(self, work, name, nbytes):
        """Run `work()` now, after every earlier nonblocking call has finished."""
        with self._lock:
            idle = self._pending == 0
        if idle:
            reported(name, nbytes, work)
            return
        done = QueuedCall()
        self._enqueue(work, name, nbytes, done)
        done.wait()

    def submit(self, work, name, nbytes):
        """Start `work()` in the background; returns a request that completes when it has run."""
        if not self.threaded:
            # Without MPI_THREAD_MULTIPLE a helper thread may not call MPI: run now, complete at once.
            reported(name, nbytes, work)
            request = MPI.Grequest.Start()
            request.Complete()
            return request
        request = Request.started()
        self._enqueue(work, name, nbytes, request)
        return request

    def follow(self, native_request, name, nbytes):
        """A request that completes with `native_request` (an MPI I* call already started), waited for
        and reported by the caller's own `Wait`, or by the thread in turn (a caller blocked in Waitall
        on it is then seen by the stall inspector). Without a thread, and for a small call nobody listens
        to, it is `native_request` itself (see DIRECT_BYTES)."""
        if not self.threaded:
            return native_request
        if handed_back(nbytes) and not listeners:
            started_unwaited(name, nbytes, native_request)
            return native_request
        request = Request.started()
        work = lambda: waiting.wait(native_request)  # noqa: E731
        request.followed, request.progress = (work, name, nbytes), self
        self._enqueue(work, name, nbytes, request)
        return request

    def taken(self, request, by_caller):
        """Whether the caller's thread (`by_caller`) or this one may wait for followed `request`: the
        first to ask; a caller's claim counts the call off the pending ones."""
        with self._lock:
            if request.taker is not None:
                return False
            request.taker = "caller" if by_caller else "thread"
            if by_caller:
                self._pending -= 1
            return True

    def _enqueue(self, work, name, nbytes, completion):
        with self._lock:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, args=(current_device(),), name="scaffe-progress",
                                                daemon=True)
                self._thread.start()
        self._queue.put((work, name, nbytes, completion))

    def _loop(self, device):
        use_device(device)
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, name, nbytes, completion = item
            if not completion.helped(self):
                continue  # a followed call its caller waited for itself
            error = _ran(work, name, nbytes)
            with self._lock:
                self._pending -= 1
            completion.finish(error)

    def stop(self):
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None


class QueuedCall:
    """What a blocking call queued behind nonblocking ones waits on: `wait()` raises the error of its work."""
    __slots__ = ("_done", "_error")

    def __init__(self):
        self._done = threading.Event()
        self._error = None

    def finish(self, error):
        self._error = error
        self._done.set()

    @staticmethod
    def helped(progress):
        return True

    def wait(self):
        self._done.wait()
        if self._error is not None:
            raise self._error


class Request(MPI.Grequest):
    """A nonblocking call's request: MPI's generalized request, so that `Waitall`/`Testall` take it, whose
    `Wait`/`Test` raise the error its work raised. `Waitall` can report one only as an MPI error code: it
    raises MPI's error, and mpi4py prints the work's traceback."""

    def __init__(self, request=None):  # mpi4py's __new__ takes over `request`'s handle
        self.error = None
        self._raising = False  # inside our own Wait/Test, which raise `error` themselves
        # A followed call's (work, name, nbytes) (Progress.follow), its Progress, and who waits for it.
        self.followed = self.progress = self.taker = None

    @classmethod
    def started(cls):
        request = None

        def query(status):
            if request.error is not None and not request._raising:
                raise request.error

        request = cls(MPI.Grequest.Start(query))
        return request

    def finish(self, error):
        """Complete the request (in the progress thread), with `error` if the work raised."""
        self.error = error
        self.Complete()

    def helped(self, progress):
        """Whether the progress thread runs this request's work (not a followed one its caller took)."""
        return self.followed is None or progress.taken(self, by_caller=False)

    def Wait(self, status=None):
        if self.followed is not None and self.taker is None and self.progress.taken(self, by_caller=True):
            self.finish(_ran(*self.followed))  # waited for here, reported as the thread would
        self._raising = True
        try:
            super().Wait(status)
        finally:
            self._raising = False
        self._raise_error()
        return True

    def Test(self, status=None):
        self._raising = True
        try:
            done = super().Test(status)
        finally:
            self._raising = False
        if done:
            self._raise_error()
        else:
            # A caller polling Test in a loop would hold the GIL the progress thread needs to finish the
            # work (it gets it only at the interpreter's switch interval, 5 ms): hand it over, and the core.
            os.sched_yield()
        return done

    def _raise_error(self):
        error, self.error = self.error, None
        if error is not None:
            raise error


def _ran(work, name, nbytes):
    """Run `work()`, reported to collectives.events; the error it raised (which its caller raises where it
    waits for the call), or None."""
    try:
        reported(name, nbytes, work)
    except BaseException as raised:
        return raised
    return None


def current_device():
    """The id of this thread's CUDA device when the process uses cupy, else None (nothing to carry)."""
    if "cupy" not in sys.modules:  # a host-only program never pays for importing cupy here
        return None
    from kernels.backend import cupy_or_none
    cupy = cupy_or_none()
    return None if cupy is None else cupy.cuda.Device().id


def use_device(device):
    """Make CUDA device `device` (from `current_device`, maybe None) current in this thread."""
    if device is not None:
        sys.modules["cupy"].cuda.Device(device).use()
