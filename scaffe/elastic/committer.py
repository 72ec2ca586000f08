"""Committing the training state every SCAFFE_COMMIT_ITERS iterations, and stopping to grow (D/GROW).

With SCAFFE_COMMIT_ITERS=auto (the supervisor's default) the spacing is measured: DEFAULT_COMMIT_ITERS, or
more where storing and sending the last commit (the writer thread's time) took more than COMMIT_SHARE of the
iterations between two commits; on a host whose cores compute that thread takes them from training, and on a
link the commit's bytes share it with the gradients. The root decides and tells the others at a commit point.

At a commit point (after update N, N a multiple of the interval) every rank lands the updates still in
flight, then on a communicator of the commits' own: the ranks' own states (random states, data readers'
places) go to the root in one gather, and one small allreduce tells every rank whether any found the file
GROW in its host's commit directory. The root copies the learnables and the history into host memory (one of
two reused sets, scaffe.elastic.state.HostCopies), and so does the replica, of what it holds: that copy is all
the training thread pays; the files and the copy on another host are made by
scaffe.elastic.replication's threads. After a commit that found GROW every rank raises GrowRequested
(scaffe.elastic.growth).
"""
import math
import os
import time

import numpy
from mpi4py import MPI

from collectives import events
from scaffe.elastic import settings
from scaffe.elastic.growth import GROW_FILE, GrowRequested
from scaffe.elastic.replication import Replication
from scaffe.elastic.state import Capture, HostCopies, ModelLayout, commit_name, rank_state
from scaffe.log import get_logger
from scaffe.solvers.callbacks import SolverCallback

log = get_logger(__name__)

UNKEPT_SOURCES = ("HDF5Data", "ImageData", "WindowData")  # data layers without reader_state (yet)
_WAIT_S = 1.0  # how often a commit waiting for host copies looks whether the writer has failed
COMMIT_SHARE = 0.05  # the measured spacing's aim: a commit's background work, at most this share of the time


