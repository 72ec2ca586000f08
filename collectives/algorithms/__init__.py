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

# kind -> smallest message in bytes that leaves native MPI, (on one node, across several nodes). Below
# it MPI's latency-tuned paths win: a call through the shared-memory cells costs about 35-50 us of Python
# and synchronisation on 2 ranks (150-200 us on 4 ranks sharing 2 cores) before any data moves. Measured
# with perf/osu_*.py --impl both on MPICH, ratio native/scaffe:
#   Reduce, one node: 64 KiB 0.63-0.76, 128 KiB 1.29-1.96 (2 and 4 ranks); across nodes of 2 ranks:
#     128 KiB 0.75-0.92, 256 KiB 2.2 (4 and 8 ranks).
#   Allreduce, one node: 128 KiB 1.14-1.20 but 256 KiB 0.86-0.96 (MPICH changes algorithm there), 512 KiB
#     1.04-1.17, 1 MiB 1.46-1.60. Across nodes the same threshold.
# None: the kind stays native unless SCAFFE_REDUCE_ALGO says otherwise. MPICH's broadcast already runs
# at this machine's memory bandwidth, which a two-copy stream through shared cells cannot beat: measured
# 0.45-0.72x of native from 1 to 64 MiB on 2 ranks (perf/osu_bcast.py), and a bare two-process cell
# ring with no Python around it only reached parity.
SELECTION = {
    "reduce": (128 << 10, 256 << 10),
    "allreduce": (512 << 10, 512 << 10),
    "bcast": (None, None),
}


def threshold(kind, several_nodes):
    """Smallest message of `kind` that leaves native MPI, or None when it never does by default."""
    return SELECTION[kind][1 if several_nodes else 0]


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


def select(kind, nbytes, override=None, several_nodes=False):
    """Name of the algorithm for a `kind` collective of `nbytes` (override: SCAFFE_REDUCE_ALGO's value)."""
    if override is not None:
        return override
    below = threshold(kind, several_nodes)
    return "native" if below is None or nbytes < below else "hierarchical"


def get(name, kind):
    return _ALGORITHMS[name][_KIND_INDEX[kind]]
