"""Reduce, Allreduce and Bcast against numpy, exactly, over ops x dtypes x sizes x roots x in-place x
blocking/nonblocking (workers/space.py loops over that space inside one launch), on many topologies.

One launch per rank count runs every pass of that count (PASSES), each on a communicator of its own: a
launch costs each rank its start-up (numba's alone is most of a second), which on a loaded 2-core machine is
most of what a small pass costs. Chunks are small (4 KiB between ranks, 2 KiB in shared memory) so that sizes
of a few thousand elements already run many pipelined chunks, none of them a multiple of the chunk.
"""
import shlex

import pytest

from mpi_harness import run_ok, settings_of

SMALL_CHUNKS = {"SCAFFE_CHUNK_BYTES": 4096, "SCAFFE_SHM_CHUNK_BYTES": 2048}
# Size 0 is checked in passes of its own ("zero": a known failure there would hide everything else).
SIZES = "1,7,1001,5003"
REDUCED = ("--ops", "sum,max", "--dtypes", "int8,float32,float64")
# float16 is checked under native MPI and the default table in the "float16" passes.
WITHOUT_FLOAT16 = "int8,int16,int32,int64,uint8,uint16,uint32,uint64,float32,float64,complex64,complex128"


def launch_id(ranks, per_node, algo):
    return f"n{ranks}-rpn{per_node or 'unset'}-{algo or 'default'}"


# Every pass of the space: (ranks, SCAFFE_RANKS_PER_NODE, SCAFFE_REDUCE_ALGO, name, space.py's arguments,
# other settings). None means unset (one real node, the default selection table). The passes of one rank
# count run in one launch (workers/space.py --pass), each on a communicator made under its settings.
PASSES = []


def add(name, args, cases, **extra):
    PASSES.extend((ranks, per_node, algo, f"{name}-{launch_id(ranks, per_node, algo)}", args(*rest), extra)
                  for ranks, per_node, algo, *rest in cases)


# Every op x every dtype MPI defines it for; (root, in-place, mode) drawn per case (--rotate).
add("every-op-and-dtype", lambda dtypes: ["--rotate", "--ops", "all", "--dtypes", dtypes, "--sizes", SIZES], [
    (1, None, None, "all"),
    (3, 2, "hierarchical", "all"),  # nodes of [2, 1]: shared memory, then the pipeline between heads
    (4, 2, "hierarchical", "int32,float16"),  # even nodes: both node loops' reduce-scatter and allgather
    (4, None, None, WITHOUT_FLOAT16),  # one node: small messages native, larger ones hierarchical
    (2, None, "native", WITHOUT_FLOAT16),
    (3, None, "tree", "all"),
])

# sum and max over three dtypes, on a covering set of topologies.
add("topology", lambda: ["--rotate", *REDUCED, "--sizes", SIZES], [
    (2, None, "hierarchical"), (2, 1, "hierarchical"), (3, 1, "hierarchical"), (4, 2, "hierarchical"),
    (4, 3, "hierarchical"), (5, 4, "hierarchical"), (8, 3, "hierarchical"), (8, None, "hierarchical"),
    (2, None, "tree"), (5, None, "tree"), (8, 2, "tree"),
    (2, None, "chain"), (4, None, "chain"), (5, 3, "chain"), (8, None, "chain"),
    (3, None, "native"), (8, None, "native"),
    (2, None, None), (3, 2, None), (5, 3, None), (8, 4, None),
])

# No rotation: every root x in-place x (blocking, Wait, Test loop, Waitall) for each op, dtype, size.
# (4, None, hierarchical): IN_PLACE at roots of local rank 2 and 3, whose buffer is a later input of the fused reduce.
add("crossed", lambda: ["--ops", "sum", "--dtypes", "int8,float64", "--sizes", "7,5003"], [
    (3, 2, "hierarchical"), (4, None, "hierarchical"), (4, None, "chain"), (4, 2, None),
])

