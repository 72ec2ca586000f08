"""Hierarchical, chunked, pipelined collectives for mpi4py programs.

    from mpi4py import MPI
    import collectives
    comm = collectives.Comm(MPI.COMM_WORLD)   # was: comm = MPI.COMM_WORLD
    comm.Reduce(sendbuf, recvbuf, op=MPI.SUM, root=0)
"""
from collectives.comm import Comm
from collectives.errors import CollectiveError, MismatchError, install_abort_hook

__all__ = ["Comm", "CollectiveError", "MismatchError", "install_abort_hook"]
