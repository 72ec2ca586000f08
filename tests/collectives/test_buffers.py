"""Buffer specs, node-shared (`alloc`) buffers, fallbacks to the wrapped MPI, bitwise reproducibility and
the drop-in promise, each checked on a few topologies."""
import pytest

from mpi_harness import run_ok, settings_words

SMALL_CHUNKS = {"SCAFFE_CHUNK_BYTES": 4096, "SCAFFE_SHM_CHUNK_BYTES": 2048}
TOPOLOGIES = [  # (ranks, SCAFFE_RANKS_PER_NODE, SCAFFE_REDUCE_ALGO); None: unset
    (1, None, None),
    (3, 2, "hierarchical"),
    (4, None, None),
    (4, 3, "hierarchical"),
    (2, None, "tree"),
    (5, 2, "chain"),
    (3, None, "native"),
]


def launch_id(case):
    ranks, per_node, algo = case
    return f"n{ranks}-rpn{per_node or 'unset'}-{algo or 'default'}"


def env_for(per_node, algo):
    return dict(SMALL_CHUNKS, SCAFFE_RANKS_PER_NODE=per_node, SCAFFE_REDUCE_ALGO=algo)


@pytest.mark.parametrize("ranks", sorted({case[0] for case in TOPOLOGIES}), ids=lambda ranks: f"n{ranks}")
def test_buffer_specs_alloc_and_fallbacks(ranks):
    """[buf, type], [buf, count, type], [buf, (count, displ), type], bytearray, array.array, mixed specs,
    alloc buffers as send/receive buffers mixed with plain ones, user ops, derived types, bool, MAXLOC: every
    topology of this rank count in one launch, each on a communicator of its own."""
    cases = [case for case in TOPOLOGIES if case[0] == ranks]
    run_ok(ranks, "buffers.py", *settings_words(case[1:] for case in cases), env=SMALL_CHUNKS,
           timeout=90 * len(cases), passes=len(cases))


@pytest.mark.parametrize("case", [(4, 2, None), (3, None, "tree"), (5, 3, "hierarchical")], ids=launch_id)
def test_bitwise_reproducible(case):
    """Same bytes for repeated, blocking and nonblocking calls and on every rank; and run to run."""
    ranks, per_node, algo = case
    digests = []
    for _ in range(2):
        job = run_ok(ranks, "reproducible.py", env=dict(env_for(per_node, algo), SCAFFE_CHUNK_BYTES=65536),
                     timeout=60)
        digests.append([line for line in job.stdout.splitlines() if line.startswith("DIGEST")])
    assert digests[0], "the worker printed no digests"
    assert digests[0] == digests[1], f"two runs gave different bytes:\n{digests[0]}\n{digests[1]}"


@pytest.mark.parametrize("case", [(1, None, None), (3, 2, None), (4, None, "tree"), (5, 2, "hierarchical")],
                         ids=launch_id)
def test_drop_in(case):
    """Comm(MPI.COMM_WORLD) keeps rank/size/group, point-to-point, every other collective, Split/Dup, and
    never matches the user's wildcard receives with its own messages."""
    ranks, per_node, algo = case
    run_ok(ranks, "dropin.py", env=env_for(per_node, algo), timeout=60)
