"""One rank fails with an uncaught exception while the others are inside a collective: the job must end.

    mpiexec -n 3 python abort.py main|thread|progress

main:     rank 1 raises in the main thread instead of joining an Allreduce.
thread:   rank 1 raises in a thread of its own while its main thread waits for the others.
progress: rank 1's share of the work fails inside the helper thread that runs nonblocking collectives
          (run it with an algorithm other than native, which MPI itself runs).
The survivors would wait forever without `collectives.install_abort_hook()` (called by Worker).
"""
import sys
import threading

import numpy
from mpi4py import MPI

from worker_util import Worker

N = 70001


def main():
    where = sys.argv[1]
    w = Worker()
    comm, rank = w.comm, w.rank
    send, recv = numpy.ones(N), numpy.empty(N)
    comm.Allreduce(send, recv, op=MPI.SUM)  # everything set up, every rank alive
    w.case(f"deliberate failure ({where})")
    if rank == 1:
        if where == "main":
            raise RuntimeError("deliberate failure on rank 1 (main thread)")
        if where == "thread":
            def fail():
                raise RuntimeError("deliberate failure on rank 1 (own thread)")
            threading.Thread(target=fail).start()
            comm.Recv(recv, source=0, tag=99)  # never sent: only the abort ends this
        if where == "progress":
            import collectives.algorithms.pipeline as pipeline
            import collectives.intranode.shm as shm

            def broken(*args, **kwargs):
                raise RuntimeError("deliberate failure on rank 1 (progress thread)")
            # Every rank of every algorithm but native reaches one of these in a reduce.
            shm.SharedWindows.begin = pipeline.chunk_slices = broken
            comm.Iallreduce(send, recv, op=MPI.SUM).Wait()
    elif where == "progress":
        comm.Iallreduce(send, recv, op=MPI.SUM).Wait()
        comm.Barrier()
    else:
        comm.Allreduce(send, recv, op=MPI.SUM)
        comm.Barrier()
    w.fail("the job went on after a rank failed")


if __name__ == "__main__":
    main()
