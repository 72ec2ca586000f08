"""Runs a communicator's collectives in call order, on a helper thread when they are nonblocking.

Every rank executes its collectives in the order it called them, which MPI requires anyway, so one
FIFO thread per communicator keeps all ranks in step. A nonblocking call returns an `MPI.Grequest`
that the thread completes, so the caller's `Wait`/`Test`/`Waitall` are MPI's own. A blocking call runs
right in the caller's thread when nothing is queued (no hand-off latency), else it queues behind the
pending nonblocking ones and waits. Each call is reported to `collectives.events` from the thread that
runs it, when it starts running and when it has finished.

The helper thread works on the GPU of the thread that started it (`current_device`): a new thread has
no current device, and CUDA would give it GPU 0's context, another rank's GPU on a multi-GPU host.
"""
import queue
import sys
import threading

from mpi4py import MPI

from collectives.events import reported


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
        done = threading.Event()
        self._enqueue(work, name, nbytes, done.set)
        done.wait()

    def submit(self, work, name, nbytes):
        """Start `work()` in the background; returns a request that completes when it has run."""
        request = MPI.Grequest.Start()
        if not self.threaded:
            # Without MPI_THREAD_MULTIPLE a helper thread may not call MPI: run now, complete at once.
            reported(name, nbytes, work)
            request.Complete()
            return request
        self._enqueue(work, name, nbytes, request.Complete)
        return request

    def follow(self, native_request, name, nbytes):
        """A request that completes with `native_request` (an MPI I* call already started), which the
        thread waits on in turn, so that its completion is reported: a caller blocked in Waitall on it
        is then seen by the stall inspector. Without a thread it is `native_request` itself."""
        if not self.threaded:
            return native_request
        return self.submit(native_request.Wait, name, nbytes)

    def _enqueue(self, work, name, nbytes, on_done):
        with self._lock:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, args=(current_device(),), name="scaffe-progress",
                                                daemon=True)
                self._thread.start()
        self._queue.put((work, name, nbytes, on_done))

    def _loop(self, device):
        use_device(device)
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, name, nbytes, on_done = item
            reported(name, nbytes, work)  # an exception here reaches threading.excepthook: the abort hook ends the job
            with self._lock:
                self._pending -= 1
            on_done()

    def stop(self):
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None


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
