"""What a commit holds, and reading and writing it: one directory D/iter_<N>, complete or absent.

A commit taken after N updates (`iter_<N>`, N zero-padded to 9 digits so that names sort) holds:
  commit.json        {"iter", "ranks", "global_batch", "batch", "iter_size", "solver", "solver_type",
                      "current_step", "created"}: what resuming needs to know before building anything
  model.caffemodel   the learned parameters, as a snapshot's .caffemodel
  state.solverstate  the iteration, the lr policy's step and the solver's history, as a snapshot's
                     .solverstate (its learned_net names model.caffemodel)
  ranks.json         per original rank: its random states and each data reader's place (scaffe.layer_impls.data)
It is written under a temporary name in D and renamed into place, so a directory called iter_<N> is complete;
a host keeps its newest KEEP commits.
"""
import json
import os
import queue
import random
import re
import shutil
import time
import zlib

import numpy

from scaffe import io as sio
from scaffe.io import CaffeFormatError
from scaffe.proto import caffe_pb2

COMMIT_FILE, MODEL_FILE, STATE_FILE, RANKS_FILE = "commit.json", "model.caffemodel", "state.solverstate", "ranks.json"
FILES = (MODEL_FILE, STATE_FILE, RANKS_FILE, COMMIT_FILE)  # in the order they are written: commit.json last
KEEP = 2  # a host's newest commits kept: the one being written may be lost with the host, the one before is whole
_NAME = re.compile(r"iter_(\d{9})$")


def commit_name(iteration):
    return f"iter_{iteration:09d}"


# ---------------------------------------------------------------- one rank's state

def data_readers(net):
    """The layers of `net` whose place in their data can be kept (scaffe.layer_impls.data)."""
    return [layer for layer in net.layers if hasattr(layer, "reader_state")]


def _nets(solver):
    """(key, net) of the training net and every test net, as ranks.json names them."""
    return [("train", solver.net)] + [(f"test{k}", net) for k, net in enumerate(solver.test_nets)]


def rank_state(solver):
    """This rank's part of a commit: its random states and its data readers' places (JSON-ready)."""
    return {"numpy_random": _numpy_state(numpy.random.get_state()),
            "python_random": _python_state(random.getstate()),
            "readers": {key: {layer.name: _reader_json(layer.reader_state()) for layer in data_readers(net)}
                        for key, net in _nets(solver)}}


def restore_rank_state(solver, ranks, rank):
    """Every data reader starts where the committed ranks' next batch starts (`ranks`: ranks.json's list); this
    rank takes the random states of the committed rank of its number, where there was one."""
    own = ranks[rank] if rank < len(ranks) else None
    for key, net in _nets(solver):
        for layer in data_readers(net):
            places = [committed["readers"].get(key, {}).get(layer.name) for committed in ranks]
            if any(place is None for place in places):
                raise CaffeFormatError(f"the commit keeps no place for data layer {layer.name!r} of the {key} net")
            # The ranks' next samples are the next positions of the stream in some order: the first is where
            # the next global batch starts, whatever the rank count.
            start = min(place["position"] for place in places)
            own_random = None if own is None else own["readers"][key][layer.name]["random"]
            layer.resume_reader(start, None if own_random is None else _numpy_tuple(own_random))
    if own is not None:
        numpy.random.set_state(_numpy_tuple(own["numpy_random"]))
        random.setstate(_python_tuple(own["python_random"]))


def _numpy_state(state):
    kind, keys, pos, has_gauss, cached = state
    return [kind, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]


def _numpy_tuple(state):
    kind, keys, pos, has_gauss, cached = state
    return kind, numpy.asarray(keys, dtype=numpy.uint32), pos, has_gauss, cached


def _python_state(state):
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _python_tuple(state):
    version, internal, gauss = state
    return version, tuple(internal), gauss


def _reader_json(place):
    return {"position": int(place["position"]),
            "random": None if place["random"] is None else _numpy_state(place["random"])}


# ---------------------------------------------------------------- the commit, in memory then in files

_NET_LAYER = caffe_pb2.NetParameter.DESCRIPTOR.fields_by_name["layer"].number
_LAYER_BLOBS = caffe_pb2.LayerParameter.DESCRIPTOR.fields_by_name["blobs"].number
_STATE_HISTORY = caffe_pb2.SolverState.DESCRIPTOR.fields_by_name["history"].number