class Committer(SolverCallback):
    """Commits `solver`'s state into `directory` every `every` iterations (with `measured`, every `every` or more:
    the module's measured spacing). `comm` (None: one process) is the training's communicator, `topology` its
    collectives Topology; collective over `comm`."""

    root = 0

    def __init__(self, solver, every, directory, comm=None, topology=None, measured=False):
        self.solver, self.every, self.directory, self.measured = solver, every, directory, measured
        self.spacing = every
        self._next = None  # the iteration of the next commit; before the first, every multiple of `every`
        self._last_commit = None  # the iteration record of the last commit
        self.control = None if comm is None else MPI.Intracomm(MPI.Intracomm.Dup(comm))
        # Reported to collectives.events like the gradients' calls: a rank lost while the others wait here (a
        # link gone down at a commit point) is then found by the stall inspector too, instead of hanging the job.
        self.names = {text: events.Name(text, None) for text in ("Commit gather", "Commit Allreduce")}
        self.rank = 0 if comm is None else comm.Get_rank()
        self.size = 1 if comm is None else comm.Get_size()
        self.replication = Replication(directory, ModelLayout(solver.net), comm, topology, self.root,
                                       solver.holds_history)
        keeps = self.rank in (self.root, self.replication.peer)  # the ranks that copy their state at a commit
        self.copies = HostCopies(solver, history=solver.holds_history) if keeps else None
        self.commits, self.spent_s = 0, 0.0
        self._first_record = self._last_record = None
        solver.callbacks.append(self)
        if self.rank == self.root:
            log.info("Committing the training state every %d iterations%s into %s%s", every,
                     " or more, as measured," if measured else "", directory,
                     f" (a copy on rank {self.replication.peer}'s host)" if self.replication.peer is not None else "")
            self._warn_unkept_readers()

    def _warn_unkept_readers(self):
        for layer in self.solver.net.layers:
            if layer.type in UNKEPT_SOURCES:
                log.warning("Layer %r (%s) does not keep its place in the data: a resumed commit restarts it "
                            "from its beginning", layer.name, layer.type)

    def on_iteration(self, record):
        self._first_record = self._first_record or record
        self._last_record = record
        if not self._due():
            return
        started = time.perf_counter()
        self.solver.parameters_read()
        mine = rank_state(self.solver)
        ranks = [mine] if self.control is None else events.reported(self.names["Commit gather"], 0,
                                                                     self.control.gather, mine, self.root)
        # Whether any rank found GROW, and the root's spacing from here on (the others give 0).
        shared = numpy.array([os.path.exists(os.path.join(self.directory, GROW_FILE)),
                              self._measured_spacing(record) if self.rank == self.root else 0], numpy.int64)
        if self.control is not None:
            events.reported(self.names["Commit Allreduce"], shared.nbytes, self.control.Allreduce, MPI.IN_PLACE,
                            shared, MPI.MAX)
        grow, self.spacing = bool(shared[0]), int(shared[1])
        self._next, self._last_commit = self.solver.iter + self.spacing, record
        if self.rank == self.root:
            global_batch = self.solver.net.batch_size * self.solver.param.iter_size * self.size
            self.replication.put(Capture(self.solver, ranks, global_batch, self._take_copies(), self.copies))
        elif self.copies is not None:  # the replica's own copies
            self.replication.put(Capture(self.solver, [], 0, self._take_copies(), self.copies))
        self.commits += 1
        self.spent_s += time.perf_counter() - started
        if grow:
            path = os.path.join(self.directory, commit_name(self.solver.iter))
            log.warning("Rank %d: %s found at iteration %d: stopping after commit %s, to grow", self.rank,
                        GROW_FILE, self.solver.iter, path)
            raise GrowRequested(self.solver.iter, path)

    def _due(self):
        """Whether this iteration commits: the first at a multiple of `every`, each later one `spacing` after."""
        return self.solver.iter % self.every == 0 if self._next is None else self.solver.iter >= self._next

    def _measured_spacing(self, record):
        """The root: the iterations until the next commit. Measured, so that storing and sending the last commit
        stored took at most COMMIT_SHARE of them, and never fewer than `every`."""
        busy_s, last = self.replication.busy_s, self._last_commit
        if not self.measured or busy_s is None or last is None or record["iteration"] <= last["iteration"]:
            return self.spacing
        iteration_s = (record["seconds"] - last["seconds"]) / (record["iteration"] - last["iteration"])
        spacing = max(self.every, math.ceil(busy_s / (COMMIT_SHARE * max(iteration_s, 1e-9))))
        if spacing != self.spacing:
            log.info("Committing every %d iterations from iteration %d: storing and sending a commit took %.2f s, "
                     "%.0f%% of %d iterations of %.1f ms (the aim: at most %.0f%%)", spacing, self.solver.iter,
                     busy_s, 100 * busy_s / (self.spacing * iteration_s), self.spacing, iteration_s * 1e3,
                     100 * COMMIT_SHARE)
        return spacing

    def _take_copies(self):
        """A set of host copies to commit into, once the writer has given one back if it holds them all."""
        waited = False
        while (copies := self.copies.take(timeout=_WAIT_S)) is None:
            self.replication.check()
            if not waited:
                log.warning("The commit of iteration %d waits for the one before to be stored and sent: commits "
                            "come faster than this host writes them; SCAFFE_COMMIT_ITERS sets how often",
                            self.solver.iter)
                waited = True
        return copies

    def close(self, wait=True):
        """Waits (with `wait`) for the commits to be stored and replicated, then reports their cost."""
        self.replication.close(wait)
        if wait and self.rank == self.root and self.commits:
            self._report()

    def _report(self):
        """The root's line on what committing cost the training thread: per commit, and spread over the
        iterations, as a share of the iteration's time."""
        first, last = self._first_record, self._last_record
        iterations = last["iteration"] - first["iteration"]
        if iterations <= 0:
            return
        iteration_s = (last["seconds"] - first["seconds"] - self.spent_s) / iterations
        each_ms, per_iteration_ms = self.spent_s / self.commits * 1e3, self.spent_s / iterations * 1e3
        log.info("Committed %d time(s) in %d iterations: %.2f ms each on the training thread, %.3f ms per "
                 "iteration = %.2f%% of the %.2f ms iteration", self.commits, iterations, each_ms, per_iteration_ms,
                 100 * per_iteration_ms / (iteration_s * 1e3), iteration_s * 1e3)


def start_committing(solver, solver_path, comm=None, topology=None):
    """A Committer for `solver` where SCAFFE_COMMIT_ITERS asks for commits, else None (collective over `comm`)."""
    every, measured = settings.commit_iters()
    if not every:
        return None
    return Committer(solver, every, settings.commit_dir(solver_path), comm, topology, measured)
