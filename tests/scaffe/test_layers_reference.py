"""Every compute layer of layer_zoo.prototxt against the numbers BVLC Caffe computed (caffe-reference/).

Each layer runs alone: its bottoms are the reference values of the blobs it reads, its parameters come
from the caffemodel the reference used, and the tops' gradients are the reference gradients written
by the layers above it (or the loss weight, for loss tops). The tops, the bottom gradients and the
parameter gradients must match Caffe's within rtol 1e-4, atol 1e-5 * max(1, max|ref|). In-place
layers run in place, as in the net. The reference manifest says which layer wrote which file.
"""
import csv
import re
from pathlib import Path

import numpy
import pytest
from google.protobuf import text_format

from scaffe.blob import Blob
from scaffe.layer_impls import create_layer
from scaffe.proto import caffe_pb2

REF_DIR = Path(__file__).resolve().parents[2].parent / "shared" / "caffe-reference"
NPY_DIR = REF_DIR / "reference"
PASSES = {"train0": (caffe_pb2.TRAIN, "layer_zoo_init.caffemodel"),
          "test20": (caffe_pb2.TEST, "layer_zoo_iter_20.caffemodel")}
# Written by other modules (data readers); everything else in the zoo is a compute layer.
NOT_COMPUTE = {"Data"}

pytestmark = pytest.mark.skipif(not (NPY_DIR / "manifest.csv").is_file(),
                                reason=f"caffe reference files not found at {REF_DIR}")


def _manifest():
    with open(NPY_DIR / "manifest.csv", newline="") as f:
        return list(csv.DictReader(f))


def _load(name):
    return numpy.load(NPY_DIR / name)


class PassRecord:
    """The manifest rows of one pass (train0 or test20), indexed for the lookups below."""

    def __init__(self, rows, prefix):
        self.prefix = prefix
        self.fwd = [r for r in rows if r["file"].startswith(prefix + "__") and r["kind"] == "fwd"]
        self.bwd = [r for r in rows if r["file"].startswith(prefix + "__") and r["kind"] == "bwd"]
        self.grad = {(r["layer"], int(r["blob"])): r["file"] for r in rows
                     if r["file"].startswith(prefix + "__") and r["kind"] == "grad"}
        self.after_fwd = {(r["layer"], int(r["blob"])): r["file"] for r in rows
                          if r["file"].startswith(prefix + "__") and r["kind"] == "param_after_fwd"}
        self.layers = {}
        for r in self.fwd + self.bwd:
            self.layers.setdefault(r["layer"], (int(r["layer_index"]), r["layer_type"]))

    def value_before(self, blob, index):
        """(file, writer layer) of `blob` as the layer at `index` reads it: its last write before."""
        rows = [r for r in self.fwd if r["blob"] == blob and int(r["layer_index"]) < index]
        row = max(rows, key=lambda r: int(r["layer_index"]))
        return row["file"], row["layer"]

    def top_diff(self, blob, index):
        """The gradient of a top as the layer at `index` sees it in backward: written last by the first
        later layer that reads it (a consumer, a Split, or the next in-place layer)."""
        rows = [r for r in self.bwd if r["blob"] == blob and int(r["layer_index"]) > index]
        return min(rows, key=lambda r: int(r["layer_index"]))["file"] if rows else None

    def bottom_diff(self, layer, blob, producer):
        """The reference gradient `layer` wrote for its bottom `blob` (maybe a Split copy of it)."""
        pattern = re.compile(rf"^{re.escape(blob)}(_{re.escape(producer)}_\d+_split_\d+)?$")
        rows = [r for r in self.bwd if r["layer"] == layer and pattern.match(r["blob"])]
        return rows[0]["file"] if rows else None

    def ran_backward(self, layer):
        return any(r["layer"] == layer for r in self.bwd) or any(k[0] == layer for k in self.grad)


def _net_layers():
    net = caffe_pb2.NetParameter()
    text_format.Parse((REF_DIR / "layer_zoo.prototxt").read_text(), net)
    return net


def _state_accepts(layer, phase):
    # The reference passes ran without stages or levels: only phase rules matter, and stage rules
    # of the zoo ("timing") are exclude rules that never match.
    if any(rule.HasField("phase") and rule.phase != phase for rule in layer.include):
        return False
    if any(rule.HasField("phase") and rule.phase == phase and not rule.stage for rule in layer.exclude):
        return False
    return True


def _caffemodel_params(filename):
    model = caffe_pb2.NetParameter()
    model.ParseFromString((REF_DIR / filename).read_bytes())
    params = {}
    for layer in model.layer:
        arrays = []
        for blob in layer.blobs:
            shape = tuple(blob.shape.dim) if blob.HasField("shape") else tuple(
                d for d in (blob.num, blob.channels, blob.height, blob.width))
            arrays.append(numpy.array(blob.data, dtype=numpy.float32).reshape(shape))
        params[layer.name] = arrays
    return params


def _cases():
    if not (NPY_DIR / "manifest.csv").is_file():
        return []
    rows = _manifest()
    cases = []
    for prefix in PASSES:
        record = PassRecord(rows, prefix)
        for name, (index, layer_type) in sorted(record.layers.items(), key=lambda kv: kv[1][0]):
            if layer_type not in NOT_COMPUTE:
                cases.append(pytest.param(prefix, name, id=f"{prefix}-{name}-{layer_type}"))
    return cases


_CACHE = {}


