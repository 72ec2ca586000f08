"""Device buffers across (simulated) nodes on the CPU stand-in device: every collective checked exactly.

    SCAFFE_RANKS_PER_NODE=2 SCAFFE_CHUNK_BYTES=4096 mpiexec -n 4 python device_nodes.py

Each rank's buffers live on a stand-in device (tests/stand_ins/cpu_device.py), whose streams run late and
in any order between them, and the caller's data is written on the default stream without waiting, so
the node stage (IPC) and the leaders' chunk pipeline give wrong results wherever they miss a wait.
Reduce, Allreduce and Bcast, blocking and not, float32/float64/int32, every op, one chunk to ten.
"""
import sys
from pathlib import Path

import numpy

from worker_util import OPS, Worker, contribution, expected_reduction, valid

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "stand_ins"))
from cpu_device import CpuDevice, register  # noqa: E402

DTYPES = [numpy.dtype(t) for t in (numpy.float32, numpy.float64, numpy.int32)]
SIZES = (1, 700, 5000)  # one chunk, a few, ten of SCAFFE_CHUNK_BYTES=4096


def on_device(device, values):
    array = device.array(values.shape, values.dtype)
    array.write(values)  # queued on the default stream: the collective must order itself after it
    return array


def finish(request):
    if request is not None:
        request.Wait()


def main():
    w = Worker()
    comm, rank, size = w.comm, w.rank, w.size
    device = CpuDevice(gpu=0, max_delay_s=2e-4, seed=rank)  # the ranks of a node share one device
    register(device)
    seed = 0
    for dtype in DTYPES:
        for n in SIZES:
            for op in [op for op in OPS if valid(op, dtype)]:
                seed += 1
                blocking = seed % 2 == 0
                data = [contribution(op, dtype, n, r, seed) for r in range(size)]
                expected = expected_reduction(op, data)
                w.case(f"{'' if blocking else 'I'}allreduce {op} {dtype} n={n}")
                recv = device.array((n,), dtype)
                send = on_device(device, data[rank])
                finish((comm.Allreduce if blocking else comm.Iallreduce)(send, recv, op=OPS[op]))
                w.check(recv.read(), expected, "allreduce result")
                root = seed % size
                w.case(f"{'' if blocking else 'I'}reduce {op} {dtype} n={n} root={root}")
                recv = device.array((n,), dtype) if rank == root else None
                finish((comm.Reduce if blocking else comm.Ireduce)(on_device(device, data[rank]), recv,
                                                                      op=OPS[op], root=root))
                if rank == root:
                    w.check(recv.read(), expected, "reduce result")
            root = (seed + 1) % size
            w.case(f"bcast {dtype} n={n} root={root}")
            data = contribution("sum", dtype, n, root, seed)
            buf = on_device(device, data if rank == root else numpy.zeros(n, dtype))
            finish(comm.Ibcast(buf, root=root) if seed % 2 else comm.Bcast(buf, root=root))
            w.check(buf.read(), data, "bcast result")
    w.case("the leaders ran the device pipeline")
    w.check_true(comm.node_topology.local_rank != 0 or device in comm.device_pipelines,
                 "a node leader has no pipeline buffers: the calls did not take the device path")
    w.done("device_nodes")


if __name__ == "__main__":
    main()
