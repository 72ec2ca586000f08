"""Validation errors raised before any message is sent, and the hook that aborts the job on an uncaught error."""
import os
import sys
import time
import traceback

_FORWARD_PAUSE_S = 0.3


class CollectiveError(ValueError):
    """Bad arguments to a collective, detected on the calling rank before it communicates."""


class MismatchError(CollectiveError):
    """Ranks called one collective with different counts, dtypes, ops or roots (found by SCAFFE_CHECK=1)."""


def abort_job(report, comm=None):
    """Write `report` on stderr and abort the whole job (MPI_Abort on `comm`, COMM_WORLD by default)."""
    from mpi4py import MPI
    sys.stderr.flush()
    # One unbuffered write, then a moment for the launcher to forward it: Abort kills the
    # forwarding too, and without the pause the report was sometimes lost entirely.
    os.write(2, report.encode())
    time.sleep(_FORWARD_PAUSE_S)
    (comm if comm is not None else MPI.COMM_WORLD).Abort(1)


def install_abort_hook(comm=None):
    """Make an uncaught exception on any rank (any thread) print its traceback and abort the whole job.

    Without this, one rank dying leaves the others blocked in a collective forever.
    """
    def abort(exc_type, exc, tb):
        from mpi4py import MPI
        report = "".join(traceback.format_exception(exc_type, exc, tb))
        abort_job(f"[rank {MPI.COMM_WORLD.Get_rank()}] uncaught exception, aborting the job:\n{report}", comm)

    sys.excepthook = abort

    import threading

    def thread_abort(args):
        abort(args.exc_type, args.exc_value, args.exc_traceback)

    threading.excepthook = thread_abort
