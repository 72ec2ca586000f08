"""Read-only access to a Caffe LMDB and a wrapping, rank-sharded cursor over its records."""
import os
import threading

import lmdb

from collectives import settings
from scaffe.data.lmdb_check import count_records
from scaffe.data.lmdb_file import LMDBFile
from scaffe.data.sharding import ShardSpec
from scaffe.io import CaffeFormatError
from scaffe.log import get_logger

log = get_logger(__name__)

__all__ = ["LMDBDatabase", "ShardedCursor", "open_database", "database_kind"]


def database_kind(path):
    """"lmdb", "leveldb" or None (not a database / missing), from the files in `path`."""
    if os.path.isdir(path):
        if os.path.exists(os.path.join(path, "data.mdb")):
            return "lmdb"
        if os.path.exists(os.path.join(path, "CURRENT")):
            return "leveldb"
        return None
    if os.path.isfile(path):
        # LMDB may also be a single file (MDB_NOSUBDIR); its first page carries the magic
        # 0xBEEFC0DE at byte 16 (little-endian) in the meta page.
        with open(path, "rb") as f:
            head = f.read(32)
        if len(head) >= 20 and head[16:20] == b"\xde\xc0\xef\xbe":
            return "lmdb"
    return None


# py-lmdb allows one open Environment per database per process, but a TRAIN and a TEST net
# (or two Data layers) often read the same database: they share one, counted by the data file's
# identity (device and inode, as py-lmdb tells databases apart). A database that other code in
# the process holds open through py-lmdb is read by scaffe.data.lmdb_file instead. Either way the
# tree is walked first (scaffe.data.lmdb_check), as liblmdb would crash or read a subset of a damaged one.
_envs = {}
_envs_lock = threading.Lock()


def _env_key(path):
    st = os.stat(os.path.join(path, "data.mdb") if os.path.isdir(path) else path)
    return st.st_dev, st.st_ino


def _partial_reads():
    """SCAFFE_LMDB_PARTIAL: 1 reads the records a damaged LMDB's tree still holds, with a warning, where its
    record count disagrees with its header; 0 (default) refuses the database."""
    return settings.switch("SCAFFE_LMDB_PARTIAL", False)


def _open_env(path):
    """(environment, number of records) of the LMDB at `path`, once its tree is found sound."""
    structure = LMDBFile(path)
    try:
        records = count_records(structure, _partial_reads())
        env = _open_py_lmdb(path)
    except BaseException:
        structure.close()
        raise
    if env is None:
        log.info("LMDB %s is already open elsewhere in this process; reading it from its data file", path)
        return structure, records
    structure.close()
    return env, records


def _open_py_lmdb(path):
    """py-lmdb's Environment for `path`, or None where other code in this process holds one."""
    try:
        return lmdb.open(path, readonly=True, lock=False, readahead=False, subdir=os.path.isdir(path),
                         max_readers=512)
    except lmdb.Error as e:
        if "already open in this process" in str(e):
            return None
        raise _damaged(path, e) from None


def _damaged(path, lmdb_error):
    """liblmdb's refusal of a database the walk found sound, as this database's error: the walk reads no
    overflow page, and liblmdb checks the type of a value's first one as it reads the value."""
    return CaffeFormatError(f"LMDB {path}: {lmdb_error}; the database is damaged; copy it again or rebuild it")


def _acquire_env(path):
    """(key for _release_env, the environment, its number of records) of the LMDB at `path`."""
    key = _env_key(path)
    with _envs_lock:
        entry = _envs.get(key)
        if entry is None:
            entry = _envs[key] = [*_open_env(path), 0]
        entry[2] += 1
        return key, entry[0], entry[1]


def _release_env(key):
    with _envs_lock:
        entry = _envs.get(key)
        if entry is None:
            return
        entry[2] -= 1
        if entry[2] == 0:
            del _envs[key]
            entry[0].close()


class LMDBDatabase:
    """An LMDB opened read-only without its lock file, so readers never write to the folder.

    Opening without locks is safe here because nothing writes to a training database while it
    is read, and it lets many ranks (and read-only file systems) share one database.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        self.env = None
        if not os.path.exists(self.path):
            raise FileNotFoundError(f"LMDB database {self.path!r} does not exist")
        self._env_key, self.env, self.num_records = _acquire_env(self.path)

    def __len__(self):
        return self.num_records

    def get(self, key):
        try:
            with self.env.begin(buffers=False) as txn:
                return txn.get(key if isinstance(key, bytes) else key.encode("ascii"))
        except lmdb.Error as e:
            raise _damaged(self.path, e) from None

    def items(self):
        """(key, value) pairs in key order."""
        try:
            with self.env.begin(buffers=False) as txn:
                yield from txn.cursor()
        except lmdb.Error as e:
            raise _damaged(self.path, e) from None

    def close(self):
        if self.env is not None:
            _release_env(self._env_key)
            self.env = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ShardedCursor:
    """Yields (key, value) of the records rank `shard.rank` of `shard.count` reads, forever.

    Follows the mapping in scaffe.data.sharding: the rank's i-th value is record
    (start + global_position(i, rank, count, block)) mod N in key order. The LMDB cursor walks
    forward and steps over the other ranks' records without reading them, so no key list is built
    (ImageNet-sized databases open instantly) and reads stay sequential on disk.
    """

    def __init__(self, database, shard=None, start=0):
        if len(database) == 0:
            raise ValueError(f"database {database.path!r} holds no records")
        self.database = database
        self.shard = shard or ShardSpec()
        self._txn = None
        self._cursor = None
        self._index = 0  # index in key order of the record under the cursor
        self._read = 0   # records this shard has returned
        self._pending = (start + self.shard.rank * self.shard.block) % len(database)

    def _open(self):
        # Opened on first use so the transaction belongs to the thread that reads (the
        # prefetch thread), not the one that built the layer.
        self._txn = self.database.env.begin(buffers=False)
        self._cursor = self._txn.cursor()
        self._cursor.first()
        pending, self._pending = self._pending, 0
        self._step(pending)

    def _step(self, n):
        n %= len(self.database)
        for _ in range(n):
            if not self._cursor.next():
                self._cursor.first()
        self._index = (self._index + n) % len(self.database)

    @property
    def record_index(self):
        """Key-order index of the record the next call returns."""
        if self._cursor is None:
            return self._pending
        return self._index

    def next(self):
        try:
            if self._cursor is None:
                self._open()
            key, value = self._cursor.item()
            self._read += 1
            # Within a block the next record is the neighbour; after a block, skip the other ranks' blocks.
            self._step(1 if self._read % self.shard.block else 1 + (self.shard.count - 1) * self.shard.block)
        except lmdb.Error as e:
            raise _damaged(self.database.path, e) from None
        return key, value

    __next__ = next

    def __iter__(self):
        return self

    def close(self):
        if self._txn is not None:
            self._txn.abort()
            self._txn = self._cursor = None


def open_database(path):
    """An LMDBDatabase for `path`; a LevelDB folder or anything else gives a clear error."""
    kind = database_kind(path)
    if kind == "lmdb":
        return LMDBDatabase(path)
    if kind == "leveldb":
        raise ValueError(f"{path!r} is a LevelDB database; scaffe reads LMDB only. Convert it, e.g. "
                         "rebuild it with Caffe's convert_imageset --backend=lmdb or scaffe convert")
    if not os.path.exists(path):
        raise FileNotFoundError(f"database {path!r} does not exist")
    raise ValueError(f"{path!r} is not an LMDB database (no data.mdb inside)")