class ModelLayout:
    """Which learnable blob each layer's blobs are, to write the .caffemodel from copies of the learnables."""

    def __init__(self, net):
        self.head = caffe_pb2.NetParameter(name=net.name).SerializeToString()
        self.layers = []  # (the layer's parameters without blobs, serialized; its blobs' learnable ids)
        for record in net.layer_records:
            layer = caffe_pb2.LayerParameter()
            layer.CopyFrom(record.layer.param)
            layer.ClearField("blobs")
            ids = [net.param_records[p].learnable_id for p in record.param_ids]
            self.layers.append((layer.SerializeToString(), ids))

    def model_chunks(self, learnables):
        """The .caffemodel of `learnables` (host arrays by learnable id) as buffers to write one after another."""
        chunks = [self.head]
        for layer, ids in self.layers:
            body = [layer]
            for i in ids:
                body += sio.field_chunks(_LAYER_BLOBS, sio.blob_chunks(learnables[i]))
            chunks += sio.field_chunks(_NET_LAYER, body)
        return chunks


def state_chunks(iteration, learned_net, current_step, history):
    """scaffe.solvers.sgd.solver_state's .solverstate as buffers to write one after another."""
    chunks = [caffe_pb2.SolverState(iter=iteration, learned_net=learned_net,
                                    current_step=current_step).SerializeToString()]
    for h in history:
        chunks += sio.field_chunks(_STATE_HISTORY, sio.blob_chunks(h))
    return chunks


class HostCopies:
    """Host arrays shaped as a solver's learnables and history, for commits to copy into: a set is taken for a
    commit and given back once the commit is stored and sent, and at most `sets` exist. Fresh arrays would cost
    the training thread their page faults at every commit (perf/RESULTS.md, "Cheaper commits"). The first set
    is made, and its pages touched, before training starts."""

    def __init__(self, solver, sets=2, history=True):
        self.solver, self._sets, self._history = solver, sets, history
        self._free, self._made = queue.Queue(), 0
        first = self.take(timeout=0)
        for array in first[0] + first[1]:
            array.fill(0)
        self.give_back(first)

    def take(self, timeout):
        """A set (learnables, history): a free one, a new one while fewer than `sets` exist, else the first given
        back within `timeout` seconds (None if none is)."""
        try:
            return self._free.get_nowait()
        except queue.Empty:
            pass
        if self._made < self._sets:
            self._made += 1
            return ([numpy.empty(blob.data.shape, blob.data.dtype) for blob in self.solver.net.learnable_params],
                    [numpy.empty(h.shape, h.dtype) for h in self.solver.history] if self._history else [])
        try:
            return self._free.get(timeout=timeout)
        except queue.Empty:
            return None

    def give_back(self, copies):
        self._free.put(copies)


class Capture:
    """A commit in this process's memory: the learnables and the history copied into a set of HostCopies on the
    training thread, turned into the commit's files later, on another (`files`), and then given back. The
    replica's is of its own copies (the history where it holds it), from which it makes the files that the root
    does not send (`own_files`)."""

    def __init__(self, solver, ranks, global_batch, copies, pool):
        self.iteration = solver.iter
        self.meta = {"iter": solver.iter, "ranks": len(ranks), "global_batch": global_batch,
                     "batch": solver.net.batch_size, "iter_size": solver.param.iter_size,
                     "solver": os.path.abspath(solver.source) if solver.source else None,
                     "solver_type": solver.type, "current_step": solver.current_step, "created": time.time()}
        self.ranks = ranks
        self.copies, self._pool = copies, pool
        self.learnables, self.history = copies
        for blob, copy in zip(solver.net.learnable_params, self.learnables):
            _copy_to_host(blob.data, copy)
        for h, copy in zip(solver.history, self.history):  # none where this rank does not hold the history
            _copy_to_host(h, copy)

    @property
    def name(self):
        return commit_name(self.iteration)

    def release(self):
        """Gives the copies back to their HostCopies (once the files are written and sent)."""
        self._pool.give_back(self.copies)

    def files(self, layout):
        """{file name: buffers} of the commit directory, in FILES' order, the arrays' buffers their own memory."""
        return {**self.own_files(layout, self.meta, (MODEL_FILE, STATE_FILE)),
                RANKS_FILE: [json.dumps(self.ranks).encode()], COMMIT_FILE: [json.dumps(self.meta, indent=1).encode()]}

    def own_files(self, layout, meta, names):
        """{file: buffers} of `names` (MODEL_FILE, STATE_FILE) of the commit that commit.json `meta` describes,
        made from this capture's copies."""
        made = {MODEL_FILE: lambda: layout.model_chunks(self.learnables),
                STATE_FILE: lambda: state_chunks(meta["iter"], MODEL_FILE, meta["current_step"], self.history)}
        return {name: made[name]() for name in names}


