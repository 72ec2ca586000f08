"""OSU-style MPI_Reduce latency: `mpiexec -n 4 python -m perf.osu_reduce --impl both -m 1048576:67108864`."""
from mpi4py import MPI

from perf import osu


def make_case(comm, count, dtype, impl, args):
    rank, size = comm.Get_rank(), comm.Get_size()
    send, recv = osu.buffers(comm, count, dtype, impl, args, value=rank + 1)
    call = osu.waited(args, lambda: comm.Reduce(send, recv, op=MPI.SUM, root=0),
                      lambda: comm.Ireduce(send, recv, op=MPI.SUM, root=0))
    return osu.case(call, recv, size * (size + 1) // 2,
                    f"{impl} Reduce of {count} elements", check_result=rank == 0)


def main(argv=None):
    osu.run("Reduce", make_case, argv)


if __name__ == "__main__":
    main()
