"""The request window (scaffe.parallel.window): waits that keep every communicator's queue moving."""
import contextlib
import signal

import pytest
from mpi4py import MPI

from collectives import waiting
from scaffe.parallel.streams import HostOrder
from scaffe.parallel.window import Windows


class CompletesAtThirdLook(MPI.Grequest):
    """A collective that completes between two looks of one wait. The window looks at it when the next
    collective queues and in the wait's first `advance`, and sees it in flight; the Test of the waited
    handles right after sees it complete (and frees it)."""

    def __init__(self, request=None):  # mpi4py's __new__ takes over `request`'s handle
        self.looks = 0

    def Test(self, status=None):
        self.looks += 1
        if self.looks == 3:
            self.Complete()
        return super().Test(status)


@pytest.fixture
def napping(monkeypatch):
    monkeypatch.setattr(waiting, "_policy", lambda: ("nap", 0.001))


@contextlib.contextmanager
def _at_most(seconds):
    """A TimeoutError where a wait would not return."""
    def give_up(signum, frame):
        raise TimeoutError(f"the wait did not return in {seconds} s")
    previous = signal.signal(signal.SIGALRM, give_up)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_a_wait_goes_on_when_the_oldest_completes_between_looks(napping):
    """The oldest collective of a full window completes as the waited handles are tested: the queued one then
    starts and the wait returns (it once napped forever on an empty list)."""
    windows = Windows(HostOrder(), limit=1)
    comm = MPI.COMM_SELF
    first = windows.start(comm, lambda stream: CompletesAtThirdLook(MPI.Grequest.Start()))
    second = windows.start(comm, lambda stream: comm.Ibarrier())
    assert first.handle is not None and second.handle is None
    with _at_most(10):
        windows.wait([first, second])
    assert first.handle.looks == 4 and second.handle is not None and second.Test()


def test_wait_any_refuses_an_empty_list(napping):
    with _at_most(10), pytest.raises(ValueError, match="no request"):
        waiting.wait_any([])
