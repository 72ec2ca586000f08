"""Read-only access to an LMDB straight from its data file, for a database py-lmdb will not open again,
and the page-level checks scaffe.data.lmdb_check's walk makes before either reader reads a record.

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

from scaffe.io import CaffeFormatError

__all__ = ["LMDBFile", "NO_ROOT", "P_BRANCH", "P_LEAF"]

_NUM_METAS = 2             # pages 0 and 1; the tree's pages follow
_PAGE_HEADER = 16          # page number (8), pad (2), flags (2), lower (2), upper (2)
_NODE_HEADER = 8           # lo (2), hi (2), flags (2), key size (2)
_META_MAGIC = 0xBEEFC0DE
_DATA_VERSION = 1
P_BRANCH, P_LEAF, _P_OVERFLOW, _P_META = 0x01, 0x02, 0x04, 0x08
_F_BIGDATA = 0x01          # the value lives on overflow pages; the node holds their page number
_F_SUBDATA_OR_DUP = 0x06   # sub-databases and duplicate keys: never in a Caffe database
NO_ROOT = 2 ** 64 - 1
# Offsets inside a meta page: MDB_meta follows the page header; mm_dbs[0] (free pages) carries the
# page size in its pad field, mm_dbs[1] is the main database.
_META_MAGIC_AT, _META_VERSION_AT, _PAGE_SIZE_AT = 16, 20, 40
_MAIN_FLAGS_AT, _MAIN_ENTRIES_AT, _MAIN_ROOT_AT, _LAST_PAGE_AT, _TXNID_AT = 92, 120, 128, 136, 144
_META_END = _TXNID_AT + 8
_REMEDY = "the database is damaged; copy it again or rebuild it"


class LMDBFile:
    """The main database of the LMDB at `path` (a folder holding data.mdb, or the data file itself).

    Opening checks the meta pages as liblmdb does and the file's size against the last page they
    name; every page read checks the page's number, its own header and its type, every node read that it
    lies inside its page, and every value read on overflow pages the type of the first. The tree as a
    whole (cycles, shared pages, record count) is scaffe.data.lmdb_check's walk.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        data_file = os.path.join(self.path, "data.mdb") if os.path.isdir(self.path) else self.path
        with open(data_file, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < _META_END:
                raise self.damaged(f"truncated: {size:,} bytes, less than one meta page", "copy it again")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self._check_meta(0, 0)
        self.page_size = self._u32(_PAGE_SIZE_AT)
        if self.page_size not in (1 << n for n in range(9, 17)):
            raise self.damaged(f"page size {self.page_size} in its first meta page")
        # The last page never moves back from one transaction to the next, so a whole file reaches the last
        # page of either meta page: the first one's is checked before the second meta page is read.
        self._check_size(size, 0)
        self._check_meta(1, self.page_size)
        # liblmdb reads the meta page written by the later transaction (the first one on a tie).
        meta = self.page_size if self._u64(self.page_size + _TXNID_AT) > self._u64(_TXNID_AT) else 0
        self.last_page = self._check_size(size, meta)
        if self._u16(meta + _MAIN_FLAGS_AT):
            raise self.damaged(f"main database flags {self._u16(meta + _MAIN_FLAGS_AT):#x}: a Caffe database "
                               "has none (no duplicate, integer or reversed keys)", "rebuild it")
        self.entries = self._u64(meta + _MAIN_ENTRIES_AT)
        self.root = self._u64(meta + _MAIN_ROOT_AT)

    def damaged(self, problem, remedy=_REMEDY):
        """The error for this database: its path, what is wrong and what to do, on one line."""
        return CaffeFormatError(f"LMDB {self.path}: {problem}; {remedy}")

    def _check_meta(self, number, at):
        if not self._u16(at + 10) & _P_META or self._u32(at + _META_MAGIC_AT) != _META_MAGIC:
            raise self.damaged(f"no LMDB meta page at page {number} (magic number missing)")
        version = self._u32(at + _META_VERSION_AT)
        if version != _DATA_VERSION:
            raise self.damaged(f"LMDB data format {version}, this reader knows format {_DATA_VERSION}",
                               "rebuild it with liblmdb 0.9")

    def _check_size(self, size, meta):
        """The last page the meta page at `meta` names, once the file is seen to reach it."""
        last_page = self._u64(meta + _LAST_PAGE_AT)
        needed = (max(last_page, _NUM_METAS - 1) + 1) * self.page_size
        if size < needed:
            raise self.damaged(f"truncated: {size:,} of {needed:,} bytes", "copy it again")
        return last_page

    def _u16(self, at):
        return struct.unpack_from("<H", self._map, at)[0]

    def _u32(self, at):
        return struct.unpack_from("<I", self._map, at)[0]

    def _u64(self, at):
        return struct.unpack_from("<Q", self._map, at)[0]

    # ------------------------------------------------------------ pages and nodes

    def page(self, number):
        """(offset of branch or leaf page `number`, its flags, its number of nodes)."""
        if not _NUM_METAS <= number <= self.last_page:
            raise self.damaged(f"a pointer to page {number:,}, outside its pages {_NUM_METAS}..{self.last_page:,}")
        at = number * self.page_size
        own_number, flags, lower, upper = struct.unpack_from("<Q2xHHH", self._map, at)
        if flags not in (P_BRANCH, P_LEAF):
            raise self.damaged(f"page {number:,} is neither a branch nor a leaf page (flags {flags:#x})")
        if own_number != number:
            raise self.damaged(f"page {number:,} holds page {own_number:,}: a page written over another")
        if not _PAGE_HEADER <= lower <= upper <= self.page_size:
            raise self.damaged(f"page {number:,}: header bounds {lower}..{upper} outside its {self.page_size} bytes")
        return at, flags, (lower - _PAGE_HEADER) // 2

    def node(self, page_at, index):
        """(key, node flags, the size/page-number field, offset of the data) of node `index` of the page at
        `page_at`; the node header and key lie inside the page."""
        ptr = self._u16(page_at + _PAGE_HEADER + 2 * index)
        if not _PAGE_HEADER <= ptr <= self.page_size - _NODE_HEADER:
            raise self.damaged(f"page {page_at // self.page_size:,}: node {index} at byte {ptr}, outside the page")
        lo, hi, flags, key_size = struct.unpack_from("<HHHH", self._map, page_at + ptr)
        key_at = page_at + ptr + _NODE_HEADER
        if ptr + _NODE_HEADER + key_size > self.page_size:
            raise self.damaged(f"page {page_at // self.page_size:,}: node {index}'s key of {key_size} bytes "
                               "runs past the page")
        return self._map[key_at:key_at + key_size], flags, lo | hi << 16, key_at + key_size

    def child(self, page_at, index):
        _, flags, low_bits, _ = self.node(page_at, index)
        return low_bits | flags << 32  # a branch node's 48-bit page number spans lo, hi and flags

    def value_span(self, page_at, index):
        """(key, offset of the value, its size, the range of its overflow pages or None) of leaf node `index`;
        the value lies inside the page or on overflow pages up to the last page."""
        key, flags, size, data_at = self.node(page_at, index)
        if flags & _F_SUBDATA_OR_DUP:
            raise self.damaged(f"record {key!r} holds a sub-database, not a value", "rebuild it")
        page_end = page_at + self.page_size
        if not flags & _F_BIGDATA:
            if data_at + size > page_end:
                raise self.damaged(f"record {key!r}: its {size:,} bytes run past page {page_at // self.page_size:,}")
            return key, data_at, size, None
        if data_at + 8 > page_end:
            raise self.damaged(f"record {key!r}: its overflow page number runs past page {page_at // self.page_size:,}")
        first = self._u64(data_at)
        pages = range(first, first + (_PAGE_HEADER + size + self.page_size - 1) // self.page_size)
        if first < _NUM_METAS or pages.stop - 1 > self.last_page:
            raise self.damaged(f"record {key!r}: overflow pages {first:,}..{pages.stop - 1:,}, outside its pages "
                               f"{_NUM_METAS}..{self.last_page:,}")
        return key, first * self.page_size + _PAGE_HEADER, size, pages

    def value(self, page_at, index):
        key, data_at, size, overflow = self.value_span(page_at, index)
        # Checked here, as liblmdb checks it, rather than by the walk, which would read a page of every value.
        if overflow is not None and not self._u16(overflow.start * self.page_size + 10) & _P_OVERFLOW:
            raise self.damaged(f"record {key!r}: the first page of its value, {overflow.start:,}, is not an overflow page")
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
        if self.db.root == NO_ROOT:
            return default
        page_at, flags, count = self.db.page(self.db.root)
        while flags & P_BRANCH:
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
            if not flags & P_BRANCH:
                return count > 0
            page_number = self.db.child(page_at, 0)

    def first(self):
        self._path, self._ended = [], False
        if self.db.root == NO_ROOT or not self._descend(self.db.root):
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
