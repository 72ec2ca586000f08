"""SCAFFE_CHECK=1: ranks that disagree on count, dtype, op or root all raise MismatchError; nobody hangs.

Rank 0 passes one thing, the other ranks another. After every case all ranks run one correct Allreduce
and check it, so a rank left inside the collective would show up as a hang or a wrong result.

    SCAFFE_CHECK=1 mpiexec -n 3 python mismatch.py
"""
import os

import numpy
from mpi4py import MPI

import collectives
from worker_util import Worker

BIG = 270001  # above every selection threshold, so without the check the ranks would pick different algorithms


def cases(rank, size):
    """(name, words the message must contain, call name, args, kwargs) as rank `rank` makes the call."""
    first = rank == 0
    n = 10 if first else 11
    big_or_small = BIG if first else 7
    dtype = numpy.float32 if first else numpy.float64
    root = 0 if first else size - 1

    def bufs(count, dt=numpy.float64):
        return numpy.zeros(count, dtype=dt), numpy.zeros(count, dtype=dt)

    def all_kinds(name, words, count=10, dt=numpy.float64, op=MPI.SUM):
        send, recv = bufs(count, dt)
        return [
            (f"{name}: Allreduce", words, "Allreduce", (send, recv), {"op": op}),
            (f"{name}: Iallreduce", words, "Iallreduce", (send, recv), {"op": op}),
            (f"{name}: Reduce", words, "Reduce", (send, recv), {"op": op, "root": 0}),
            (f"{name}: Ireduce", words, "Ireduce", (send, recv), {"op": op, "root": 0}),
        ]

    out = []
    out += all_kinds("different counts", ["count"], count=n)
    out += all_kinds("counts on both sides of the selection threshold", ["count"], count=big_or_small)
    out += all_kinds("different dtypes", ["dtype"], dt=dtype)
    out += all_kinds("different ops", ["op"], op=MPI.SUM if first else MPI.MAX)
    out += all_kinds("bool (computed by MPI) against int8", ["count", "dtype"],
                     dt=numpy.bool_ if first else numpy.int8, op=MPI.LOR)
    send, recv = bufs(10)
    out += [("different roots: Reduce", ["root"], "Reduce", (send, recv), {"root": root}),
            ("different roots: Ireduce", ["root"], "Ireduce", (send, recv), {"root": root})]
    buf = numpy.zeros(n)
    out += [("different counts: Bcast", ["count"], "Bcast", (buf,), {"root": 0}),
            ("different counts: Ibcast", ["count"], "Ibcast", (buf,), {"root": 0})]
    buf = numpy.zeros(10, dtype=dtype)
    out += [("different dtypes: Bcast", ["dtype"], "Bcast", (buf,), {"root": 0})]
    buf = numpy.zeros(10)
    out += [("different roots: Bcast", ["root"], "Bcast", (buf,), {"root": root}),
            ("different roots: Ibcast", ["root"], "Ibcast", (buf,), {"root": root})]
    return out


def main():
    w = Worker()
    comm, rank, size = w.comm, w.rank, w.size
    if os.environ.get("SCAFFE_CHECK") != "1" or size < 2:
        w.fail("run me with SCAFFE_CHECK=1 on at least 2 ranks")
    for name, words, call_name, args, kwargs in cases(rank, size):
        w.case(name)
        w.check_raises(collectives.MismatchError, words, lambda: getattr(comm, call_name)(*args, **kwargs))
        w.check_in_step("the mismatch")
    w.done("mismatch")


if __name__ == "__main__":
    main()
