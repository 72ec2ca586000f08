"""Block sharding (what sharded testing uses): rank r of P reads blocks r, r+P, ... of b records, so each
of its batches is one whole batch of the single-rank stream."""
from pathlib import Path

import numpy
import pytest

from scaffe import io
from scaffe.blob import Blob
from scaffe.data import LMDBDatabase, ShardedCursor, ShardSpec, global_position
from scaffe.layer_impls import create_layer
from scaffe.proto import caffe_pb2

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mnist_test_lmdb():
    from scaffe.tools.convert_mnist import ensure_mnist_lmdb
    return ensure_mnist_lmdb(str(ROOT / "examples" / "mnist"))[1]


def test_block_sharded_cursors_hand_out_whole_batches(mnist_test_lmdb):
    ranks, block = 3, 700
    with LMDBDatabase(mnist_test_lmdb) as db:
        records = len(db)
        stream = [i % records for i in range(20 * block)]  # key order, wrapping around
        cursors = [ShardedCursor(db, ShardSpec(r, ranks, block)) for r in range(ranks)]
        for k in range(20):  # 20 global batches of 700 cross the end of the 10000 records
            r = k % ranks
            assert [int(cursors[r].next()[0]) for _ in range(block)] == stream[k * block:(k + 1) * block]
        for c in cursors:
            c.close()
    assert [global_position(i, 1, 3, 4) for i in range(9)] == [4, 5, 6, 7, 16, 17, 18, 19, 28]
    assert global_position(5, 2, 3) == 17  # block 1 is the record-level rule
    with pytest.raises(ValueError):
        ShardSpec(0, 2, 0)


def test_block_sharded_hdf5_layers_hand_out_whole_batches(tmp_path):
    h5py = pytest.importorskip("h5py")
    rows = numpy.arange(13 * 2, dtype=numpy.float32).reshape(13, 2)
    with h5py.File(tmp_path / "part.h5", "w") as h:
        h["data"] = rows
    (tmp_path / "list.txt").write_text("part.h5\n")
    param = io.parse_net_text(f'layer {{ name: "h" type: "HDF5Data" top: "data" '
                              f'hdf5_data_param {{ source: "{tmp_path / "list.txt"}" batch_size: 4 }} }}').layer[0]
    layers = []
    for r in range(2):
        layer, top = create_layer(param, caffe_pb2.TEST), [Blob()]
        layer.shard_rank, layer.shard_count, layer.shard_block = r, 2, 4
        layer.setup([], top)
        layers.append((layer, top))
    for k in range(8):  # 8 batches of 4 wrap around the 13 rows twice
        layer, top = layers[k % 2]
        layer.forward([], top)
        numpy.testing.assert_array_equal(top[0].data, rows[numpy.arange(4 * k, 4 * k + 4) % 13])
