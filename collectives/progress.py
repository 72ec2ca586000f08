"""Runs a communicator's collectives in call order, on a helper thread when they are nonblocking.

Every rank executes its collectives in the order it called them, which MPI requires anyway, so one
FIFO thread per communicator keeps all ranks in step. A nonblocking call returns an `MPI.Grequest`
that the thread completes, so the caller's `Wait`/`Test`/`Waitall` are MPI's own. A blocking call runs
right in the caller's thread when nothing is queued (no hand-off latency), else it queues behind the
pending nonblocking ones and waits.
"""
import queue
import threading

from mpi4py import MPI


class Progress:
    def __init__(self, threaded=True):
        self.threaded = threaded
        self._queue = queue.Queue()
        self._pending = 0
        self._lock = threading.Lock()  # guards _pending
        self._thread = None

    def run(self, work):
        """Run `work()` now, after every earlier nonblocking call has finished."""
        with self._lock:
            idle = self._pending == 0
        if idle:
            work()
            return
        done = threading.Event()
        self._enqueue(work, done.set)
        done.wait()

    def submit(self, work):
        """Start `work()` in the background; returns a request that completes when it has run."""
        request = MPI.Grequest.Start()
        if not self.threaded:
            # Without MPI_THREAD_MULTIPLE a helper thread may not call MPI: run now, complete at once.
            work()
            request.Complete()
            return request
        self._enqueue(work, request.Complete)
        return request

    def _enqueue(self, work, on_done):
        with self._lock:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="scaffe-progress", daemon=True)
                self._thread.start()
        self._queue.put((work, on_done))

    def _loop(self):
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, on_done = item
            work()  # an exception here reaches threading.excepthook: the abort hook ends the job
            with self._lock:
                self._pending -= 1
            on_done()

    def stop(self):
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
