"""SCAFFE_CHOICE=measured: the first calls of a size our algorithm runs also time native MPI, and every rank
keeps the same, faster one; every result along the way is exact.

One rank is made slow on one road (a sleep around it): the sum of the ranks' times must then pick the
other road on every rank, for the slowed native twin (our algorithm kept) and for a slowed algorithm
(native MPI kept). Blocking and nonblocking calls of one size share the trial.

    mpiexec -n 3 python measured_choice.py
"""
import time

import numpy
from mpi4py import MPI

import collectives.algorithms
import collectives.planning
import collectives.plans
from worker_util import Worker, contribution, expected_reduction

SLOW_S = 0.05


def slowed(function, rank, nbytes):
    """`function(comm, call)` that sleeps first on `rank` for calls of `nbytes`."""
    def run(comm, call):
        if comm.Get_rank() == rank and call.nbytes == nbytes:
            time.sleep(SLOW_S)
        return function(comm, call)
    return run


def run_calls(w, kind, n, seed):
    """14 calls of one size, blocking and nonblocking alternating, each result checked."""
    comm, rank = w.comm, w.rank
    for step in range(14):
        data = [contribution("sum", numpy.float32, n, r, seed + step) for r in range(w.size)]
        out = numpy.full(n, 99, numpy.float32)
        nonblocking = step % 2
        if kind == "allreduce":
            request = (comm.Iallreduce if nonblocking else comm.Allreduce)(data[rank], out, op=MPI.SUM)
        else:
            request = (comm.Ireduce if nonblocking else comm.Reduce)(data[rank], out, op=MPI.SUM, root=0)
        if nonblocking:
            request.Wait()
        if kind == "allreduce" or rank == 0:
            w.check(out, expected_reduction("sum", data), f"{kind} call {step}")


def kept(w, kind, n):
    """Every rank's trial for this size: decided, and the same on all of them."""
    trial = w.comm.trials[(kind, MPI.SUM.py2f(), numpy.dtype(numpy.float32), n * 4)]
    choices = w.world.allgather(trial.native)
    w.check_true(len(set(choices)) == 1 and choices[0] is not None, f"ranks kept {choices}")
    return choices[0]


def floats(w, kind):
    """Twice the table's threshold for `kind` in float32s: our algorithm's size, within the trials' span."""
    w.comm.describe()  # sets the communicator up
    return 2 * collectives.algorithms.threshold(kind, w.comm.several_nodes) // 4


def main():
    w = Worker()
    n = floats(w, "allreduce")
    w.case("the native twin slowed on the last rank: our algorithm kept")
    twin = collectives.plans._native_twin
    collectives.plans._native_twin = slowed(twin, w.size - 1, n * 4)
    run_calls(w, "allreduce", n, 100)
    w.check_true(kept(w, "allreduce", n) is False, "native MPI kept though its twin was slowed")
    collectives.plans._native_twin = twin

    w.case("our algorithm slowed on rank 0: native MPI kept")
    n = floats(w, "reduce")
    choose = collectives.planning.algorithms.get
    collectives.planning.algorithms.get = lambda name, kind: slowed(choose(name, kind), 0, n * 4)
    run_calls(w, "reduce", n, 200)
    w.check_true(kept(w, "reduce", n) is True, "our algorithm kept though it was slowed")
    collectives.planning.algorithms.get = choose
    w.done("measured_choice")


if __name__ == "__main__":
    main()
