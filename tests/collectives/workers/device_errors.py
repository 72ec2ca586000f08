"""Device calls that cannot run on the direct path end with the same one-line error on every local rank,
never with one rank waiting forever (collectives.intranode.ipc), on the CPU stand-in device.

    mpiexec -n 2 python device_errors.py --mode export|mixed

export: rank 1's device cannot export its buffer (CUDA IPC refuses cudaMallocAsync memory): every rank
raises the CollectiveError naming local rank 1, and the next call on exportable buffers works.
mixed: rank 1 passes host buffers where rank 0 passes device buffers. With SCAFFE_CHECK=1 every rank
raises a MismatchError naming the path; without it rank 0's wait ends with an error (half SCAFFE_STALL_S)
while rank 1 is left inside MPI, so the abort hook ends the job. With SCAFFE_DEVICE_PATH=staged the call
runs, checked or not.
"""
import argparse
import sys
from pathlib import Path

import numpy
from mpi4py import MPI

sys.path.append(str(Path(__file__).resolve().parents[2] / "stand_ins"))

import cpu_device  # noqa: E402
from collectives.errors import CollectiveError, MismatchError  # noqa: E402
from worker_util import Worker  # noqa: E402

N = 1000


class RefusingDevice(cpu_device.CpuDevice):
    """A stand-in device whose buffers cannot be exported while `refuse` is set."""

    refuse = True

    def export(self, view):
        if self.refuse:
            raise RuntimeError("planted: this allocation cannot be shared through CUDA IPC")
        return super().export(view)


def export_case(w, device):
    send, recv = device.array((N,), numpy.float64), device.array((N,), numpy.float64)
    send.write(numpy.full(N, w.rank + 1.0))
    w.case("allreduce with an unexportable buffer on rank 1")
    w.check_raises(CollectiveError, ["local rank 1", "planted", "cuda ipc"],
                   lambda: w.comm.Allreduce(send, recv, MPI.SUM))
    device.refuse = False
    w.case("allreduce after the failed one")
    w.comm.Allreduce(send, recv, MPI.SUM)
    w.check(recv.peek(), numpy.full(N, sum(r + 1.0 for r in range(w.size))), "result")


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
    parser.add_argument("--mode", choices=["export", "mixed"], required=True)
    args = parser.parse_args()
    rank = MPI.COMM_WORLD.Get_rank()
    device = (RefusingDevice if args.mode == "export" else cpu_device.CpuDevice)(seed=rank)
    device.refuse = rank == 1
    cpu_device.register(device)
    w = Worker()
    (export_case if args.mode == "export" else mixed_case)(w, device)
    w.done(f"device-errors-{args.mode}")


if __name__ == "__main__":
    main()
