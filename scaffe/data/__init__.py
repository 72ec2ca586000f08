"""Data input for scaffe: LMDB Datum reading, rank sharding, Caffe's transformer, prefetching, HDF5.

Rank sharding (see scaffe.data.sharding for the exact mapping): rank r of P reads every P-th
record of one global stream, starting at record r, so P ranks with batch B together see the
samples one rank with batch P*B sees. Data layers take the shard from the optional attributes
`shard_rank` and `shard_count` (defaults 0 and 1) that the net or trainer sets on them before
their first forward pass.
"""
from scaffe.data.datum import array_to_datum, datum_to_array, decode_image, encode_image, parse_datum
from scaffe.data.hdf5_source import HDF5Source, read_source_list
from scaffe.data.lmdb_reader import LMDBDatabase, ShardedCursor, database_kind, open_database
from scaffe.data.prefetch import PrefetchError, Prefetcher
from scaffe.data.sharding import ShardSpec, global_position, rank_batch_positions
from scaffe.data.transformer import DataTransformer

__all__ = [
    "array_to_datum", "datum_to_array", "decode_image", "encode_image", "parse_datum",
    "HDF5Source", "read_source_list",
    "LMDBDatabase", "ShardedCursor", "database_kind", "open_database",
    "PrefetchError", "Prefetcher",
    "ShardSpec", "global_position", "rank_batch_positions",
    "DataTransformer",
]
