"""Runs a communicator's collectives in call order, on a helper thread when they are nonblocking.

Every rank executes its collectives in the order it called them, which MPI requires anyway, so one
FIFO thread per communicator keeps all ranks in step. A nonblocking call returns an `MPI.Grequest`
that the thread completes, so the caller's `Wait`/`Test`/`Waitall` are MPI's own; work that raises
completes its request with the error, which `Wait`/`Test` raise (and `Waitall` reports as an MPI error),
and the thread goes on with the next call. A nonblocking call that MPI runs itself (`follow`) returns
MPI's own request: handing a call to another thread and back costs far more than MPI's call on a small VM
(perf/RESULTS.md, "Small nonblocking calls: MPI's own request", "Large nonblocking calls: MPI's own request,
nudged"). MPI moves a large one only inside MPI calls, so while one is outstanding the process's `Nudge` thread
probes MPI now and then, and the transfer goes on while the caller computes. Only where event listeners must
hear its end is it waited for by whichever comes first: the caller's own `Wait`, in the caller's thread, or the
helper thread in turn. A blocking call runs right in the caller's thread when nothing is queued (no hand-off
latency), else it queues behind the pending nonblocking ones and waits. Each call is reported to
`collectives.events` from the thread that runs it, when it starts running and when it has finished.

The helper thread works on the GPU of the thread that started it (`current_device`): a new thread has
no current device, and CUDA would give it GPU 0's context, another rank's GPU on a multi-GPU host.
"""
import atexit
import os
import queue
import sys
import threading
import time

from mpi4py import MPI

from collectives import waiting
from collectives.events import listeners, reported, started_unwaited

# Above this, a nonblocking call MPI runs is nudged (Nudge) until its caller has waited for it; a smaller one
# takes MPI less time than the Nudge takes to look (perf/RESULTS.md, "Large nonblocking calls: MPI's own request,
# nudged").
NUDGED_ABOVE = 64 << 10
# How often the Nudge thread looks at the requests it watches (a wake-up takes a core from the ranks on a
# small host), and how often it probes MPI while one has stayed outstanding for a whole look. It goes on looking
# for NUDGE_IDLE_LOOKS looks after the last was freed: a caller posting again in that time need not wake it, which
# showed on every call of a loop (perf/RESULTS.md, "Large nonblocking calls: MPI's own request, nudged").
NUDGE_LOOK_S = 1e-3
NUDGE_PROBE_S = 50e-6
NUDGE_IDLE_LOOKS = 20
NUDGE_TAG = 32766  # a tag nobody sends on a probed communicator (every MPI allows tags up to 32767)


def nudged(nbytes):
    """Whether a nonblocking call MPI runs on `nbytes` is nudged while outstanding (Progress.nudge)."""
    return nbytes > NUDGED_ABOVE


class Progress:
    def __init__(self, threaded=True, probed=None):
        """`probed`: a communicator private to this one that `Nudge` may probe (needed where `threaded`)."""
        self.threaded = threaded
        self.probed = probed
        self._queue = queue.Queue()
        self._pending = 0
        self._lock = threading.Lock()  # guards _pending
        self._thread = None
        self.free_since = 0.0  # perf_counter() when the thread finished its last work

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
        """The request a nonblocking call MPI runs (`native_request`, already started) returns: itself, nudged
        while it is large and outstanding, unless listeners must hear its end; then one that completes with
        it, waited for and reported by the caller's own `Wait`, or by the thread in turn (a caller blocked in
        Waitall on it is then seen by the stall inspector)."""
        if not (self.threaded and listeners):
            started_unwaited(name, nbytes, native_request)
            if nudged(nbytes):
                self.nudge(native_request)
            return native_request
        request = Request.started()
        work = lambda: waiting.wait(native_request)  # noqa: E731
        request.followed, request.progress = (work, name, nbytes), self
        self._enqueue(work, name, nbytes, request)
        return request

    def nudge(self, native_request):
        """Have MPI probed while `native_request`, a large call's that goes back to its caller, is outstanding."""
        if self.threaded:  # else no other thread may call MPI
            NUDGE.watch(self.probed, native_request)

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
            self.free_since = time.perf_counter()

    def stop(self):
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        if self.probed is not None:
            NUDGE.forget(self.probed)


