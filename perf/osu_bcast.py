"""OSU-style MPI_Bcast latency: `mpiexec -n 4 python -m perf.osu_bcast --impl both`."""
import numpy

from perf import osu


def make_case(comm, count, dtype, impl, args):
    rank = comm.Get_rank()
    buf, _ = osu.buffers(comm, count, dtype, impl, args, value=7 if rank == 0 else 0)

    def call():
        comm.Bcast(buf, root=0)

    def check():
        if rank != 0:
            osu.clear(buf)
        call()
        if count and not numpy.all(osu.on_host(buf) == 7):
            raise AssertionError(f"{impl} Bcast of {count} elements on rank {rank}: got {osu.on_host(buf)[:4]}...")

    return call, check


def main(argv=None):
    osu.run("Bcast", make_case, argv)


if __name__ == "__main__":
    main()
