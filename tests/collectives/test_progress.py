"""The progress thread survives work that raises: the call's request carries the error, later calls run."""
import threading
import time

import pytest
from mpi4py import MPI

from collectives import events
from collectives.events import Name
from collectives import progress as progress_module
from collectives.progress import NUDGED_ABOVE, Nudge, Progress
from mpi_harness import run_ok

NAMES = {name: Name(name, comm=0) for name in ("Iallreduce", "Allreduce", "Ibcast", "Bcast")}


def failing():
    raise ValueError("deliberate failure in the progress thread")


def wait(request, seconds=10.0):
    """`request.Wait()` by polling `Test`, failing the test where the request never completes."""
    deadline = time.monotonic() + seconds
    while not request.Test():
        if time.monotonic() > deadline:
            pytest.fail("the request never completed: the progress thread is gone")
        time.sleep(1e-3)


@pytest.fixture
def progress():
    progress = Progress(threaded=True, probed=MPI.COMM_SELF)
    yield progress
    progress.stop()


class Listening:
    """A listener that hears every start and end and keeps nothing."""

    def started(self, op_id, name, nbytes, t):
        pass

    def finished(self, op_id, t):
        pass


@pytest.fixture
def listening():
    listener = Listening()
    events.add_listener(listener)
    yield
    events.remove_listener(listener)


def test_a_failed_call_raises_at_wait_and_later_calls_still_run(progress):
    ran = []
    failed = progress.submit(failing, NAMES["Iallreduce"], 8)
    with pytest.raises(ValueError, match="deliberate failure"):
        wait(failed)  # before the fix it never completed
    failed.Wait()  # done: its error was raised once
    assert failed == MPI.REQUEST_NULL
    later = [progress.submit(lambda i=i: ran.append(i), NAMES["Iallreduce"], 8) for i in range(3)]
    for request in later:
        wait(request)
    progress.run(lambda: ran.append("blocking"), NAMES["Allreduce"], 8)
    assert ran == [0, 1, 2, "blocking"]


@pytest.mark.timeout(30)  # before the fix the blocking call waited behind a dead thread forever
def test_test_raises_once_done_and_a_queued_blocking_call_raises_only_its_own_error(progress):
    failed = progress.submit(failing, NAMES["Ibcast"], 8)
    progress.run(lambda: None, NAMES["Bcast"], 8)  # behind the failed one, which does not fail it
    with pytest.raises(ValueError, match="deliberate failure"):
        wait(failed)
    assert failed.Test()  # a finished request stays finished, its error raised once
    progress.submit(lambda: None, NAMES["Ibcast"], 8)
    with pytest.raises(ValueError, match="deliberate failure"):
        progress.run(failing, NAMES["Bcast"], 8)  # queued behind the pending Ibcast: raised in the caller


def test_waitall_reports_a_failed_call_as_an_mpi_error(progress):
    name = NAMES["Iallreduce"]
    requests = [progress.submit(failing, name, 8), progress.submit(lambda: None, name, 8)]
    wait(requests[1])  # both done: Waitall does not wait for a dead thread
    with pytest.raises(MPI.Exception):
        MPI.Request.Waitall(requests)
    assert all(request == MPI.REQUEST_NULL for request in requests)
    progress.run(lambda: None, NAMES["Allreduce"], 8)


def test_a_followed_call_is_waited_for_by_its_caller_or_else_by_the_thread(progress, listening):
    """A nonblocking call MPI runs (`follow`) where listeners hear its end: the caller's Wait waits for it in its
    own thread (no hand-off to the progress thread and back), a C-level Waitall has the thread wait for it; each
    call is reported once, and a blocking call after them runs at once."""
    name = NAMES["Ibcast"]
    comm = MPI.COMM_SELF
    data = bytearray(8)
    size = len(data)
    begun = name.tally[0]
    release = threading.Event()
    blocker = progress.submit(release.wait, NAMES["Iallreduce"], 8)  # the thread is busy until the Wait below
    waited = progress.follow(comm.Ibcast(data, 0), name, size)
    caller = threading.Thread(target=waited.Wait)
    caller.start()
    caller.join(10)
    on_its_own = not caller.is_alive()
    release.set()
    blocker.Wait()
    caller.join()
    assert on_its_own, "the caller's Wait waited for the busy progress thread"
    assert waited.taker == "caller" and waited == MPI.REQUEST_NULL
    together = [progress.follow(comm.Ibcast(data, 0), name, size) for _ in range(3)]
    MPI.Request.Waitall(together)
    assert [request.taker for request in together] == ["thread"] * 3
    progress.run(lambda: None, NAMES["Bcast"], 4)  # nothing pending: it runs here, not queued behind
    assert progress._pending == 0
    deadline = time.monotonic() + 10
    while name.tally[1] != begun + 4 and time.monotonic() < deadline:
        time.sleep(1e-3)  # the thread reports each call's end just after it completes its request
    assert name.tally[0] == name.tally[1] == begun + 4


