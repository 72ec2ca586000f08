"""OSU-style MPI_Allreduce latency: `mpiexec -n 4 python -m perf.osu_allreduce --impl both`."""
import numpy
from mpi4py import MPI

from perf import osu


def make_case(comm, count, dtype, impl, args):
    rank, size = comm.Get_rank(), comm.Get_size()
    send, recv = osu.buffers(comm, count, dtype, impl, args, value=rank + 1)
    expected = size * (size + 1) // 2

    def call():
        comm.Allreduce(send, recv, op=MPI.SUM)

    def check():
        osu.clear(recv)
        call()
        if count and not numpy.all(osu.on_host(recv) == expected):
            raise AssertionError(f"{impl} Allreduce of {count} elements on rank {rank}: got {osu.on_host(recv)[:4]}...")

    return call, check


def main(argv=None):
    osu.run("Allreduce", make_case, argv)


if __name__ == "__main__":
    main()
