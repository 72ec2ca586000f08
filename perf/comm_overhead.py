"""What collectives.Comm adds to a repeated 4-byte Reduce on one rank: its latency path, without the network.

    mpiexec -n 1 python -m perf.comm_overhead

Alternates MPI.COMM_WORLD.Reduce and Comm.Reduce on the same arrays (best of 5 loops each) and prints
both times and their difference.
"""
import time

import numpy
from mpi4py import MPI

import collectives


def best_loop_us(reduce, send, recv, calls=200_000, loops=5):
    for _ in range(1000):
        reduce(send, recv, MPI.SUM, 0)
    best = float("inf")
    for _ in range(loops):
        start = time.perf_counter()
        for _ in range(calls):
            reduce(send, recv, MPI.SUM, 0)
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main():
    comm = collectives.Comm(MPI.COMM_WORLD)
    send, recv = numpy.ones(1, numpy.float32), numpy.empty(1, numpy.float32)
    native, ours = [], []
    for _ in range(2):
        native.append(best_loop_us(MPI.COMM_WORLD.Reduce, send, recv))
        ours.append(best_loop_us(comm.Reduce, send, recv))
    print(f"native {min(native):.3f} us  scaffe {min(ours):.3f} us  over native {min(ours) - min(native):.3f} us")


if __name__ == "__main__":
    main()
