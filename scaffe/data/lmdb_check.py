"""The walk that proves an LMDB's tree sound before py-lmdb or scaffe.data.lmdb_file reads a record.

liblmdb trusts its file: a page pointer into a truncated data.mdb is a SIGBUS, a zeroed page or a
branch page of one node an assertion that aborts the process, and a damaged branch page silently hides
the records below it, so a scan reads a subset. This walk visits every branch and leaf page once, in the
order a scan does, and refuses the database at the first fault: a page reached twice (a cycle, or a
page copied over another), leaves at different depths, a node or value outside its page or the file,
keys out of order, or a number of records other than the header's. Overflow pages are checked from
the nodes that point at them, never read, so the walk reads a small part of a database of images.
"""
from scaffe.data.lmdb_file import NO_ROOT, P_BRANCH
from scaffe.log import get_logger

__all__ = ["count_records"]

log = get_logger(__name__)


def count_records(db, partial=False):
    """The number of records a scan of `db` (a scaffe.data.lmdb_file.LMDBFile) reads.

    A damaged tree raises CaffeFormatError. So does a count other than the header's, unless `partial`:
    then a warning names both counts and the walk's count is returned.
    """
    found = 0 if db.root == NO_ROOT else _Walk(db).run()
    if found != db.entries:
        problem = f"header says {db.entries:,} records, walk found {found:,}"
        if not partial:
            raise db.damaged(problem, "copy it again or rebuild it (SCAFFE_LMDB_PARTIAL=1 reads the records found)")
        log.warning("LMDB %s: %s; reading the %s found (SCAFFE_LMDB_PARTIAL=1)", db.path, problem, f"{found:,}")
    return found


class _Walk:
    def __init__(self, db):
        self.db = db
        self.reached = bytearray(db.last_page + 1)  # 1: a page of the tree or of a value, seen
        self.leaf_depth = None
        self.last_key = None
        self.records = 0

    def run(self):
        pending = [(self.db.root, 1)]  # (page, depth), the next to visit last
        while pending:
            number, depth = pending.pop()
            page_at, flags, count = self.db.page(number)
            self._reach(range(number, number + 1))
            if flags & P_BRANCH:
                if count < 2:  # liblmdb asserts this
                    raise self.db.damaged(f"branch page {number:,} has {count} node(s)")
                pending.extend((self.db.child(page_at, i), depth + 1) for i in reversed(range(count)))
            else:
                self._leaf(number, page_at, count, depth)
        return self.records

    def _reach(self, pages, holding=""):
        again = self.reached.find(1, pages.start, pages.stop)
        if again >= 0:
            raise self.db.damaged(f"page {again:,}{holding} is reached twice (a cycle, or a page written over another)")
        self.reached[pages.start:pages.stop] = b"\x01" * len(pages)

    def _leaf(self, number, page_at, count, depth):
        if self.leaf_depth is None:
            self.leaf_depth = depth
        if depth != self.leaf_depth:
            raise self.db.damaged(f"leaf page {number:,} is at depth {depth}, the first leaf at depth {self.leaf_depth}")
        if count < 1:
            raise self.db.damaged(f"leaf page {number:,} holds no records")
        for i in range(count):
            key, _, _, overflow = self.db.value_span(page_at, i)
            if self.last_key is not None and key <= self.last_key:
                raise self.db.damaged(f"leaf page {number:,}: key {key!r} follows {self.last_key!r}")
            self.last_key = key
            if overflow is not None:
                self._reach(overflow, f", holding part of record {key!r},")
        self.records += count
