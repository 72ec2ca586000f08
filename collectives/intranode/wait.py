"""The node loops' one wait policy for a flag another process sets in shared memory: spin a little, then
give the core away with sched_yield, then nap.

On an oversubscribed node (more ranks than cores) a busy-wait steals the very core the rank we wait for
needs; sched_yield returns at once when no other process wants the core. Only compiled code spins: a
check there costs nanoseconds, where an interpreted one costs about a microsecond and a spin of a few
dozen of them measurably slowed a 4-rank call on 2 cores (perf/RESULTS.md).
Naps are NAP_US; with SCAFFE_WAIT=nap (collectives.waiting: a host whose ranks leave the cores idle, as the
modelled bed's) each is twice the last, up to the longest that setting allows: a peer that computes for
seconds is then waited for with a few wake-ups, not tens of thousands. There a wait also yields only as
often as an MPI wait does (waiting.YIELDS): with 16 ranks on 2 cores, each of a wait's 2000 yields lets
another rank run, and those yields kept the modelled bed's CPU much busier (perf/RESULTS.md). The
compiled loop (`_steps.wait`) reads these numbers from SharedWindows.description.
"""
import os
import time

from collectives import waiting

COMPILED_SPINS = 64  # failed checks in compiled code before the first sched_yield: about a microsecond
YIELDS = 2000  # failed checks that yield the core before the waits turn into naps
NAP_US = 20  # the first nap


def yields():
    """The failed checks that yield the core before a wait naps: YIELDS, or waiting.YIELDS where waits nap."""
    return waiting.YIELDS if waiting.napping() else YIELDS


def longest_nap_us():
    """NAP_US, or with SCAFFE_WAIT=nap the longest nap it allows (each nap doubles up to it)."""
    return max(NAP_US, int(waiting.longest_nap_s() * 1e6)) if waiting.napping() else NAP_US


def _naps():
    """The sleeps of a wait once its yields are spent: NAP_US, doubling up to longest_nap_us()."""
    return waiting.nap_lengths(NAP_US * 1e-6, longest_nap_us() * 1e-6)


def wait_until(ready, limit_s=None):
    """Block until ready() is true (interpreted code, so no spinning) and return True; False once `limit_s`
    seconds have passed (None: never)."""
    if ready():
        return True
    for _ in range(yields()):
        os.sched_yield()
        if ready():
            return True
    deadline = None if limit_s is None else time.monotonic() + limit_s
    naps = _naps()
    while not ready():
        if deadline is not None and time.monotonic() > deadline:
            return False
        time.sleep(next(naps))
    return True


def wait_for_column(column, target, limit_s, failed, yielding):
    """Block until every entry of `column` (a live memoryview of the ranks' counters) reaches `target` and
    return True; return False as soon as an entry of `failed` (the ranks' counters of calls they left with an
    error; None: no rank can fail) reaches it, or after `limit_s` seconds (None: never); the first `yielding`
    failed checks yield the core (the caller's `yields()`, read once), the rest nap. The loop makes no
    Python calls of its own: the device path's count of them per call stays what its own code makes."""
    if min(column) >= target:
        return True
    deadline = None if limit_s is None else time.monotonic() + limit_s
    checks = 0
    naps = None
    while min(column) < target:
        if failed is not None and max(failed) >= target:
            return False
        checks += 1
        if checks < yielding:
            os.sched_yield()
        else:
            if deadline is not None and time.monotonic() > deadline:
                return False
            naps = naps or _naps()
            time.sleep(next(naps))
    return True
