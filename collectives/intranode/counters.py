"""Counters in node-shared memory that the local ranks raise and wait on: the one protocol by which the ranks
of a node stage tell each other how far they are, on the host (shm.py, and its compiled loop) and on the
device (ipc.py).

Each local rank has a row of int64 words in one block on local rank 0 (so a wait reads one small region)
and writes only its own row. A counter only grows: each call's values are above the last call's, so a value
left from an earlier call never satisfies a wait in a later one. Order rests on the window's memory fence
(MPI_Win_sync): a rank fences before it raises a counter, so what it wrote before is visible before the
counter is, and a waiter fences once the counters it waits for are reached, so what their owners wrote
before them is visible after. The compiled loop (_steps.py) keeps the same rules with atomic loads and stores
at `address`. How long and how hard a wait spins is wait.py's policy.
"""
import numpy
from mpi4py import MPI

from collectives.errors import CollectiveError
from collectives.intranode.wait import wait_for_column, wait_until, yields


class CounterBlock:
    """A row of dtype `row` (whole int64 words) per local rank of `node_comm`, in node-shared memory.

    `rows` views them as `row`; word w of local rank k's row is `words[k * row_words + w]` (a memoryview:
    plain Python ints, at half the cost of numpy scalar indexing and comparison) and `columns[w][k]` (live
    memoryviews, for a wait on every rank that makes no Python calls per check: `min` over one costs a seventh
    of a numpy view's `min()`)."""

    def __init__(self, node_comm, row):
        row = numpy.dtype(row)
        if row.itemsize % 8:
            raise ValueError(f"a counter block's rows must be whole int64 words; this row takes {row.itemsize} bytes")
        self.local_rank = node_comm.Get_rank()
        self.local_size = node_comm.Get_size()
        self.row_words = row.itemsize // 8
        self._counter_win = MPI.Win.Allocate_shared(row.itemsize * self.local_size if self.local_rank == 0 else 0,
                                                    8, comm=node_comm)
        self._counter_win.Lock_all()
        memory, _ = self._counter_win.Shared_query(0)
        self.address = MPI.buffer(memory).address
        self.rows = numpy.frombuffer(memory, dtype=row, count=self.local_size)
        table = numpy.frombuffer(memory, dtype=numpy.int64, count=self.row_words * self.local_size)
        self.words = memoryview(memory).cast("B").cast("q")[:self.row_words * self.local_size]
        self.columns = [self.words[word::self.row_words] for word in range(self.row_words)]
        self._mine = self.row_words * self.local_rank
        table[self._mine:self._mine + self.row_words] = 0
        self.fence = self._counter_win.Sync  # bound once: the per-call path calls MPI directly
        self.yields = yields()  # a wait's yields before it naps (wait.py), read once: the compiled loop's too

    def field(self, rank, word):
        return self.words[self.row_words * rank + word]

    def set_field(self, word, value):
        """Set a word of my row that peers read only after a later `publish`."""
        self.words[self._mine + word] = value

    def publish(self, word, value):
        """Raise my counter `word` to `value`, once what I wrote before is visible."""
        self.fence()
        self.words[self._mine + word] = value

    def reached(self, ranks, word, value):
        words, row_words = self.words, self.row_words
        for k in ranks:
            if words[row_words * k + word] < value:
                return False
        return True

    def wait_ranks(self, ranks, word, value):
        """Block until counter `word` of every rank in `ranks` reaches `value`; what they wrote before is then
        visible."""
        wait_until(lambda: self.reached(ranks, word, value))
        self.fence()

    def wait_all(self, word, value, limit_s=None, failed=None):
        """Block until counter `word` of every local rank reaches `value`; what they wrote before is then
        visible. If first a rank's counter `failed` (the calls it left with an error) reaches `value`, or
        `limit_s` seconds pass (None: never), `missed(word, value)` says what happens."""
        failed_column = None if failed is None else self.columns[failed]
        if not wait_for_column(self.columns[word], value, limit_s, failed_column, self.yields):
            self.missed(word, value)
        self.fence()

    def missed(self, word, value):
        """A wait_all for `value` in counter `word` ended without every rank reaching it (a user of limits and
        failures overrides this to leave its call the way its ranks agree on)."""
        late = [rank for rank in range(self.local_size) if self.columns[word][rank] < value]
        raise CollectiveError(f"local ranks {late} did not reach {value} in counter {word} of the node's counters")

    def free(self):
        self._counter_win.Unlock_all()
        self._counter_win.Free()
