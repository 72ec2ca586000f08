"""Two communicators of one process share their device's registration cache (collectives.devices.peers),
each calling from a thread of its own, as the S-Caffe schedule's two do from their progress threads.

    mpiexec -n 2 python device_threads.py [--rounds 150]

Every rank has its own stand-in GPU (so every rank maps the others' buffers and runs a kernel), and two
threads, one per communicator (the second a Dup of the first), that allocate new device buffers for
every Allreduce and free them after it: mappings go stale and are closed all the time, by one thread
while the other's kernel may be running. Results are checked exactly; WatchfulDevice fails any close made
while a kernel launched on one of its streams has not been synchronised, which on a GPU would unmap
memory under a kernel reading it (the stand-in's own close keeps the memory while views hold it).
"""
import argparse
import sys
from pathlib import Path

import numpy
from mpi4py import MPI

sys.path.append(str(Path(__file__).resolve().parents[2] / "stand_ins"))

import cpu_device  # noqa: E402
from collectives.devices import peers  # noqa: E402
from worker_util import Worker, contribution, expected_reduction  # noqa: E402

SIZES = [300, 1000, 700, 2000]  # float64s: freed buffers' ranges come back merged and split again


class WatchfulDevice(cpu_device.CpuDevice):
    """A stand-in device that refuses to close a mapping while a launched kernel may still be running."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.launched = set()  # streams with a kernel launched and not yet synchronised
        self.closes_checked = 0

    def reduce(self, outputs, inputs, op, stream):
        self.launched.add(stream)
        super().reduce(outputs, inputs, op, stream)

    def synchronize_stream(self, stream):
        super().synchronize_stream(stream)
        self.launched.discard(stream)

    def close(self, opened):
        if self.launched:
            raise AssertionError(f"a mapping was closed while {len(self.launched)} launched kernel(s) may read it")
        self.closes_checked += 1
        super().close(opened)


def calls(w, comm, device, rounds, seed):
    """`rounds` Allreduces on `comm`, each on buffers allocated for it and freed after it, checked."""
    for round_ in range(rounds):
        n = SIZES[round_ % len(SIZES)]
        inputs = [contribution("sum", numpy.float64, n, r, seed + round_) for r in range(w.size)]
        send, recv = device.array((n,), numpy.float64), device.array((n,), numpy.float64)
        send.write(inputs[w.rank])
        comm.Allreduce(send, recv, MPI.SUM)
        w.check(recv.peek(), expected_reduction("sum", inputs), f"thread {seed}'s round {round_}")
        del send, recv


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=150)
    args = parser.parse_args()
    rank = MPI.COMM_WORLD.Get_rank()
    device = WatchfulDevice(gpu=rank, seed=rank, max_delay_s=2e-3)
    cpu_device.register(device)
    w = Worker()
    w.case("two communicators, a thread each, on buffers allocated for every call")
    comms = w.each_on_its_communicator([(calls, (device, args.rounds, 0)), (calls, (device, args.rounds, 1000))])
    cache = peers.of(device)
    w.check_true(cache.closes > args.rounds // 4, f"only {cache.closes} mappings closed: nothing went stale")
    w.check_true(device.closes_checked == cache.closes, "a close bypassed the check")
    comms[1].Free()
    w.done("device-threads")


if __name__ == "__main__":
    main()