class Nudge:
    """Probes MPI while large nonblocking calls that went back to their callers as MPI's own requests are
    outstanding, so that MPI moves their data while the callers compute, as a helper thread waiting for them
    did. One thread per process (MPI's progress is the process's): it looks at the requests every NUDGE_LOOK_S,
    and where the oldest has stayed outstanding for a whole look, its caller is busy elsewhere, and it probes
    MPI every NUDGE_PROBE_S until that one is freed (with SCAFFE_WAIT=nap it probes as waits nap, and looks no
    more often than the longest nap). A caller waiting at once has its request freed before a look finds it
    twice, and meets no probe in its way. It never calls MPI on the callers' requests (a caller may be freeing
    one): it reads whether they are null, and probes a communicator of its own for a message nobody sends."""

    def __init__(self):
        self._watched = []  # (probed communicator, request) in the order started; callers append
        self._lock = threading.Lock()  # one sweep of _watched at a time, and no probe of a communicator being freed
        self._wake = threading.Event()
        self._thread = None
        self._stopping = False

    def watch(self, probed, request):
        self._watched.append((probed, request))
        if not self._wake.is_set():
            self._wake.set()
            if self._thread is None:
                self._start()

    def forget(self, probed):
        """Stop probing `probed`, which is about to be freed."""
        with self._lock:
            self._keep(lambda entry: entry[0] is not probed)

    def _start(self):
        with self._lock:
            if self._thread is None and not self._stopping:
                self._thread = threading.Thread(target=self._loop, name="scaffe-nudge", daemon=True)
                self._thread.start()
                atexit.register(self._stop)  # before mpi4py's MPI_Finalize, which the thread must not outlive

    def _loop(self):
        seen = None  # the oldest outstanding request at the last look
        idle = 0  # looks in a row that found none
        probes = None  # the waits between probes of `seen`
        look = _look_s()
        while True:
            oldest = self._oldest()
            if self._stopping:
                return
            if oldest is None:
                seen = None
                idle += 1
                if idle <= NUDGE_IDLE_LOOKS:
                    time.sleep(look)
                    continue
                self._wake.clear()
                if not self._watched:
                    self._wake.wait()
                continue
            idle = 0
            if oldest[1] is not seen:
                seen, probes = oldest[1], _probe_intervals()
                time.sleep(look)
                continue
            with self._lock:
                if self._watched and self._watched[0] is oldest:
                    self._probe(oldest[0])
            time.sleep(next(probes))

    def _oldest(self):
        """The oldest watched request not yet freed, with its communicator (None if there is none); drops the
        freed ones."""
        with self._lock:
            self._keep(lambda entry: entry[1])
            return self._watched[0] if self._watched else None

    def _keep(self, keep):
        """Drop the watched entries `keep` refuses (with the lock held); callers may append meanwhile."""
        watched = self._watched
        taken = watched[:]  # entries appended meanwhile come after these, and stay
        watched[:len(taken)] = [entry for entry in taken if keep(entry)]

    def _probe(self, probed):
        try:
            probed.Iprobe(probed.Get_rank(), NUDGE_TAG)
        except Exception:  # a communicator MPI found broken: its callers hear of it from their own calls
            self._keep(lambda entry: entry[0] is not probed)

    def _stop(self):
        with self._lock:
            self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join()


def _look_s():
    """How often the Nudge looks: NUDGE_LOOK_S, or where waits nap (SCAFFE_WAIT=nap), the longest nap if that is
    longer (a slowed-down bed's ranks, many to a core, would otherwise each wake a thousand times a second)."""
    return max(NUDGE_LOOK_S, waiting.longest_nap_s()) if waiting.napping() else NUDGE_LOOK_S


def _probe_intervals():
    """The Nudge's waits between probes of one request: NUDGE_PROBE_S, or where waits nap (SCAFFE_WAIT=nap), as
    their naps do, each twice the last up to the longest (a slowed-down bed counts the CPU they take)."""
    longest = waiting.longest_nap_s() if waiting.napping() else NUDGE_PROBE_S
    return waiting.nap_lengths(NUDGE_PROBE_S, longest)


NUDGE = Nudge()


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
