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

# kind -> smallest message in bytes that leaves native MPI. Below it MPI's latency-tuned small-message
# paths win; above it the shared-memory pipeline does (see perf/osu_*.py for the crossover measured).
# None: the kind stays native unless SCAFFE_REDUCE_ALGO says otherwise. MPICH's broadcast already runs
# at this machine's memory bandwidth, which a two-copy stream through shared cells cannot beat: measured
# 0.45-0.72x of native from 1 to 64 MiB on 2 ranks (perf/osu_bcast.py), and a bare two-process cell
# ring with no Python around it only reached parity.
SELECTION = {
    "reduce": 16 << 10,
    "allreduce": 16 << 10,
    "bcast": None,
}


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


def select(kind, nbytes, override=None):
    """Name of the algorithm for a `kind` collective of `nbytes` (override: SCAFFE_REDUCE_ALGO's value)."""
    if override is not None:
        return override
    threshold = SELECTION[kind]
    return "native" if threshold is None or nbytes < threshold else "hierarchical"


def get(name, kind):
    return _ALGORITHMS[name][_KIND_INDEX[kind]]
