"""The compiled node loop (collectives/intranode/compiled.py): taken where it applies, exact where taken.

Plain buffers of every op and dtype it computes, read-only send buffers, in place, a Reduce's ranks
without a receive buffer, sizes from 0 to several cells; then the same calls once the node has an alloc
window, which still take it, with the same results.

    SCAFFE_REDUCE_ALGO=hierarchical mpiexec -n 3 python compiled_path.py
"""

import numpy
from mpi4py import MPI

from collectives.ops import COMPILED_OPS
from worker_util import OPS, Worker, contribution, expected_reduction, valid

SIZES = [0, 1, 17, 1001, 70001]  # 70001 float64: several 128 KiB cells per rank


def check_calls(w, ops, dtypes, label):
    comm, rank, size = w.comm, w.rank, w.size
    root = size - 1
    for op in ops:
        for dtype in dtypes:
            if not valid(op, dtype):
                continue
            for n in SIZES:
                data = [contribution(op, dtype, n, r, n) for r in range(size)]
                expected = expected_reduction(op, data)
                w.case(f"{label} Allreduce {op} {dtype} n={n}")
                read_only = data[rank].copy()
                read_only.setflags(write=False)
                out = numpy.empty_like(data[rank])
                comm.Allreduce(read_only, out, op=OPS[op])
                w.check(out, expected, "read-only send buffer")
                w.case(f"{label} Allreduce in place {op} {dtype} n={n}")
                buf = data[rank].copy()
                comm.Allreduce(MPI.IN_PLACE, buf, op=OPS[op])
                w.check(buf, expected, "in place")
                w.case(f"{label} Reduce to {root} {op} {dtype} n={n}")
                out = numpy.empty_like(data[rank]) if rank == root else None
                comm.Reduce(read_only, out, op=OPS[op], root=root)
                if rank == root:
                    w.check(out, expected, "Reduce")


def main():
    w = Worker()
    dtypes = [numpy.dtype(t) for t in ("int8", "uint16", "int32", "int64", "float32", "float64", "complex64",
                                       "complex128")]
    ops = sorted(COMPILED_OPS)
    check_calls(w, ops, dtypes, "plain")
    w.case("the plain calls took the compiled loop")
    w.check_true(w.comm.shm.compiled_calls > 0, "the compiled loop never ran")
    w.check_true(w.comm.shm.compiled_applies("sum", numpy.float32), "compiled_applies is false for float32 sum")
    w.check_true(not w.comm.shm.compiled_applies("sum", numpy.float16), "float16 is not compiled")
    w.check_true(not w.comm.shm.compiled_applies("band", numpy.int32), "bitwise ops are not compiled")

    w.case("alloc window")
    shared = w.comm.alloc(8, numpy.float64)
    w.check_true(w.comm.shm.compiled_applies("sum", numpy.float32), "an alloc window leaves the loop compiled")
    check_calls(w, ["sum", "max"], [numpy.dtype("float64"), numpy.dtype("int32")], "after alloc")
    del shared
    w.done("compiled_path")


if __name__ == "__main__":
    main()
