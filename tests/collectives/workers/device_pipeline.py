"""The leaders' device pipeline (collectives.devices.pipeline) on its own, on the CPU stand-in device.

    mpiexec -n 4 python device_pipeline.py STAGING PLANT

Every rank is one node's leader with its buffers on a stand-in device (tests/stand_ins/cpu_device.py),
whose streams run late and in any order between them, so a missing wait gives wrong results. Reduce and
Bcast along a binomial tree and a chain, every root, float32/float64/int32, every op, sizes of one chunk and
of many, all checked exactly. STAGING: `pinned` (chunks staged through pinned host buffers) or `direct`
(device chunks handed to MPI, as with a CUDA-aware MPI). PLANT drops one wait on purpose, to show that the
stand-in catches such a miss:
  none:     nothing dropped;
  upload:   the reduce kernel does not wait for the chunks copied up to the device;
  download: MPI sends a pinned chunk without waiting for its copy down from the device.
"""
import sys
from pathlib import Path

import numpy

from collectives.algorithms import chain, tree
from collectives.devices import pipeline as device_pipeline
from worker_util import OPS, Worker, contribution, expected_reduction, valid

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "stand_ins"))
from cpu_device import CpuDevice  # noqa: E402

DTYPES = [numpy.dtype(t) for t in (numpy.float32, numpy.float64, numpy.int32)]
CHUNK = 256  # elements: the sizes below are one chunk and eleven
SIZES = (1, 2600)


def plant(device, scratch, which):
    """Make the device forget one kind of the pipeline's waits (see the module's docstring)."""
    wait, synchronize = device.wait, device.synchronize

    def careless_wait(stream, event):
        if not (which == "upload" and stream is scratch.compute and any(event is e for e in scratch.landed)):
            wait(stream, event)

    def careless_synchronize(event):
        if not (which == "download" and any(event is e for e in scratch.fetched)):
            synchronize(event)

    device.wait, device.synchronize = careless_wait, careless_synchronize


def on_device(device, values):
    array = device.array(values.shape, values.dtype)
    array.write(values)
    device.default_stream.synchronize()  # the pipeline's callers hand it buffers that are ready
    return array


def main():
    staging, planted = sys.argv[1], sys.argv[2]
    w = Worker()
    world, rank, size = w.world, w.rank, w.size
    device = CpuDevice(max_delay_s=1e-3 if planted != "none" else 2e-4, seed=rank)
    scratch = device_pipeline.Scratch(device)
    direct = staging == "direct"
    if planted != "none":
        plant(device, scratch, planted)
    seed = 0
    for shape in (tree.shape, chain.shape):
        for dtype in DTYPES:
            for n in SIZES:
                for op in [op for op in OPS if valid(op, dtype)]:
                    seed += 1
                    root = seed % size
                    parent, children = shape(rank, size, root)
                    data = [contribution(op, dtype, n, r, seed) for r in range(size)]
                    w.case(f"{shape.__module__} reduce {op} {dtype} n={n} root={root}")
                    own = on_device(device, data[rank])
                    out = device.array((n,), dtype) if rank == root else None
                    device_pipeline.reduce(world, own, out, op, parent, children, CHUNK, scratch, direct)
                    if rank == root:
                        w.check(out.peek(), expected_reduction(op, data), "reduce result")
                w.case(f"{shape.__module__} bcast {dtype} n={n} root={root}")
                buf = on_device(device, data[root] if rank == root else numpy.zeros(n, dtype))
                device_pipeline.bcast(world, buf, parent, children, CHUNK, scratch, direct)
                w.check(buf.peek(), data[root], "bcast result")
    w.done(f"device_pipeline {staging}, plant={planted}")


if __name__ == "__main__":
    main()
