"""Net: builds Caffe's layer graph from a NetParameter and runs forward/backward over it.

What it keeps from BVLC Caffe, because users and saved files depend on it: the include/exclude
rules on phase, level and stage; automatic Split layers where a blob feeds several layers (named
`<blob>_<producer>_<top index>_split`); in-place layers; loss weights (1 on the first top of a
loss layer unless given); the rules deciding which layers run backward; parameter sharing by
ParamSpec name; lr_mult/decay_mult per learnable blob; CopyTrainedLayersFrom and ToProto.

The distributed trainer hooks in without touching the single-process path: `on_param_needed`
callbacks run before a layer's forward, `on_grads_ready` callbacks after a layer's backward;
`on_layer_timed` callbacks (the training timeline) receive each layer's compute interval. With the
hooks after a layer's forward and before its backward, these are Caffe's four Net callbacks
(before_forward, after_forward, before_backward, after_backward), which pycaffe exposes.

Every piece of an iteration's work goes through `run_step`, so that a captured iteration (scaffe.capture)
can tell a layer's device work, which a CUDA graph can replay, from a hook, which must run each time.
"""
import os
import time
from dataclasses import dataclass, field

import numpy
from google.protobuf import text_format

from scaffe import io as sio
from scaffe.blob import Blob
from scaffe.closing import Closing
from scaffe.insert_splits import insert_splits
from scaffe.layer_impls import create_layer
from scaffe.log import fmt, get_logger
from scaffe.net_filter import NetError, filter_net
from scaffe.proto import caffe_pb2

log = get_logger(__name__)

__all__ = ["Net", "NetError", "LayerRecord", "BlobRecord", "ParamRecord", "LearnableRecord", "HOST"]

# The owner of a step that is host work (a hook, a callback): it runs at every iteration, never in a graph.
HOST = "host"


def _phase_value(phase):
    if phase is None:
        return None
    if isinstance(phase, str):
        try:
            return {"TRAIN": caffe_pb2.TRAIN, "TEST": caffe_pb2.TEST}[phase.upper()]
        except KeyError:
            raise ValueError(f"unknown phase {phase!r}; use TRAIN or TEST") from None
    return int(phase)


# ---------------------------------------------------------------- what the net holds

@dataclass(eq=False)
class LayerRecord:
    """One layer and its wiring: the ids and Blobs of its bottoms and tops, which bottoms get a
    gradient, whether it runs backward, its net param ids, and its (top index, weight) losses."""
    name: str
    layer: object
    bottom_ids: list = field(default_factory=list)
    top_ids: list = field(default_factory=list)
    bottoms: list = field(default_factory=list)
    tops: list = field(default_factory=list)
    bottom_need_backward: list = field(default_factory=list)
    need_backward: bool = False
    param_ids: list = field(default_factory=list)
    loss_tops: list = field(default_factory=list)


@dataclass(eq=False)
class BlobRecord:
    """One blob: its name, the Blob, whether a gradient reaches it, and its loss weight."""
    name: str
    blob: Blob
    need_backward: bool = False
    loss_weight: float = 0.0


@dataclass(eq=False)
class ParamRecord:
    """One parameter blob of a layer (Caffe's params_): blob `index` of layer `layer_id`, owned
    (`owner_id` -1) or shared from the net param `owner_id`, updated as learnable `learnable_id`."""
    blob: Blob
    layer_id: int
    index: int
    display_name: str
    owner_id: int
    learnable_id: int


@dataclass(eq=False)
class LearnableRecord:
    """One parameter the solver updates (an owned one) with its multipliers; `has_*` say whether
    a ParamSpec gave them, as a sharing layer may set a multiplier its owner left unset."""
    blob: Blob
    lr_mult: float
    decay_mult: float
    has_lr_mult: bool
    has_decay_mult: bool


# ---------------------------------------------------------------- the net

