"""SCAFFE_CHOICE=measured: the first calls of a size our algorithm runs also time native MPI, and every rank
keeps the same, faster one; every result along the way is exact.

One rank is made slow on one road (a sleep around it): the sum of the ranks' times must then pick the
other road on every rank, for the slowed native twin (our algorithm kept) and for a slowed algorithm
(native MPI kept), for blocking and nonblocking calls of one size, which have a trial each. A slow hand-off
of nonblocking calls to the progress thread counts against our road; the time a call waits queued behind
other work of the thread does not. A nonblocking call whose trial kept native MPI returns MPI's own request.

    mpiexec -n 3 python measured_choice.py
"""
import time

import numpy
from mpi4py import MPI

import collectives.algorithms
import collectives.planning
import collectives.plans
import collectives.progress
from worker_util import Worker, contribution, expected_reduction

SLOW_S = 0.05
# Work queued ahead of a nonblocking call: counted against our road, it would outweigh the native twin's
# SLOW_S (which every rank waits for in the native call) several times over; not counted, the twin's
# SLOW_S outweighs our road's own time, even on a loaded machine.
QUEUED_S = 3 * SLOW_S


def slowed(function, rank, nbytes, seconds=SLOW_S):
    """`function(comm, call)` that sleeps `seconds` first on `rank` for calls of `nbytes`."""
    def run(comm, call):
        if comm.Get_rank() == rank and call.nbytes == nbytes:
            time.sleep(seconds)
        return function(comm, call)
    return run


def run_calls(w, kind, n, seed):
    """Calls of one size, blocking and nonblocking alternating, each result checked, until both trials have
    chosen and two calls more; the type of the last nonblocking call's request."""
    comm, rank = w.comm, w.rank
    for step in range(2 * collectives.plans.Trial.CALLS + 4):
        data = [contribution("sum", numpy.float32, n, r, seed + step) for r in range(w.size)]
        out = numpy.full(n, 99, numpy.float32)
        nonblocking = step % 2
        if kind == "allreduce":
            request = (comm.Iallreduce if nonblocking else comm.Allreduce)(data[rank], out, op=MPI.SUM)
        else:
            request = (comm.Ireduce if nonblocking else comm.Reduce)(data[rank], out, op=MPI.SUM, root=0)
        if nonblocking:
            returned = type(request)
            request.Wait()
        if kind == "allreduce" or rank == 0:
            w.check(out, expected_reduction("sum", data), f"{kind} call {step}")
    return returned


def kept(w, kind, n, blocking):
    """Every rank's trial for this size: decided, and the same on all of them."""
    trial = w.comm.trials[(kind, blocking, MPI.SUM.py2f(), numpy.dtype(numpy.float32), n * 4)]
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
    returned = run_calls(w, "allreduce", n, 100)
    for blocking in (True, False):
        w.check_true(kept(w, "allreduce", n, blocking) is False, "native MPI kept though its twin was slowed")
    w.check_true(returned is not MPI.Request, "our algorithm's request is not MPI's own")
    collectives.plans._native_twin = twin

    w.case("our algorithm slowed on rank 0: native MPI kept")
    n = floats(w, "reduce")
    choose = collectives.planning.algorithms.get
    collectives.planning.algorithms.get = lambda name, kind: slowed(choose(name, kind), 0, n * 4)
    returned = run_calls(w, "reduce", n, 200)
    for blocking in (True, False):
        w.check_true(kept(w, "reduce", n, blocking) is True, "our algorithm kept though it was slowed")
    w.check_true(returned is MPI.Request, f"native MPI's call returned a {returned.__name__}, not MPI's request")
    collectives.planning.algorithms.get = choose

    # On every rank: where one rank alone is late, the others' native twins wait for it as long.
    w.case("the hand-off of nonblocking calls to the progress thread slowed: native MPI kept for them")
    n = 3 * floats(w, "allreduce") // 2  # a size of its own, within the trials' span
    submit = collectives.progress.Progress.submit

    def slow_submit(progress, work, name, nbytes):
        if nbytes == n * 4:
            time.sleep(SLOW_S)
        return submit(progress, work, name, nbytes)

    collectives.progress.Progress.submit = slow_submit
    returned = run_calls(w, "allreduce", n, 300)
    collectives.progress.Progress.submit = submit
    w.check_true(kept(w, "allreduce", n, False) is True, "our algorithm kept though its hand-off was slowed")
    w.check_true(returned is MPI.Request, f"native MPI's call returned a {returned.__name__}, not MPI's request")

    # As in the S-Caffe schedule, whose reduces of several sizes queue behind each other.
    w.case("nonblocking calls queued behind other work of the thread: not counted against our road")
    n = 5 * floats(w, "allreduce") // 4
    collectives.plans._native_twin = slowed(twin, w.size - 1, n * 4)
    ahead = []

    def queued_behind(progress, work, name, nbytes):
        if nbytes == n * 4:
            ahead.append(submit(progress, lambda: time.sleep(QUEUED_S), name, 0))
        return submit(progress, work, name, nbytes)

    collectives.progress.Progress.submit = queued_behind
    returned = run_calls(w, "allreduce", n, 400)
    collectives.progress.Progress.submit = submit
    collectives.plans._native_twin = twin
    MPI.Request.Waitall(ahead)
    w.check_true(kept(w, "allreduce", n, False) is False, "native MPI kept: the queue was counted as the hand-off")
    w.check_true(returned is not MPI.Request, "our algorithm's request is not MPI's own")
    w.done("measured_choice")


if __name__ == "__main__":
    main()