def checksum(chunks):
    """The CRC-32 of buffers `chunks` written one after another."""
    crc = 0
    for chunk in chunks:
        crc = zlib.crc32(chunk, crc)
    return crc


def _copy_to_host(array, host):
    if isinstance(array, numpy.ndarray):
        numpy.copyto(host, array)
    else:  # a device array downloads into it
        array.get(out=host)


def store(directory, name, files, keep=KEEP):
    """Writes commit `name` ({file: buffers, written one after another}) into `directory` under a temporary
    name, renames it into place and drops all but the newest `keep` commits; returns its path. A commit already
    there stays (two ranks of one host may both hold it)."""
    os.makedirs(directory, exist_ok=True)
    final = os.path.join(directory, name)
    partial = os.path.join(directory, f".{name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    os.mkdir(partial)
    for file_name, chunks in files.items():
        with open(os.path.join(partial, file_name), "wb") as f:
            f.writelines(chunks)
    try:
        os.rename(partial, final)
    except OSError:
        if not os.path.isdir(final):
            raise
        shutil.rmtree(partial, ignore_errors=True)
    for _, stale in list_commits(directory)[keep:]:
        shutil.rmtree(stale, ignore_errors=True)
    return final


def list_commits(directory):
    """(iteration, path) of every complete commit in `directory`, newest first; none when it does not exist."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = [(int(match.group(1)), os.path.join(directory, name)) for name in names if (match := _NAME.match(name))]
    return sorted(found, reverse=True)


# ---------------------------------------------------------------- reading one

class Commit:
    """A commit directory, read: `meta` (commit.json), `ranks` (ranks.json), and the paths of its model and state."""

    def __init__(self, path):
        self.path = os.fspath(path)
        if not os.path.isdir(self.path):
            raise CaffeFormatError(f"{self.path}: no such commit directory")
        self.meta = self._json(COMMIT_FILE)
        self.ranks = self._json(RANKS_FILE)
        missing = {"iter", "ranks", "global_batch", "batch", "iter_size"} - set(self.meta)
        if missing or len(self.ranks) != self.meta["ranks"]:
            raise CaffeFormatError(f"{self.path}: {COMMIT_FILE} lacks {', '.join(sorted(missing))}" if missing else
                                   f"{self.path}: {RANKS_FILE} holds {len(self.ranks)} ranks, "
                                   f"{COMMIT_FILE} says {self.meta['ranks']}")
        self.iteration = int(self.meta["iter"])
        self.model_path = os.path.join(self.path, MODEL_FILE)
        self.state_path = os.path.join(self.path, STATE_FILE)

    def _json(self, name):
        path = os.path.join(self.path, name)
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            raise CaffeFormatError(f"{path}: no such file; not a complete commit") from None
        except (OSError, ValueError) as e:
            raise CaffeFormatError(f"{path}: unreadable ({e}); the commit is damaged") from None


def write_snapshot(commit_path, prefix):
    """Commit `commit_path` as a snapshot `scaffe train --snapshot` resumes: <prefix>_iter_<N>.caffemodel and
    <prefix>_iter_<N>.solverstate (data readers start from their beginning then, as with any snapshot).
    Returns the two paths."""
    commit = Commit(commit_path)
    model_path = f"{prefix}_iter_{commit.iteration}.caffemodel"
    state_path = f"{prefix}_iter_{commit.iteration}.solverstate"
    with open(commit.model_path, "rb") as f:
        sio.atomic_write_bytes(model_path, f.read())
    state = sio.read_solverstate(commit.state_path)
    state.learned_net = model_path
    sio.write_solverstate(state, state_path)
    return model_path, state_path
