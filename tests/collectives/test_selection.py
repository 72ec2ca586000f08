"""The selection table (collectives.algorithms): which calls leave native MPI, and from which size."""
import pytest

from collectives import algorithms, waiting


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


def test_reductions_keep_their_thresholds_whatever_the_waits(wait_policy):
    for kind in ("reduce", "allreduce"):
        for several_nodes in (False, True):
            assert (algorithms.threshold(kind, several_nodes, nonblocking=True)
                    == algorithms.threshold(kind, several_nodes) == algorithms.SELECTION[kind][several_nodes])
