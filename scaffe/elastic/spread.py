"""Copies a commit directory from the host of rank 0 to the hosts of the other ranks (one rank per host), so
that every rank of a relaunched job finds the commit in its own host's memory. The supervisor runs it through
the launcher: `python -m scaffe.elastic.spread PATH [DEST]` (DEST, default PATH: where the others write it).

Each receiver stores it as a commit is stored (scaffe.elastic.state.store: under a temporary name, renamed
into place), so a directory with a commit's name is always complete; a host that has it already keeps its own.
"""
import os
import sys

import numpy

from scaffe.elastic.state import store


def _listing(path):
    """[(name, size)] of every file in commit directory `path` (a commit is flat: scaffe.elastic.state)."""
    return [(name, os.path.getsize(os.path.join(path, name))) for name in sorted(os.listdir(path))]


def spread(comm, source, dest):
    """Collective over `comm`: rank 0's directory `source` becomes `dest` on every other rank. Returns
    whether it did; every rank returns the same."""
    listing = None
    if comm.Get_rank() == 0:
        try:
            listing = _listing(source) if os.path.isdir(source) else None
        except OSError:
            listing = None
    # Told to every rank, so that a missing commit ends them all instead of leaving them in a broadcast.
    listing = comm.bcast(listing, root=0)
    if listing is None:
        return False
    files = {}
    for relative, size in listing:
        data = (numpy.fromfile(os.path.join(source, relative), dtype=numpy.uint8) if comm.Get_rank() == 0
                else numpy.empty(size, dtype=numpy.uint8))
        comm.Bcast(data, root=0)
        files[relative] = [data]
    if comm.Get_rank() != 0:
        store(os.path.dirname(dest), os.path.basename(dest), files)  # a host that has it keeps its own
    return True


def main(argv):
    from mpi4py import MPI
    if len(argv) not in (1, 2):
        sys.stderr.write("usage: python -m scaffe.elastic.spread PATH [DEST]\n")
        return 2
    source = argv[0]
    if not spread(MPI.COMM_WORLD, source, argv[-1]):
        sys.stderr.write(f"scaffe.elastic.spread: {source} is not a readable commit directory on rank 0's host\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
