"""Waiting on a flag another process sets in shared memory, without spinning a core away from it.

On an oversubscribed node (more ranks than cores) a busy-wait steals the very core the rank we wait for
needs. So: a short spin for the fast case, then sched_yield, then short sleeps.
"""
import os
import time

_SPINS = 64
_YIELDS = 2000
_SLEEP_S = 20e-6


def wait_until(ready):
    """Block until ready() is true."""
    if ready():
        return
    for _ in range(_SPINS):
        if ready():
            return
    for _ in range(_YIELDS):
        os.sched_yield()
        if ready():
            return
    while not ready():
        time.sleep(_SLEEP_S)
