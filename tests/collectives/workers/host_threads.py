"""Two communicators of one process, each calling from a thread of its own, as the S-Caffe schedule's two do
from their progress threads, on host buffers through the compiled node loop.

    SCAFFE_REDUCE_ALGO=hierarchical mpiexec -n 2 python host_threads.py [--rounds 12]

One thread reduces long vectors while the other reduces short ones, with the loop's cache of per-size tables
cut to one entry, so the short calls push the long call's table out of the cache while its loop reads it
(where nothing else held it, its memory was reused under the loop). Results are checked exactly.
"""
import argparse
import functools

import numpy
from mpi4py import MPI

from collectives.intranode import protocol
from worker_util import Worker, contribution, expected_reduction


def calls(w, comm, sizes, seed):
    """An Allreduce on `comm` of each size of `sizes`, checked."""
    for k, n in enumerate(sizes):
        inputs = [contribution("sum", numpy.int64, n, r, seed + k) for r in range(w.size)]
        recv = numpy.empty(n, numpy.int64)
        comm.Allreduce(inputs[w.rank], recv, MPI.SUM)
        w.check(recv, expected_reduction("sum", inputs), f"thread {seed}'s call {k} ({n} elements)")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    # A cache of one entry: every call of the other thread pushes a call's table out while its loop runs.
    protocol.starts = functools.lru_cache(maxsize=1)(protocol.starts.__wrapped__)
    w = Worker()
    w.case("two communicators, a thread each, on sizes the other does not use")
    long_sizes = [(1 << 20) + k for k in range(args.rounds)]
    short_sizes = [1 + k % 200 for k in range(100 * args.rounds)]  # a new size at nearly every call
    comms = w.each_on_its_communicator([(calls, (long_sizes, 0)), (calls, (short_sizes, 1000))])
    w.check_true(min(c.shm.compiled_calls for c in comms) >= args.rounds, "calls did not take the compiled loop")
    comms[1].Free()
    w.done("host-threads")


if __name__ == "__main__":
    main()
