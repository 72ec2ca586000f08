"""Reduce/Allreduce/Bcast algorithms, one per module with one call shape, and the table that picks one.

Each algorithm provides reduce(comm, call), allreduce(comm, call) and bcast(comm, call), where `comm`
is the `collectives.Comm` and `call` the validated `Call`. Adding an algorithm touches its own module,
`_ALGORITHMS` and, if it should ever be chosen automatically, `SELECTION`. "native" has no module:
`Comm` then calls the wrapped MPI itself with the user's own arguments, as it does for every call it
cannot compute.
"""

from collectives import waiting
from collectives.algorithms import chain, flat, hierarchical, tree

_ALGORITHMS = {
    "native": None,
    "tree": flat.make(tree.shape),
    "chain": flat.make(chain.shape),
    "hierarchical": (hierarchical.reduce, hierarchical.allreduce, hierarchical.bcast),
}
_KIND_INDEX = {"reduce": 0, "allreduce": 1, "bcast": 2}

# kind -> smallest message in bytes that leaves native MPI, (on one node, across several nodes), for calls
# that the compiled node loop runs (sum/prod/min/max on numba's dtypes: collectives.ops.compiled). Below it MPI's latency-tuned paths win: a call through the
# shared-memory cells pays tens of microseconds of Python and synchronisation before any data moves.
# None: the kind stays native unless SCAFFE_REDUCE_ALGO says otherwise: on one node MPICH's one-copy broadcast
# runs at memory bandwidth, which a two-copy stream through shared cells cannot beat; across nodes its
# broadcast among all ranks crosses each node's link more than once, where ours crosses it once per node.
# The measurements behind every number here are in perf/RESULTS.md ("Selection thresholds").
SELECTION = {
    "reduce": (128 << 10, 256 << 10),
    "allreduce": (64 << 10, 1 << 20),
    "bcast": (None, 512 << 10),
}
# Calls the interpreted loop runs (bitwise and logical ops, float16, long double) leave native MPI from
# here at the earliest (perf/RESULTS.md).
INTERPRETED_FROM = {"reduce": 128 << 10, "allreduce": 512 << 10}


def threshold(kind, several_nodes, compiled=True, nonblocking=False):
    """Smallest message of `kind` that leaves native MPI, or None when it never does by default;
    `compiled`: whether the node loop of the call is the compiled one (a Bcast reduces nothing: it has none);
    `nonblocking`: an I* call."""
    below = SELECTION[kind][1 if several_nodes else 0]
    if nonblocking and waiting.napping():
        # MPI's nonblocking schedule moves only inside the Tests of the thread that waits for it, which naps
        # between them (perf/RESULTS.md, "The window's stop, MPI's Ibcast under naps, buckets on two lanes").
        # Ours moves whenever the ranks' threads do. Across nodes each of MPI's rounds waits for naps on both
        # sides, a small call's too ("Small nonblocking calls across nodes where waits nap").
        if several_nodes:
            below = 0
        elif below is None:
            below = SELECTION[kind][1]
    return below if below is None or compiled or kind not in INTERPRETED_FROM else max(below, INTERPRETED_FROM[kind])


def names():
    return sorted(_ALGORITHMS)


def select(kind, nbytes, override=None, several_nodes=False, compiled=True, nonblocking=False):
    """Name of the algorithm for a `kind` collective of `nbytes` (override: SCAFFE_REDUCE_ALGO's value)."""
    if override is not None:
        return override
    below = threshold(kind, several_nodes, compiled, nonblocking)
    return "native" if below is None or nbytes < below else "hierarchical"


def get(name, kind):
    return _ALGORITHMS[name][_KIND_INDEX[kind]]
