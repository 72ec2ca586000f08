"""The node loops' one wait policy for a flag another process sets in shared memory: spin a little, then
give the core away with sched_yield, then nap.

On an oversubscribed node (more ranks than cores) a busy-wait steals the very core the rank we wait for
needs; sched_yield returns at once when no other process wants the core. Only compiled code spins: a
check there costs nanoseconds, where an interpreted one costs about a microsecond and a spin of a few
dozen of them measurably slowed a 4-rank call on 2 cores (perf/RESULTS.md).
The compiled loop (`_steps.wait`) reads these numbers from SharedWindows.description.
"""
import os
import time

COMPILED_SPINS = 64  # failed checks in compiled code before the first sched_yield: about a microsecond
YIELDS = 2000  # failed checks that yield the core before the waits turn into naps
NAP_US = 20


def wait_until(ready, limit_s=None):
    """Block until ready() is true (interpreted code, so no spinning) and return True; False once `limit_s`
    seconds have passed (None: never)."""
    if ready():
        return True
    for _ in range(YIELDS):
        os.sched_yield()
        if ready():
            return True
    deadline = None if limit_s is None else time.monotonic() + limit_s
    while not ready():
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(NAP_US * 1e-6)
    return True


def wait_for_column(column, target, limit_s, failed):
    """Block until every entry of `column` (a live memoryview of the ranks' counters) reaches `target` and
    return True; return False as soon as an entry of `failed` (the ranks' counters of calls they left with an
    error; None: no rank can fail) reaches it, or after `limit_s` seconds (None: never). The loop makes no
    Python calls of its own: the device path's count of them per call stays what its own code makes."""
    if min(column) >= target:
        return True
    deadline = None if limit_s is None else time.monotonic() + limit_s
    checks = 0
    while min(column) < target:
        if failed is not None and max(failed) >= target:
            return False
        checks += 1
        if checks < YIELDS:
            os.sched_yield()
        else:
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(NAP_US * 1e-6)
    return True
