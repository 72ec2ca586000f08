"""Bitwise reproducibility: the same float reduction with the same data gives the same bytes.

Within one run: repeated calls, blocking and nonblocking, and (Allreduce) every rank, all give identical
bytes. Rank 0 prints one `DIGEST` line per collective, so the test can compare two runs.

    mpiexec -n 4 python reproducible.py
"""
import hashlib

import numpy
from mpi4py import MPI

from worker_util import Worker

N = 100003  # random floats: the summation order shows in the last bits


def digest(a):
    return hashlib.sha256(a.tobytes()).hexdigest()[:16]


def main():
    w = Worker()
    comm, rank, size = w.comm, w.rank, w.size
    rng = numpy.random.default_rng([2024, rank])
    for dtype in (numpy.float32, numpy.float64, numpy.complex64):
        mine = rng.standard_normal(N).astype(dtype)
        if numpy.dtype(dtype).kind == "c":
            mine = mine + 1j * rng.standard_normal(N).astype(dtype)
        everyone = comm.allgather(mine)
        reference = numpy.sum(numpy.array(everyone, dtype=numpy.complex128 if mine.dtype.kind == "c"
                                          else numpy.float64), axis=0)
        for kind in ("allreduce", "reduce"):
            w.case(f"{kind} {numpy.dtype(dtype)}: repeated, blocking and nonblocking")
            results = []
            for nonblocking in (False, True, False, True):
                out = numpy.zeros(N, dtype=dtype)
                if kind == "allreduce":
                    call = comm.Iallreduce if nonblocking else comm.Allreduce
                    request = call(mine, out, op=MPI.SUM)
                else:
                    call = comm.Ireduce if nonblocking else comm.Reduce
                    request = call(mine, out if rank == size - 1 else None, op=MPI.SUM, root=size - 1)
                if nonblocking:
                    request.Wait()
                results.append(digest(out))
            receives = kind == "allreduce" or rank == size - 1
            if receives:
                w.check_true(len(set(results)) == 1, f"the same reduction gave different bytes: {results}")
                tolerance = 1e-4 if numpy.dtype(dtype) in (numpy.float32, numpy.complex64) else 1e-10
                w.check_true(numpy.allclose(out, reference, rtol=tolerance, atol=tolerance * size),
                             "result is not the sum (beyond rounding)")
            if kind == "allreduce":
                every_rank = comm.allgather(results[0])
                w.check_true(len(set(every_rank)) == 1, f"ranks got different bytes: {every_rank}")
            line = comm.bcast(results[0] if receives else None, root=0 if kind == "allreduce" else size - 1)
            if rank == 0:
                print(f"DIGEST {kind} {numpy.dtype(dtype)} {line}", flush=True)
    w.done("reproducible")


if __name__ == "__main__":
    main()
