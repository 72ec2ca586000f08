"""Testing on every rank: test batches dealt out round-robin, per-batch outputs gathered on the root.

Global test batch k (counted over all tests of a net, as its data layer's stream runs on) is run by
rank k mod P: the net's data layers read blocks of one batch (scaffe.data.sharding), so rank r's
j-th batch is global batch j*P + r, exactly the batch one process would read. The root gathers
every batch's outputs and sums them in batch order: the report equals one process's, number for
number, and no rank waits while the root tests alone. The gathers are reported to collectives.events, so the
stall inspector finds a rank lost while the others wait in one.
"""
import numpy

from collectives import events

SHARDED_SOURCES = ("Data", "HDF5Data")  # layers that read their shard of a database (scaffe.data.sharding)
# Sources that make the same (or unrelated random) samples on every rank: sharding them would not
# split one stream, so nets with them are tested by the root alone.
UNSHARDABLE_SOURCES = ("Input", "DummyData", "MemoryData")


def shardable(net):
    """True when every sample of `net` comes from a source that reads its shard of a database."""
    types = {layer.type for layer in net.layers}
    return bool(types & set(SHARDED_SOURCES)) and not types & set(UNSHARDABLE_SOURCES)


def shard_by_batch(net, rank, size):
    """Rank `rank` of `size` reads whole batches rank, rank + size, ... of each data layer's stream.
    Data layers start reading at their first forward, so this holds after construction."""
    for layer in net.layers:
        if layer.type in SHARDED_SOURCES:
            layer.shard_rank, layer.shard_count, layer.shard_block = rank, size, layer.batch_size


class ShardedTesting:
    """Deals the batches of each test out to the ranks of `comm` and gathers their outputs on rank 0."""

    root = 0

    def __init__(self, comm, nets):
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        for net in nets:
            shard_by_batch(net, self.rank, self.size)
        self._batches_run = [0] * len(nets)  # global batches each net's stream has given out so far
        self.name = events.Name("Test gather", None)

    def batches(self, net_id, iterations):
        """Global indices of this rank's batches in the next test of `iterations` batches of net `net_id`."""
        first = self._batches_run[net_id]
        self._batches_run[net_id] += iterations
        return [k for k in range(first, first + iterations) if k % self.size == self.rank]

    def gather(self, batches, rows):
        """The root gets every rank's `rows` (one array per batch) in global batch order; others get None."""
        parts = self._gather((list(batches), numpy.asarray(rows, dtype=numpy.float64)))
        if self.rank != self.root:
            return None
        return _in_batch_order(zip(indices, block) for indices, block in parts)

    def rounds(self, net_id, iterations, run_batch):
        """Runs this rank's batches of the next test of `iterations` batches of net `net_id` in rounds of one
        batch per rank, and yields on the root every batch's `run_batch()` in global batch order as its round
        ends (a report can then show each batch as it finishes); the other ranks yield nothing. Every rank
        must exhaust it: each round ends in a gather."""
        first = self._batches_run[net_id]
        mine = self.batches(net_id, iterations)
        for start in range(first, first + iterations, self.size):
            results = [(k, run_batch()) for k in mine if start <= k < start + self.size]
            parts = self._gather(results)
            if self.rank == self.root:
                yield from _in_batch_order(parts)

    def _gather(self, part):
        return events.reported(self.name, 0, self.comm.gather, part, self.root)


def _in_batch_order(parts):
    """The results in every rank's part (pairs of global batch index and result), in batch order."""
    return [result for _, result in sorted((pair for part in parts for pair in part), key=lambda pair: pair[0])]
