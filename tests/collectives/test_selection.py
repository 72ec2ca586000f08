"""The selection table (collectives.algorithms): which calls leave native MPI, and from which size."""
import pytest

from collectives import algorithms, waiting
from collectives.algorithms import chain, hierarchical, tree


@pytest.fixture(params=["spin", "nap"])
def wait_policy(request, monkeypatch):
    monkeypatch.setattr(waiting, "_policy", lambda: (request.param, 0.001 if request.param == "nap" else None))
    return request.param


def test_a_one_node_broadcast_leaves_native_mpi_only_when_nonblocking_waits_nap(wait_policy):
    """MPICH's one-copy Bcast wins on one node; its Ibcast moves only in the Tests of a napping waiter."""
    big = 64 << 20
    assert algorithms.select("bcast", big) == "native"
    expected = "hierarchical" if wait_policy == "nap" else "native"
    assert algorithms.select("bcast", big, nonblocking=True) == expected
    assert algorithms.select("bcast", 4, nonblocking=True) == "native"  # small ones stay MPI's latency path
    assert algorithms.select("bcast", big, several_nodes=True, nonblocking=True) == "hierarchical"


def test_reductions_keep_their_thresholds_on_one_node_and_where_waits_spin(wait_policy):
    for kind in ("reduce", "allreduce"):
        for several_nodes in (False, True):
            assert algorithms.threshold(kind, several_nodes) == algorithms.SELECTION[kind][several_nodes]
        assert algorithms.threshold(kind, False, nonblocking=True) == algorithms.SELECTION[kind][0]
        if wait_policy == "spin":
            assert algorithms.threshold(kind, True, nonblocking=True) == algorithms.SELECTION[kind][1]


def test_across_nodes_every_nonblocking_call_leaves_native_mpi_where_waits_nap(wait_policy):
    """Each round of MPI's schedule waits for naps on both sides of the link, a 54 KB reduce's too."""
    for kind in ("reduce", "allreduce", "bcast"):
        for nbytes in (4, 54528):
            expected = "hierarchical" if wait_policy == "nap" else "native"
            assert algorithms.select(kind, nbytes, several_nodes=True, nonblocking=True) == expected
            assert algorithms.select(kind, nbytes, several_nodes=True) == "native"
            assert algorithms.select(kind, nbytes, nonblocking=True) == "native"
    if wait_policy == "nap":  # ops the interpreted loop runs keep MPI's latency path for small calls
        interpreted = algorithms.threshold("reduce", True, compiled=False, nonblocking=True)
        assert interpreted == algorithms.INTERPRETED_FROM["reduce"]


def test_node_heads_take_a_chain_once_it_fills_faster_than_the_trees_root_drains():
    """Eighth-of-a-call chunks from 256 KiB up to SCAFFE_CHUNK_BYTES; a chain wherever a tree's root would take
    more children's chunks than the chain's extra fill (the S-Caffe schedule's 2 MiB pieces on 8 heads)."""
    mib = 1 << 20
    assert hierarchical.heads_shape(2 * mib, 8, mib) == (chain.shape, 256 << 10)
    assert hierarchical.heads_shape(4 * mib, 4, mib) == (chain.shape, 512 << 10)
    assert hierarchical.heads_shape(64 * mib, 16, mib) == (chain.shape, mib)
    assert hierarchical.heads_shape(64 << 10, 8, mib) == (tree.shape, 256 << 10)  # one chunk: the tree's depth
    assert hierarchical.heads_shape(mib, 16, mib)[0] is tree.shape  # 4 chunks fill 16 heads slower than 4 x 4
    assert hierarchical.heads_shape(64 * mib, 2, mib)[0] is tree.shape  # two heads: both shapes are one link
    assert hierarchical.heads_shape(40000, 3, 4096) == (chain.shape, 4096)  # a smaller setting is the largest chunk


@pytest.mark.parametrize("size", [1, 2, 3, 4, 8])
def test_chains_in_turn_end_at_each_non_root_rank_once_and_share_out_the_forwarding(size):
    """chain.turns: every turn a chain of all ranks from the root, its links the same seen from either end; each
    non-root rank ends one turn, so it forwards a reduce's and a broadcast's chunks in all turns but that one."""
    for root in range(size):
        routes = [chain.turns(rank, size, root) for rank in range(size)]
        assert all(len(r) == max(1, size - 1) for r in routes)
        ends = []
        for turn in range(max(1, size - 1)):
            parents = {rank: routes[rank][turn][0] for rank in range(size)}
            assert [rank for rank, parent in parents.items() if parent is None] == [root]
            for rank in range(size):
                assert routes[rank][turn][1] == [child for child, p in parents.items() if p == rank]
                assert len(routes[rank][turn][1]) <= 1
            ends += [rank for rank in range(size) if not routes[rank][turn][1]]
        assert sorted(ends) == sorted(set(range(size)) - {root}) or size == 1


class _Heads:
    def __init__(self, rank, size):
        self.rank, self.size = rank, size

    def Get_rank(self):
        return self.rank

    def Get_size(self):
        return self.size


def test_node_heads_share_a_calls_chunks_equally_among_the_chains_in_turn():
    """An S-Caffe piece of 2 MiB on 4 heads, its communicator two-way: 9 chunks, 3 along each turn (8 would load
    two turns more)."""
    comm = type("Comm", (), {"chunk_bytes": 1 << 20})()
    routes, chunk = hierarchical.heads_pipeline(comm, _Heads(1, 4), 2 << 20, "float32", 0, turns=True)
    assert routes == chain.turns(1, 4, 0) and -(-(2 << 18) // chunk) == 9
    routes, chunk = hierarchical.heads_pipeline(comm, _Heads(1, 4), 2 << 20, "float32", 0, turns=False)
    assert routes == [chain.shape(1, 4, 0)] and chunk == (256 << 10) // 4  # one way at a time: one chain
    routes, chunk = hierarchical.heads_pipeline(comm, _Heads(1, 2), 2 << 20, "float32", 0, turns=True)
    assert routes == [tree.shape(1, 2, 0)] and chunk == (256 << 10) // 4