# A few MiB: above every selection threshold, so the default table picks the hierarchical path, and the heads
# take a chain of eighth-of-a-call chunks (collectives.algorithms.hierarchical.heads_shape).
LARGE_ELEMENTS = str((4 << 20) // 4 + 3)
add("large", lambda: ["--rotate", "--ops", "sum,max", "--dtypes", "float32,float64", "--sizes", LARGE_ELEMENTS],
    [(3, 2, "hierarchical"), (4, 1, None)], SCAFFE_CHUNK_BYTES="", SCAFFE_SHM_CHUNK_BYTES="")

# Empty messages, also as the very first call on a communicator (before any shared memory exists).
add("zero", lambda sizes: [*REDUCED, "--sizes", sizes], [
    (1, None, "hierarchical", "0,1,0"),
    (2, None, "hierarchical", "1,0"),
    (3, 2, "hierarchical", "1,0"),
    (2, None, "tree", "0,1,0"),
    (3, None, "chain", "0,1,0"),
    (2, None, "native", "0,1,0"),
    (4, 2, None, "0,1,0"),
])

# float16 never goes to native MPI (no portable MPI type); every rank must make the same choice.
add("float16", lambda: ["--rotate", "--ops", "sum,max", "--dtypes", "float16", "--sizes", SIZES],
    [(2, None, "native"), (3, 2, None)])

# SCAFFE_CHECK=1 must not change any result when all ranks agree.
add("checked", lambda: ["--rotate", *REDUCED, "--sizes", SIZES], [(4, 2, None)], SCAFFE_CHECK=1)

# Device buffers (numba device arrays; the CUDA simulator without a GPU) go through host staging, with
# the same algorithm choice as host buffers of that size, so ranks may mix device and host buffers.
add("device", lambda memory, dtypes: ["--rotate", "--memory", memory, "--ops", "all", "--dtypes", dtypes,
                                      "--sizes", "0," + SIZES], [
    (4, None, None, "device", "all"),
    (3, 2, "hierarchical", "device", "all"),
    (4, 2, None, "mixed", WITHOUT_FLOAT16),
    (3, None, "native", "mixed", WITHOUT_FLOAT16),
])
# Blocking, Wait, Test and Waitall crossed with every root and in-place, device buffers on the ranks.
add("device-crossed", lambda memory: ["--memory", memory, "--ops", "sum", "--dtypes", "float64",
                                      "--sizes", "7,5003"], [(4, 2, None, "device"), (4, 2, None, "mixed")])

RANKS = sorted({ranks for ranks, *_ in PASSES})


@pytest.mark.parametrize("ranks", RANKS, ids=lambda ranks: f"n{ranks}")
def test_the_space(ranks):
    """Every pass of PASSES at this rank count, in one launch."""
    passes = [(name, args, settings_of(per_node, algo, **extra))
              for count, per_node, algo, name, args, extra in PASSES if count == ranks]
    words = [word for name, args, settings in passes
             for word in ("--pass", shlex.join([*args, "--name", name, "--settings", settings]))]
    run_ok(ranks, "space.py", *words, env=SMALL_CHUNKS, timeout=60 + 20 * ranks * len(passes), passes=len(passes))


def test_every_root_uneven_nodes():
    """Roots at every local rank of every node, nodes of [2, 2, 1]; waits that nap (SCAFFE_WAIT=nap:0.2, read
    once per process) in the pipelines between nodes, the progress thread and the column allreduce."""
    run_ok(5, "space.py", "--rotate", "--roots", "all", *REDUCED, "--sizes", SIZES, "--name", "all-roots",
           env=dict(SMALL_CHUNKS, SCAFFE_RANKS_PER_NODE=2, SCAFFE_REDUCE_ALGO="hierarchical", SCAFFE_WAIT="nap:0.2"),
           timeout=90)


def test_without_thread_multiple():
    """With MPI_THREAD_SERIALIZED (chosen at MPI's initialisation) the I* calls run at once in the caller;
    requests still complete."""
    run_ok(3, "space.py", "--rotate", *REDUCED, "--sizes", SIZES, "--name", "serialized",
           env=dict(SMALL_CHUNKS, SCAFFE_RANKS_PER_NODE=2, SCAFFE_REDUCE_ALGO="hierarchical",
                    MPI4PY_RC_THREAD_LEVEL="serialized"), timeout=90)