def _context(prefix):
    if prefix not in _CACHE:
        phase, model = PASSES[prefix]
        net = _net_layers()
        layers = {lp.name: lp for lp in net.layer if _state_accepts(lp, phase)}
        _CACHE[prefix] = (PassRecord(_manifest(), prefix), layers, _caffemodel_params(model), phase)
    return _CACHE[prefix]


def _split_param(record, name, index):
    """A LayerParameter for an automatic Split layer, rebuilt from the manifest."""
    lp = caffe_pb2.LayerParameter(name=name, type="Split")
    tops = [r["blob"] for r in record.fwd if r["layer"] == name]
    lp.top.extend(tops)
    # The bottom is the blob named by the split: "<blob>_<producer>_<top index>_split".
    writers = {r["blob"]: r["layer"] for r in record.fwd if int(r["layer_index"]) < index}
    blob = next(b for b, producer in writers.items()
                if re.fullmatch(rf"{re.escape(b)}_{re.escape(producer)}_\d+_split", name))
    lp.bottom.append(blob)
    return lp


def _assert_close(actual, expected, what):
    expected = numpy.asarray(expected, dtype=numpy.float64)
    actual = numpy.asarray(actual, dtype=numpy.float64).reshape(expected.shape)
    atol = 1e-5 * max(1.0, float(numpy.abs(expected).max(initial=0.0)))
    numpy.testing.assert_allclose(actual, expected, rtol=1e-4, atol=atol, err_msg=what)


@pytest.mark.parametrize("prefix,name", _cases())
def test_layer_matches_caffe(prefix, name, monkeypatch):
    record, layers, params, phase = _context(prefix)
    index, layer_type = record.layers[name]
    lp = _layer_param(record, layers, name, index, phase)
    monkeypatch.chdir(REF_DIR)   # relative paths in the prototxt (infogain_H.binaryproto) are Caffe's cwd's
    bottoms, producers = _reference_bottoms(record, lp, index)
    # In-place layers run in place: such a top is its bottom's blob.
    tops = [bottoms[list(lp.bottom).index(t)] if t in lp.bottom else Blob(()) for t in lp.top]
    layer = _layer_with_caffemodel_params(lp, phase, bottoms, tops, params.get(name, []))

    layer.forward(bottoms, tops)
    for t, blob_name in zip(tops, lp.top):
        _assert_close(t.data, _load(f"{prefix}__fwd__{name}__{blob_name}.npy"), f"{name} top {blob_name}")
    for k, blob in enumerate(layer.blobs):
        if (name, k) in record.after_fwd:
            _assert_close(blob.data, _load(record.after_fwd[name, k]), f"{name} param {k} after forward")
    if record.ran_backward(name):
        _check_backward(record, layer, lp, index, bottoms, tops, producers)


def _layer_param(record, layers, name, index, phase):
    if record.layers[name][1] == "Split":
        lp = _split_param(record, name, index)
    else:
        lp = caffe_pb2.LayerParameter()
        lp.CopyFrom(layers[name])
    lp.phase = phase
    return lp


def _reference_bottoms(record, lp, index):
    """(bottom blobs holding the reference values the layer read, the layer that wrote each)."""
    bottoms, producers = [], []
    for blob in lp.bottom:
        file, producer = record.value_before(blob, index)
        b = Blob(_load(file).shape)
        b.data[...] = _load(file)
        bottoms.append(b)
        producers.append(producer)
    return bottoms, producers


def _layer_with_caffemodel_params(lp, phase, bottoms, tops, stored):
    layer = create_layer(lp, phase)
    layer.setup(bottoms, tops)
    layer.reshape(bottoms, tops)
    assert len(stored) == len(layer.blobs), f"{lp.name}: {len(layer.blobs)} param blobs, caffemodel has {len(stored)}"
    for blob, array in zip(layer.blobs, stored):
        assert blob.shape == array.shape, f"{lp.name}: param shape {blob.shape} vs caffemodel {array.shape}"
        blob.data[...] = array
    return layer


def _check_backward(record, layer, lp, index, bottoms, tops, producers):
    name = lp.name
    for t, blob_name in zip(tops, lp.top):
        if layer.is_loss() and blob_name == lp.top[0]:
            t.diff[...] = lp.loss_weight[0] if len(lp.loss_weight) else 1.0
        else:
            diff_file = record.top_diff(blob_name, index)
            t.diff[...] = _load(diff_file) if diff_file else 0
    expected_bottom = [record.bottom_diff(name, blob, producer) for blob, producer in zip(lp.bottom, producers)]
    propagate = [f is not None for f in expected_bottom]
    for blob in layer.blobs:
        blob.diff[...] = 0
    for b in bottoms:
        if not any(b is t for t in tops):
            b.diff[...] = numpy.nan   # a bottom gradient must be written, not accumulated
    layer.backward(tops, propagate, bottoms)
    for b, blob_name, file in zip(bottoms, lp.bottom, expected_bottom):
        if file is not None:
            _assert_close(b.diff, _load(file), f"{name} gradient of bottom {blob_name}")
    for k, blob in enumerate(layer.blobs):
        if (name, k) in record.grad and lp.type != "Parameter":
            _assert_close(blob.diff, _load(record.grad[name, k]), f"{name} gradient of param {k}")


def test_every_zoo_layer_type_is_registered():
    from scaffe.layer_impls import known_types
    zoo_types = {lp.type for lp in _net_layers().layer} | {"Split"}
    assert zoo_types - set(known_types()) == set()
