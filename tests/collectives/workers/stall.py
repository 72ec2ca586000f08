"""A job that loops on collectives while its last rank freezes, dies or dawdles at one place.

    mpiexec -n N python stall.py ACTION PLACE

ACTION: stop (the last rank SIGSTOPs itself), kill (SIGKILLs itself), or a number of seconds it sleeps.
PLACE: where in the fourth iteration it does so: before the small blocking Allreduce ("small"), before the
large one, which our algorithms run ("large"), or before the small Ireduce and Ibcast that every rank waits
for with Waitall ("nonblocking"). Each iteration makes 2 Allreduces, 1 Ireduce and 1 Ibcast, so in the
fourth the small Allreduce is #7, the large one #8, the Ireduce and Ibcast #4 each. PLACE "unwaited": in the
fourth iteration every rank starts the small Ireduce and Ibcast and sleeps ACTION seconds before it waits for them
(MPI's own requests, which nothing of ours sees complete until then).
A frozen or dead rank must end the job (the stall inspector, or the launcher); with a rank that is only
slow, or requests left unwaited, the job finishes, and rank 0 says whether the stall inspector's thread ran.
"""
import os
import signal
import sys
import threading
import time

import numpy
from mpi4py import MPI

from worker_util import Worker

ITERATIONS, STALLED_ITERATION = 5, 3
SMALL, LARGE = 3, 300000  # 24 B goes to MPI's own call; 2.3 MiB to ours on one node and across nodes


def misbehave(action):
    if action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        time.sleep(float(action))


def main():
    action, place = sys.argv[1], sys.argv[2]
    w = Worker()
    comm, rank, size = w.comm, w.rank, w.size
    everyone = numpy.arange(size)
    for iteration in range(ITERATIONS):
        for step in ("small", "large", "nonblocking"):
            w.case(f"iteration {iteration}, {step}")
            if iteration == STALLED_ITERATION and step == place and rank == size - 1:
                misbehave(action)
            if step == "nonblocking":
                part = numpy.full(SMALL, rank + iteration, dtype=numpy.int64)
                total, news = numpy.zeros(SMALL, dtype=numpy.int64), part.copy()
                requests = [comm.Ireduce(part, total, op=MPI.SUM, root=0), comm.Ibcast(news, root=1 % size)]
                if iteration == STALLED_ITERATION and place == "unwaited":
                    time.sleep(float(action))
                MPI.Request.Waitall(requests)
                if rank == 0:
                    w.check(total, numpy.full(SMALL, (everyone + iteration).sum(), dtype=numpy.int64), "Ireduce")
                w.check(news, numpy.full(SMALL, 1 % size + iteration, dtype=numpy.int64), "Ibcast")
            else:
                n = SMALL if step == "small" else LARGE
                result = numpy.empty(n)
                comm.Allreduce(numpy.full(n, float(rank + iteration)), result, op=MPI.SUM)
                w.check(result, numpy.full(n, float((everyone + iteration).sum())), "Allreduce")
    inspector = any(thread.name == "scaffe-stall" for thread in threading.enumerate())
    if rank == 0:
        print(f"stall inspector running: {inspector}", flush=True)
    w.done(f"stall {action} {place}")


if __name__ == "__main__":
    main()
