"""A large nonblocking call MPI runs, handed back to its caller as MPI's own request, moves while a rank computes
without calling MPI: its Nudge thread probes MPI for it (collectives.progress).

    mpiexec -n 2 python nudged.py

The last rank posts a 4 MiB Ibcast and computes for COMPUTE_S before it waits; the root, waiting at once, needs
that rank's progress to finish (MPI's rendezvous for a message this large), and finishes long before it ends its
compute. Without the Nudge the root would wait the whole COMPUTE_S.
"""
import time

import numpy
from mpi4py import MPI

from worker_util import Worker

SIZE = 4 << 20
COMPUTE_S = 1.0


def main():
    w = Worker()
    comm = w.comm
    buf = numpy.full(SIZE // 8, 7.0) if w.rank == 0 else numpy.zeros(SIZE // 8)
    comm.Ibcast(buf, root=0).Wait()  # the plan made: the call below is a repeat, as in a training loop
    w.case("a 4 MiB Ibcast moves while its last rank computes")
    buf[:] = 8.0 if w.rank == 0 else 0.0
    comm.Barrier()
    request = comm.Ibcast(buf, root=0)
    w.check_true(type(request) is MPI.Request, f"the Ibcast returned a {type(request).__name__}, not MPI's own")
    start = time.monotonic()
    if w.rank == w.size - 1:
        time.sleep(COMPUTE_S)  # computing: no MPI call
    request.Wait()
    waited = time.monotonic() - start
    w.check_true((buf == 8.0).all(), "the broadcast data did not arrive")
    if w.rank == 0:
        w.check_true(waited < COMPUTE_S / 2, f"the root waited {waited:.2f} s for a rank computing {COMPUTE_S} s")
    w.done("nudged")


if __name__ == "__main__":
    main()
