"""How many threads a CPU kernel call should use: one for small calls, numba's pool size for large ones."""
import numba

# Below this many output elements a call finishes in tens of microseconds, less than it takes to wake
# numba's thread pool (and on a loaded machine a parallel call can wait milliseconds for a busy core).
PARALLEL_MIN_WORK = 1 << 15


def parallel_parts(work, units):
    """Number of shares to split `units` independent work units (rows, planes) into."""
    if work < PARALLEL_MIN_WORK:
        return 1
    return max(1, min(numba.get_num_threads(), units))
