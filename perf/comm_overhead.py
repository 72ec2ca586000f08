"""What collectives.Comm adds to a repeated small call on one rank, without the network: microseconds over
MPI's own call and Python calls in the collectives' own code, for every kind of buffer argument.

    mpiexec -n 1 python -m perf.comm_overhead [--calls 200000]

A 4-byte Reduce on ndarrays, and a 4-byte Bcast on each kind of buffer mpi4py programs pass (an ndarray,
a buffer spec over an mmap as mpi4py's demo/osu_bcast.py passes it, a memoryview, a bytearray, an mmap).
Alternates MPI.COMM_WORLD's method and Comm's on the same arguments (best of 5 loops each, two rounds)
and prints one line per case: both times, their difference, and Comm's Python calls per call (cProfile,
functions defined under collectives/ only).
"""
import argparse
import cProfile
import mmap
import os
import pstats
import time
from pathlib import Path

import numpy
from mpi4py import MPI

import collectives

_OWN_CODE = str(Path(collectives.__file__).resolve().parent) + os.sep


def best_loop_us(call, calls, loops=5):
    for _ in range(1000):
        call()
    best = float("inf")
    for _ in range(loops):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def own_calls(call, calls=100):
    """Python calls per call made to functions defined in the collectives package."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        call()
    profile.disable()
    stats = pstats.Stats(profile).stats
    return sum(n for (filename, _, _), (_, n, _, _, _) in stats.items() if filename.startswith(_OWN_CODE)) / calls


def cases():
    """(name, method name, arguments) of each repeated call."""
    send, recv = numpy.ones(1, numpy.float32), numpy.empty(1, numpy.float32)
    memory = mmap.mmap(-1, 4)
    yield "Reduce ndarray", "Reduce", (send, recv, MPI.SUM, 0)
    yield "Bcast ndarray", "Bcast", (numpy.zeros(4, numpy.uint8), 0)
    yield "Bcast spec [mmap, 4, BYTE]", "Bcast", ([memory, 4, MPI.BYTE], 0)
    yield "Bcast memoryview", "Bcast", (memoryview(bytearray(4)), 0)
    yield "Bcast bytearray", "Bcast", (bytearray(4), 0)
    yield "Bcast mmap", "Bcast", (mmap.mmap(-1, 4), 0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    args = parser.parse_args()
    comm = collectives.Comm(MPI.COMM_WORLD)
    comm.describe()  # set up, so that the methods fetched below are what a repeated call runs
    for name, method, call_args in cases():
        native_method, ours_method = getattr(MPI.COMM_WORLD, method), getattr(comm, method)
        native_call = lambda: native_method(*call_args)  # noqa: E731
        ours_call = lambda: ours_method(*call_args)  # noqa: E731
        native, ours = [], []
        for _ in range(2):
            native.append(best_loop_us(native_call, args.calls))
            ours.append(best_loop_us(ours_call, args.calls))
        print(f"{name:28s} native {min(native):.3f} us  scaffe {min(ours):.3f} us  "
              f"over native {min(ours) - min(native):.3f} us  python_calls={own_calls(ours_call):.0f}")


if __name__ == "__main__":
    main()
