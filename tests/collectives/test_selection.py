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
