"""Data layer: batches of Datums from an LMDB, transformed and prefetched by a background thread.

Reads its shard of the database (layer attributes `shard_rank`/`shard_count`, see
scaffe.data.layer_support) in key order from record 0 at creation, wrapping around, like Caffe.
Tops: data (N x C x H x W float32) and, optionally, label (N,).

A reader's place can be kept and taken up again (scaffe.elastic): `reader_state()` says where in the
global sample stream its next batch starts and the random state its transforms will draw from, counting
the batches forward has delivered, not those the prefetch thread has prepared ahead; `resume_reader`
(before the first forward) starts a reader there.
"""
import collections
import os
import weakref

import numpy

from scaffe.data.device_upload import DeviceUploader
from scaffe.data.layer_support import copy_to_blob, layer_rng, layer_shard, reading_error, resolve_source
from scaffe.data.lmdb_reader import ShardedCursor, database_kind, open_database
from scaffe.data.prefetch import PrefetchError, Prefetcher
from scaffe.data.sharding import global_position
from scaffe.data.transformer import DataTransformer
from scaffe.layer_impls import register
from scaffe.layer_impls.layer import Layer
from scaffe.proto import caffe_pb2


@register
class DataLayer(Layer):
    type = "Data"
    capture_refusal_reason = "it delivers a new batch each iteration"
    exact_num_bottom = 0
    min_num_top = 1
    max_num_top = 2

    def setup(self, bottom, top):
        p = self.param.data_param
        where = f"layer {self.name!r} (Data)"
        if not p.HasField("source") or not p.source:
            raise ValueError(f"{where}: data_param.source is not set")
        if p.batch_size < 1:
            raise ValueError(f"{where}: data_param.batch_size must be positive")
        self.batch_size = int(p.batch_size)
        self.source = resolve_source(self, p.source)
        self.database = self._open(p.backend, where)
        self.transformer = DataTransformer(self.param.transform_param, self.phase, rng=None)
        self.output_labels = len(top) > 1
        self.sample_shape = self._first_sample_shape()
        top[0].reshape((self.batch_size,) + self.sample_shape)
        if self.output_labels:
            top[1].reshape((self.batch_size,))
        self.prefetch_depth = max(1, int(p.prefetch))
        self._prefetcher = None
        self._cursor = None
        self.stream_start = 0  # where in the global sample stream this reader's stream begins
        self.delivered = 0  # batches forward has delivered
        self._resumed_random = None  # the transforms' random state to start from, from resume_reader
        # The transforms' random state after each prepared batch, in order: forward takes one per batch.
        self._random_after = collections.deque()
        self._random_now = None  # the state after the last delivered batch

    def reader_state(self):
        """{"position": where in the global stream this rank's next sample is, "random": the transforms' random
        state for the next batch, or None before the first batch}."""
        shard = layer_shard(self)
        position = self.stream_start + global_position(self.delivered * self.batch_size, shard.rank, shard.count,
                                                       shard.block)
        return {"position": position, "random": self._random_now}

    def resume_reader(self, position, random_state=None):
        """Starts this reader's stream at global position `position`, its transforms drawing from
        `random_state` (numpy RandomState.get_state() form; None: a fresh seed as usual). Before the first forward."""
        if self._prefetcher is not None:
            raise RuntimeError(f"layer {self.name!r} (Data): a reader that has started cannot be moved")
        self.stream_start = int(position)
        self._resumed_random = random_state

    def _open(self, backend, where):
        """The LMDB at self.source; an error that says what to do for anything else."""
        kind = database_kind(self.source)
        # An LMDB is read whatever `backend` says: the proto's default is LEVELDB, and nets that
        # forget `backend: LMDB` should not fail on a database we can read.
        if kind is None:
            if not os.path.exists(self.source):
                raise FileNotFoundError(f"{where}: data source {self.source!r} does not exist")
            if backend == caffe_pb2.DataParameter.LEVELDB:
                raise ValueError(f"{where}: {self.source!r} is not an LMDB and LevelDB is not supported; "
                                 "convert the data to LMDB")
            raise ValueError(f"{where}: {self.source!r} is not an LMDB database (no data.mdb inside)")
        if kind == "leveldb":
            raise ValueError(f"{where}: {self.source!r} is a LevelDB database, which scaffe does not read; "
                             "convert it to LMDB (e.g. Caffe's convert_imageset --backend=lmdb)")
        try:
            database = open_database(self.source)
        except (OSError, ValueError) as e:
            raise reading_error(where, e) from None
        if len(database) == 0:
            raise ValueError(f"{where}: database {self.source!r} is empty")
        return database

    def _first_sample_shape(self):
        """Transformed shape of the first record, as Caffe shapes the tops.

        The record goes through the transformer so a record or transform_param that cannot work fails
        here, not at its first batch. The reader starts later so the net can still set
        shard_rank/shard_count after setup.
        """
        key, first = next(self.database.items())
        try:
            sample, _ = self._decode(key, first)
        except ValueError as e:
            raise ValueError(f"{self.source}: {e}") from None
        try:
            self.transformer.transform(sample)
        except ValueError as e:
            raise ValueError(f"{self.source}: {_record_error(key, e)}") from None
        return self.transformer.output_shape(sample.shape)

    def _start(self, xp):
        if self._resumed_random is None:
            self.transformer.rng = layer_rng(self)
        else:  # no draw from numpy's global state: the interrupted run made it long ago
            self.transformer.rng = numpy.random.RandomState()
            self.transformer.rng.set_state(self._resumed_random)
        # On a GPU the prefetch thread also uploads each batch (pinned, double-buffered).
        uploader = self._uploader = None if xp is numpy else DeviceUploader(xp, self.prefetch_depth)
        self._cursor = ShardedCursor(self.database, layer_shard(self), start=self.stream_start)
        # The thread holds the layer only weakly, so a net that is dropped gets collected and
        # its __del__ stops the thread, instead of the thread keeping the net alive forever.
        layer_ref = weakref.ref(self)

        def produce():
            layer = layer_ref()
            if layer is None:
                raise RuntimeError("the Data layer was deleted")
            batch = layer._load_batch()
            layer._random_after.append(layer.transformer.rng.get_state())
            return batch if uploader is None else uploader.upload(batch)

        self._prefetcher = Prefetcher(produce, depth=self.prefetch_depth, name=f"scaffe-data-{self.name}")

    def _decode(self, key, value):
        """(sample, label) of the record `key`; errors name the key (the caller adds the database)."""
        try:
            sample, label = self.transformer.decode(value)
        except ValueError as e:
            raise _record_error(key, e) from None
        if sample.size == 0:
            raise _record_error(key, "not a Caffe Datum (no channels, height and width)")
        return sample, label

    def _load_batch(self):
        samples, labels = [], numpy.empty(self.batch_size, dtype=numpy.float32)
        for i in range(self.batch_size):
            key, value = self._cursor.next()
            sample, labels[i] = self._decode(key, value)
            # Caffe sizes each batch by its first sample, so encoded images of varying size work
            # with batch_size 1; mixed sizes inside one batch are an error.
            if samples and sample.shape != samples[0].shape:
                raise _record_error(key, f"sample of shape {sample.shape} in a batch whose first sample has "
                                         f"shape {samples[0].shape}")
            samples.append(sample)
        return self.transformer.transform_batch(samples), labels

    def reshape(self, bottom, top):
        # Tops are shaped by setup and by each forward (from the batch itself).
        pass

    def forward(self, bottom, top):
        if self._prefetcher is None:
            self._start(top[0].xp)
        try:
            batch = self._prefetcher.next()
        except PrefetchError as e:
            where = f"layer {self.name!r} (Data) reading {self.source!r}"
            # A damaged record or database is the data's fault, told as every reader tells it.
            if isinstance(e.__cause__, (OSError, ValueError)):
                raise reading_error(where, e.__cause__) from None
            raise RuntimeError(f"{where}: {e.__cause__ or e}") from e
        self.delivered += 1
        self._random_now = self._random_after.popleft()
        if self._uploader is not None:
            self._uploader.deliver(batch, top[:2] if self.output_labels else top[:1])
            return
        copy_to_blob(top[0], batch[0])
        if self.output_labels:
            copy_to_blob(top[1], batch[1])

    def backward(self, top, propagate_down, bottom):
        pass

    def close(self):
        """Stops the reader thread and closes the database (the layer cannot be used after)."""
        if getattr(self, "_uploader", None) is not None:
            self._uploader.close()
        if self._prefetcher is not None:
            self._prefetcher.close()
            self._prefetcher = None
        if self._cursor is not None:
            self._cursor = None
        db = getattr(self, "database", None)
        if db is not None:
            db.close()
            self.database = None

    def __del__(self):
        try:
            if getattr(self, "_uploader", None) is not None:
                self._uploader.close()
            if getattr(self, "_prefetcher", None) is not None:
                self._prefetcher.close()
        except Exception:  # interpreter shutdown: the daemon thread dies with the process
            pass


def _record_error(key, problem):
    """A ValueError naming the database record `key` (bytes from the cursor)."""
    name = key.decode("ascii", errors="replace") if isinstance(key, bytes) else str(key)
    return ValueError(f"record {name!r}: {problem}")
