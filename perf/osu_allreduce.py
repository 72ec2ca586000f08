"""OSU-style MPI_Allreduce latency: `mpiexec -n 4 python -m perf.osu_allreduce --impl both`."""
from mpi4py import MPI

from perf import osu


def make_case(comm, count, dtype, impl, args):
    rank, size = comm.Get_rank(), comm.Get_size()
    send, recv = osu.buffers(comm, count, dtype, impl, args, value=rank + 1)
    call = osu.waited(args, lambda: comm.Allreduce(send, recv, op=MPI.SUM),
                      lambda: comm.Iallreduce(send, recv, op=MPI.SUM))
    return osu.case(call, recv, size * (size + 1) // 2,
                    f"{impl} Allreduce of {count} elements on rank {rank}")


def main(argv=None):
    osu.run("Allreduce", make_case, argv)


if __name__ == "__main__":
    main()
