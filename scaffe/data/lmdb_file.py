"""Read-only access to an LMDB straight from its data file, for a database py-lmdb will not open again.

py-lmdb refuses to open an environment that is already open in the same process, so a script that
opened a training database itself (to look at its records, as pycaffe scripts do) would keep its
nets from reading it; Caffe, being C++, never meets that rule. This reader walks LMDB's on-disk B+tree
(data format 1 of liblmdb 0.9: little-endian, 64-bit page numbers) in a read-only memory map of
data.mdb and offers the part of py-lmdb's Environment that scaffe.data.lmdb_reader uses: `begin()`
giving a transaction with `get()` and `cursor()`, cursors with `first()`, `next()`, `item()` and
iteration, `stat()` and `close()`. Like the py-lmdb readers there, it takes no lock.
"""
import mmap
import os
import struct

__all__ = ["LMDBFile", "LMDBFormatError"]

_PAGE_HEADER = 16          # page number (8), pad (2), flags (2), lower (2), upper (2)
_NODE_HEADER = 8           # lo (2), hi (2), flags (2), key size (2)
_META_MAGIC = 0xBEEFC0DE
_DATA_VERSION = 1
_P_BRANCH, _P_LEAF = 0x01, 0x02
_F_BIGDATA = 0x01          # the value lives on overflow pages; the node holds their page number
_F_SUBDATA_OR_DUP = 0x06   # sub-databases and duplicate keys: never in a Caffe database
_MDB_DUPSORT = 0x04
_NO_ROOT = 2 ** 64 - 1
# Offsets inside a meta page: MDB_meta follows the page header; mm_dbs[0] (free pages) carries the
# page size in its pad field, mm_dbs[1] is the main database.
_META_MAGIC_AT, _META_VERSION_AT, _PAGE_SIZE_AT = 16, 20, 40
_MAIN_FLAGS_AT, _MAIN_ENTRIES_AT, _MAIN_ROOT_AT, _TXNID_AT = 92, 120, 128, 144


class LMDBFormatError(ValueError):
    """The file is not an LMDB this reader understands (names the file and what was wrong)."""


