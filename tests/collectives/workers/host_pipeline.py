"""The host pipeline (collectives.algorithms.pipeline) on its own, every rank one node's head.

    mpiexec -n N python host_pipeline.py

Reduce and Bcast along a binomial tree, a chain and chains taken in turn (chain.turns: each turn a pipeline of
its own, whose chunks a rank moves as they come), every root, float32/float64/int32, every op, sizes of one
chunk and of many, with the reduce's result in place or apart, all checked exactly; a broadcast reports the
run of chunks arrived from the first as it grows, up to all of them.
"""
import numpy

from collectives.algorithms import chain, pipeline, tree
from worker_util import OPS, Worker, contribution, expected_reduction, valid

DTYPES = [numpy.dtype(t) for t in (numpy.float32, numpy.float64, numpy.int32)]
CHUNK = 256  # elements: the sizes below are one chunk and eleven
SIZES = (1, 2600)
SHAPES = {"tree": lambda *a: [tree.shape(*a)], "chain": lambda *a: [chain.shape(*a)], "turns": chain.turns}


def main():
    w = Worker()
    world, rank, size = w.world, w.rank, w.size
    scratch = pipeline.ScratchPool()
    seed = 0
    for name, shape in SHAPES.items():
        for dtype in DTYPES:
            for n in SIZES:
                for op in [op for op in OPS if valid(op, dtype)]:
                    seed += 1
                    root = seed % size
                    routes = shape(rank, size, root)
                    data = [contribution(op, dtype, n, r, seed) for r in range(size)]
                    in_place = seed % 2 == 0
                    w.case(f"{name} reduce {op} {dtype} n={n} root={root} in_place={in_place}")
                    own = data[rank].copy()
                    out = (own if in_place else numpy.empty(n, dtype)) if rank == root else None
                    pipeline.reduce(world, own, out, op, routes, CHUNK, scratch)
                    if rank == root:
                        w.check(out, expected_reduction(op, data), "reduce result")
                    elif not in_place:
                        w.check(own, data[rank], "the send buffer, untouched")
                w.case(f"{name} bcast {dtype} n={n} root={root}")
                buf = data[root].copy() if rank == root else numpy.zeros(n, dtype)
                runs = []
                pipeline.bcast(world, buf, routes, CHUNK, on_chunk=runs.append)
                w.check(buf, data[root], "bcast result")
                chunks = -(-n // CHUNK)
                w.check_true(runs == sorted(runs) and runs[-1:] == [chunks] and len(set(runs)) == len(runs),
                             f"chunks reported {runs}, expected a growing run up to {chunks}")
    w.done("host_pipeline")


if __name__ == "__main__":
    main()
