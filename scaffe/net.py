"""Net: builds Caffe's layer graph from a NetParameter and runs forward/backward over it.

What it keeps from BVLC Caffe, because users and saved files depend on it: the include/exclude
rules on phase, level and stage; automatic Split layers where a blob feeds several layers (named
`<blob>_<producer>_<top index>_split`); in-place layers; loss weights (1 on the first top of a
loss layer unless given); the rules deciding which layers run backward; parameter sharing by
ParamSpec name; lr_mult/decay_mult per learnable blob; CopyTrainedLayersFrom and ToProto.

The distributed trainer hooks in without touching the single-process path: `on_param_needed`
callbacks run before a layer's forward, `on_grads_ready` callbacks after a layer's backward;
`on_layer_timed` callbacks (the training timeline) receive each layer's compute interval.
"""
import os
import time

import numpy

from scaffe import io as sio
from scaffe.blob import Blob
from scaffe.insert_splits import insert_splits
from scaffe.layers import create_layer
from scaffe.log import fmt, get_logger
from scaffe.net_filter import NetError, filter_net
from scaffe.proto import caffe_pb2

log = get_logger(__name__)

__all__ = ["Net", "NetError"]



def _phase_value(phase):
    if phase is None:
        return None
    if isinstance(phase, str):
        try:
            return {"TRAIN": caffe_pb2.TRAIN, "TEST": caffe_pb2.TEST}[phase.upper()]
        except KeyError:
            raise ValueError(f"unknown phase {phase!r}; use TRAIN or TEST") from None
    return int(phase)


# ---------------------------------------------------------------- the net

