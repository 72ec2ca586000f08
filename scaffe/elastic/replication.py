"""Commits written to this host's shared memory and copied to another host's, by helper threads.

The root (the rank that holds the solver's history under every schedule) hands each commit over as a
scaffe.elastic.state.Capture; a writer thread turns it into files and stores them in this host's commit
directory. The replica, rank (root + ranks on the root's host) % P, the first rank of the next host, keeps
one too: every rank holds the parameters at a commit point, so it copies its own, and its own history where
it holds one (not under the S-Caffe schedule). The writer sends it the rest (send_commit: the arrays' own
memory, no pickle: under the S-Caffe schedule the history, under the allreduce schedule only the small JSON
files) on a duplicate communicator, with the checksums of the files the replica makes itself; its
receiver thread makes them, checks them against the root's (a difference means the ranks have diverged: an
error) and stores the commit in that host's directory. With one host the replica would be the same
directory: nothing travels. Nodes are collectives' (SCAFFE_RANKS_PER_NODE cuts a host into simulated ones, so
that CI sends a replica across).

Helper threads may call MPI only under MPI_THREAD_MULTIPLE; without it commits stay on the root's host.
"""
import json
import queue
import threading
import time

import numpy
from mpi4py import MPI

from scaffe.elastic.state import COMMIT_FILE, FILES, MODEL_FILE, STATE_FILE, checksum, store
from scaffe.log import get_logger

log = get_logger(__name__)

_DONE = None  # what the writer sends, and the receiver takes, as the end of the commits


def replica_rank(root, topology):
    """The rank that keeps the copy of the root's commits (None where it would be on the root's host)."""
    node_of = topology.node_of
    peer = (root + topology.node_sizes[node_of[root]]) % len(node_of)
    return None if node_of[peer] == node_of[root] else peer


class ReplicaMismatch(RuntimeError):
    """The replica's own copy of the parameters or history differs from the root's."""


def send_commit(link, dest, name, files, own=()):
    """Sends commit `name` ({file: buffers}, as scaffe.elastic.state.store takes them) to rank `dest`, which
    makes the files `own` itself: a message naming the other files with their buffers' sizes, and the
    checksums of `own`'s, then each buffer of the others as it is, unpickled and uncopied."""
    sent = {file: chunks for file, chunks in files.items() if file not in own}
    link.send((name, {file: [memoryview(chunk).nbytes for chunk in chunks] for file, chunks in sent.items()},
               {file: checksum(files[file]) for file in own}), dest=dest)
    for chunks in sent.values():
        for chunk in chunks:
            link.Send([chunk, MPI.BYTE], dest=dest)


def receive_commit(link, source, message, buffers):
    """(name, {file: [its bytes]}, {file: checksum} of those it is to make) of the commit whose first message
    (send_commit's) is `message`, the files received into `buffers` ({file: uint8 array}, grown where too small
    and kept for the next commit: fresh memory would cost every commit its page faults)."""
    name, sizes, sums = message
    files = {}
    for file, chunk_sizes in sizes.items():
        total = sum(chunk_sizes)
        if file not in buffers or buffers[file].size < total:
            buffers[file] = numpy.empty(total, numpy.uint8)
        data = buffers[file][:total]
        offset = 0
        for size in chunk_sizes:
            link.Recv([data[offset:offset + size], MPI.BYTE], source=source)
            offset += size
        files[file] = [data]
    return name, files, sums


_PROBE_S = 0.01  # how often the receiver looks for the next commit


