"""OSU-style MPI_Reduce latency: `mpiexec -n 4 python -m perf.osu_reduce --impl both -m 1048576:67108864`."""
import numpy
from mpi4py import MPI

from perf import osu


def make_case(comm, count, dtype, impl, args):
    rank, size = comm.Get_rank(), comm.Get_size()
    send, recv = osu.buffers(comm, count, dtype, impl, args, value=rank + 1)
    expected = size * (size + 1) // 2

    def call():
        comm.Reduce(send, recv, op=MPI.SUM, root=0)

    def check():
        osu.clear(recv)
        call()
        if rank == 0 and count and not numpy.all(osu.on_host(recv) == expected):
            raise AssertionError(f"{impl} Reduce of {count} elements: got {osu.on_host(recv)[:4]}..., "
                                 f"expected {expected}")

    return call, check


def main(argv=None):
    osu.run("Reduce", make_case, argv)


if __name__ == "__main__":
    main()