class LMDBFile:
    """The main database of the LMDB at `path` (a folder holding data.mdb, or the data file itself)."""

    def __init__(self, path):
        self.path = os.fspath(path)
        data_file = os.path.join(self.path, "data.mdb") if os.path.isdir(self.path) else self.path
        with open(data_file, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if len(self._map) < 2 * _PAGE_HEADER + _TXNID_AT:
            raise LMDBFormatError(f"{data_file}: too short for an LMDB data file")
        self.page_size = self._u32(_PAGE_SIZE_AT)
        # Two meta pages; the one written by the later transaction is current.
        meta = max((0, self.page_size), key=lambda at: self._u64(at + _TXNID_AT))
        if self._u32(meta + _META_MAGIC_AT) != _META_MAGIC:
            raise LMDBFormatError(f"{data_file}: no LMDB meta page (magic number missing)")
        if self._u32(meta + _META_VERSION_AT) != _DATA_VERSION:
            raise LMDBFormatError(f"{data_file}: LMDB data format {self._u32(meta + _META_VERSION_AT)}, "
                                  f"this reader knows format {_DATA_VERSION}")
        if self._u16(meta + _MAIN_FLAGS_AT) & _MDB_DUPSORT:
            raise LMDBFormatError(f"{data_file}: a database with duplicate keys is not a Caffe database")
        self.entries = self._u64(meta + _MAIN_ENTRIES_AT)
        self.root = self._u64(meta + _MAIN_ROOT_AT)

    def _u16(self, at):
        return struct.unpack_from("<H", self._map, at)[0]

    def _u32(self, at):
        return struct.unpack_from("<I", self._map, at)[0]

    def _u64(self, at):
        return struct.unpack_from("<Q", self._map, at)[0]

    # ------------------------------------------------------------ pages and nodes

    def page(self, number):
        """(offset of the page, its flags, its number of nodes)."""
        at = number * self.page_size
        flags, lower = struct.unpack_from("<HH", self._map, at + 10)
        if not flags & (_P_BRANCH | _P_LEAF):
            raise LMDBFormatError(f"{self.path}: page {number} is neither a branch nor a leaf page (flags {flags:#x})")
        return at, flags, (lower - _PAGE_HEADER) // 2

    def node(self, page_at, index):
        """(key, node flags, the size/page-number field, offset of the data) of node `index`."""
        at = page_at + self._u16(page_at + _PAGE_HEADER + 2 * index)
        lo, hi, flags, key_size = struct.unpack_from("<HHHH", self._map, at)
        key_at = at + _NODE_HEADER
        return self._map[key_at:key_at + key_size], flags, lo | hi << 16, key_at + key_size

    def child(self, page_at, index):
        _, flags, low_bits, _ = self.node(page_at, index)
        return low_bits | flags << 32  # a branch node's 48-bit page number spans lo, hi and flags

    def value(self, page_at, index):
        key, flags, size, data_at = self.node(page_at, index)
        if flags & _F_SUBDATA_OR_DUP:
            raise LMDBFormatError(f"{self.path}: record {key!r} holds a sub-database, not a value")
        if flags & _F_BIGDATA:
            data_at = self._u64(data_at) * self.page_size + _PAGE_HEADER
        return key, self._map[data_at:data_at + size]

    # ------------------------------------------------------------ py-lmdb's Environment, read side

    def begin(self, buffers=False, write=False):
        if write:
            raise ValueError(f"{self.path}: opened read-only")
        return _Transaction(self)

    def stat(self):
        return {"psize": self.page_size, "entries": self.entries}

    def close(self):
        self._map.close()


class _Transaction:
    """A read transaction: the database as of the meta page read when it was opened."""

    def __init__(self, db):
        self.db = db

    def cursor(self):
        return _Cursor(self.db)

    def get(self, key, default=None):
        if self.db.root == _NO_ROOT:
            return default
        page_at, flags, count = self.db.page(self.db.root)
        while flags & _P_BRANCH:
            # Node 0's key stands for "smaller than everything": take the last node not above `key`.
            lo, hi = 1, count
            while lo < hi:
                mid = (lo + hi) // 2
                if self.db.node(page_at, mid)[0] <= key:
                    lo = mid + 1
                else:
                    hi = mid
            page_at, flags, count = self.db.page(self.db.child(page_at, lo - 1))
        lo, hi = 0, count
        while lo < hi:
            mid = (lo + hi) // 2
            if self.db.node(page_at, mid)[0] < key:
                lo = mid + 1
            else:
                hi = mid
        if lo < count and self.db.node(page_at, lo)[0] == key:
            return self.db.value(page_at, lo)[1]
        return default

    def abort(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Cursor:
    """Walks the records in key order; `first()`/`next()` return False past the last one, as py-lmdb's do."""

    def __init__(self, db):
        self.db = db
        self._path = []     # [page offset, node index, node count] from the root down to a leaf
        self._ended = False

    def _descend(self, page_number):
        while True:
            page_at, flags, count = self.db.page(page_number)
            self._path.append([page_at, 0, count])
            if not flags & _P_BRANCH:
                return count > 0
            page_number = self.db.child(page_at, 0)

    def first(self):
        self._path, self._ended = [], False
        if self.db.root == _NO_ROOT or not self._descend(self.db.root):
            self._ended = True
        return not self._ended

    def next(self):
        if self._ended:
            return False
        if not self._path:
            return self.first()
        # Climb to the lowest page with a node to the right, step onto it, then take its leftmost path down.
        depth = len(self._path) - 1
        while depth >= 0 and self._path[depth][1] + 1 >= self._path[depth][2]:
            depth -= 1
        if depth < 0:
            self._path, self._ended = [], True
            return False
        leaf_level = len(self._path) - 1
        del self._path[depth + 1:]
        self._path[depth][1] += 1
        if depth < leaf_level:
            page_at, index, _ = self._path[depth]
            return self._descend(self.db.child(page_at, index))
        return True

    def item(self):
        page_at, index, _ = self._path[-1]
        return self.db.value(page_at, index)

    def __iter__(self):
        positioned = bool(self._path) or self.first()
        while positioned:
            yield self.item()
            positioned = self.next()
