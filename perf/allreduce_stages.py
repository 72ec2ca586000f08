"""Where an Allreduce across nodes spends its time: each stage of the hierarchical path alone, the stages
chained (the real call), and native MPI, in the same run.

    SCAFFE_RANKS_PER_NODE=2 mpiexec -n 8 python -m perf.allreduce_stages -m 1048576:4194304

The path (`collectives/algorithms/hierarchical.py`, nodes of one size, plain float32 buffers) is a node
reduce-scatter through shared memory (`rs`), an MPI Allreduce of each rank's range among the ranks with
its local rank on the other nodes (`column`), and a node allgather (`ag`). A stage timed alone has every
rank in that stage at once, so the sum of the three is what the call would cost if no rank ever waited
for another to arrive; `chained` is the call itself. For each, the table gives the median over rounds
(alternating in order, as in perf/osu.py) of the wall time per call, its ratio to native's in the same
round, and the CPU time per call summed over all ranks (getrusage), which is the figure that bounds an
oversubscribed node: when ranks outnumber cores, wall time is total CPU time over the cores.
"""
import argparse
import os
import resource
import time

import numpy
from mpi4py import MPI

import collectives
from perf.osu import parse_size_range, sizes


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--message-size", default="1048576:4194304", help="[min:]max message size in bytes")
    p.add_argument("-i", "--iterations", type=int, default=10, help="calls per stage per round")
    p.add_argument("-r", "--rounds", type=int, default=8, help="rounds per size (order reversed every other)")
    args = p.parse_args(argv)
    args.min_size, args.max_size = parse_size_range(args.message_size)
    return args


def stages(world, comm, send, recv):
    """name -> one call of that stage (or of the whole Allreduce) on these buffers."""
    topo, shm = comm.node_topology, comm.shm
    lo, hi = shm.owned_range(recv.shape[0], recv.dtype)
    return {
        "native": lambda: world.Allreduce(send, recv),
        "chained": lambda: comm.Allreduce(send, recv),
        "rs": lambda: shm.reduce_scatter(send, recv, "sum"),
        "column": lambda: topo.column_comm.Allreduce(MPI.IN_PLACE, recv[lo:hi]),
        "ag": lambda: shm.allgather(recv),
    }


def cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(world, call, iterations):
    """(slowest rank's wall seconds, all ranks' CPU seconds) per call."""
    call()
    world.Barrier()
    start, cpu = time.perf_counter(), cpu_seconds()
    for _ in range(iterations):
        call()
    wall, cpu = (time.perf_counter() - start) / iterations, (cpu_seconds() - cpu) / iterations
    return world.allreduce(wall, op=MPI.MAX), world.allreduce(cpu, op=MPI.SUM)


def main(argv=None):
    args = parse_args(argv)
    collectives.install_abort_hook()  # a failed check on one rank must end the job, not hang the others
    world = MPI.COMM_WORLD
    comm = collectives.Comm(world)
    topology = comm.describe()
    rank, shm = world.Get_rank(), comm.shm
    if comm.node_topology.column_comm is None or not shm.compiled_applies("sum", numpy.float32):
        raise SystemExit(f"allreduce_stages needs several nodes of one size without alloc windows; have {topology}"
                         " (simulate them with SCAFFE_RANKS_PER_NODE)" if rank == 0 else 2)
    if rank == 0:
        print(f"# Allreduce stages across nodes (scaffe perf); {world.Get_size()} ranks; topology: {topology}")
        print(f"# {os.cpu_count()} cores here; medians of {args.rounds} rounds of {args.iterations} calls")
        print(f"{'# Size':<12}{'stage':>12}{'wall(us)':>12}{'native/stage':>14}{'cpu(us)':>12}", flush=True)
    for size in sizes(args, numpy.dtype(numpy.float32).itemsize):
        send = numpy.full(size // 4, rank + 1, dtype=numpy.float32)
        recv = numpy.zeros_like(send)
        calls = stages(world, comm, send, recv)
        walls, cpus = {name: [] for name in calls}, {name: [] for name in calls}
        for round_index in range(args.rounds):
            for name in (list(calls) if round_index % 2 == 0 else list(calls)[::-1]):
                wall, cpu = measure(world, calls[name], args.iterations)
                walls[name].append(wall)
                cpus[name].append(cpu)
        comm.Allreduce(send, recv)
        if not numpy.all(recv == world.Get_size() * (world.Get_size() + 1) // 2):
            raise AssertionError(f"rank {rank}: the chained Allreduce of {size} bytes gave {recv[:4]}...")
        if rank == 0:
            native = numpy.array(walls["native"])
            rows = {name: (numpy.median(walls[name]), numpy.median(native / numpy.array(walls[name])),
                           numpy.median(cpus[name])) for name in calls}
            alone = [rows[name] for name in ("rs", "column", "ag")]
            wall_sum, cpu_sum = sum(r[0] for r in alone), sum(r[2] for r in alone)
            rows["rs+column+ag"] = (wall_sum, rows["native"][0] / wall_sum, cpu_sum)
            for name, (wall, ratio, cpu) in rows.items():
                print(f"{size:<12d}{name:>12}{wall * 1e6:>12.0f}{ratio:>14.2f}{cpu * 1e6:>12.0f}")
            print(flush=True)


if __name__ == "__main__":
    main()
