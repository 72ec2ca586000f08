"""The stall inspector: a collective that waits longer than SCAFFE_STALL_S seconds ends the job with a report
of which ranks have not joined it, instead of hanging forever.

One daemon thread per process, started by the set-up of the first Comm over all of MPI.COMM_WORLD, samples
this rank's collectives in flight from the counts `collectives.events` keeps per name (started, finished),
so the calls themselves pay two list updates and no clock. Each poll it answers the other ranks'
questions; when one of its own operations has waited too long it asks the other ranks of that operation's
communicator for their state, gives them a few seconds to answer, prints one report on stderr and aborts
the job. With SCAFFE_LOST_S it also asks them, while an operation waits, whether they are there: one that
has not answered for that long (dead, frozen, or behind a link that is down) ends the job at once, long
before the stall limit, which a live rank that is only slow to join still has. It asks only once the
operation has waited SCAFFE_LOST_S itself: a dead rank is the launcher's to report, which it does at once, and
MPICH over UCX crashes a rank that sends to a peer whose process has died (a segfault in MPI_Isend), which would
have the launcher name the asking rank's host instead of the dead one's. Its messages travel on its own
duplicate of COMM_WORLD, and it only makes nonblocking MPI calls (improbe, isend, Test): a thread blocked in MPI
could not report the very hang it is there for. Ranks are named by their rank in COMM_WORLD, so nothing depends
on where they run.
"""
import atexit
import sys
import threading
import time

from mpi4py import MPI

from collectives import events
from collectives.errors import abort_job
from collectives import settings
from collectives.stall_report import report

_QUERY, _STATE = 1, 2  # tags: "what are you doing?" and its answer

_members = {}  # Comm set-up index -> the COMM_WORLD ranks of that communicator
_inspector = None


def watch(comm, index):
    """Record `comm`, a Comm being set up (collectively) as number `index`; the first one over all of
    COMM_WORLD starts the inspector unless SCAFFE_STALL_S is 0 or the job has one rank."""
    global _inspector
    world = MPI.COMM_WORLD
    group, world_group = comm.Get_group(), world.Get_group()
    _members[index] = group.Translate_ranks(None, world_group)
    group.Free()
    world_group.Free()
    if _inspector is not None or comm.Get_size() != world.Get_size():
        return
    stall_s = settings.stall_seconds()
    if stall_s == 0 or world.Get_size() == 1:
        return
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        if world.Get_rank() == 0:
            print(f"scaffe: SCAFFE_STALL_S is ignored: the stall inspector needs MPI_THREAD_MULTIPLE, and MPI "
                  f"runs at thread level {MPI.Query_thread()}; a collective that waits forever will hang",
                  file=sys.stderr, flush=True)
        return
    _inspector = _Inspector(stall_s)


