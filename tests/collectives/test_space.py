"""Reduce, Allreduce and Bcast against numpy, exactly, over ops x dtypes x sizes x roots x in-place x
blocking/nonblocking (workers/space.py loops over that space inside one launch), on many topologies.

A launch is (ranks, SCAFFE_RANKS_PER_NODE, SCAFFE_REDUCE_ALGO); None means unset (one real node, the
default selection table). Chunks are small (4 KiB between ranks, 2 KiB in shared memory) so that sizes
of a few thousand elements already run many pipelined chunks, none of them a multiple of the chunk.
"""
import pytest

from mpi_harness import run_ok

SMALL_CHUNKS = {"SCAFFE_CHUNK_BYTES": 4096, "SCAFFE_SHM_CHUNK_BYTES": 2048}
# Size 0 is checked on its own in test_zero_length (a known failure there would hide everything else).
SIZES = "1,7,1001,5003"
REDUCED = ("--ops", "sum,max", "--dtypes", "int8,float32,float64")
# float16 is checked under native MPI and the default table in test_float16_native_paths.
WITHOUT_FLOAT16 = "int8,int16,int32,int64,uint8,uint16,uint32,uint64,float32,float64,complex64,complex128"


def env_for(per_node, algo, **extra):
    env = dict(SMALL_CHUNKS, SCAFFE_RANKS_PER_NODE=per_node, SCAFFE_REDUCE_ALGO=algo)
    env.update(extra)
    return env


def launch_id(case):
    ranks, per_node, algo = case[:3]
    return f"n{ranks}-rpn{per_node or 'unset'}-{algo or 'default'}"


# Every op x every dtype MPI defines it for; (root, in-place, mode) drawn per case (--rotate).
FULL = [
    (1, None, None, "all"),
    (3, 2, "hierarchical", "all"),  # nodes of [2, 1]: shared memory, then the pipeline between heads
    (4, 2, "hierarchical", "int32,float16"),  # even nodes: both node loops' reduce-scatter and allgather
    (4, None, None, WITHOUT_FLOAT16),  # one node: small messages native, larger ones hierarchical
    (2, None, "native", WITHOUT_FLOAT16),
    (3, None, "tree", "all"),
]


@pytest.mark.parametrize("case", FULL, ids=launch_id)
def test_every_op_and_dtype(case):
    ranks, per_node, algo, dtypes = case
    run_ok(ranks, "space.py", "--rotate", "--ops", "all", "--dtypes", dtypes, "--sizes", SIZES,
           "--name", launch_id(case), env=env_for(per_node, algo), timeout=90)


# sum and max over three dtypes, on a covering set of topologies.
GRID = [
    (2, None, "hierarchical"), (2, 1, "hierarchical"), (3, 1, "hierarchical"), (4, 2, "hierarchical"),
    (4, 3, "hierarchical"), (5, 4, "hierarchical"), (8, 3, "hierarchical"), (8, None, "hierarchical"),
    (2, None, "tree"), (5, None, "tree"), (8, 2, "tree"),
    (2, None, "chain"), (4, None, "chain"), (5, 3, "chain"), (8, None, "chain"),
    (3, None, "native"), (8, None, "native"),
    (2, None, None), (3, 2, None), (5, 3, None), (8, 4, None),
]


def settings_of(cases):
    """--settings of each (ranks, per_node, algo) case: one pass each, on a communicator of its own."""
    return [word for _, per_node, algo, *_ in cases
            for word in ("--settings", f"SCAFFE_RANKS_PER_NODE={per_node or ''},SCAFFE_REDUCE_ALGO={algo or ''}")]


def by_ranks(cases):
    """`cases` grouped by rank count: each group runs in one launch."""
    return {ranks: [case for case in cases if case[0] == ranks] for ranks in sorted({case[0] for case in cases})}


@pytest.mark.parametrize("ranks", by_ranks(GRID), ids=lambda ranks: f"n{ranks}")
def test_topologies(ranks):
    cases = by_ranks(GRID)[ranks]
    job = run_ok(ranks, "space.py", "--rotate", *REDUCED, "--sizes", SIZES, "--name", f"n{ranks}", *settings_of(cases),
                 env=SMALL_CHUNKS, timeout=30 + 30 * len(cases))
    assert job.stdout.count("WORKER-OK") == len(cases), job.report()


def test_every_root_uneven_nodes():
    """Roots at every local rank of every node, nodes of [2, 2, 1]; waits that nap (SCAFFE_WAIT=nap:0.2) in
    the pipelines between nodes, the progress thread and the column allreduce."""
    run_ok(5, "space.py", "--rotate", "--roots", "all", *REDUCED, "--sizes", SIZES, "--name", "all-roots",
           env=env_for(2, "hierarchical", SCAFFE_WAIT="nap:0.2"), timeout=90)


# (4, None, hierarchical): IN_PLACE at roots of local rank 2 and 3, whose buffer is a later input of the fused reduce.
CROSSED = [(3, 2, "hierarchical"), (4, None, "hierarchical"), (4, None, "chain"), (4, 2, None)]


