"""Bad arguments raise CollectiveError on the rank that passed them, before any message is sent.

Each case says which ranks make the mistake; the others sit the case out (a mistake that only the root
can make, such as a read-only receive buffer, is made by the root alone). After every case all ranks run
one correct Allreduce and check it, which fails or hangs if the bad call had sent or posted anything.
Every case is tried with the blocking call and, where there is one, its I* form, on small buffers and
then on large ones after correct large calls: `Comm` builds a repeated large call of an (op, dtype) it
has computed before on a shortcut (`Lane.computed_call`), which must let none of these through.

    mpiexec -n 2 python bad_input.py [--settings VAR=value,...]...

Each --settings runs every case once more on a communicator made under them (worker_util.each_setting).
"""
import numpy
from mpi4py import MPI

import collectives
from worker_util import check_each_setting


def read_only(a):
    a = a.copy()
    a.setflags(write=False)
    return a


LARGE = 270001  # elements: past every size the selection table sends to native MPI


def cases(rank, size, n):
    """(name, words the message must contain, who makes the mistake, [(call name, args, kwargs)])."""
    f64 = numpy.zeros(n)
    f32 = numpy.zeros(n, dtype=numpy.float32)
    strided = numpy.zeros((n, 2))[:, 0]
    c64 = numpy.zeros(n, dtype=numpy.complex64)
    everyone, root_only = (lambda r: True), (lambda r: r == 0)
    non_root = (lambda r: r != 0) if size > 1 else None

    def both(name, *args, **kwargs):
        return [(name, args, kwargs), ("I" + name[0].lower() + name[1:], args, kwargs)]

    return [
        ("non-contiguous recvbuf", ["contiguous"], everyone, both("Allreduce", f64, strided)),
        ("non-contiguous recvbuf at the root", ["contiguous"], root_only, both("Reduce", f64, strided, root=0)),
        ("non-contiguous sendbuf", ["contiguous"], everyone, both("Allreduce", strided, f64.copy())),
        ("non-contiguous Bcast buffer", ["contiguous"], everyone, both("Bcast", strided, root=0)),
        ("read-only recvbuf", ["read-only"], everyone, both("Allreduce", f64, read_only(f64))),
        ("read-only recvbuf at the root", ["read-only"], root_only, both("Reduce", f64, read_only(f64), root=0)),
        ("read-only recvbuf in a buffer spec", ["read-only"], everyone,
         both("Allreduce", [f64, MPI.DOUBLE], [read_only(f64), MPI.DOUBLE])),
        ("bytes object as recvbuf", ["read-only"], everyone, both("Allreduce", bytearray(8), bytes(8))),
        ("read-only Bcast buffer at a non-root", ["read-only"], non_root,
         both("Bcast", read_only(f64), root=0)),
        ("send/recv size mismatch", [str(n), str(n + 1)], everyone, both("Allreduce", f64, numpy.zeros(n + 1))),
        ("send/recv size mismatch at the root", [str(n), str(n - 1)], root_only,
         both("Reduce", f64, numpy.zeros(n - 1), root=0)),
        ("count beyond the buffer", ["count"], everyone,
         both("Allreduce", [f64, n + 1, MPI.DOUBLE], [f64.copy(), n + 1, MPI.DOUBLE])),
        ("dtype mismatch", ["float32", "float64"], everyone, both("Allreduce", f32, f64)),
        ("dtype mismatch in buffer specs", ["float32", "float64"], everyone,
         both("Allreduce", [f32, MPI.FLOAT], [numpy.zeros(n // 2), MPI.DOUBLE])),
        ("MIN on complex", ["MIN", "complex64"], everyone, both("Allreduce", c64, c64.copy(), op=MPI.MIN)),
        ("MAX on complex at Reduce", ["MAX", "complex128"], everyone,
         both("Reduce", c64.astype(numpy.complex128), c64.astype(numpy.complex128), op=MPI.MAX, root=0)),
        ("BAND on float", ["BAND", "float64"], everyone, both("Allreduce", f64, f64.copy(), op=MPI.BAND)),
        ("BXOR on float32", ["BXOR", "float32"], everyone,
         both("Reduce", f32, f32.copy(), op=MPI.BXOR, root=0)),
        ("LAND on float", ["LAND", "float64"], everyone, both("Allreduce", f64, f64.copy(), op=MPI.LAND)),
        ("negative root in Reduce", ["root", "-1"], everyone, both("Reduce", f64, f64.copy(), root=-1)),
        ("root == size in Reduce", ["root", str(size)], everyone, both("Reduce", f64, f64.copy(), root=size)),
        ("negative root in Bcast", ["root", "-1"], everyone, both("Bcast", f64.copy(), root=-1)),
        ("root == size in Bcast", ["root", str(size)], everyone, both("Bcast", f64.copy(), root=size)),
        ("MPI.IN_PLACE at a non-root in Reduce", ["IN_PLACE"], non_root,
         both("Reduce", MPI.IN_PLACE, f64.copy(), root=0)),
        ("no recvbuf at the root", ["recvbuf"], root_only, both("Reduce", f64, None, root=0)),
    ]


def spoiled_cases(size, n):
    """Mistakes made in place on arrays a correct call used just before (the latency path remembers
    those): (name, words, who makes the mistake, call name, args, kwargs, the change)."""
    def made_read_only(a):
        a.setflags(write=False)

    f64, out, every, root_out = numpy.zeros(n), numpy.zeros(n), numpy.zeros(n), numpy.zeros(n)
    cases = [
        ("recvbuf made read-only", ["read-only"], lambda r: True, "Allreduce", (f64, out), {},
         lambda: made_read_only(out)),
        ("recvbuf resized", [str(n), str(n + 1)], lambda r: True, "Allreduce", (f64, every), {},
         lambda: every.resize(n + 1, refcheck=False)),
        ("root's recvbuf made read-only", ["read-only"], lambda r: r == 0, "Reduce", (numpy.zeros(n), root_out),
         {"root": 0}, lambda: made_read_only(root_out)),
    ]
    if size > 1:
        bcast_buf = numpy.zeros(n)
        cases.append(("Bcast buffer made read-only at a non-root", ["read-only"], lambda r: r != 0, "Bcast",
                      (bcast_buf,), {"root": 0}, lambda: made_read_only(bcast_buf)))
    return cases


def main():
    check_each_setting(__doc__, "bad_input", check_all)


def check_all(w):
    comm, rank, size = w.comm, w.rank, w.size
    checked = 0
    for n in (10, LARGE):
        if n == LARGE:
            w.case("correct large calls")
            for dtype in (numpy.float64, numpy.float32):
                send, summed, reduced = numpy.ones(n, dtype), numpy.zeros(n, dtype), numpy.zeros(n, dtype)
                comm.Allreduce(send, summed)
                comm.Reduce(send, reduced, root=0)
                w.check_true((summed == size).all() and (rank != 0 or (reduced == size).all()),
                             f"large {numpy.dtype(dtype)} results")
        for name, words, makers, calls in cases(rank, size, n):
            if makers is None:
                continue  # needs a rank that is not the root: not in a 1-rank job
            for call_name, args, kwargs in calls:
                w.case(f"{name} ({n} elements): {call_name}")
                if makers(rank):
                    w.check_raises(collectives.CollectiveError, words,
                                   lambda: getattr(comm, call_name)(*args, **kwargs))
                    checked += 1
                w.check_in_step("the bad call")
        for name, words, makers, call_name, args, kwargs, spoil in spoiled_cases(size, n):
            w.case(f"{name} ({n} elements): {call_name}, correct first")
            getattr(comm, call_name)(*args, **kwargs)
            getattr(comm, call_name)(*args, **kwargs)
            if makers(rank):
                spoil()
                w.check_raises(collectives.CollectiveError, words, lambda: getattr(comm, call_name)(*args, **kwargs))
                checked += 1
            w.check_in_step("the bad call")
    w.check_true(checked > 0, "no bad call was made on this rank")


if __name__ == "__main__":
    main()
