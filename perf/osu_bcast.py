"""OSU-style MPI_Bcast latency: `mpiexec -n 4 python -m perf.osu_bcast --impl both`."""
from perf import osu


def make_case(comm, count, dtype, impl, args):
    rank = comm.Get_rank()
    buf, _ = osu.buffers(comm, count, dtype, impl, args, value=7 if rank == 0 else 0)
    call = osu.waited(args, lambda: comm.Bcast(buf, root=0), lambda: comm.Ibcast(buf, root=0))
    return osu.case(call, buf, 7, f"{impl} Bcast of {count} elements on rank {rank}",
                    clear_result=rank != 0)


def main(argv=None):
    osu.run("Bcast", make_case, argv)


if __name__ == "__main__":
    main()
