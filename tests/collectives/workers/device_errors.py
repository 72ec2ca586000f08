"""Device calls that fail on one rank end with the same one-line error on every local rank, promptly, never
with one rank waiting forever, and no rank's kernel touches the buffers of a rank that has left the call
(collectives.devices.ipc), on the CPU stand-in device.

    mpiexec -n 2 python device_errors.py --mode export|open|launch|sync|mixed
    mpiexec -n 3 python device_errors.py --mode late     (with SCAFFE_STALL_S=4)

export, open, launch, sync: rank 1's device fails that step of the call (its buffer cannot be exported, as
CUDA IPC refuses cudaMallocAsync memory; it cannot map its peers' buffers, as on GPUs without peer access;
its kernel's launch or its stream's synchronisation fails). Every rank raises the CollectiveError naming
local rank 1 and the failure within a few seconds (whatever SCAFFE_STALL_S says), and the next call works.
late: the last rank comes to the call after the others have given up on it (half SCAFFE_STALL_S): every
rank raises the others' "did not join" error, the late rank's kernel does not write into the buffers the
others have taken back, and the next call works.
mixed: rank 1 passes host buffers where rank 0 passes device buffers. With SCAFFE_CHECK=1 every rank
raises a MismatchError naming the path; without it rank 0's wait ends with an error (half SCAFFE_STALL_S)
while rank 1 is left inside MPI, so the abort hook ends the job. With SCAFFE_DEVICE_PATH=staged the call
runs, checked or not.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy
from mpi4py import MPI

sys.path.append(str(Path(__file__).resolve().parents[2] / "stand_ins"))

import cpu_device  # noqa: E402
from collectives import settings  # noqa: E402
from collectives.errors import CollectiveError, MismatchError  # noqa: E402
from worker_util import Worker  # noqa: E402

N = 1000  # 32 aligned units of float64s: a slice for each of 3 owners
PROMPT_S = 5.0  # a failure must reach every rank within this, however long SCAFFE_STALL_S is
PLANTED = {  # the step that fails -> what its error must name
    "export": ["cuda ipc"], "open": ["peer access"], "launch": ["launch"], "sync": ["synchron"],
}


class FailingDevice(cpu_device.CpuDevice):
    """A stand-in device that fails one step of a device call while `fail` names it (see PLANTED)."""

    fail = None

    def export(self, view):
        if self.fail == "export":
            raise RuntimeError("planted: this allocation cannot be shared through CUDA IPC")
        return super().export(view)

    def open(self, handle):
        if self.fail == "open":
            raise RuntimeError("planted: peer access refused (cudaErrorPeerAccessUnsupported)")
        return super().open(handle)

    def prepare_reduce(self, outputs, inputs, op):
        launch = super().prepare_reduce(outputs, inputs, op)

        def failing(stream):
            if self.fail == "launch":
                raise RuntimeError("planted: kernel launch failed")
            launch(stream)

        return failing

    def synchronize_stream(self, stream):
        super().synchronize_stream(stream)
        if self.fail == "sync":
            raise RuntimeError("planted: stream synchronisation failed")


def allreduce(w, device):
    """An Allreduce of device buffers, checked when it returns."""
    send, recv = device.array((N,), numpy.float64), device.array((N,), numpy.float64)
    send.write(numpy.full(N, w.rank + 1.0))
    w.comm.Allreduce(send, recv, MPI.SUM)
    w.check(recv.peek(), numpy.full(N, sum(r + 1.0 for r in range(w.size))), "result")


def failing_case(w, device, mode):
    send, recv = device.array((N,), numpy.float64), device.array((N,), numpy.float64)
    send.write(numpy.full(N, w.rank + 1.0))
    w.case(f"allreduce failing at {mode} on rank 1")
    started = time.monotonic()
    w.check_raises(CollectiveError, ["local rank 1", "planted"] + PLANTED[mode],
                   lambda: w.comm.Allreduce(send, recv, MPI.SUM))
    took = time.monotonic() - started
    w.check_true(took < PROMPT_S, f"the error took {took:.1f} s to reach this rank")
    device.fail = None
    w.case("allreduce after the failed one")
    allreduce(w, device)


def late_case(w, device):
    """The last rank comes after the others' wait has ended; they take their buffers back at once."""
    late = w.rank == w.size - 1
    send, recv = device.array((N,), numpy.float64), device.array((N,), numpy.float64)
    send.write(numpy.full(N, w.rank + 1.0))
    w.case("allreduce with a late rank")
    w.comm.describe()  # sets the communicator up (collective): the call itself is what comes late
    time.sleep(settings.stall_seconds() * 0.75 if late else 0)  # half the stall limit is the others' wait
    w.check_raises(CollectiveError, ["did not join", f"[{w.size - 1}]"], lambda: w.comm.Allreduce(send, recv, MPI.SUM))
    if not late:
        recv.write(numpy.full(N, -1.0))  # the buffer is this rank's again: nobody else may write it
        recv.read()
    w.world.Barrier()
    if not late:
        w.check(recv.peek(), numpy.full(N, -1.0), "a buffer taken back after the failed call")
    w.case("allreduce after the failed one")
    allreduce(w, device)


def mixed_case(w, device):
    if w.rank == 1:
        send, recv = numpy.ones(N), numpy.zeros(N)
    else:
        send, recv = device.array((N,), numpy.float64), device.array((N,), numpy.float64)
        send.write(numpy.ones(N))
    w.case("allreduce on device buffers on rank 0, host buffers on rank 1")
    w.comm.describe()  # sets the communicator up
    if w.comm.device_ipc is None:  # SCAFFE_DEVICE_PATH=staged: mixing is allowed, and the check lets it be
        w.comm.Allreduce(send, recv, MPI.SUM)
        got = recv if w.rank == 1 else recv.read()
        w.check(got, numpy.full(N, float(w.size)), "result")
    elif w.comm.check:
        w.check_raises(MismatchError, ["path", "host", "direct"], lambda: w.comm.Allreduce(send, recv, MPI.SUM))
    else:
        w.comm.Allreduce(send, recv, MPI.SUM)  # rank 0 raises "did not join"; rank 1 stays inside MPI


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=sorted(PLANTED) + ["late", "mixed"], required=True)
    args = parser.parse_args()
    rank = MPI.COMM_WORLD.Get_rank()
    # One GPU each (so every rank owns a slice and maps the others' buffers), but one for all to export.
    device = FailingDevice(gpu=0 if args.mode in ("export", "mixed") else rank, seed=rank)
    device.fail = args.mode if rank == 1 else None
    cpu_device.register(device)
    w = Worker()
    if args.mode in PLANTED:
        failing_case(w, device, args.mode)
    else:
        (late_case if args.mode == "late" else mixed_case)(w, device)
    w.done(f"device-errors-{args.mode}")


if __name__ == "__main__":
    main()
