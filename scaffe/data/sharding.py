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
"""

__all__ = ["global_position", "rank_batch_positions", "ShardSpec"]


def global_position(local_index, rank, count):
    """The global stream position of a rank's `local_index`-th sample."""
    return local_index * count + rank


def rank_batch_positions(batch_index, batch_size, rank, count):
    """Global positions of the samples of batch `batch_index` (size `batch_size`) on `rank` of `count`."""
    return [global_position(batch_index * batch_size + j, rank, count) for j in range(batch_size)]


class ShardSpec:
    """rank and count of a shard, validated once (count >= 1, 0 <= rank < count)."""

    __slots__ = ("rank", "count")

    def __init__(self, rank=0, count=1):
        rank, count = int(rank), int(count)
        if count < 1 or not 0 <= rank < count:
            raise ValueError(f"invalid shard: rank {rank} of {count}")
        self.rank = rank
        self.count = count

    def __repr__(self):
        return f"ShardSpec(rank={self.rank}, count={self.count})"
