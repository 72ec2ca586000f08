"""Reduce/Allreduce/Bcast algorithms, one per module with one call shape, and the table that picks one.

Each algorithm provides reduce(comm, call), allreduce(comm, call) and bcast(comm, call), where `comm`
is the `collectives.Comm` and `call` the validated `Call`. Adding an algorithm touches its own module,
`_ALGORITHMS` and, if it should ever be chosen automatically, `SELECTION`. "native" has no module:
`Comm` then calls the wrapped MPI itself with the user's own arguments, as it does for every call it
cannot compute.
"""
import os

from collectives.algorithms import chain, flat, hierarchical, tree

_ALGORITHMS = {
    "native": None,
    "tree": flat.make(tree.shape),
    "chain": flat.make(chain.shape),
    "hierarchical": (hierarchical.reduce, hierarchical.allreduce, hierarchical.bcast),
}
_KIND_INDEX = {"reduce": 0, "allreduce": 1, "bcast": 2}

# kind -> smallest message in bytes that leaves native MPI, (on one node, across several nodes), for calls
# that the compiled node loop runs (plain buffers, sum/prod/min/max, numba's dtypes; see
# collectives/intranode/compiled.py). Below it MPI's latency-tuned paths win: a call through the
# shared-memory cells costs about 35 us of Python and synchronisation on 2 ranks before any data moves
# (about 70 us before the loop was compiled). Measured with perf/osu_*.py --impl both on MPICH, forcing
# SCAFFE_REDUCE_ALGO=hierarchical, ratio native/scaffe:
#   Reduce, one node: 64 KiB 1.16-1.18 forced but 0.94-1.14 by default, 128 KiB 1.63-2.03 on 2 ranks
#     (compiled gather), 64 KiB 1.10-1.40 on 4; across nodes of 2 ranks: 128 KiB 0.75-0.92, 256 KiB 2.2
#     (4 and 8 ranks).
#   Allreduce, one node: 32 KiB 0.59-0.83, 64 KiB 1.19-1.35 (2 and 4 ranks); across nodes of 2 ranks:
#     512 KiB 0.59-0.90, 1 MiB 0.66-0.97, 2 MiB 0.94-1.10 (4 and 8 ranks), so from 1 MiB.
# None: the kind stays native unless SCAFFE_REDUCE_ALGO says otherwise. MPICH's broadcast already runs
# at this machine's memory bandwidth, which a two-copy stream through shared cells cannot beat: measured
# 0.45-0.72x of native from 1 to 64 MiB on 2 ranks (perf/osu_bcast.py), and a bare two-process cell
# ring with no Python around it only reached parity.
SELECTION = {
    "reduce": (128 << 10, 256 << 10),
    "allreduce": (64 << 10, 1 << 20),
    "bcast": (None, None),
}
# Calls the interpreted loop runs (alloc buffers, bitwise and logical ops, float16) leave native MPI from
# here at the earliest: measured on one node, Reduce 64 KiB 0.63-0.76, 128 KiB 1.29-1.96; Allreduce
# 256 KiB 0.86-0.96, 512 KiB 1.04-1.17.
INTERPRETED_FROM = {"reduce": 128 << 10, "allreduce": 512 << 10}


def threshold(kind, several_nodes, compiled=True):
    """Smallest message of `kind` that leaves native MPI, or None when it never does by default;
    `compiled`: whether the node loop of the call is the compiled one."""
    below = SELECTION[kind][1 if several_nodes else 0]
    return below if below is None or compiled else max(below, INTERPRETED_FROM[kind])


def names():
    return sorted(_ALGORITHMS)


def forced():
    """The algorithm named by SCAFFE_REDUCE_ALGO, or None."""
    name = os.environ.get("SCAFFE_REDUCE_ALGO", "").strip().lower()
    if not name:
        return None
    if name not in _ALGORITHMS:
        raise ValueError(f"SCAFFE_REDUCE_ALGO={name!r} is not one of {', '.join(names())}")
    return name


def select(kind, nbytes, override=None, several_nodes=False, compiled=True):
    """Name of the algorithm for a `kind` collective of `nbytes` (override: SCAFFE_REDUCE_ALGO's value)."""
    if override is not None:
        return override
    below = threshold(kind, several_nodes, compiled)
    return "native" if below is None or nbytes < below else "hierarchical"


def get(name, kind):
    return _ALGORITHMS[name][_KIND_INDEX[kind]]
