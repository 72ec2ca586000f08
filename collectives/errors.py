"""Validation errors raised before any message is sent, and the hook that aborts the job on an uncaught error."""
import os
import sys
import threading
import time
import traceback

_FORWARD_PAUSE_S = 0.3


class CollectiveError(ValueError):
    """Bad arguments to a collective, detected on the calling rank before it communicates."""


class MismatchError(CollectiveError):
    """Ranks called one collective with different counts, dtypes, ops or roots (found by SCAFFE_CHECK=1)."""


# The MPI libraries' shared-memory segments of a node (MPICH's, Open MPI's), which MPI_Abort leaves in /dev/shm.
MPI_SEGMENTS = ("/dev/shm/mpich_shm_", "/dev/shm/vader_segment")


def shm_files_mapped(maps="/proc/self/maps"):
    """The /dev/shm files a process maps (read from its /proc/PID/maps); none where that cannot be read."""
    try:
        with open(maps) as lines:
            return {line.split(maxsplit=5)[-1].strip() for line in lines if "/dev/shm/" in line}
    except OSError:  # no /proc, or the process has ended
        return set()


def mapped_mpi_segments():
    """The MPI library's shared-memory files this process maps and that still have a name."""
    return sorted(path for path in shm_files_mapped() if path.startswith(MPI_SEGMENTS) and
                  not path.endswith(" (deleted)"))


def abort_job(report, comm=None):
    """Write `report` on stderr and abort the whole job (MPI_Abort on `comm`, COMM_WORLD by default).

    MPI_Abort leaves the node's MPI segments named in /dev/shm (4 MiB each for MPICH, kept until the host
    restarts); the job is ending, so their names go first, and their memory once the last rank has died."""
    from mpi4py import MPI
    for path in mapped_mpi_segments():
        try:
            os.unlink(path)
        except OSError:  # another rank of the node removed it first
            pass
    sys.stderr.flush()
    # One unbuffered write, then a moment for the launcher to forward it: Abort kills the
    # forwarding too, and without the pause the report was sometimes lost entirely.
    os.write(2, report.encode())
    time.sleep(_FORWARD_PAUSE_S)
    (comm if comm is not None else MPI.COMM_WORLD).Abort(1)


class _AbortHook:
    """sys.excepthook and threading.excepthook that abort the job, after the hooks they replaced.

    A hook the program had set is called first (its report, its clean-up); Python's default ones are
    not, since the abort report prints the traceback itself, with the rank.
    """

    def __init__(self):
        self.comm = None
        self.earlier_sys_hook = self.earlier_thread_hook = None
        self._in_earlier_hook = False  # an earlier hook that calls the one it replaced (ours) must not loop

    def install(self, comm):
        if comm is not None:
            self.comm = comm
        if sys.excepthook != self.on_exception:
            self.earlier_sys_hook = None if sys.excepthook is sys.__excepthook__ else sys.excepthook
            sys.excepthook = self.on_exception
        if threading.excepthook != self.on_thread_exception:
            self.earlier_thread_hook = (None if threading.excepthook is threading.__excepthook__
                                        else threading.excepthook)
            threading.excepthook = self.on_thread_exception

    def on_exception(self, exc_type, exc, tb):
        self._call(self.earlier_sys_hook, exc_type, exc, tb)
        self._abort(exc_type, exc, tb)

    def on_thread_exception(self, args):
        self._call(self.earlier_thread_hook, args)
        self._abort(args.exc_type, args.exc_value, args.exc_traceback)

    def _call(self, hook, *args):
        if hook is None or self._in_earlier_hook:
            return
        self._in_earlier_hook = True
        try:
            hook(*args)
        except BaseException:  # the job must still end
            traceback.print_exc()
        finally:
            self._in_earlier_hook = False

    def _abort(self, exc_type, exc, tb):
        from mpi4py import MPI
        report = "".join(traceback.format_exception(exc_type, exc, tb))
        if not MPI.Is_initialized() or MPI.Is_finalized():
            sys.stderr.write(report)  # no job left to abort
            return
        abort_job(f"[rank {MPI.COMM_WORLD.Get_rank()}] uncaught exception, aborting the job:\n{report}", self.comm)


_hook = _AbortHook()


def install_abort_hook(comm=None):
    """Make an uncaught exception on any rank (any thread) print its traceback and abort the whole job.

    Without this, one rank dying leaves the others blocked in a collective forever. The first
    `collectives.Comm` installs it (unless SCAFFE_ABORT_ON_ERROR=0); calling it again changes nothing
    but the communicator to abort, when one is given. Hooks the program had set still run first.
    """
    _hook.install(comm)
