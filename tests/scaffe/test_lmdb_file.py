"""scaffe.data.lmdb_file reads what py-lmdb reads: every record in key order, lookups, overflow pages."""
import lmdb
import numpy as np
import pytest

from scaffe.data.lmdb_file import LMDBFile
from scaffe.data.lmdb_reader import LMDBDatabase, ShardedCursor
from scaffe.data.sharding import ShardSpec
from scaffe.io import CaffeFormatError


def make_lmdb(path, records, subdir=True):
    env = lmdb.open(str(path), map_size=1 << 26, subdir=subdir)
    with env.begin(write=True) as txn:
        for key, value in records:
            txn.put(key, value)
    env.close()


def random_records(seed, count):
    """Keys of 1..12 bytes, values of 0 bytes to 3 pages (large ones go to overflow pages)."""
    rng = np.random.RandomState(seed)
    records = {}
    while len(records) < count:
        key = rng.randint(0, 256, rng.randint(1, 13), dtype=np.uint8).tobytes()
        size = int(rng.choice([0, 1, 100, 2000, 5000, 13000]))
        records[key] = rng.randint(0, 256, size, dtype=np.uint8).tobytes()
    return sorted(records.items())


@pytest.mark.parametrize("seed,count", [(0, 1), (1, 300), (2, 3000)])
def test_reads_every_record_in_key_order_like_py_lmdb(tmp_path, seed, count):
    records = random_records(seed, count)
    make_lmdb(tmp_path / "db", records)
    if count == 3000:  # the case that covers branch levels and overflow pages
        with lmdb.open(str(tmp_path / "db"), readonly=True) as env:
            assert env.stat()["depth"] >= 3 and env.stat()["overflow_pages"] > 0
    db = LMDBFile(tmp_path / "db")
    assert db.stat()["entries"] == count
    with db.begin() as txn:
        assert list(txn.cursor()) == records
        for key, value in records[::7]:
            assert txn.get(key) == value
        keys = set(dict(records))
        absent = [b"", b"\xff" * 13] + [key + b"\x00" for key, _ in records[::5] if key + b"\x00" not in keys]
        assert [txn.get(key) for key in absent] == [None] * len(absent)
    cursor = db.begin().cursor()
    assert cursor.first() and cursor.item() == records[0]
    steps = 1
    while cursor.next():
        steps += 1
    assert steps == count and not cursor.next()
    assert cursor.first() and cursor.item() == records[0]
    db.close()


def test_single_file_and_empty_databases(tmp_path):
    records = random_records(3, 50)
    make_lmdb(tmp_path / "one.mdb", records, subdir=False)
    with LMDBFile(tmp_path / "one.mdb").begin() as txn:
        assert list(txn.cursor()) == records
    make_lmdb(tmp_path / "empty", [])
    empty = LMDBFile(tmp_path / "empty")
    assert empty.stat()["entries"] == 0
    cursor = empty.begin().cursor()
    assert not cursor.first() and list(empty.begin().cursor()) == []
    (tmp_path / "junk").write_bytes(b"\0" * 8192)
    with pytest.raises(CaffeFormatError, match="junk: no LMDB meta page at page 0"):
        LMDBFile(tmp_path / "junk")
    whole = (tmp_path / "one.mdb").read_bytes()
    (tmp_path / "cut.mdb").write_bytes(whole[:len(whole) // 2])
    with pytest.raises(CaffeFormatError, match=f"cut.mdb: truncated: {len(whole) // 2:,} of {len(whole):,} bytes; "
                                               "copy it again$"):
        LMDBFile(tmp_path / "cut.mdb")


def test_a_database_open_elsewhere_in_the_process_is_still_read(tmp_path):
    records = [(f"{i:08d}".encode(), bytes([i]) * (i * 40)) for i in range(200)]
    make_lmdb(tmp_path / "db", records)
    theirs = lmdb.open(str(tmp_path / "db"), readonly=True)  # py-lmdb refuses a second open of this
    try:
        with LMDBDatabase(tmp_path / "db") as ours:
            assert isinstance(ours.env, LMDBFile)
            assert len(ours) == 200 and list(ours.items()) == records
            assert ours.get("00000123") == records[123][1]
            shard = ShardedCursor(ours, ShardSpec(1, 3), start=5)
            assert [shard.next()[0] for _ in range(3)] == [b"00000006", b"00000009", b"00000012"]
            shard.close()
    finally:
        theirs.close()