@pytest.mark.parametrize("size", [8, NUDGED_ABOVE + 1])
def test_a_followed_call_is_mpis_own_request_counted_until_freed_or_completed(progress, monkeypatch, size):
    """Where no listener hears its end, `follow` hands MPI's own request back: no helper thread, no generalized
    request. Where the stall inspector sweeps, the call counts as started until a sweep finds its request freed,
    or, probing, completed; without a sweep it is not counted at all."""
    name = NAMES["Ibcast"]
    comm = MPI.COMM_SELF
    data = bytearray(size)
    monkeypatch.setattr(events, "_unwaited", None)
    begun = name.tally[0]
    request = progress.follow(comm.Ibcast(data, 0), name, len(data))
    assert type(request) is MPI.Request and progress._thread is None
    request.Wait()
    assert name.tally[0] == name.tally[1] == begun  # nobody sweeps: not counted

    monkeypatch.setattr(events, "_unwaited", [])
    freed = progress.follow(comm.Ibcast(data, 0), name, len(data))
    unwaited = progress.follow(comm.Ibcast(data, 0), name, len(data))
    assert name.tally[0] - name.tally[1] == 2 and events.sweep() == 0
    MPI.Request.Waitall([freed])
    assert events.sweep() == 1 and name.tally[0] - name.tally[1] == 1
    assert events.sweep(probe=True) == 1 and name.tally[0] == name.tally[1]  # completed, not yet waited for
    unwaited.Wait()
    assert events.sweep() == 0 and name.tally[0] == name.tally[1] == begun + 2 and progress._thread is None


def test_unwaited_calls_are_counted_once_while_threads_post_and_sweep(monkeypatch):
    """Callers posting (and sweeping when the list has doubled) while another thread sweeps, as the stall
    inspector does: every call is counted finished exactly once, and none while its request is pending."""
    name = Name("Ibcast", comm=0)
    monkeypatch.setattr(events, "_unwaited", [])
    data = bytearray(8)
    stop = threading.Event()

    def inspector():
        while not stop.is_set():
            events.sweep()

    def caller(held, comm):  # a communicator of its own: one thread's collectives on it, in order
        for i in range(3000):
            request = comm.Ibcast(data, 0)
            events.started_unwaited(name, len(data), request)
            if i % 100 == 0:
                held.append(request)  # waited for at the end
            else:
                request.Wait()

    sweeper = threading.Thread(target=inspector)
    sweeper.start()
    helds = [[], []]
    comms = [MPI.COMM_SELF.Dup() for _ in helds]
    callers = [threading.Thread(target=caller, args=(held, comm)) for held, comm in zip(helds, comms)]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join()
    stop.set()
    sweeper.join()
    events.sweep()
    assert name.tally[0] == 6000 and name.tally[1] == 6000 - 60  # the held ones are pending
    for held in helds:
        MPI.Request.Waitall(held)
    assert events.sweep() == 60 and name.tally[1] == 6000 and events._unwaited == []
    for comm in comms:
        comm.Free()


class Probed:
    """A communicator's stand-in for the Nudge, which only asks its rank and probes it: counts the probes."""

    def __init__(self):
        self.probes = 0

    def Get_rank(self):
        return 0

    def Iprobe(self, source, tag):
        self.probes += 1
        return False


def probes_while(probed, condition, seconds=5.0):
    """Waits until `condition(probes so far)` holds or `seconds` have passed; `probed`'s probes meanwhile."""
    before = probed.probes
    deadline = time.monotonic() + seconds
    while not condition(probed.probes - before) and time.monotonic() < deadline:
        time.sleep(1e-3)
    return probed.probes - before


def test_the_nudge_probes_only_while_a_request_stays_outstanding(monkeypatch):
    """A request freed at once (a caller waiting for its call) meets no probe; one left outstanding for a look is
    probed for until it is freed, and then the thread goes idle; a forgotten communicator is probed no more."""
    monkeypatch.setattr(progress_module, "NUDGE_LOOK_S", 0.05)  # a caller stalled this long would be probed
    nudge, probed = Nudge(), Probed()
    comm = MPI.COMM_SELF.Dup()
    data = bytearray(8)
    try:
        for _ in range(200):
            request = comm.Ibcast(data, 0)
            nudge.watch(probed, request)
            request.Wait()
        assert probes_while(probed, lambda _: not nudge._watched) == 0 and probed.probes == 0
        pending = comm.Irecv(data, 0, 5)  # outstanding until the send below
        nudge.watch(probed, pending)
        assert probes_while(probed, lambda probes: probes >= 3) >= 3
        comm.Send(b"x", 0, 5)
        pending.Wait()
        time.sleep(3 * progress_module.NUDGE_LOOK_S)
        assert probes_while(probed, lambda _: False, 0.05) == 0
        assert nudge._watched == []

        pending = comm.Irecv(data, 0, 5)
        nudge.watch(probed, pending)
        assert probes_while(probed, lambda probes: probes >= 3) >= 3
        nudge.forget(probed)
        time.sleep(2 * progress_module.NUDGE_PROBE_S)
        assert probes_while(probed, lambda _: False, 0.05) == 0
        comm.Send(b"x", 0, 5)
        pending.Wait()
    finally:
        nudge._stop()
        comm.Free()


def test_a_large_call_handed_back_moves_while_a_rank_computes():
    run_ok(2, "nudged.py", timeout=60)


def test_the_nudge_probes_as_waits_nap_where_they_do(monkeypatch):
    """Under SCAFFE_WAIT=nap the probes of one request space out as a wait's naps do, up to the longest nap, and
    the Nudge looks no more often than the longest nap."""
    monkeypatch.setattr(progress_module.waiting, "_policy", lambda: ("nap", 0.4e-3))
    intervals = progress_module._probe_intervals()
    assert [next(intervals) for _ in range(5)] == [50e-6, 100e-6, 200e-6, 400e-6, 400e-6]
    assert progress_module._look_s() == progress_module.NUDGE_LOOK_S  # the longest nap is shorter
    monkeypatch.setattr(progress_module.waiting, "_policy", lambda: ("nap", 12e-3))
    assert progress_module._look_s() == 12e-3
    monkeypatch.setattr(progress_module.waiting, "_policy", lambda: ("spin", None))
    intervals = progress_module._probe_intervals()
    assert [next(intervals) for _ in range(3)] == [50e-6] * 3
