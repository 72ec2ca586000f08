"""The abort hook that the first `collectives.Comm` installs, in a program that never installs it itself.

    mpiexec -n 3 python abort_hook.py uncaught|own-hooks-main|own-hooks-thread|opt-out

uncaught:         rank 1 raises in its main thread while the others wait in an Allreduce; the job must end.
own-hooks-main:   the program set sys.excepthook and threading.excepthook before making the Comm; rank 1
                  raises in its main thread: the program's hook runs, then the job ends.
own-hooks-thread: the same, rank 1 raising in a thread of its own.
opt-out:          run with SCAFFE_ABORT_ON_ERROR=0: making a Comm leaves both hooks as they were.
Rank 1 prints "FAILING AT <time.time()>" just before it raises, so the test can time the abort itself, and
"SEGMENTS <path> ..." (the MPI library's shared-memory files it maps), which the abort must remove.
"""
import sys
import threading
import time

import numpy
from mpi4py import MPI

import collectives
from collectives.errors import mapped_mpi_segments


def own_sys_hook(exc_type, exc, tb):
    sys.stderr.write(f"OWN SYS HOOK saw {exc_type.__name__}: {exc}\n")


def own_thread_hook(args):
    sys.stderr.write(f"OWN THREAD HOOK saw {args.exc_type.__name__}: {args.exc_value}\n")


def main():
    mode = sys.argv[1]
    if mode.startswith("own-hooks"):
        sys.excepthook, threading.excepthook = own_sys_hook, own_thread_hook
    comm = collectives.Comm(MPI.COMM_WORLD)
    rank = comm.Get_rank()
    if mode == "opt-out":
        untouched = sys.excepthook is sys.__excepthook__ and threading.excepthook is threading.__excepthook__
        if not untouched:
            raise SystemExit(f"[rank {rank}] SCAFFE_ABORT_ON_ERROR=0, yet the hooks are "
                             f"{sys.excepthook!r} and {threading.excepthook!r}")
        comm.Barrier()
        if rank == 0:
            print("WORKER-OK abort_hook opt-out: hooks untouched", flush=True)
        return
    send, recv = numpy.ones(1000), numpy.empty(1000)
    comm.Allreduce(send, recv)  # every rank alive and set up
    if rank == 1:
        print(f"SEGMENTS {' '.join(mapped_mpi_segments())}", flush=True)
        print(f"FAILING AT {time.time():.3f}", flush=True)
        if mode == "own-hooks-thread":
            def fail():
                raise RuntimeError("deliberate failure on rank 1 (own thread)")
            threading.Thread(target=fail).start()
            comm.Recv(recv, source=0, tag=99)  # never sent: only the abort ends this
        raise RuntimeError("deliberate failure on rank 1 (main thread)")
    comm.Allreduce(send, recv)
    comm.Barrier()
    sys.stderr.write("the job went on after a rank failed\n")


if __name__ == "__main__":
    main()