class Net(Closing):
    """A Caffe net for one phase.

    Construction: `Net(net_param, phase=None, stages=None, level=None, source=...)`. `phase`,
    `stages` and `level` work like Caffe's `Net(file, phase, level, stages)`: phase and level
    replace the values in `net_param.state`, stages are added to it. `source` (the file name)
    names the net in error messages, and its folder is where relative data paths are tried
    after the working directory (or `data_root`). `shard_rank`/`shard_count` are handed to
    layers that read a database, so each rank reads its own part.

    What it holds: `layer_records`, `blob_records`, `param_records` (every parameter blob,
    shared ones included) and `learnables` (the ones the solver updates, in Caffe's order, the
    same order as solverstate history); Caffe's vectors (`layers`, `blob_names`, `top_vecs`,
    `learnable_params`, `params_lr`, ...) are read from them.

    Running: `forward()` returns the total loss (sum of loss_weight * top; a 0-d array on a GPU),
    `backward()` fills every gradient, `forward_backward()` does both.

    Hooks for a distributed trainer and pycaffe's net callbacks (each a list of callables taking the
    layer index): `param_needed_hooks` run before layer i's forward, `after_forward_hooks` after it,
    `before_backward_hooks` before layer i's backward and `grads_ready_hooks` after it (both also
    for layers that skip backward, as in Caffe, so a trainer sees every index). Use
    `params_needed_at(i)` and `grads_ready_at(i)` to know which learnable params are concerned.
    `layer_timed_hooks` get `(i, "forward" or "backward", start, end)` after each layer's computation,
    `stamp()`s taken around it (perf_counter seconds on the CPU, CUDA events on a GPU) only while one
    is registered.
    """

    def __init__(self, param, phase=None, stages=None, level=None, *, source=None, xp=numpy,
                 shard_rank=None, shard_count=None, data_root=None):
        self.source = source or "<net>"
        self.xp = xp
        param = sio.copy_message(param)
        phase = _phase_value(phase)
        if phase is not None:
            param.state.phase = phase
        if stages:
            param.state.stage.extend(stages)
        if level is not None:
            param.state.level = int(level)
        self.shard_rank = shard_rank
        self.shard_count = shard_count
        self.data_root = data_root
        if data_root is None and source and os.path.exists(source):
            self.data_root = os.path.dirname(os.path.abspath(source))
        self.param_needed_hooks = []
        self.after_forward_hooks = []
        self.before_backward_hooks = []
        self.grads_ready_hooks = []
        self.layer_timed_hooks = []
        self.tape = None  # the scaffe.capture tape recording or checking this net's steps, if any
        self._loss = 0.0  # the loss forward_from_to is adding up
        self._init(param)

    @classmethod
    def from_file(cls, path, phase=None, stages=None, level=None, **kwargs):
        """The net in prototxt file `path` (Caffe's `Net(param_file, phase, level, stages)`)."""
        try:
            param = sio.read_net_prototxt(path)
        except sio.CaffeFormatError as e:
            raise NetError(str(e)) from None
        kwargs.setdefault("source", os.fspath(path))
        return cls(param, phase, stages, level, **kwargs)

    # ------------------------------------------------------------ Caffe's vectors, read from the records

    layers = property(lambda self: [r.layer for r in self.layer_records])
    layer_names = property(lambda self: [r.name for r in self.layer_records])
    bottom_vecs = property(lambda self: [r.bottoms for r in self.layer_records])
    top_vecs = property(lambda self: [r.tops for r in self.layer_records])
    bottom_id_vecs = property(lambda self: [r.bottom_ids for r in self.layer_records])
    top_id_vecs = property(lambda self: [r.top_ids for r in self.layer_records])
    bottom_need_backward = property(lambda self: [r.bottom_need_backward for r in self.layer_records])
    layer_need_backward = property(lambda self: [r.need_backward for r in self.layer_records])
    blobs_list = property(lambda self: [b.blob for b in self.blob_records])
    blob_names = property(lambda self: [b.name for b in self.blob_records])
    blob_loss_weights = property(lambda self: [b.loss_weight for b in self.blob_records])
    learnable_params = property(lambda self: [p.blob for p in self.learnables])
    params_lr = property(lambda self: [p.lr_mult for p in self.learnables])
    params_weight_decay = property(lambda self: [p.decay_mult for p in self.learnables])

    # ------------------------------------------------------------ construction

    def _init(self, in_param):
        self.phase = in_param.state.phase
        filtered = filter_net(in_param, self.source)
        if not filtered.layer:
            # Caffe builds such a net, and `caffe time` then times nothing; a net file cut short or the
            # wrong file is the likely cause.
            rules = f" in phase {caffe_pb2.Phase.Name(self.phase)}" if in_param.layer else ""
            raise NetError(f"{self.source}: the net has no layers{rules}; nothing to run")
        log.info("Initializing net from parameters: \n%s", text_format.MessageToString(filtered))
        param = insert_splits(filtered, self.source)
        self.name = param.name
        self.net_param = param
        self.layer_records, self.blob_records = [], []
        self.param_records, self.learnables = [], []
        self.input_blob_ids = []
        self._param_names_index = {}
        available = set()
        name_to_id = {}
        memory_used = 0
        for lp in param.layer:
            record = self._create_layer(lp)
            self._wire(record, lp, available, name_to_id)
            self._setup_layer(record, lp)
            self._set_loss_weights(record, lp)
            log.info("Setting up %s", lp.name)
            for blob_id, blob in zip(record.top_ids, record.tops):
                log.info("Top shape: %s", _shape_string(blob))
                if self.blob_records[blob_id].loss_weight:
                    log.info("    with loss weight %s", fmt(self.blob_records[blob_id].loss_weight))
                memory_used += blob.count
            log.info("Memory required for data: %d", memory_used * 4)
            self._append_params(record, lp)
            if record.need_backward:
                for blob_id in record.top_ids:
                    self.blob_records[blob_id].need_backward = True

        self._prune_backward()
        if param.force_backward:
            self._force_backward()
        # Whatever no layer consumed is an output; Caffe lists them in name order (a std::set).
        self.output_blob_ids = [name_to_id[n] for n in sorted(available)]
        for blob_id in self.output_blob_ids:
            log.info("This network produces output %s", self.blob_records[blob_id].name)
        self.blobs = {b.name: b.blob for b in self.blob_records}
        self.blob_names_index = {b.name: i for i, b in enumerate(self.blob_records)}
        self.layer_names_index = {r.name: i for i, r in enumerate(self.layer_records)}
        self._share_weights()
        log.info("Network initialization done.")

    def _create_layer(self, lp):
        """The record of a new layer built from LayerParameter `lp` (not wired yet)."""
        # A layer without a phase inherits the net's (Caffe does this before creating it).
        if not lp.HasField("phase"):
            lp.phase = self.phase
        if len(lp.propagate_down) and len(lp.propagate_down) != len(lp.bottom):
            raise NetError(f"{self.source}: layer '{lp.name}': propagate_down must be given either 0 or "
                           f"{len(lp.bottom)} times (once per bottom), got {len(lp.propagate_down)}")
        try:
            layer = create_layer(sio.copy_message(lp), lp.phase)
        except ValueError as e:
            raise NetError(self._where(lp, e)) from None
        # Attributes that data layers read before their first batch (scaffe.data.layer_support):
        # the rank's shard of the database, and a folder to try for relative data paths; the
        # net file's folder, so a net runs from any working directory (Caffe: only from its own).
        if self.shard_count is not None:
            layer.shard_rank = int(self.shard_rank or 0)
            layer.shard_count = int(self.shard_count)
        if self.data_root is not None and getattr(layer, "data_root", None) is None:
            layer.data_root = self.data_root
        record = LayerRecord(lp.name, layer)
        self.layer_records.append(record)
        log.info("Creating Layer %s", lp.name)
        return record

    def _setup_layer(self, record, lp):
        try:
            record.layer.setup(record.bottoms, record.tops)
            record.layer.reshape(record.bottoms, record.tops)
        except NetError:
            raise
        except (ValueError, KeyError, IndexError, TypeError, OSError, NotImplementedError, RuntimeError) as e:
            if getattr(record.layer, "raises_own_errors", False):
                raise
            raise NetError(self._where(lp, e)) from None
        except MemoryError as e:
            # A blob that passed the size checks may still not fit beside what the process holds already.
            raise NetError(self._where(lp, f"out of memory setting it up: {e or 'MemoryError'}")) from None

    def _where(self, lp, err):
        msg = " ".join(str(err).split())
        if f"'{lp.name}'" in msg or f'"{lp.name}"' in msg:
            return f"{self.source}: {msg}"
        return f"{self.source}: layer '{lp.name}' ({lp.type}): {msg}"

    def _wire(self, record, lp, available, name_to_id):
        """Connects the layer's bottoms and tops to the net's blobs, creating its new tops."""
        for bottom_id in range(len(lp.bottom)):
            self._append_bottom(record, lp, bottom_id, available, name_to_id)
        for top_id in range(len(lp.top)):
            self._append_top(record, lp, top_id, available, name_to_id)
        if lp.type == "Input":
            self.input_blob_ids.extend(record.top_ids)
        # Layers that need more tops than written get anonymous ones nobody else can read.
        layer = record.layer
        if getattr(layer, "auto_top_blobs", lambda: False)():
            needed = max(layer.min_num_top or 0, layer.exact_num_top or 0)
            for top_id in range(len(lp.top), needed):
                self._append_top(record, lp, top_id, None, None)
        checks = (("bottom", len(record.bottoms), layer.exact_num_bottom, layer.min_num_bottom, layer.max_num_bottom),
                  ("top", len(record.tops), layer.exact_num_top, layer.min_num_top, layer.max_num_top))
        for what, n, exact, lo, hi in checks:
            if exact is not None and exact >= 0 and n != exact:
                raise NetError(f"{self.source}: layer '{lp.name}' ({lp.type}) takes exactly {exact} {what} blob(s), got {n}")
            if lo is not None and lo >= 0 and n < lo:
                raise NetError(f"{self.source}: layer '{lp.name}' ({lp.type}) takes at least {lo} {what} blob(s), got {n}")
            if hi is not None and hi >= 0 and n > hi:
                raise NetError(f"{self.source}: layer '{lp.name}' ({lp.type}) takes at most {hi} {what} blob(s), got {n}")

    def _append_bottom(self, record, lp, bottom_id, available, name_to_id):
        blob_name = lp.bottom[bottom_id]
        if blob_name not in available:
            raise NetError(f"{self.source}: layer '{lp.name}': unknown bottom blob '{blob_name}' "
                           f"(bottom index {bottom_id}); no earlier layer produces it")
        blob_id = name_to_id[blob_name]
        log.info("%s <- %s", lp.name, blob_name)
        blob = self.blob_records[blob_id]
        record.bottom_ids.append(blob_id)
        record.bottoms.append(blob.blob)
        available.discard(blob_name)
        need = bool(lp.propagate_down[bottom_id]) if len(lp.propagate_down) else blob.need_backward
        record.bottom_need_backward.append(need)
        record.need_backward |= blob.need_backward

    def _append_top(self, record, lp, top_id, available, name_to_id):
        blob_name = lp.top[top_id] if top_id < len(lp.top) else "(automatic)"
        if name_to_id is not None and top_id < len(lp.bottom) and blob_name == lp.bottom[top_id]:
            log.info("%s -> %s (in-place)", lp.name, blob_name)
            blob_id = name_to_id[blob_name]
        elif name_to_id is not None and blob_name in name_to_id:
            raise NetError(f"{self.source}: layer '{lp.name}': top blob '{blob_name}' is produced by more than one "
                           f"layer; in-place use must read and write it at the same index")
        else:
            log.info("%s -> %s", lp.name, blob_name)
            blob_id = len(self.blob_records)
            self.blob_records.append(BlobRecord(blob_name, Blob((), xp=self.xp)))
            if name_to_id is not None:
                name_to_id[blob_name] = blob_id
        record.top_ids.append(blob_id)
        record.tops.append(self.blob_records[blob_id].blob)
        if available is not None:
            available.add(blob_name)

    def _set_loss_weights(self, record, lp):
        # Loss layers weigh their first top by 1 unless told otherwise; Caffe records that weight
        # in the layer's own parameters, so it also appears in saved .caffemodel files.
        layer = record.layer
        if layer.is_loss() and not len(layer.param.loss_weight):
            layer.param.loss_weight.append(1.0)
        weights = [float(w) for w in layer.param.loss_weight]
        if weights and len(weights) != len(record.tops):
            raise NetError(f"{self.source}: layer '{lp.name}': loss_weight must be given either 0 times or once "
                           f"per top blob ({len(record.tops)}), got {len(weights)}")
        for top_id, (blob_id, top) in enumerate(zip(record.top_ids, record.tops)):
            w = weights[top_id] if weights else 0.0
            self.blob_records[blob_id].loss_weight = w
            if w:
                top.diff[...] = w
        # What Caffe's Layer::Forward adds to the loss.
        record.loss_tops = [(top_id, w) for top_id, w in enumerate(weights) if w]

    def _append_params(self, record, lp):
        layer = record.layer
        num_params = len(layer.blobs)
        if len(lp.param) > num_params:
            raise NetError(f"{self.source}: layer '{lp.name}': {len(lp.param)} param specs given but the "
                           f"layer has only {num_params} parameter blobs")
        # Caffe never computes gradients for lr_mult 0 blobs (see _backward_layer).
        propagate = [(lp.param[k] if k < len(lp.param) else caffe_pb2.ParamSpec()).lr_mult != 0
                     for k in range(num_params)]
        record.need_backward |= any(propagate)
        layer.param_propagate_down = propagate
        for index in range(num_params):
            self._append_param(record, index)

    def _append_param(self, record, index):
        layer_id = len(self.layer_records) - 1
        lp = record.layer.param  # the layer's own copy: layers such as BatchNorm add ParamSpecs to it
        spec = lp.param[index] if index < len(lp.param) else caffe_pb2.ParamSpec()
        name = spec.name
        net_param_id = len(self.param_records)
        record.param_ids.append(net_param_id)
        blob = record.layer.blobs[index]
        owner_id = self._param_names_index.get(name, -1) if name else -1
        if owner_id < 0:
            if name:
                self._param_names_index[name] = net_param_id
            learnable_id = len(self.learnables)
            self.learnables.append(LearnableRecord(blob, float(spec.lr_mult), float(spec.decay_mult),
                                                   spec.HasField("lr_mult"), spec.HasField("decay_mult")))
        else:
            learnable_id = self._check_sharing(lp, spec, blob, self.param_records[owner_id])
        self.param_records.append(ParamRecord(blob, layer_id, index, name or str(index), owner_id, learnable_id))

    def _check_sharing(self, lp, spec, blob, owner):
        """The learnable id of `owner`, after checking that `blob` may share it as `spec` asks."""
        name = spec.name
        owner_layer = self.layer_records[owner.layer_id].name
        log.info("Sharing parameters '%s' owned by layer '%s', param index %d", name, owner_layer, owner.index)
        shapes = f"owner shape {_shape_string(owner.blob)}, this shape {_shape_string(blob)}"
        if spec.share_mode == caffe_pb2.ParamSpec.PERMISSIVE and blob.count != owner.blob.count:
            raise NetError(f"{self.source}: layer '{lp.name}': cannot share param '{name}' owned by layer "
                           f"'{owner_layer}': count mismatch, {shapes}")
        if spec.share_mode != caffe_pb2.ParamSpec.PERMISSIVE and blob.shape != owner.blob.shape:
            raise NetError(f"{self.source}: layer '{lp.name}': cannot share param '{name}' owned by layer "
                           f"'{owner_layer}': shape mismatch, {shapes}; use share_mode: PERMISSIVE to require "
                           f"only equal counts")
        # A multiplier set at the owner must agree; one the owner left unset is taken from here.
        learnable = self.learnables[owner.learnable_id]
        for multiplier in ("lr_mult", "decay_mult"):
            if not spec.HasField(multiplier):
                continue
            value = float(getattr(spec, multiplier))
            if not getattr(learnable, f"has_{multiplier}"):
                setattr(learnable, f"has_{multiplier}", True)
                setattr(learnable, multiplier, value)
            elif value != getattr(learnable, multiplier):
                raise NetError(f"{self.source}: layer '{lp.name}': shared param '{name}' has mismatched "
                               f"{multiplier} ({fmt(value)} here, {fmt(getattr(learnable, multiplier))} at its owner)")
        return owner.learnable_id

    def _prune_backward(self):
        """Caffe's backward pass over the graph: only layers whose tops lead to a loss run
        backward, and a layer all of whose tops skip propagation skips backward too."""
        under_loss, skip_backprop = set(), set()
        for record in reversed(self.layer_records):
            top_names = [self.blob_records[blob_id].name for blob_id in record.top_ids]
            loss_top_ids = {top_id for top_id, _ in record.loss_tops}
            contributes = any(top_id in loss_top_ids or name in under_loss for top_id, name in enumerate(top_names))
            skip = all(name in skip_backprop for name in top_names)
            if record.need_backward and skip:
                record.need_backward = False
                record.bottom_need_backward = [False] * len(record.bottom_need_backward)
            if not contributes:
                record.need_backward = False
            log.info("%s %s", record.name, "needs backward computation." if record.need_backward
                     else "does not need backward computation.")
            for bottom_id, blob_id in enumerate(record.bottom_ids):
                name = self.blob_records[blob_id].name
                if contributes:
                    under_loss.add(name)
                else:
                    record.bottom_need_backward[bottom_id] = False
                if not record.bottom_need_backward[bottom_id]:
                    skip_backprop.add(name)

    def _force_backward(self):
        for record in self.layer_records:
            record.need_backward = True
            for bottom_id, blob_id in enumerate(record.bottom_ids):
                need = record.bottom_need_backward[bottom_id] or record.layer.allow_force_backward(bottom_id)
                record.bottom_need_backward[bottom_id] = need
                self.blob_records[blob_id].need_backward = self.blob_records[blob_id].need_backward or need
            record.layer.param_propagate_down = [True] * len(record.layer.blobs)

    def _share_weights(self):
        # A sharing layer's blob views its owner's arrays (reshaped where PERMISSIVE sharing
        # let the shapes differ), so forward reads and backward accumulates into one array.
        for param in self.param_records:
            if param.owner_id < 0:
                continue
            owner, mine = self.param_records[param.owner_id].blob, param.blob
            if mine.shape != owner.shape:
                mine.data = owner.data.reshape(mine.shape)
                mine.diff = owner.diff.reshape(mine.shape)
            else:
                mine.share_data(owner)
                mine.share_diff(owner)

    # ------------------------------------------------------------ running

    def add_hooks(self, on_param_needed=None, on_grads_ready=None, on_layer_timed=None):
        """Registers per-layer callbacks (see the class docstring); None adds nothing."""
        if on_param_needed is not None:
            self.param_needed_hooks.append(on_param_needed)
        if on_grads_ready is not None:
            self.grads_ready_hooks.append(on_grads_ready)
        if on_layer_timed is not None:
            self.layer_timed_hooks.append(on_layer_timed)

    def params_needed_at(self, layer_id):
        """Learnable param ids first used by layer `layer_id` in forward (so must be present then):
        the ones it owns, since a layer shares only params that an earlier layer owns."""
        return self._owned_learnable_ids(layer_id)

    def grads_ready_at(self, layer_id):
        """Learnable param ids whose gradient is complete once layer `layer_id` has run backward:
        the ones it owns, as backward reaches the owner after every layer sharing them."""
        return self._owned_learnable_ids(layer_id)

    def _owned_learnable_ids(self, layer_id):
        params = (self.param_records[i] for i in self.layer_records[layer_id].param_ids)
        return [p.learnable_id for p in params if p.owner_id < 0]

    def layer_learnable_ids(self, layer_id):
        """Learnable param ids of layer `layer_id`'s blobs, in the layer's blob order."""
        return [self.param_records[i].learnable_id for i in self.layer_records[layer_id].param_ids]

    def run_step(self, owner, work, *args):
        """Runs `work(*args)`, one step of an iteration, or hands it to the tape recording the iteration:
        `owner` is the LayerRecord whose layer does the work, HOST for a hook or callback, None for
        device work of the net's or the solver's own."""
        if self.tape is None:
            work(*args)
        else:
            self.tape.step(owner, work, args)

    def forward_from_to(self, start, end):
        """Runs layers start..end (inclusive) forward; returns the loss they produced: a float on the CPU,
        a 0-d float64 device array on a GPU, so that the host need not wait for the device each pass
        (`float(loss)` fetches it; check_deferred_errors() should come with that fetch)."""
        self._loss = 0.0
        for i in range(start, end + 1):
            for hook in self.param_needed_hooks:
                self.run_step(HOST, hook, i)
            record = self.layer_records[i]
            self.run_step(record, self._timed, i, "forward", self._forward_layer, record)
            if record.loss_tops:
                self.run_step(None, self._add_loss, record)
            for hook in self.after_forward_hooks:
                self.run_step(HOST, hook, i)
        return self._loss

    def _timed(self, i, phase, work, record):
        """work(record), layer `i`'s `phase`; the layer_timed hooks, if any, get its interval."""
        timed = self.layer_timed_hooks
        if not timed:
            work(record)
            return
        began = self.stamp()
        work(record)
        ended = self.stamp()
        for hook in timed:
            hook(i, phase, began, ended)

    @staticmethod
    def _forward_layer(record):
        record.layer.reshape(record.bottoms, record.tops)
        record.layer.forward(record.bottoms, record.tops)

    def _add_loss(self, record):
        for top_id, w in record.loss_tops:
            top_loss = record.tops[top_id].data.sum(dtype=numpy.float64)
            if self.xp is numpy:
                self._loss = self._loss + w * float(top_loss)
            else:  # each operation is a kernel launch on the device: none for a lone loss of weight 1
                term = top_loss if w == 1 else w * top_loss
                self._loss = term if isinstance(self._loss, float) else self._loss + term

    def check_deferred_errors(self):
        """Raises the first error a layer found on the device and kept there (a bad label, say), so that
        checking it did not cost a host sync per pass; call it where the host reads results anyway."""
        for record in self.layer_records:
            check = getattr(record.layer, "deferred_label_check", None)
            message = None if check is None else check.message()
            if message:
                raise ValueError(message)

    def forward(self, start=None, end=None):
        """Forward over the whole net (or layers start..end); returns the total loss (see forward_from_to)."""
        start = 0 if start is None else start
        end = len(self.layer_records) - 1 if end is None else end
        return self.forward_from_to(start, end)

    def reshape(self):
        """Caffe's Net::Reshape: every layer reshapes its tops from its bottoms (after an input blob
        was reshaped), without running forward."""
        for record in self.layer_records:
            record.layer.reshape(record.bottoms, record.tops)

    def backward_from_to(self, start, end):
        """Runs layers start down to end (inclusive) backward."""
        if start == len(self.layer_records) - 1:
            self.run_step(None, self._reset_loss_diffs)
        for i in range(start, end - 1, -1):
            for hook in self.before_backward_hooks:
                self.run_step(HOST, hook, i)
            record = self.layer_records[i]
            if record.need_backward:
                self.run_step(record, self._timed, i, "backward", self._backward_layer, record)
            for hook in self.grads_ready_hooks:
                self.run_step(HOST, hook, i)

    def clock(self):
        """perf_counter() once the work queued so far is done: a GPU runs layers asynchronously, so
        without waiting for its stream a layer's time would be its kernel launches only."""
        if self.xp is not numpy:
            self.xp.cuda.get_current_stream().synchronize()
        return time.perf_counter()

    def stamp(self):
        """A point in the layers' time for the layer_timed hooks, without waiting for the device:
        perf_counter() on the CPU; on a GPU a CUDA event recorded on the current stream, which
        completes when the work queued before it has run (the receiver reads it after the fact)."""
        if self.xp is numpy:
            return time.perf_counter()
        event = self.xp.cuda.Event()
        event.record()
        return event

    @staticmethod
    def _backward_layer(record):
        layer = record.layer
        frozen = [k for k, p in enumerate(layer.param_propagate_down) if not p]
        # Caffe never computes gradients for lr_mult 0 blobs; a layer that computes them anyway
        # must not change them, or gradient clipping would see a different global norm.
        saved = [layer.blobs[k].diff.copy() for k in frozen]
        layer.backward(record.tops, record.bottom_need_backward, record.bottoms)
        for k, d in zip(frozen, saved):
            layer.blobs[k].diff[...] = d

    def _reset_loss_diffs(self):
        # The loss weight lives in the loss top's diff (Caffe's loss multiplier); put it back in
        # case a reshape reallocated the blob since the last pass.
        for record in self.layer_records:
            for top_id, w in record.loss_tops:
                record.tops[top_id].diff[...] = w

    def backward(self):
        self.backward_from_to(len(self.layer_records) - 1, 0)

    def forward_backward(self):
        loss = self.forward()
        self.backward()
        return loss

    def clear_param_diffs(self):
        for learnable in self.learnables:
            learnable.blob.diff[...] = 0

    def update(self):
        """Caffe's Net::Update: data -= diff for every learnable blob (the solver put the step in diff)."""
        for learnable in self.learnables:
            learnable.blob.data -= learnable.blob.diff

    # ------------------------------------------------------------ outputs

    @property
    def output_blobs(self):
        return [self.blob_records[i].blob for i in self.output_blob_ids]

    @property
    def output_names(self):
        return [self.blob_records[i].name for i in self.output_blob_ids]

    @property
    def input_blobs(self):
        return [self.blob_records[i].blob for i in self.input_blob_ids]

    def outputs(self):
        """{output name: numpy array copy} of the net outputs after the last forward."""
        return {name: sio.to_host(blob.data).copy() for name, blob in zip(self.output_names, self.output_blobs)}

    def loss_weight(self, blob_name):
        return self.blob_records[self.blob_names_index[blob_name]].loss_weight

    def layer(self, name):
        return self.layer_records[self.layer_names_index[name]].layer

    @property
    def batch_size(self):
        """Samples per forward pass: the first axis of the first top of the first data layer."""
        for record in self.layer_records:
            if not record.bottoms and record.tops and record.tops[0].shape:
                return int(record.tops[0].shape[0])
        return 1

    # ------------------------------------------------------------ weights in and out

    def copy_trained_layers_from(self, source, *more_sources):
        """Copies blobs from each source in turn (a NetParameter, a .caffemodel path or a .caffemodel.h5
        path) into the layers of the same name: Caffe's CopyTrainedLayersFrom, once per source as its
        LoadNetWeights calls it, so a later source overwrites the layers it holds; others keep their values."""
        sources = (source,) + more_sources
        wheres = ["<NetParameter>" if isinstance(s, caffe_pb2.NetParameter) else os.fspath(s) for s in sources]
        copied = set()
        for each, where in zip(sources, wheres):
            copied |= (self._copy_from_param(each, where) if isinstance(each, caffe_pb2.NetParameter)
                       else self._copy_from_file(where))
        # Caffe is silent here, but a renamed or misspelt layer then trains from its fillers unnoticed.
        missing = [record.name for record in self.layer_records
                   if record.layer.blobs and record.name not in copied
                   and any(self.param_records[p].owner_id < 0 for p in record.param_ids)]
        if missing:
            log.warning("%s %s no weights for layer(s) %s of %s: they keep their filler values", ", ".join(wheres),
                        "have" if more_sources else "has", ", ".join(f"'{n}'" for n in missing), self.source)

    def _copy_from_file(self, path):
        """Names of the layers copied from the .caffemodel or .caffemodel.h5 file `path`."""
        if not os.path.exists(path):
            raise NetError(f"{path}: no such weights file")
        try:
            if sio.is_hdf5_file(path):
                return self._copy_from_hdf5(sio.read_hdf5_weights(path), path)
            return self._copy_from_param(sio.read_net_binary(path), path)
        except sio.CaffeFormatError as e:
            raise NetError(str(e)) from None

    def _copy_from_param(self, param, where):
        copied = set()
        for source_layer in sio.model_layers(param):
            name, stored = source_layer.name, source_layer.blobs
            target = self._target_blobs(name)
            if target is None:
                continue
            if len(target) != len(stored):
                raise self._count_mismatch(where, name, len(stored), target)
            for j, (blob, blob_proto) in enumerate(zip(target, stored)):
                if not sio.blobproto_matches_shape(blob_proto, blob.shape):
                    raise self._shape_mismatch(where, name, j, sio.blobproto_shape(blob_proto), blob)
                try:
                    values = sio.blobproto_to_array(blob_proto, shape=blob.shape)
                except ValueError as e:
                    raise NetError(f"{where}: layer '{name}' blob {j}: {e}") from None
                _load_values(blob, values, where, name, j)
            copied.add(name)
        return copied

    def _copy_from_hdf5(self, weights, path):
        copied = set()
        for name, stored in weights.items():
            target = self._target_blobs(name)
            if target is None:
                continue
            if len(stored) > len(target):
                raise self._count_mismatch(path, name, len(stored), target)
            param_ids = self.layer_records[self.layer_names_index[name]].param_ids
            for j, blob in enumerate(target):
                if j not in stored:
                    # Missing in the file is fine only for blobs shared from another layer.
                    if self.param_records[param_ids[j]].owner_id >= 0:
                        continue
                    raise NetError(f"{path}: layer '{name}' lacks blob {j}: incompatible number of blobs")
                values = numpy.asarray(stored[j])
                if tuple(values.shape) != blob.shape:
                    raise self._shape_mismatch(path, name, j, values.shape, blob)
                _load_values(blob, values, path, name, j)
            copied.add(name)
        return copied

    def _target_blobs(self, name):
        """The blobs of this net's layer `name`, or None (said in the log) if it has none of that name."""
        if name not in self.layer_names_index:
            log.info("Ignoring source layer %s", name)
            return None
        return self.layer_records[self.layer_names_index[name]].layer.blobs

    def _count_mismatch(self, where, name, stored_count, target):
        return NetError(f"{where}: layer '{name}' has {stored_count} blobs in the file but {len(target)} in the "
                        f"net ({self.source}): incompatible number of blobs")

    def _shape_mismatch(self, where, name, j, stored_shape, blob):
        return NetError(f"{where}: cannot copy param {j} of layer '{name}': shape mismatch, file has "
                        f"{_shape_str(stored_shape)}, net ({self.source}) has {_shape_string(blob)}; "
                        f"rename the layer to learn its parameters from scratch")

    def share_trained_layers_with(self, other):
        """Makes this net's layers use the parameter arrays of `other`'s layers of the same name
        (Caffe's ShareTrainedLayersWith: how a solver's test nets see the training weights)."""
        for record in other.layer_records:
            if record.name not in self.layer_names_index:
                continue
            source, target = record.layer.blobs, self.layer(record.name).blobs
            if len(source) != len(target):
                raise NetError(f"{self.source}: layer '{record.name}' has {len(target)} blobs here but {len(source)} "
                               f"in the training net: incompatible number of blobs")
            for j, (s, t) in enumerate(zip(source, target)):
                if s.shape != t.shape:
                    raise NetError(f"{self.source}: cannot share param {j} of layer '{record.name}': shape mismatch, "
                                   f"{_shape_string(s)} in the training net vs {_shape_string(t)}")
                t.share_data(s)

    def to_proto(self, write_diff=False):
        """A NetParameter holding every layer (Split layers included) with its blobs, as Caffe's
        Net::ToProto writes into a .caffemodel."""
        out = caffe_pb2.NetParameter()
        out.name = self.name
        for record in self.layer_records:
            lp = out.layer.add()
            lp.CopyFrom(record.layer.param)
            blobs = record.layer.blobs
            sio.set_layer_blobs(lp, [sio.to_host(b.data) for b in blobs],
                                [sio.to_host(b.diff) for b in blobs] if write_diff else None)
        return out

    def save(self, path, write_diff=False):
        """Writes a binary .caffemodel atomically."""
        sio.write_net_binary(self.to_proto(write_diff), path)

    def save_hdf5(self, path, write_diff=False):
        """Caffe's Net::ToHDF5 layout: data/<layer>/<i> for blobs a layer owns (shared ones are
        skipped), diff/<layer>/<i> for every blob when `write_diff`."""
        data = [(record.name, [sio.to_host(self.param_records[p].blob.data) if self.param_records[p].owner_id < 0
                               else None for p in record.param_ids]) for record in self.layer_records]
        diff = [(record.name, [sio.to_host(blob.diff) for blob in record.layer.blobs])
                for record in self.layer_records] if write_diff else None
        sio.write_hdf5_weights(path, data, diff)

    # ------------------------------------------------------------ reporting

    def close(self):
        """Stops data reader threads and closes databases; the net cannot run afterwards."""
        for record in self.layer_records:
            close = getattr(record.layer, "close", None)
            if callable(close):
                close()

    def describe(self):
        """One line per layer: index, name, type, bottoms -> tops, backward flag (for debugging)."""
        lines = []
        for i, record in enumerate(self.layer_records):
            b = ", ".join(self.blob_records[j].name for j in record.bottom_ids)
            t = ", ".join(self.blob_records[j].name for j in record.top_ids)
            lines.append(f"{i:3d} {record.name} ({record.layer.param.type}) [{b}] -> [{t}]"
                         f"{' backward' if record.need_backward else ''}")
        return "\n".join(lines)


def _shape_str(shape):
    shape = tuple(int(d) for d in shape)
    count = int(numpy.prod(shape, dtype=numpy.int64)) if shape else 1
    return "".join(f"{d} " for d in shape) + f"({count})"


def _shape_string(blob):
    return _shape_str(blob.shape)


def _load_values(blob, values, where, name, j):
    """Copies the host array `values`, blob `j` of layer `name` in the weights `where`, into `blob`."""
    sio.warn_non_finite(values, f"{where}: layer '{name}' blob {j}")
    _assign(blob.data, values)


def _assign(dest, values):
    if isinstance(dest, numpy.ndarray):
        dest[...] = values
    else:
        import cupy
        dest[...] = cupy.asarray(values)
