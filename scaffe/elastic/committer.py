"""Committing the training state every SCAFFE_COMMIT_ITERS iterations, and stopping to grow (D/GROW).

At a commit point (after update N, N a multiple of the interval) every rank lands the updates still in
flight, then on a communicator of the commits' own: the ranks' own states (random states, data readers'
places) go to the root in one gather, and one small allreduce tells every rank whether any found the file
GROW in its host's commit directory. The root copies the learnables and the history into host memory (one of
two reused sets, scaffe.elastic.state.HostCopies): that copy is all the training thread pays; the files and the copy on another host are made by
scaffe.elastic.replication's threads. After a commit that found GROW every rank raises GrowRequested
(scaffe.elastic.growth).
"""
import os
import time

from mpi4py import MPI

from scaffe.elastic import settings
from scaffe.elastic.growth import GROW_FILE, GrowRequested
from scaffe.elastic.replication import Replication
from scaffe.elastic.state import Capture, HostCopies, ModelLayout, commit_name, rank_state
from scaffe.log import get_logger
from scaffe.solvers.callbacks import SolverCallback

log = get_logger(__name__)

UNKEPT_SOURCES = ("HDF5Data", "ImageData", "WindowData")  # data layers without reader_state (yet)
_WAIT_S = 1.0  # how often a commit waiting for host copies looks whether the writer has failed


class Committer(SolverCallback):
    """Commits `solver`'s state into `directory` every `every` iterations. `comm` (None: one process) is the
    training's communicator, `topology` its collectives Topology; collective over `comm`."""

    root = 0

    def __init__(self, solver, every, directory, comm=None, topology=None):
        self.solver, self.every, self.directory = solver, every, directory
        self.control = None if comm is None else MPI.Intracomm(MPI.Intracomm.Dup(comm))
        self.rank = 0 if comm is None else comm.Get_rank()
        self.size = 1 if comm is None else comm.Get_size()
        self.replication = Replication(directory, ModelLayout(solver.net), comm, topology, self.root)
        self.copies = HostCopies(solver) if self.rank == self.root else None
        self.commits, self.spent_s = 0, 0.0
        self._first_record = self._last_record = None
        solver.callbacks.append(self)
        if self.rank == self.root:
            log.info("Committing the training state every %d iterations into %s%s", every, directory,
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
        if self.solver.iter % self.every:
            return
        started = time.perf_counter()
        self.solver.parameters_read()
        mine = rank_state(self.solver)
        ranks = [mine] if self.control is None else self.control.gather(mine, root=self.root)
        found = os.path.exists(os.path.join(self.directory, GROW_FILE))
        grow = found if self.control is None else self.control.allreduce(int(found), op=MPI.MAX)
        if self.rank == self.root:
            global_batch = self.solver.net.batch_size * self.solver.param.iter_size * self.size
            self.replication.put(Capture(self.solver, ranks, global_batch, self._take_copies(), self.copies))
        self.commits += 1
        self.spent_s += time.perf_counter() - started
        if grow:
            path = os.path.join(self.directory, commit_name(self.solver.iter))
            log.warning("Rank %d: %s found at iteration %d: stopping after commit %s, to grow", self.rank,
                        GROW_FILE, self.solver.iter, path)
            raise GrowRequested(self.solver.iter, path)

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
        each_ms = self.spent_s / self.commits * 1e3
        log.info("Committed %d time(s): %.2f ms each on the training thread, %.3f ms per iteration at every %d "
                 "iterations = %.2f%% of the %.2f ms iteration", self.commits, each_ms, each_ms / self.every,
                 self.every, 100 * each_ms / self.every / (iteration_s * 1e3), iteration_s * 1e3)


def start_committing(solver, solver_path, comm=None, topology=None):
    """A Committer for `solver` where SCAFFE_COMMIT_ITERS asks for commits, else None (collective over `comm`)."""
    every = settings.commit_iters()
    if not every:
        return None
    return Committer(solver, every, settings.commit_dir(solver_path), comm, topology)
