"""Host cost of a repeated device collective on the CPU stand-in device (or a GPU): microseconds and Python calls.

A proxy that runs without a GPU for what a repeated call costs the host before any data moves (issue 22:
about 1,000 Python function calls a call on the GPU). Each rank serves its buffers with the stand-in
device of tests/stand_ins/cpu_device.py, without its random delays; the same buffers are passed again and
again, as a training loop passes its gradients. Rank 0 (the root) prints, per call kind, the median host
time of a call and the Python function calls made in the collectives' own code (cProfile, only functions
defined under collectives/; the stand-in device's and numpy's are not counted). The counts are
deterministic; the times are whatever the machine gives. With `--device cupy` (or `numba`) the buffers are
cupy (numba) arrays on the GPU instead (every rank on GPU 0), and `--top N` lists the N functions that
took most of the root's own time (cProfile's tottime, every package), to see where a real device's call goes.

    mpiexec -n 4 python perf/device_overhead.py [--calls 200] [--count 1024] [--device cupy|numba] [--top 15]
"""
import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy
from mpi4py import MPI

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO / "tests" / "stand_ins"))

import collectives  # noqa: E402
import cpu_device  # noqa: E402

_OWN_CODE = str(REPO / "collectives") + os.sep


def own_calls(profile):
    """Calls made to functions defined in the collectives package, from a cProfile run."""
    stats = pstats.Stats(profile).stats
    return sum(calls for (filename, _, _), (_, calls, _, _, _) in stats.items() if filename.startswith(_OWN_CODE))


def calls_of(comm, kind, send, recv):
    """The repeated call of `kind` on these buffers, as a function of no arguments."""
    if kind == "Reduce":
        return lambda: comm.Reduce(send, recv, MPI.SUM, 0)
    if kind == "Allreduce":
        return lambda: comm.Allreduce(send, recv, MPI.SUM)
    return lambda: comm.Bcast(recv, 0)


def measure(comm, call, calls, top=0):
    """(median microseconds of a call, Python calls per call in the collectives' code) on this rank; the
    `top` functions by own time are printed on rank 0."""
    for _ in range(10):
        call()  # the first calls map buffers and build what later ones reuse
    times = []
    for _ in range(calls):
        comm.private.Barrier()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    profiled = 20
    profile = cProfile.Profile()
    comm.private.Barrier()
    profile.enable()
    for _ in range(profiled):
        call()
    profile.disable()
    if top and comm.Get_rank() == 0:
        pstats.Stats(profile).sort_stats("tottime").print_stats(top)
    return statistics.median(times) * 1e6, own_calls(profile) / profiled


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--count", type=int, default=1024, help="float32 elements per buffer")
    parser.add_argument("--device", choices=["stand-in", "cupy", "numba"], default="stand-in")
    parser.add_argument("--top", type=int, default=0, help="functions to list by the root's own time")
    args = parser.parse_args()
    if args.device == "cupy":
        import cupy
        send, recv = cupy.ones(args.count, cupy.float32), cupy.zeros(args.count, cupy.float32)
        cupy.cuda.Device().synchronize()
    elif args.device == "numba":
        from numba import cuda
        send, recv = cuda.to_device(numpy.ones(args.count, numpy.float32)), cuda.device_array(args.count, numpy.float32)
        cuda.synchronize()
    else:
        local_rank = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED).Get_rank()
        device = cpu_device.CpuDevice(gpu=0, max_delay_s=0.0, seed=local_rank)
        cpu_device.register(device)
        send, recv = device.array((args.count,), numpy.float32), device.array((args.count,), numpy.float32)
        send.write(numpy.ones(args.count))
        recv.write(numpy.zeros(args.count))
    comm = collectives.Comm(MPI.COMM_WORLD.Dup())
    comm.describe()
    rows = []
    for kind in ("Reduce", "Allreduce", "Bcast"):
        rows.append((kind, *measure(comm, calls_of(comm, kind, send, recv), args.calls, args.top)))
    if comm.Get_rank() == 0:
        size = comm.Get_size()
        for kind, micros, calls in rows:
            print(f"{kind:9s} ranks={size} count={args.count} device={args.device} host_us={micros:8.1f} "
                  f"python_calls={calls:6.1f}")
    comm.Free()


if __name__ == "__main__":
    main()