class Replication:
    """This rank's part in keeping commits: the root's writer, the replica's receiver, or nothing.
    Collective over `comm` (None: a single process); `topology`: collectives.topology.Topology of it."""

    def __init__(self, directory, layout, comm=None, topology=None, root=0, holds_history=True):
        self.directory, self.layout, self.root = directory, layout, root
        self.rank = 0 if comm is None else comm.Get_rank()
        threads = comm is not None and MPI.Query_thread() == MPI.THREAD_MULTIPLE
        self.peer = replica_rank(root, topology) if comm is not None else None
        self.link = MPI.Intracomm(MPI.Intracomm.Dup(comm)) if comm is not None else None  # every rank takes part in Dup
        if self.peer is not None and not threads:
            if self.rank == root:
                log.warning("Commits stay on this host: sending them to another needs MPI_THREAD_MULTIPLE")
            self.peer = None
        # The files the replica makes from its own copies (told by it: whether it holds the history).
        peer_history = self.link.bcast(holds_history, root=self.peer) if self.peer is not None else False
        self.own = (MODEL_FILE, STATE_FILE) if peer_history else (MODEL_FILE,)
        self.error = None  # the helper thread's failure, raised on the training thread
        self.busy_s = None  # the root: how long the writer took to store and send the last commit
        self._captures = queue.Queue()  # the root's, for the writer; the replica's own, for the receiver
        self._thread = None
        if self.rank == root:
            self._thread = threading.Thread(target=self._write_and_send, name="scaffe-commit-writer", daemon=True)
        elif self.rank == self.peer:
            self._thread = threading.Thread(target=self._receive, name="scaffe-commit-receiver", daemon=True)
        if self._thread is not None:
            self._thread.start()

    def put(self, capture):
        """The root: commit `capture` (a Capture) in the background; the writer releases it when done. The
        replica: its own copies of that commit, which the receiver completes and releases."""
        self._raise_failure()
        self._captures.put(capture)

    def close(self, wait=True):
        """Ends the helper threads; with `wait`, once every commit handed over is stored and sent. Without it
        (training failed: the peer may be gone) they are left to die with the process."""
        if self.rank == self.root:
            self._captures.put(_DONE)
        if wait and self._thread is not None:
            self._thread.join()
            self._raise_failure()

    def check(self):
        """Raises the helper thread's failure, or says that it has stopped."""
        self._raise_failure()
        if self._thread is not None and not self._thread.is_alive():
            raise OSError(f"the commit thread of {self.directory} has stopped")

    def _raise_failure(self):
        if isinstance(self.error, ReplicaMismatch):
            raise self.error
        if self.error is not None:
            raise OSError(f"writing a commit into {self.directory} failed: {self.error}")

    def _write_and_send(self):
        while True:
            capture = self._captures.get()
            if capture is _DONE:
                break
            started = time.perf_counter()
            try:
                files = capture.files(self.layout)
                store(self.directory, capture.name, files)
                if self.peer is not None:
                    send_commit(self.link, self.peer, capture.name, files, self.own)
                self.busy_s = time.perf_counter() - started
            except Exception as e:  # the next commit point raises it on the training thread
                self.error = e
            finally:
                capture.release()
        if self.peer is not None:
            self.link.send(_DONE, dest=self.peer)

    def _receive(self):
        buffers = {}
        while True:
            # MPI's blocking receive spins on a core for as long as it waits, which is the whole run: the
            # training ranks sharing the host lost a core to it (LeNet on 2 bed hosts: 62-65 against 34-40 ms
            # an iteration). Commits come seconds apart, so a probe every hundredth of a second is early enough.
            while not self.link.iprobe(source=self.root):
                time.sleep(_PROBE_S)
            message = self.link.recv(source=self.root)
            if message is _DONE:
                return
            name, files, sums = receive_commit(self.link, self.root, message, buffers)
            mine = self._own_capture(name)
            try:
                self._complete(name, files, sums, mine)
            except ReplicaMismatch as e:
                self.error = e
            finally:
                mine.release()

    def _own_capture(self, name):
        """This rank's own Capture of commit `name` (those of commits the root did not send are let go)."""
        while (capture := self._captures.get()).name != name:
            capture.release()
        return capture

    def _complete(self, name, files, sums, mine):
        """Stores commit `name`: the `files` received and, made from `mine`, those whose checksums are `sums`."""
        meta = json.loads(bytes(files[COMMIT_FILE][0]))
        made = mine.own_files(self.layout, meta, tuple(sums))
        for file, chunks in made.items():
            if checksum(chunks) != sums[file]:
                raise ReplicaMismatch(f"commit {name}: rank {self.rank}'s own {file} differs from the root's: the "
                                      f"ranks' {'parameters' if file == MODEL_FILE else 'solver history'} have "
                                      f"diverged")
        try:
            store(self.directory, name, {file: files.get(file) or made[file] for file in FILES})
        except OSError as e:  # the root goes on; this host just keeps no copy of this one
            log.warning("The replica of commit %s could not be written into %s: %s", name, self.directory, e)
