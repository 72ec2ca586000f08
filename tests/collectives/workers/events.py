"""Every overridden collective is reported to collectives.events once, with its name, communicator and size,
started before it runs and finished by the time the caller sees it complete.

    mpiexec -n 2 python events.py

Covers each way a call runs: MPI's own call (first and repeated arrays), our algorithm (first and
repeated), nonblocking small (MPI's request, followed by the progress thread) and large (ours), and the
fallbacks for a derived datatype and a user-defined op; and a second Comm gets the next index.
"""
import threading

import numpy
from mpi4py import MPI

import collectives
from collectives import events
from worker_util import Worker

SMALL, LARGE = 5, 200000  # 40 B: MPI's own call; 1.6 MiB: ours on one node


class Recorder:
    def __init__(self):
        self.log = []  # ("started", op_id, name, comm index, nbytes) and ("finished", op_id)
        self.lock = threading.Lock()

    def started(self, op_id, name, nbytes, t):
        with self.lock:
            self.log.append(("started", op_id, str(name), name.comm, nbytes))

    def finished(self, op_id, t):
        with self.lock:
            self.log.append(("finished", op_id))

    def take(self):
        with self.lock:
            log, self.log = self.log, []
        return log


def main():
    w = Worker()
    comm = w.comm
    recorder = Recorder()
    comm.Barrier()
    comm.describe()  # sets the communicator up: its index is 0
    events.add_listener(recorder)

    def expect(what, call, name, nbytes, index=0):
        w.case(what)
        request = call()
        if request is not None:
            request.Wait()
        log = recorder.take()
        w.check_true(len(log) == 2 and log[0][0] == "started" and log[1] == ("finished", log[0][1]),
                     f"expected one started and its finished, got {log}")
        w.check_true(log[0][2:] == (name, index, nbytes), f"reported {log[0][2:]}, expected {(name, index, nbytes)}")

    small, small_out = numpy.ones(SMALL), numpy.empty(SMALL)
    large, large_out = numpy.ones(LARGE), numpy.empty(LARGE)
    for repeat in ("first", "repeated"):
        expect(f"small Allreduce ({repeat})", lambda: comm.Allreduce(small, small_out), "Allreduce", small.nbytes)
        expect(f"large Allreduce ({repeat})", lambda: comm.Allreduce(large, large_out), "Allreduce", large.nbytes)
        expect(f"small Reduce ({repeat})", lambda: comm.Reduce(small, small_out, root=1), "Reduce", small.nbytes)
        expect(f"large Reduce ({repeat})", lambda: comm.Reduce(large, large_out, root=1), "Reduce", large.nbytes)
        expect(f"Bcast ({repeat})", lambda: comm.Bcast(small, root=0), "Bcast", small.nbytes)
    expect("small Iallreduce", lambda: comm.Iallreduce(small, small_out), "Iallreduce", small.nbytes)
    expect("large Iallreduce", lambda: comm.Iallreduce(large, large_out), "Iallreduce", large.nbytes)
    expect("small Ireduce", lambda: comm.Ireduce(small, small_out, root=0), "Ireduce", small.nbytes)
    expect("large Ireduce", lambda: comm.Ireduce(large, large_out, root=0), "Ireduce", large.nbytes)
    expect("Ibcast", lambda: comm.Ibcast(small, root=1), "Ibcast", small.nbytes)
    pair = MPI.DOUBLE.Create_contiguous(2).Commit()
    expect("derived datatype", lambda: comm.Bcast([small[:4], 2, pair], root=0), "Bcast", 0)
    pair.Free()
    own_sum = MPI.Op.Create(lambda a, b, datatype: numpy.add(numpy.frombuffer(a), numpy.frombuffer(b),
                                                             out=numpy.frombuffer(b)), commute=True)
    expect("user-defined op", lambda: comm.Iallreduce(small, small_out, op=own_sum), "Iallreduce", small.nbytes)
    own_sum.Free()
    second = collectives.Comm(MPI.COMM_WORLD.Dup())
    second.describe()
    expect("a second Comm", lambda: second.Allreduce(small, small_out), "Allreduce", small.nbytes, index=1)
    events.remove_listener(recorder)
    w.done("events")


if __name__ == "__main__":
    main()
