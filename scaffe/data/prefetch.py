"""Prefetcher: a daemon thread that prepares batches ahead of the consumer.

The producer function runs in the thread; its results go through a bounded queue in order.
An exception in the producer is handed to the consumer and raised from `next()` (with the
producer's traceback chained), so a broken database fails the training step instead of hanging it.
Reading LMDB, decoding and numpy copies release the GIL, so the thread overlaps with compute.
"""
import queue
import threading

from scaffe import timeline

__all__ = ["Prefetcher", "PrefetchError"]


class PrefetchError(RuntimeError):
    """Raised in the consumer when the producer thread failed; `__cause__` is the original error."""


class _Failure:
    __slots__ = ("error",)

    def __init__(self, error):
        self.error = error


class Prefetcher:
    """Calls `produce()` repeatedly in a daemon thread, keeping up to `depth` results ready."""

    def __init__(self, produce, depth=4, name="scaffe-prefetch"):
        if depth < 1:
            raise ValueError(f"prefetch depth must be at least 1, got {depth}")
        self._produce = produce
        self.name = name
        self._queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._failed = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                item = self._produce()
            except BaseException as e:  # handed to the consumer, who decides what is fatal
                item = _Failure(e)
            # Waiting with a timeout lets close() stop a producer blocked on a full queue.
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, _Failure):
                return

    def next(self, timeout=None):
        """The next batch, in production order; re-raises a producer failure as PrefetchError."""
        if self._failed is not None:
            raise PrefetchError(f"the prefetch thread failed earlier: {self._failed}") from self._failed
        with timeline.waiting("data", self.name):
            while True:
                try:
                    item = self._queue.get(timeout=0.5 if timeout is None else timeout)
                    break
                except queue.Empty:
                    if timeout is not None:
                        raise TimeoutError(f"no batch ready after {timeout} s") from None
                    if not self._thread.is_alive() and self._queue.empty():
                        raise PrefetchError("the prefetch thread stopped without producing a batch")
        if isinstance(item, _Failure):
            self._failed = item.error
            raise PrefetchError(f"the prefetch thread failed: {type(item.error).__name__}: {item.error}") from item.error
        return item

    __next__ = next

    def __iter__(self):
        return self

    def close(self):
        """Stops the thread and drops prepared batches (idempotent)."""
        self._stop.set()
        while True:
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    @property
    def alive(self):
        return self._thread.is_alive()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