class Net:
    """A Caffe net for one phase.

    Construction: `Net(net_param, phase=None, stages=None, level=None, source=...)`. `phase`,
    `stages` and `level` work like Caffe's `Net(file, phase, level, stages)`: phase and level
    replace the values in `net_param.state`, stages are added to it. `source` (the file name)
    names the net in error messages, and its folder is where relative data paths are tried
    after the working directory (or `data_root`). `shard_rank`/`shard_count` are handed to
    layers that read a database, so each rank reads its own part.

    Running: `forward()` returns the total loss (sum of loss_weight * top), `backward()` fills
    every gradient, `forward_backward()` does both. Parameters: `learnable_params` (Blobs, in
    Caffe's order, the same order as solverstate history), with `params_lr` and
    `params_weight_decay`.

    Hooks for a distributed trainer (each a list of callables taking the layer index):
    `param_needed_hooks` run before layer i's forward, `grads_ready_hooks` after layer i's
    backward (also for layers that skip backward, so a trainer sees every index). Use
    `params_needed_at(i)` and `grads_ready_at(i)` to know which learnable params are concerned.
    `layer_timed_hooks` get `(i, "forward" or "backward", start, end)` (perf_counter seconds) after
    each layer's computation; the clock is read (on a GPU, after waiting for the current stream)
    only while one is registered.
    """

    def __init__(self, param, phase=None, stages=None, level=None, *, source=None, xp=numpy,
                 shard_rank=None, shard_count=None, data_root=None):
        self.source = source or "<net>"
        self.xp = xp
        param = _copy(param)
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
        self.grads_ready_hooks = []
        self.layer_timed_hooks = []
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

    # ------------------------------------------------------------ construction

    def _init(self, in_param):
        self.phase = in_param.state.phase
        filtered = filter_net(in_param, self.source)
        log.info("Initializing net from parameters: \n%s", _short_text(filtered))
        param = insert_splits(filtered, self.source)
        self.name = param.name
        self.net_param = param
        self.layers = []
        self.layer_names = []
        self.bottom_vecs, self.top_vecs = [], []
        self.bottom_id_vecs, self.top_id_vecs = [], []
        self.bottom_need_backward = []
        self.layer_need_backward = []
        self.blobs_list = []           # every blob, by blob id
        self.blob_names = []
        self.blob_need_backward = []
        self.blob_loss_weights = []    # by blob id
        self.params = []               # every param blob, shared ones included
        self.param_id_vecs = []        # per layer: net param ids
        self.param_owners = []         # per net param: -1 or the owner's net param id
        self.param_layer_indices = []  # per net param: (layer id, param index in layer)
        self.param_display_names = []
        self._param_names_index = {}
        self.learnable_params = []
        self.learnable_param_ids = []  # per net param: its learnable param id
        self.params_lr = []
        self.params_weight_decay = []
        self.has_params_lr = []
        self.has_params_decay = []
        self.input_blob_ids = []
        self._param_propagate_down = []
        available = set()
        name_to_id = {}
        memory_used = 0

        for layer_id, lp in enumerate(param.layer):
            # A layer without a phase inherits the net's (Caffe does this before creating it).
            if not lp.HasField("phase"):
                lp.phase = self.phase
            if len(lp.propagate_down) and len(lp.propagate_down) != len(lp.bottom):
                raise NetError(f"{self.source}: layer '{lp.name}': propagate_down must be given either 0 or "
                               f"{len(lp.bottom)} times (once per bottom), got {len(lp.propagate_down)}")
            try:
                layer = create_layer(_copy(lp), lp.phase)
            except ValueError as e:
                raise NetError(self._where(lp, e)) from None
            self._configure_layer(layer)
            self.layers.append(layer)
            self.layer_names.append(lp.name)
            log.info("Creating Layer %s", lp.name)
            self.bottom_vecs.append([])
            self.top_vecs.append([])
            self.bottom_id_vecs.append([])
            self.top_id_vecs.append([])
            self.bottom_need_backward.append([])
            self.param_id_vecs.append([])
            need_backward = False
            for bottom_id in range(len(lp.bottom)):
                blob_id = self._append_bottom(lp, layer_id, bottom_id, available, name_to_id)
                need_backward |= self.blob_need_backward[blob_id]
            for top_id in range(len(lp.top)):
                self._append_top(lp, layer_id, top_id, available, name_to_id)
                if lp.type == "Input":
                    self.input_blob_ids.append(len(self.blobs_list) - 1)
            # Layers that need more tops than written get anonymous ones nobody else can read.
            if getattr(layer, "auto_top_blobs", lambda: False)():
                needed = max(layer.min_num_top or 0, layer.exact_num_top or 0)
                for top_id in range(len(lp.top), needed):
                    self._append_top(lp, layer_id, top_id, None, None)
            self._check_blob_counts(layer, lp)
            bottom, top = self.bottom_vecs[layer_id], self.top_vecs[layer_id]
            try:
                layer.setup(bottom, top)
                layer.reshape(bottom, top)
            except NetError:
                raise
            except (ValueError, KeyError, IndexError, TypeError, OSError, NotImplementedError, RuntimeError) as e:
                raise NetError(self._where(lp, e)) from None
            self._set_loss_weights(layer, lp, layer_id)
            log.info("Setting up %s", lp.name)
            for top_id, blob in enumerate(top):
                blob_id = self.top_id_vecs[layer_id][top_id]
                log.info("Top shape: %s", _shape_string(blob))
                if self.blob_loss_weights[blob_id]:
                    log.info("    with loss weight %s", fmt(self.blob_loss_weights[blob_id]))
                memory_used += blob.count
            log.info("Memory required for data: %d", memory_used * 4)
            num_params = len(layer.blobs)
            if len(lp.param) > num_params:
                raise NetError(f"{self.source}: layer '{lp.name}': {len(lp.param)} param specs given but the "
                               f"layer has only {num_params} parameter blobs")
            propagate = []
            for param_id in range(num_params):
                spec = lp.param[param_id] if param_id < len(lp.param) else caffe_pb2.ParamSpec()
                propagate.append(spec.lr_mult != 0)
                need_backward |= spec.lr_mult != 0
            self._param_propagate_down.append(propagate)
            layer.param_propagate_down = list(propagate)
            for param_id in range(num_params):
                self._append_param(layer_id, param_id)
            self.layer_need_backward.append(need_backward)
            if need_backward:
                for blob_id in self.top_id_vecs[layer_id]:
                    self.blob_need_backward[blob_id] = True

        self._prune_backward()
        if param.force_backward:
            self._force_backward()
        # Whatever no layer consumed is an output; Caffe lists them in name order (a std::set).
        self.output_blob_ids = [name_to_id[n] for n in sorted(available)]
        for blob_id in self.output_blob_ids:
            log.info("This network produces output %s", self.blob_names[blob_id])
        self.blobs = {name: self.blobs_list[i] for i, name in enumerate(self.blob_names)}
        self.blob_names_index = {name: i for i, name in enumerate(self.blob_names)}
        self.layer_names_index = {name: i for i, name in enumerate(self.layer_names)}
        self._share_weights()
        self._index_hooks()
        # (top index, weight) per layer: what Caffe's Layer::Forward adds to the loss.
        self._layer_loss_tops = [[(t, float(w)) for t, w in enumerate(layer.param.loss_weight) if w]
                                 for layer in self.layers]
        self._loss_tops = [(self.top_vecs[i][t], w) for i, tops in enumerate(self._layer_loss_tops) for t, w in tops]
        log.info("Network initialization done.")

    def _where(self, lp, err):
        msg = " ".join(str(err).split())
        if f"'{lp.name}'" in msg or f'"{lp.name}"' in msg:
            return f"{self.source}: {msg}"
        return f"{self.source}: layer '{lp.name}' ({lp.type}): {msg}"

    def _configure_layer(self, layer):
        # Attributes that data layers read before their first batch (scaffe.data.layer_support):
        # the rank's shard of the database, and a folder to try for relative data paths; the
        # net file's folder, so a net runs from any working directory (Caffe: only from its own).
        if self.shard_count is not None:
            layer.shard_rank = int(self.shard_rank or 0)
            layer.shard_count = int(self.shard_count)
        if self.data_root is not None and getattr(layer, "data_root", None) is None:
            layer.data_root = self.data_root

    def _check_blob_counts(self, layer, lp):
        nb, nt = len(self.bottom_vecs[-1]), len(self.top_vecs[-1])
        checks = (("bottom", nb, layer.exact_num_bottom, layer.min_num_bottom, layer.max_num_bottom),
                  ("top", nt, layer.exact_num_top, layer.min_num_top, layer.max_num_top))
        for what, n, exact, lo, hi in checks:
            if exact is not None and exact >= 0 and n != exact:
                raise NetError(f"{self.source}: layer '{lp.name}' ({lp.type}) takes exactly {exact} {what} blob(s), got {n}")
            if lo is not None and lo >= 0 and n < lo:
                raise NetError(f"{self.source}: layer '{lp.name}' ({lp.type}) takes at least {lo} {what} blob(s), got {n}")
            if hi is not None and hi >= 0 and n > hi:
                raise NetError(f"{self.source}: layer '{lp.name}' ({lp.type}) takes at most {hi} {what} blob(s), got {n}")

    def _append_bottom(self, lp, layer_id, bottom_id, available, name_to_id):
        blob_name = lp.bottom[bottom_id]
        if blob_name not in available:
            raise NetError(f"{self.source}: layer '{lp.name}': unknown bottom blob '{blob_name}' "
                           f"(bottom index {bottom_id}); no earlier layer produces it")
        blob_id = name_to_id[blob_name]
        log.info("%s <- %s", lp.name, blob_name)
        self.bottom_vecs[layer_id].append(self.blobs_list[blob_id])
        self.bottom_id_vecs[layer_id].append(blob_id)
        available.discard(blob_name)
        need = self.blob_need_backward[blob_id]
        if len(lp.propagate_down):
            need = bool(lp.propagate_down[bottom_id])
        self.bottom_need_backward[layer_id].append(need)
        return blob_id

    def _append_top(self, lp, layer_id, top_id, available, name_to_id):
        blob_name = lp.top[top_id] if top_id < len(lp.top) else "(automatic)"
        if name_to_id is not None and top_id < len(lp.bottom) and blob_name == lp.bottom[top_id]:
            log.info("%s -> %s (in-place)", lp.name, blob_name)
            blob_id = name_to_id[blob_name]
        elif name_to_id is not None and blob_name in name_to_id:
            raise NetError(f"{self.source}: layer '{lp.name}': top blob '{blob_name}' is produced by more than one "
                           f"layer; in-place use must read and write it at the same index")
        else:
            log.info("%s -> %s", lp.name, blob_name)
            blob_id = len(self.blobs_list)
            self.blobs_list.append(Blob((), xp=self.xp))
            self.blob_names.append(blob_name)
            self.blob_need_backward.append(False)
            self.blob_loss_weights.append(0.0)
            if name_to_id is not None:
                name_to_id[blob_name] = blob_id
        self.top_id_vecs[layer_id].append(blob_id)
        self.top_vecs[layer_id].append(self.blobs_list[blob_id])
        if available is not None:
            available.add(blob_name)

    def _set_loss_weights(self, layer, lp, layer_id):
        # Loss layers weigh their first top by 1 unless told otherwise; Caffe records that weight
        # in the layer's own parameters, so it also appears in saved .caffemodel files.
        if layer.is_loss() and not len(layer.param.loss_weight):
            layer.param.loss_weight.append(1.0)
        weights = list(layer.param.loss_weight)
        tops = self.top_vecs[layer_id]
        if weights and len(weights) != len(tops):
            raise NetError(f"{self.source}: layer '{lp.name}': loss_weight must be given either 0 times or once "
                           f"per top blob ({len(tops)}), got {len(weights)}")
        for top_id, blob_id in enumerate(self.top_id_vecs[layer_id]):
            w = float(weights[top_id]) if weights else 0.0
            self.blob_loss_weights[blob_id] = w
            if w:
                tops[top_id].diff[...] = w

    def _append_param(self, layer_id, param_id):
        layer = self.layers[layer_id]
        lp = layer.param  # the layer's own copy: layers such as BatchNorm add ParamSpecs to it
        name = lp.param[param_id].name if param_id < len(lp.param) else ""
        self.param_display_names.append(name or str(param_id))
        net_param_id = len(self.params)
        self.params.append(layer.blobs[param_id])
        self.param_id_vecs[layer_id].append(net_param_id)
        self.param_layer_indices.append((layer_id, param_id))
        spec = lp.param[param_id] if param_id < len(lp.param) else caffe_pb2.ParamSpec()
        if not name or name not in self._param_names_index:
            self.param_owners.append(-1)
            if name:
                self._param_names_index[name] = net_param_id
            self.learnable_param_ids.append(len(self.learnable_params))
            self.learnable_params.append(layer.blobs[param_id])
            self.has_params_lr.append(spec.HasField("lr_mult"))
            self.has_params_decay.append(spec.HasField("decay_mult"))
            self.params_lr.append(float(spec.lr_mult))
            self.params_weight_decay.append(float(spec.decay_mult))
            return
        owner_id = self._param_names_index[name]
        self.param_owners.append(owner_id)
        owner_layer, owner_param = self.param_layer_indices[owner_id]
        log.info("Sharing parameters '%s' owned by layer '%s', param index %d", name,
                 self.layer_names[owner_layer], owner_param)
        this_blob = layer.blobs[param_id]
        owner_blob = self.layers[owner_layer].blobs[owner_param]
        permissive = (param_id < len(lp.param) and lp.param[param_id].share_mode == caffe_pb2.ParamSpec.PERMISSIVE)
        if permissive and this_blob.count != owner_blob.count:
            raise NetError(f"{self.source}: layer '{lp.name}': cannot share param '{name}' owned by layer "
                           f"'{self.layer_names[owner_layer]}': count mismatch, owner shape "
                           f"{_shape_string(owner_blob)}, this shape {_shape_string(this_blob)}")
        if not permissive and this_blob.shape != owner_blob.shape:
            raise NetError(f"{self.source}: layer '{lp.name}': cannot share param '{name}' owned by layer "
                           f"'{self.layer_names[owner_layer]}': shape mismatch, owner shape "
                           f"{_shape_string(owner_blob)}, this shape {_shape_string(this_blob)}; "
                           f"use share_mode: PERMISSIVE to require only equal counts")
        learnable_id = self.learnable_param_ids[owner_id]
        self.learnable_param_ids.append(learnable_id)
        for has, values, field in ((self.has_params_lr, self.params_lr, "lr_mult"),
                                   (self.has_params_decay, self.params_weight_decay, "decay_mult")):
            if spec.HasField(field):
                value = float(getattr(spec, field))
                if has[learnable_id]:
                    if value != values[learnable_id]:
                        raise NetError(f"{self.source}: layer '{lp.name}': shared param '{name}' has mismatched "
                                       f"{field} ({fmt(value)} here, {fmt(values[learnable_id])} at its owner)")
                else:
                    has[learnable_id] = True
                    values[learnable_id] = value

    def _prune_backward(self):
        """Caffe's backward pass over the graph: only layers whose tops lead to a loss run
        backward, and a layer all of whose tops skip propagation skips backward too."""
        under_loss, skip_backprop = set(), set()
        for layer_id in range(len(self.layers) - 1, -1, -1):
            contributes = False
            skip = True
            for top_id, blob_id in enumerate(self.top_id_vecs[layer_id]):
                name = self.blob_names[blob_id]
                if self._layer_loss(layer_id, top_id) or name in under_loss:
                    contributes = True
                if name not in skip_backprop:
                    skip = False
                if contributes and not skip:
                    break
            if self.layer_need_backward[layer_id] and skip:
                self.layer_need_backward[layer_id] = False
                self.bottom_need_backward[layer_id] = [False] * len(self.bottom_need_backward[layer_id])
            if not contributes:
                self.layer_need_backward[layer_id] = False
            log.info("%s %s", self.layer_names[layer_id],
                     "needs backward computation." if self.layer_need_backward[layer_id]
                     else "does not need backward computation.")
            for bottom_id, blob_id in enumerate(self.bottom_id_vecs[layer_id]):
                if contributes:
                    under_loss.add(self.blob_names[blob_id])
                else:
                    self.bottom_need_backward[layer_id][bottom_id] = False
                if not self.bottom_need_backward[layer_id][bottom_id]:
                    skip_backprop.add(self.blob_names[blob_id])

    def _layer_loss(self, layer_id, top_id):
        weights = self.layers[layer_id].param.loss_weight
        return top_id < len(weights) and weights[top_id] != 0

    def _force_backward(self):
        for layer_id, layer in enumerate(self.layers):
            self.layer_need_backward[layer_id] = True
            for bottom_id, blob_id in enumerate(self.bottom_id_vecs[layer_id]):
                need = self.bottom_need_backward[layer_id][bottom_id] or layer.allow_force_backward(bottom_id)
                self.bottom_need_backward[layer_id][bottom_id] = need
                self.blob_need_backward[blob_id] = self.blob_need_backward[blob_id] or need
            self._param_propagate_down[layer_id] = [True] * len(layer.blobs)
            layer.param_propagate_down = [True] * len(layer.blobs)

    def _share_weights(self):
        # A sharing layer sees its owner's arrays; its list entry becomes the owner's Blob too,
        # so code that walks layer.blobs and code holding the old Blob agree.
        for net_param_id, owner_id in enumerate(self.param_owners):
            if owner_id < 0:
                continue
            layer_id, param_id = self.param_layer_indices[net_param_id]
            owner_layer, owner_param = self.param_layer_indices[owner_id]
            owner = self.layers[owner_layer].blobs[owner_param]
            mine = self.layers[layer_id].blobs[param_id]
            if mine.shape != owner.shape:
                mine.data = owner.data.reshape(mine.shape)
                mine.diff = owner.diff.reshape(mine.shape)
            else:
                mine.share_data(owner)
                mine.share_diff(owner)
            self.params[net_param_id] = mine

    def _index_hooks(self):
        """Which learnable params each layer needs first in forward and completes in backward."""
        first_use, last_grad = {}, {}
        for layer_id, ids in enumerate(self.param_id_vecs):
            for net_param_id in ids:
                lid = self.learnable_param_ids[net_param_id]
                first_use.setdefault(lid, layer_id)
                # Backward runs from the last layer down, so the lowest user completes the gradient.
                last_grad[lid] = min(last_grad.get(lid, layer_id), layer_id)
        self._needed_at = [[] for _ in self.layers]
        self._ready_at = [[] for _ in self.layers]
        for lid in range(len(self.learnable_params)):
            if lid in first_use:
                self._needed_at[first_use[lid]].append(lid)
                self._ready_at[last_grad[lid]].append(lid)

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
        """Learnable param ids first used by layer `layer_id` in forward (so must be present then)."""
        return list(self._needed_at[layer_id])

    def grads_ready_at(self, layer_id):
        """Learnable param ids whose gradient is complete once layer `layer_id` has run backward."""
        return list(self._ready_at[layer_id])

    def layer_learnable_ids(self, layer_id):
        """Learnable param ids of layer `layer_id`'s blobs, in the layer's blob order."""
        return [self.learnable_param_ids[p] for p in self.param_id_vecs[layer_id]]

    def forward_from_to(self, start, end):
        """Runs layers start..end (inclusive) forward; returns the loss they produced."""
        loss = 0.0
        timed = self.layer_timed_hooks
        for i in range(start, end + 1):
            for hook in self.param_needed_hooks:
                hook(i)
            layer, bottom, top = self.layers[i], self.bottom_vecs[i], self.top_vecs[i]
            if timed:
                began = self._clock()
            layer.reshape(bottom, top)
            layer.forward(bottom, top)
            if timed:
                ended = self._clock()
                for hook in timed:
                    hook(i, "forward", began, ended)
            for top_id, w in self._layer_loss_tops[i]:
                loss += w * float(top[top_id].data.sum(dtype=numpy.float64))
        return loss

    def forward(self, start=None, end=None):
        """Forward over the whole net (or layers start..end); returns the total loss."""
        start = 0 if start is None else start
        end = len(self.layers) - 1 if end is None else end
        return self.forward_from_to(start, end)

    def reshape(self):
        """Caffe's Net::Reshape: every layer reshapes its tops from its bottoms (after an input blob
        was reshaped), without running forward."""
        for layer, bottom, top in zip(self.layers, self.bottom_vecs, self.top_vecs):
            layer.reshape(bottom, top)

    def backward_from_to(self, start, end):
        """Runs layers start down to end (inclusive) backward."""
        if start == len(self.layers) - 1:
            self._reset_loss_diffs()
        timed = self.layer_timed_hooks
        for i in range(start, end - 1, -1):
            if self.layer_need_backward[i]:
                if timed:
                    began = self._clock()
                self._backward_layer(i)
                if timed:
                    ended = self._clock()
                    for hook in timed:
                        hook(i, "backward", began, ended)
            for hook in self.grads_ready_hooks:
                hook(i)

    def _clock(self):
        """perf_counter() once the work queued so far is done: a GPU runs layers asynchronously, so
        without waiting for its stream a layer's time would be its kernel launches only."""
        if self.xp is not numpy:
            self.xp.cuda.get_current_stream().synchronize()
        return time.perf_counter()

    def _backward_layer(self, i):
        layer = self.layers[i]
        frozen = [k for k, p in enumerate(self._param_propagate_down[i]) if not p]
        # Caffe never computes gradients for lr_mult 0 blobs; a layer that computes them anyway
        # must not change them, or gradient clipping would see a different global norm.
        saved = [layer.blobs[k].diff.copy() for k in frozen]
        layer.backward(self.top_vecs[i], self.bottom_need_backward[i], self.bottom_vecs[i])
        for k, d in zip(frozen, saved):
            layer.blobs[k].diff[...] = d

    def _reset_loss_diffs(self):
        # The loss weight lives in the loss top's diff (Caffe's loss multiplier); put it back in
        # case a reshape reallocated the blob since the last pass.
        for blob, w in self._loss_tops:
            blob.diff[...] = w

    def backward(self):
        self.backward_from_to(len(self.layers) - 1, 0)

    def forward_backward(self):
        loss = self.forward()
        self.backward()
        return loss

    def clear_param_diffs(self):
        for blob in self.learnable_params:
            blob.diff[...] = 0

    def update(self):
        """Caffe's Net::Update: data -= diff for every learnable blob (the solver put the step in diff)."""
        for blob in self.learnable_params:
            blob.data -= blob.diff

    # ------------------------------------------------------------ outputs

    @property
    def output_blobs(self):
        return [self.blobs_list[i] for i in self.output_blob_ids]

    @property
    def output_names(self):
        return [self.blob_names[i] for i in self.output_blob_ids]

    @property
    def input_blobs(self):
        return [self.blobs_list[i] for i in self.input_blob_ids]

    def outputs(self):
        """{output name: numpy array copy} of the net outputs after the last forward."""
        return {self.blob_names[i]: _to_numpy(self.blobs_list[i].data).copy() for i in self.output_blob_ids}

    def loss_weight(self, blob_name):
        return self.blob_loss_weights[self.blob_names_index[blob_name]]

    def layer(self, name):
        return self.layers[self.layer_names_index[name]]

    @property
    def batch_size(self):
        """Samples per forward pass: the first axis of the first top of the first data layer."""
        for layer_id, bottoms in enumerate(self.bottom_vecs):
            if not bottoms and self.top_vecs[layer_id] and self.top_vecs[layer_id][0].shape:
                return int(self.top_vecs[layer_id][0].shape[0])
        return 1

    # ------------------------------------------------------------ weights in and out

    def copy_trained_layers_from(self, source):
        """Copies blobs from a NetParameter, a .caffemodel path or a .caffemodel.h5 path into the
        layers of the same name (Caffe's CopyTrainedLayersFrom); other layers keep their values."""
        where = "<NetParameter>" if isinstance(source, caffe_pb2.NetParameter) else os.fspath(source)
        copied = self._copy_trained_layers(source)
        # Caffe is silent here, but a renamed or misspelt layer then trains from its fillers unnoticed.
        missing = [name for layer_id, (name, layer) in enumerate(zip(self.layer_names, self.layers))
                   if layer.blobs and name not in copied
                   and any(self.param_owners[p] < 0 for p in self.param_id_vecs[layer_id])]
        if missing:
            log.warning("%s has no weights for layer(s) %s of %s: they keep their filler values",
                        where, ", ".join(f"'{n}'" for n in missing), self.source)

    def _copy_trained_layers(self, source):
        """Names of the layers copied from `source`."""
        if isinstance(source, caffe_pb2.NetParameter):
            return self._copy_from_param(source, "<NetParameter>")
        path = os.fspath(source)
        if not os.path.exists(path):
            raise NetError(f"{path}: no such weights file")
        if sio.is_hdf5_file(path):
            return self._copy_from_hdf5(path)
        try:
            param = sio.read_net_binary(path)
        except sio.CaffeFormatError as e:
            raise NetError(str(e)) from None
        return self._copy_from_param(param, path)

    def _copy_from_param(self, param, where):
        copied = set()
        layers = list(param.layer) if len(param.layer) else list(param.layers)
        for source_layer in layers:
            name = source_layer.name
            if name not in self.layer_names_index:
                log.info("Ignoring source layer %s", name)
                continue
            target = self.layers[self.layer_names_index[name]].blobs
            if len(target) != len(source_layer.blobs):
                raise NetError(f"{where}: layer '{name}' has {len(source_layer.blobs)} blobs in the file but "
                               f"{len(target)} in the net ({self.source}): incompatible number of blobs")
            for j, (blob, stored) in enumerate(zip(target, source_layer.blobs)):
                if not sio.blobproto_matches_shape(stored, blob.shape):
                    raise NetError(
                        f"{where}: cannot copy param {j} of layer '{name}': shape mismatch, file has "
                        f"{_shape_str(sio.blobproto_shape(stored))}, net ({self.source}) has {_shape_string(blob)}; "
                        f"rename the layer to learn its parameters from scratch")
                values = sio.blobproto_to_array(stored, shape=blob.shape)
                _assign(blob.data, values)
            copied.add(name)
        return copied

    def _copy_from_hdf5(self, path):
        import h5py
        copied = set()
        try:
            with h5py.File(path, "r") as f:
                if "data" not in f:
                    raise NetError(f"{path}: HDF5 file has no 'data' group (not a Caffe .caffemodel.h5)")
                data = f["data"]
                for name in data:
                    if name not in self.layer_names_index:
                        log.info("Ignoring source layer %s", name)
                        continue
                    layer_id = self.layer_names_index[name]
                    target = self.layers[layer_id].blobs
                    group = data[name]
                    if len(group) > len(target):
                        raise NetError(f"{path}: layer '{name}' has {len(group)} blobs in the file but "
                                       f"{len(target)} in the net ({self.source}): incompatible number of blobs")
                    for j, blob in enumerate(target):
                        if str(j) not in group:
                            # Missing in the file is fine only for blobs shared from another layer.
                            if self.param_owners[self.param_id_vecs[layer_id][j]] >= 0:
                                continue
                            raise NetError(f"{path}: layer '{name}' lacks blob {j}: incompatible number of blobs")
                        values = numpy.asarray(group[str(j)][()])
                        if tuple(values.shape) != blob.shape:
                            raise NetError(
                                f"{path}: cannot copy param {j} of layer '{name}': shape mismatch, file has "
                                f"{_shape_str(values.shape)}, net ({self.source}) has {_shape_string(blob)}; "
                                f"rename the layer to learn its parameters from scratch")
                        _assign(blob.data, values)
                    copied.add(name)
        except OSError as e:
            raise NetError(f"{path}: cannot read as a Caffe HDF5 model: {' '.join(str(e).split())}") from None
        return copied

    def share_trained_layers_with(self, other):
        """Makes this net's layers use the parameter arrays of `other`'s layers of the same name
        (Caffe's ShareTrainedLayersWith: how a solver's test nets see the training weights)."""
        for layer_id, name in enumerate(other.layer_names):
            if name not in self.layer_names_index:
                continue
            source = other.layers[layer_id].blobs
            target = self.layers[self.layer_names_index[name]].blobs
            if len(source) != len(target):
                raise NetError(f"{self.source}: layer '{name}' has {len(target)} blobs here but {len(source)} "
                               f"in the training net: incompatible number of blobs")
            for j, (s, t) in enumerate(zip(source, target)):
                if s.shape != t.shape:
                    raise NetError(f"{self.source}: cannot share param {j} of layer '{name}': shape mismatch, "
                                   f"{_shape_string(s)} in the training net vs {_shape_string(t)}")
                t.share_data(s)

    def to_proto(self, write_diff=False):
        """A NetParameter holding every layer (Split layers included) with its blobs, as Caffe's
        Net::ToProto writes into a .caffemodel."""
        out = caffe_pb2.NetParameter()
        out.name = self.name
        for layer in self.layers:
            lp = out.layer.add()
            lp.CopyFrom(layer.param)
            del lp.blobs[:]
            for blob in layer.blobs:
                sio.array_to_blobproto(_to_numpy(blob.data), _to_numpy(blob.diff) if write_diff else None,
                                       blob=lp.blobs.add())
        return out

    def save(self, path, write_diff=False):
        """Writes a binary .caffemodel atomically."""
        sio.write_net_binary(self.to_proto(write_diff), path)

    def save_hdf5(self, path, write_diff=False):
        """Caffe's Net::ToHDF5 layout: data/<layer>/<i> for blobs a layer owns (shared ones are
        skipped), diff/<layer>/<i> for every blob when `write_diff`."""
        import h5py
        with sio.atomic_path(path) as tmp:
            with h5py.File(tmp, "w") as f:
                data = f.create_group("data", track_order=True)
                diff = f.create_group("diff", track_order=True) if write_diff else None
                for layer_id, layer in enumerate(self.layers):
                    g = data.create_group(layer.name)
                    gd = diff.create_group(layer.name) if write_diff else None
                    for j, blob in enumerate(layer.blobs):
                        if self.param_owners[self.param_id_vecs[layer_id][j]] < 0:
                            g.create_dataset(str(j), data=_to_numpy(blob.data))
                        if write_diff:
                            gd.create_dataset(str(j), data=_to_numpy(blob.diff))

    # ------------------------------------------------------------ reporting

    def close(self):
        """Stops data reader threads and closes databases; the net cannot run afterwards."""
        for layer in self.layers:
            close = getattr(layer, "close", None)
            if callable(close):
                close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def describe(self):
        """One line per layer: index, name, type, bottoms -> tops, backward flag (for debugging)."""
        lines = []
        for i, layer in enumerate(self.layers):
            b = ", ".join(self.blob_names[j] for j in self.bottom_id_vecs[i])
            t = ", ".join(self.blob_names[j] for j in self.top_id_vecs[i])
            lines.append(f"{i:3d} {layer.name} ({layer.param.type}) [{b}] -> [{t}]"
                         f"{' backward' if self.layer_need_backward[i] else ''}")
        return "\n".join(lines)


def _copy(msg):
    out = type(msg)()
    out.CopyFrom(msg)
    return out


def _short_text(param):
    from google.protobuf import text_format
    return text_format.MessageToString(param)


def _shape_str(shape):
    shape = tuple(int(d) for d in shape)
    count = int(numpy.prod(shape, dtype=numpy.int64)) if shape else 1
    return "".join(f"{d} " for d in shape) + f"({count})"


def _shape_string(blob):
    return _shape_str(blob.shape)


def _to_numpy(a):
    return a if isinstance(a, numpy.ndarray) else a.get()


def _assign(dest, values):
    if isinstance(dest, numpy.ndarray):
        dest[...] = values
    else:
        import cupy
        dest[...] = cupy.asarray(values)
