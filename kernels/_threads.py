"""Splits a CPU kernel call over threads: each compiled kernel (kernels.native; the GIL is let go) takes a
[first, last) range.

Why not numba's `parallel=True`: every parallel kernel then needs a parfor twin, which is slow to
compile (seconds each, per dtype and per specialized window size), and a parfor region cannot be
skipped for small inputs. A plain thread pool over nogil kernels runs the same compiled code serially
or in parallel, decided per call from the amount of work.
"""
import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor


# Below this many elements a call finishes in tens of microseconds, less than handing work to another
# thread costs (and on a loaded machine a parallel call can wait milliseconds for a busy core).
PARALLEL_MIN_WORK = 1 << 15

_executor = None
_executor_pid = None
_executor_lock = threading.Lock()


@functools.cache
def num_threads():
    """Threads for kernels: NUMBA_NUM_THREADS, read once as numba does, else the cores this process may run on."""
    try:
        return max(1, int(os.environ["NUMBA_NUM_THREADS"]))
    except (KeyError, ValueError):
        return max(1, len(os.sched_getaffinity(0)))


def parallel_parts(work, units):
    """Number of shares to split `units` independent work units (rows, planes) into."""
    if work < PARALLEL_MIN_WORK:
        return 1
    return max(1, min(num_threads(), units))


def _pool(workers):
    global _executor, _executor_pid
    with _executor_lock:
        # A forked child inherits the executor object but not its threads: start a fresh one there.
        if _executor is None or _executor_pid != os.getpid() or _executor._max_workers < workers:
            _executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kernels-split")
            _executor_pid = os.getpid()
        return _executor


def run_split(kernel, args, units, work):
    """kernel(*args, first, last) over [0, units), split into shares when `work` (elements) is large.

    The calling thread runs the first share itself; the kernel must release the GIL (nogil=True) and
    shares must not write the same memory.
    """
    parts = parallel_parts(work, units)
    if parts == 1:
        kernel(*args, 0, units)
        return
    pool = _pool(parts - 1)
    bounds = [units * p // parts for p in range(parts + 1)]
    futures = [pool.submit(kernel, *args, bounds[p], bounds[p + 1]) for p in range(1, parts)]
    try:
        kernel(*args, bounds[0], bounds[1])
    finally:
        for f in futures:
            f.result()
