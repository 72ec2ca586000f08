"""What the bed's links carry of the S-Caffe schedule's traffic, without the training: the gradients'
reduces to the root in pieces, the parameters' broadcasts back, each alone and both at once.

    jobs/cluster.sh run -n 1 .venv/bin/python -m perf.tree_traffic --rate-kbit R [--piece-bytes P] [--pieces N]

Run with one rank per host on the multi-host bed, R its links' rate (`jobs/cluster.sh up H --rate Rkbit`).
Each line: the median seconds of one round (all N pieces, every request posted at once) and its efficiency,
the busiest direction's bytes over the link's rate divided by those seconds. With both at once the busiest
host's link carries, in each direction, the schedule's bound (perf/cluster_sim.py): B (N x P bytes) on two
hosts; from three on, where the hosts form chains taken in turn (collectives.algorithms.hierarchical), (2 H - 3) /
(H - 1) B, and 2 B at the root of a tree; a reduce or a broadcast alone carries B along chains, 2 B at a tree's
root. `native` rows run MPI's own Ireduce and Ibcast on the same pieces, measured against the same bytes.
"""
import argparse
import statistics
import time

import numpy
from mpi4py import MPI

import collectives
from collectives import settings
from collectives.algorithms import chain
from collectives.algorithms.hierarchical import heads_shape


def busiest_bytes(kind, hosts, piece_bytes, total):
    """Bytes the busiest direction of a host's link carries for `kind`."""
    if hosts == 2:
        return total
    shape, _ = heads_shape(piece_bytes, hosts, settings.chunk_bytes())
    if shape is not chain.shape:
        return 2 * total  # a tree's root: two children's streams in, or out to two children
    # Along chains in turn every non-root host sends each reduce chunk up and forwards a broadcast chunk in
    # every turn but the one it ends.
    return total if kind in ("reduces", "bcasts") else (2 * hosts - 3) * total / (hosts - 1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate-kbit", type=float, required=True, help="the bed's link rate, kbit/s")
    p.add_argument("--piece-bytes", type=int, default=2 << 20)
    p.add_argument("--pieces", type=int, default=14)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    world = MPI.COMM_WORLD
    rank, hosts = world.Get_rank(), world.Get_size()
    ours = collectives.Comm(world)
    ours_back, native, native_back = ours.Dup(), world.Dup(), world.Dup()
    ours.two_way = ours_back.two_way = True  # as the S-Caffe schedule's: chains in turn among the hosts
    count = args.piece_bytes // 4
    gradients = [numpy.full(count, rank + 1, numpy.float32) for _ in range(args.pieces)]
    parameters = [numpy.zeros(count, numpy.float32) for _ in range(args.pieces)]

    def reduces(comm):
        return [comm.Ireduce(MPI.IN_PLACE if rank == 0 else g, g if rank == 0 else None, op=MPI.SUM, root=0)
                for g in gradients]

    def bcasts(comm):
        return [comm.Ibcast(data, root=0) for data in parameters]

    kinds = {"reduces": lambda: reduces(ours), "bcasts": lambda: bcasts(ours),
             "both": lambda: reduces(ours) + bcasts(ours_back),
             "native both": lambda: reduces(native) + bcasts(native_back)}
    for start in kinds.values():  # set-up and first calls
        MPI.Request.Waitall(start())
    total = args.pieces * args.piece_bytes
    for name, start in kinds.items():
        seconds = []
        for _ in range(args.rounds):
            world.Barrier()
            begin = time.perf_counter()
            MPI.Request.Waitall(start())
            world.Barrier()
            seconds.append(time.perf_counter() - begin)
        if rank == 0:
            ideal = busiest_bytes(name.split()[-1], hosts, args.piece_bytes, total) / (args.rate_kbit * 125)
            median = statistics.median(seconds)
            print(f"{name:12s} {median:8.3f} s  link-bound {ideal:8.3f} s  efficiency {ideal / median:.2f}", flush=True)
    for comm in (ours_back, native, native_back):
        comm.Free()


if __name__ == "__main__":
    main()