class _Inspector:
    def __init__(self, stall_s):
        self.comm = MPI.COMM_WORLD.Dup()
        self.rank = self.comm.Get_rank()
        self.stall_s = stall_s
        self.lost_s = settings.lost_seconds()
        # A question is answered at the other's next poll: a few polls must fit in the time a rank may take.
        self.period = min(1.0, stall_s / 10, self.lost_s / 4 or 1.0)
        # Long enough for a live rank under load to wake and answer, short against the limit itself.
        self.answer_window = min(5.0, max(1.0, stall_s / 2))
        self.first_seen = {}  # (comm index, name, number) in flight -> when a poll first saw it
        self.asked = {}  # rank -> when the question it has not answered yet went out
        self.heard = {}  # rank -> when its last answer came
        self.states = {}  # rank -> its last answer
        self.sends = []  # our questions and answers still on their way
        self._stop = threading.Event()
        events.sweep_unwaited()
        self._thread = threading.Thread(target=self._watch, name="scaffe-stall", daemon=True)
        self._thread.start()
        atexit.register(self.stop)  # before mpi4py's MPI_Finalize, which the thread must not outlive

    # -- the inspector's thread ---------------------------------------------------------------------
    def _watch(self):
        while not self._stop.wait(self.period):
            self._answer()
            events.sweep()
            in_flight = self._in_flight()
            if in_flight:
                oldest = min(in_flight, key=lambda op: op[4])
                waited = time.perf_counter() - oldest[4]
                if waited > self.stall_s:
                    # A call handed back as MPI's own request may have completed unwaited: looked at next poll.
                    if not events.sweep(probe=True):
                        self._report_and_abort(oldest)
                elif self.lost_s and waited > self.lost_s:
                    self._check_answering(oldest)
            else:
                self.asked.clear()  # a question only counts while something waits for its rank

    def _in_flight(self):
        """(comm index, name, number, nbytes, first seen) of each operation started and not finished.

        Operations of one name run one at a time (a blocking call holds its thread, nonblocking ones run
        in FIFO order), so a name whose count of starts is ahead of its count of ends has exactly one in
        flight, the one numbered by its starts; a poll dates it when it first sees it."""
        now = time.perf_counter()
        current = {}
        for name in events.names():
            begun, ended, nbytes = list(name.tally)
            if begun > ended:
                key = (name.comm, str(name), begun)
                current[key] = key + (nbytes, self.first_seen.get(key, now))
        self.first_seen = {key: op[4] for key, op in current.items()}
        return list(current.values())

    def _answer(self):
        """Answer every question waiting for us, and let go of the messages already delivered."""
        status = MPI.Status()
        while (message := self.comm.improbe(MPI.ANY_SOURCE, _QUERY, status)) is not None:
            message.recv()
            self._send(self._state(), status.Get_source(), _STATE)
        self._push()

    def _push(self):
        """Moves our messages on now (MPI progresses a send in the calls that test it), and lets go of those
        delivered."""
        self.sends = [request for request in self.sends if not _delivered(request)]

    def _others(self, index):
        return [rank for rank in _members.get(index, range(self.comm.Get_size())) if rank != self.rank]

    def _collect(self, deadline=None):
        """Takes the answers that have come (and, until `deadline`, those that come)."""
        status = MPI.Status()
        while True:
            while (message := self.comm.improbe(MPI.ANY_SOURCE, _STATE, status)) is not None:
                source = status.Get_source()
                self.states[source], self.heard[source] = message.recv(), time.perf_counter()
                self.asked.pop(source, None)
            if deadline is None or time.perf_counter() >= deadline:
                return
            self._answer()  # the others may be asking us at the same time
            time.sleep(0.05)

    def _check_answering(self, op):
        """Asks the ranks of waiting operation `op` that have not answered lately; ends the job if one has left
        a question unanswered for SCAFFE_LOST_S."""
        self._collect()
        now = time.perf_counter()
        others = self._others(op[0])
        silent = {rank for rank in others if rank in self.asked and now - self.asked[rank] > self.lost_s}
        if silent:
            states = {rank: state for rank, state in self.states.items() if rank not in silent}
            abort_job(report(self.rank, op[:4] + (now - op[4],), others, states, self.stall_s, self.lost_s))
        for rank in others:
            if rank not in self.asked and now - self.heard.get(rank, 0.0) > self.lost_s / 2:
                self.asked[rank] = now
                self._send(None, rank, _QUERY)
        self._push()

    def _send(self, payload, rank, tag):
        try:
            self.sends.append(self.comm.isend(payload, rank, tag))
        except MPI.Exception:
            pass  # a rank MPI can no longer reach: it shows as not answering

    def _state(self):
        now = time.perf_counter()
        started = {}
        for name in events.names():
            key = (name.comm, str(name))
            started[key] = started.get(key, 0) + name.tally[0]
        return {"started": started,
                "in_flight": [(index, name, number, now - t)
                              for index, name, number, _, t in sorted(self._in_flight(), key=lambda op: op[4])]}

    def _report_and_abort(self, op):
        index, name, number, nbytes, t = op
        others = self._others(index)
        asked = time.perf_counter()
        for rank in others:
            self._send(None, rank, _QUERY)
        deadline = asked + self.answer_window
        while time.perf_counter() < deadline and any(self.heard.get(rank, 0.0) < asked for rank in others):
            self._collect(min(deadline, time.perf_counter() + 0.05))
        states = {rank: self.states[rank] for rank in others if self.heard.get(rank, 0.0) >= asked}
        waited = time.perf_counter() - t
        abort_job(report(self.rank, (index, str(name), number, nbytes, waited), others, states, self.stall_s))

    def stop(self):
        self._stop.set()
        self._thread.join()


def _delivered(request):
    try:
        return request.Test()
    except MPI.Exception:
        return True  # to a rank MPI can no longer reach: nothing more will come of it