@pytest.mark.parametrize("ranks", by_ranks(CROSSED), ids=lambda ranks: f"n{ranks}")
def test_every_root_inplace_and_mode_crossed(ranks):
    """No rotation: every root x in-place x (blocking, Wait, Test loop, Waitall) for each op, dtype, size."""
    cases = by_ranks(CROSSED)[ranks]
    job = run_ok(ranks, "space.py", "--ops", "sum", "--dtypes", "int8,float64", "--sizes", "7,5003",
                 "--name", f"crossed-n{ranks}", *settings_of(cases), env=SMALL_CHUNKS, timeout=30 + 60 * len(cases))
    assert job.stdout.count("WORKER-OK") == len(cases), job.report()


# A few MiB: above every selection threshold and CHAIN_FROM_BYTES (4 MiB for float32 and float64), so the
# default table picks the hierarchical path and the heads use the chain; default chunk sizes here.
LARGE_ELEMENTS = str((4 << 20) // 4 + 3)


@pytest.mark.parametrize("case", [(3, 2, "hierarchical"), (4, 1, None)], ids=launch_id)
def test_large_messages(case):
    ranks, per_node, algo = case
    run_ok(ranks, "space.py", "--rotate", "--ops", "sum,max", "--dtypes", "float32,float64",
           "--sizes", LARGE_ELEMENTS, "--name", launch_id(case),
           env={"SCAFFE_RANKS_PER_NODE": per_node, "SCAFFE_REDUCE_ALGO": algo}, timeout=120)


def test_without_thread_multiple():
    """With MPI_THREAD_SERIALIZED the I* calls run at once in the caller; requests still complete."""
    run_ok(3, "space.py", "--rotate", *REDUCED, "--sizes", SIZES, "--name", "serialized",
           env=env_for(2, "hierarchical", MPI4PY_RC_THREAD_LEVEL="serialized"), timeout=90)


ZERO = [
    (1, None, "hierarchical", "0,1,0"),
    (2, None, "hierarchical", "1,0"),
    (3, 2, "hierarchical", "1,0"),
    (2, None, "tree", "0,1,0"),
    (3, None, "chain", "0,1,0"),
    (2, None, "native", "0,1,0"),
    (4, 2, None, "0,1,0"),
]


@pytest.mark.parametrize("case", ZERO, ids=launch_id)
def test_zero_length(case):
    """Empty messages, also as the very first call (before any shared memory exists)."""
    ranks, per_node, algo, sizes = case
    run_ok(ranks, "space.py", *REDUCED, "--sizes", sizes, "--name", "zero-" + launch_id(case),
           env=env_for(per_node, algo), timeout=60)


@pytest.mark.parametrize("case", [(2, None, "native"), (3, 2, None)], ids=launch_id)
def test_float16_native_paths(case):
    """float16 never goes to native MPI (no portable MPI type); every rank must make the same choice."""
    ranks, per_node, algo = case
    run_ok(ranks, "space.py", "--rotate", "--ops", "sum,max", "--dtypes", "float16", "--sizes", SIZES,
           "--name", "float16-" + launch_id(case), env=env_for(per_node, algo), timeout=60)


def test_checked_mode_accepts_matching_calls():
    """SCAFFE_CHECK=1 must not change any result when all ranks agree."""
    run_ok(4, "space.py", "--rotate", *REDUCED, "--sizes", SIZES, "--name", "checked",
           env=env_for(2, None, SCAFFE_CHECK=1), timeout=60)


# Device buffers (numba device arrays; the CUDA simulator without a GPU) go through host staging, with
# the same algorithm choice as host buffers of that size, so ranks may mix device and host buffers.
DEVICE = [
    (4, None, None, "device", "all"),
    (3, 2, "hierarchical", "device", "all"),
    (4, 2, None, "mixed", WITHOUT_FLOAT16),
    (3, None, "native", "mixed", WITHOUT_FLOAT16),
]


@pytest.mark.parametrize("case", DEVICE, ids=lambda c: launch_id(c) + "-" + c[3])
def test_device_buffers(case):
    ranks, per_node, algo, memory, dtypes = case
    run_ok(ranks, "space.py", "--rotate", "--memory", memory, "--ops", "all", "--dtypes", dtypes,
           "--sizes", "0," + SIZES, "--name", f"{memory}-{launch_id(case)}",
           env=env_for(per_node, algo), timeout=90)


@pytest.mark.parametrize("memory", ["device", "mixed"])
def test_device_buffers_every_mode(memory):
    """Blocking, Wait, Test and Waitall crossed with every root and in-place, device buffers on the ranks."""
    run_ok(4, "space.py", "--memory", memory, "--ops", "sum", "--dtypes", "float64", "--sizes", "7,5003",
           "--name", f"{memory}-crossed", env=env_for(2, None), timeout=90)
