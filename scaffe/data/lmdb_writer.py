"""LMDBWriter: creates a new LMDB of (key, value) records, as Caffe's conversion tools do."""
import os

__all__ = ["LMDBWriter"]


class LMDBWriter:
    """Writes records into a new LMDB folder, committing every `commit_every` records.

    The map starts at 1 GiB and doubles whenever it fills, so small databases stay small and
    large ones need no size guess (Caffe reserves a fixed 1 TiB of address space instead).
    """

    def __init__(self, path, commit_every=1000, map_size=1 << 30):
        import lmdb

        self.path = os.fspath(path)
        if os.path.exists(self.path):
            raise FileExistsError(f"{self.path!r} already exists; remove it or choose another output name")
        os.makedirs(self.path)
        self._lmdb = lmdb
        self.env = lmdb.open(self.path, map_size=map_size, subdir=True, meminit=False, map_async=True)
        self.commit_every = commit_every
        self._pending = []
        self.count = 0

    def put(self, key, value):
        self._pending.append((key if isinstance(key, bytes) else key.encode("ascii"), bytes(value)))
        if len(self._pending) >= self.commit_every:
            self._flush()

    def _flush(self):
        while self._pending:
            try:
                with self.env.begin(write=True) as txn:
                    for key, value in self._pending:
                        txn.put(key, value)
            except self._lmdb.MapFullError:
                self.env.set_mapsize(self.env.info()["map_size"] * 2)
                continue
            self.count += len(self._pending)
            self._pending = []

    def close(self):
        if self.env is not None:
            self._flush()
            self.env.sync(True)
            self.env.close()
            self.env = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        elif self.env is not None:
            self.env.close()
            self.env = None
