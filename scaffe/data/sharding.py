"""Which database record each rank reads: round-robin sharding of one global sample stream.

The mapping (the same one Caffe's multi-GPU DataLayer uses when it skips records):

    one global stream of positions 0, 1, 2, ... over the records in key order, wrapping around:
        record(g) = (start + g) mod N                      (N records in the database)
    rank r of P reads global positions r, r + P, r + 2P, ...; its i-th sample overall is
        g = i * P + r
    so its j-th sample (0 <= j < B) of its k-th batch of B is
        g = (k * B + j) * P + r.

Consequence: in batch k the P ranks together read exactly global positions k*P*B .. (k+1)*P*B - 1,
which is batch k of a single rank reading with batch size P*B, wrap-around included. Within that
batch, rank r holds positions j*P + r (j = 0..B-1): laying the single-rank batch out as a
(B, P) matrix, rank r holds column r. Summed gradients are therefore the same samples; only the
order of summation differs.

Blocks: with `block` = b > 1 the stream is cut into blocks of b consecutive positions and rank r
reads blocks r, r + P, ...; its i-th sample is g = ((i // b) * P + r) * b + i % b. Testing uses
b = the test batch size, so each rank's batch is exactly one batch of a single-rank test run and
per-batch scores match it number for number.
"""

__all__ = ["global_position", "rank_batch_positions", "ShardSpec"]


def global_position(local_index, rank, count, block=1):
    """The global stream position of a rank's `local_index`-th sample."""
    return ((local_index // block) * count + rank) * block + local_index % block


def rank_batch_positions(batch_index, batch_size, rank, count):
    """Global positions of the samples of batch `batch_index` (size `batch_size`) on `rank` of `count`."""
    return [global_position(batch_index * batch_size + j, rank, count) for j in range(batch_size)]


class ShardSpec:
    """rank, count and block of a shard, validated once (count >= 1, 0 <= rank < count, block >= 1)."""

    __slots__ = ("rank", "count", "block")

    def __init__(self, rank=0, count=1, block=1):
        rank, count, block = int(rank), int(count), int(block)
        if count < 1 or not 0 <= rank < count or block < 1:
            raise ValueError(f"invalid shard: rank {rank} of {count} in blocks of {block}")
        self.rank = rank
        self.count = count
        self.block = block

    def owns(self, position):
        """True when global stream position `position` belongs to this shard."""
        return (position // self.block) % self.count == self.rank

    def __repr__(self):
        return f"ShardSpec(rank={self.rank}, count={self.count}, block={self.block})"
