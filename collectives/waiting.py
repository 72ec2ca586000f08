"""How a rank waits for MPI requests: MPI's own wait, or, with SCAFFE_WAIT=nap (or nap:MS), a loop of Tests that
gives the core away.

MPICH's Wait spins on its core until the request completes: the lowest latency where every rank has a core
of its own. Where ranks share cores with each other and with the TCP stack (an oversubscribed host, the bed
of perf/cluster_sim.py, whose modelled GPUs leave the CPU idle), a spinning waiter takes the core that the
rank it waits for, or the kernel moving its bytes, needs, and every waiting rank looks busy. The nap loop
yields the core for a while (sched_yield returns at once when nobody wants it) and then sleeps between Tests,
each nap twice the last, up to 1 ms (MS ms): a wait's naps cost CPU in proportion to its length, so a
slowed-down bed (perf/cluster_sim.py's dilation D) sets the longest nap D times longer.
"""
import functools
import os
import time

from mpi4py import MPI

from collectives.settings import wait_policy

YIELDS = 100  # failed Tests that yield the core before the waits turn into naps
NAP_S = 50e-6  # the first nap; each next one twice as long, up to the longest SCAFFE_WAIT allows


@functools.cache
def _policy():
    return wait_policy()


def napping():
    """Whether waits nap (SCAFFE_WAIT=nap), read once per process."""
    return _policy()[0] == "nap"


def longest_nap_s():
    """The longest nap SCAFFE_WAIT=nap[:MS] allows (None where waits spin)."""
    return _policy()[1]


def wait_all(requests):
    """Until every request of `requests` (MPI requests, REQUEST_NULL allowed) has completed."""
    pending = [request for request in requests if request]
    if not napping():
        # Completed ones (REQUEST_NULL) are left out: MPICH's Waitall asserts on a list holding both a null
        # request and a generalized one still in progress.
        if pending:
            MPI.Request.Waitall(pending)
        return
    naps = _naps()
    for request in pending:  # completion within a communicator is in order: the first is the one to watch
        while not request.Test():
            next(naps)


def wait(request):
    wait_all([request])


def complete(blocking, nonblocking, *args):
    """One MPI collective to its end: `blocking(*args)`, or under SCAFFE_WAIT=nap `nonblocking(*args)` waited
    for with naps (MPI's blocking calls spin on the core)."""
    if napping():
        return wait(nonblocking(*args))
    return blocking(*args)


def wait_any(requests):
    """Until one of `requests` (none null) has completed."""
    if not requests:
        raise ValueError("wait_any: no request to wait for (it would never return)")
    if not napping():
        MPI.Request.Waitany(requests)
        return
    naps = _naps()
    while not any(request.Test() for request in requests):
        next(naps)


def nap_lengths(first_s, longest_s):
    """The seconds of each nap of a wait: `first_s`, then each twice the last, up to `longest_s`."""
    nap = min(first_s, longest_s)
    while True:
        yield nap
        nap = min(2 * nap, longest_s)


def _naps():
    """Each step gives the core away: YIELDS yields, then naps from NAP_S doubling to the longest allowed."""
    for _ in range(YIELDS):
        yield os.sched_yield()
    for nap in nap_lengths(NAP_S, longest_nap_s()):
        yield time.sleep(nap)
