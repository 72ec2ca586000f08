"""Old Caffe files upgraded on load as Caffe's upgrade_proto does: V1 `layers { type: CONVOLUTION }`,
V0 `layers { layer { type: "conv" } }` with padding layers, V1/V0 .caffemodels, old solvers, and
the upgrade_net_proto_text|binary / upgrade_solver_proto_text commands."""
import logging
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format

from scaffe import io as sio
from scaffe.cli import main
from scaffe.net import Net
from scaffe.proto import caffe_pb2
from scaffe.tools.convert_mnist import ensure_mnist_lmdb
from scaffe.upgrade import net_needs_upgrade, upgrade_net

ROOT = Path(__file__).resolve().parents[2]
MNIST = ROOT / "examples" / "mnist"

# examples/mnist/lenet_train_test.prototxt as Caffe's examples wrote it before 2015 (V1 layers,
# blobs_lr, the train data layer with its scale still inside data_param).
LENET_V1 = """
name: "LeNet"
layers {
  name: "mnist"
  type: DATA
  top: "data"
  top: "label"
  data_param {
    source: "examples/mnist/mnist_train_lmdb"
    backend: LMDB
    batch_size: 64
    scale: 0.00390625
  }
  include: { phase: TRAIN }
}
layers {
  name: "mnist"
  type: DATA
  top: "data"
  top: "label"
  data_param {
    source: "examples/mnist/mnist_test_lmdb"
    backend: LMDB
    batch_size: 100
  }
  transform_param {
    scale: 0.00390625
  }
  include: { phase: TEST }
}
layers {
  name: "conv1"
  type: CONVOLUTION
  bottom: "data"
  top: "conv1"
  blobs_lr: 1
  blobs_lr: 2
  convolution_param {
    num_output: 20
    kernel_size: 5
    stride: 1
    weight_filler { type: "xavier" }
    bias_filler { type: "constant" }
  }
}
layers {
  name: "pool1"
  type: POOLING
  bottom: "conv1"
  top: "pool1"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 }
}
layers {
  name: "conv2"
  type: CONVOLUTION
  bottom: "pool1"
  top: "conv2"
  blobs_lr: 1
  blobs_lr: 2
  convolution_param {
    num_output: 50
    kernel_size: 5
    stride: 1
    weight_filler { type: "xavier" }
    bias_filler { type: "constant" }
  }
}
layers {
  name: "pool2"
  type: POOLING
  bottom: "conv2"
  top: "pool2"
  pooling_param { pool: MAX kernel_size: 2 stride: 2 }
}
layers {
  name: "ip1"
  type: INNER_PRODUCT
  bottom: "pool2"
  top: "ip1"
  blobs_lr: 1
  blobs_lr: 2
  inner_product_param {
    num_output: 500
    weight_filler { type: "xavier" }
    bias_filler { type: "constant" }
  }
}
layers {
  name: "relu1"
  type: RELU
  bottom: "ip1"
  top: "ip1"
}
layers {
  name: "ip2"
  type: INNER_PRODUCT
  bottom: "ip1"
  top: "ip2"
  blobs_lr: 1
  blobs_lr: 2
  inner_product_param {
    num_output: 10
    weight_filler { type: "xavier" }
    bias_filler { type: "constant" }
  }
}
layers {
  name: "accuracy"
  type: ACCURACY
  bottom: "ip2"
  bottom: "label"
  top: "accuracy"
  include: { phase: TEST }
}
layers {
  name: "loss"
  type: SOFTMAX_LOSS
  bottom: "ip2"
  bottom: "label"
  top: "loss"
}
"""

# A V0 net in the style of the first ImageNet example: net inputs, a padding layer in front of
# a convolution, V0 field names (kernelsize, biasterm, batchsize, meanfile ...).
V0_NET = """
name: "tiny_v0"
input: "data"
input_dim: 2 input_dim: 3 input_dim: 9 input_dim: 9
layers {
  layer { name: "pad1" type: "padding" pad: 2 }
  bottom: "data"
  top: "pad1"
}
layers {
  layer {
    name: "conv1" type: "conv" num_output: 4 kernelsize: 3 stride: 2 group: 1
    weight_filler { type: "gaussian" std: 0.1 } bias_filler { type: "constant" value: 0.5 }
    blobs_lr: 1 blobs_lr: 2 weight_decay: 1 weight_decay: 0
  }
  bottom: "pad1"
  top: "conv1"
}
layers { layer { name: "relu1" type: "relu" } bottom: "conv1" top: "conv1" }
layers { layer { name: "pool1" type: "pool" pool: AVE kernelsize: 3 stride: 2 } bottom: "conv1" top: "pool1" }
layers { layer { name: "norm1" type: "lrn" local_size: 3 alpha: 0.0001 beta: 0.75 } bottom: "pool1" top: "norm1" }
layers { layer { name: "fc" type: "innerproduct" num_output: 5 biasterm: false
                 weight_filler { type: "xavier" } } bottom: "norm1" top: "fc" }
layers { layer { name: "drop" type: "dropout" dropout_ratio: 0.4 } bottom: "fc" top: "fc" }
layers { layer { name: "prob" type: "softmax" } bottom: "fc" top: "prob" }
"""

# The same net written by hand in today's format: what Caffe's upgrade makes of V0_NET.
V0_NET_UPGRADED = """
name: "tiny_v0"
layer { name: "input" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 9 dim: 9 } } }
layer {
  name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
  param { lr_mult: 1 decay_mult: 1 } param { lr_mult: 2 decay_mult: 0 }
  convolution_param { num_output: 4 pad: 2 kernel_size: 3 stride: 2 group: 1
                      weight_filler { type: "gaussian" std: 0.1 } bias_filler { type: "constant" value: 0.5 } }
}
layer { name: "relu1" type: "ReLU" bottom: "conv1" top: "conv1" }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1" pooling_param { pool: AVE kernel_size: 3 stride: 2 } }
layer { name: "norm1" type: "LRN" bottom: "pool1" top: "norm1" lrn_param { local_size: 3 alpha: 0.0001 beta: 0.75 } }
layer { name: "fc" type: "InnerProduct" bottom: "norm1" top: "fc"
        inner_product_param { num_output: 5 bias_term: false weight_filler { type: "xavier" } } }
layer { name: "drop" type: "Dropout" bottom: "fc" top: "fc" dropout_param { dropout_ratio: 0.4 } }
layer { name: "prob" type: "Softmax" bottom: "fc" top: "prob" }
"""


def parse_raw(text):
    return text_format.Parse(text, caffe_pb2.NetParameter())


@pytest.fixture
def mnist_cwd(tmp_path, monkeypatch):
    """A working folder with examples/mnist/mnist_{train,test}_lmdb, as the lenet nets expect."""
    ensure_mnist_lmdb(tmp_path / "examples" / "mnist")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_v1_lenet_upgrades_to_the_current_file_and_runs_the_same(mnist_cwd):
    current = sio.read_net_prototxt(MNIST / "lenet_train_test.prototxt")
    (mnist_cwd / "lenet_v1.prototxt").write_text(LENET_V1)
    upgraded = sio.read_net_prototxt(mnist_cwd / "lenet_v1.prototxt")
    assert upgraded == current
    assert not net_needs_upgrade(upgraded)
    new = Net(current, "TRAIN")
    old = Net(upgraded, "TRAIN")
    try:
        old.copy_trained_layers_from(new.to_proto())
        for _ in range(2):
            for net in (new, old):
                net.clear_param_diffs()
            loss_new, loss_old = new.forward_backward(), old.forward_backward()
            assert loss_old == loss_new
            for a, b in zip(new.learnable_params, old.learnable_params):
                np.testing.assert_array_equal(b.diff, a.diff)
            for net in (new, old):
                for blob in net.learnable_params:  # one plain SGD step, the same on both
                    blob.data -= 0.01 * blob.diff
    finally:
        new.close()
        old.close()


def test_v0_net_with_padding_layer_upgrades_like_caffe(tmp_path, caplog):
    path = tmp_path / "v0.prototxt"
    path.write_text(V0_NET)
    with caplog.at_level(logging.INFO, logger="scaffe"):
        net = sio.read_net_prototxt(path)
    assert net == sio.parse_net_text(V0_NET_UPGRADED)
    assert "deprecated V0LayerParameter" in caplog.text and str(path) in caplog.text
    with Net(net, "TEST") as model:
        model.forward()
        assert model.blobs["prob"].data.shape == (2, 5)


def test_v0_data_layer_fields_go_to_data_and_transform_params():
    net = sio.parse_net_text('layers { layer { name: "d" type: "data" source: "db" batchsize: 8 rand_skip: 3 '
                             'scale: 0.5 meanfile: "m.binaryproto" cropsize: 4 mirror: true } '
                             'top: "data" top: "label" }')
    expected = sio.parse_net_text('layer { name: "d" type: "Data" top: "data" top: "label" '
                                  'data_param { source: "db" batch_size: 8 rand_skip: 3 } '
                                  'transform_param { scale: 0.5 mean_file: "m.binaryproto" crop_size: 4 mirror: true } }')
    assert net == expected


def test_v0_problems():
    # A field with no place for the layer's type is dropped with an error, as Caffe does.
    net = parse_raw('layers { layer { name: "r" type: "relu" num_output: 3 } }')
    assert upgrade_net(net, "n.prototxt") is False
    assert net.layer[0].type == "ReLU" and not net.layer[0].HasField("convolution_param")
    with pytest.raises(sio.CaffeFormatError, match="reads blob 'y', which no earlier layer or input produces"):
        sio.parse_net_text('input: "x" layers { layer { name: "r" type: "relu" } bottom: "y" top: "z" }')
    with pytest.raises(sio.CaffeFormatError, match="unknown type 'reshape'"):
        sio.parse_net_text('layers { layer { name: "r" type: "reshape" } }')
    with pytest.raises(sio.CaffeFormatError, match="only conv and pool can take padding"):
        sio.parse_net_text('input: "x" layers { layer { name: "p" type: "padding" pad: 1 } bottom: "x" top: "p" }'
                           'layers { layer { name: "r" type: "relu" } bottom: "p" top: "r" }')
    with pytest.raises(sio.CaffeFormatError, match="both 'layer' and 'layers'"):
        sio.parse_net_text('layer { name: "a" type: "ReLU" } layers { name: "b" type: RELU }')


def test_v1_params_and_other_net_upgrades():
    net = sio.parse_net_text(
        'layers { name: "c" type: CONVOLUTION bottom: "x" top: "y" param: "w" param: "b" '
        'blob_share_mode: PERMISSIVE blobs_lr: 0.5 weight_decay: 3 weight_decay: 0 loss_weight: 2 '
        'exclude { stage: "deploy" } convolution_param { num_output: 1 kernel_size: 1 } }')
    expected = sio.parse_net_text(
        'layer { name: "c" type: "Convolution" bottom: "x" top: "y" loss_weight: 2 '
        'param { name: "w" share_mode: PERMISSIVE lr_mult: 0.5 decay_mult: 3 } param { name: "b" decay_mult: 0 } '
        'exclude { stage: "deploy" } convolution_param { num_output: 1 kernel_size: 1 } }')
    assert net == expected
    bn = sio.parse_net_text('layer { name: "bn" type: "BatchNorm" bottom: "x" top: "x" '
                            'param { lr_mult: 1 } param { lr_mult: 1 } param { lr_mult: 1 decay_mult: 2 } }')
    assert [(p.lr_mult, p.decay_mult) for p in bn.layer[0].param] == [(0, 0)] * 3


def _lenet_deploy(tmp_path):
    net = Net.from_file(MNIST / "lenet_deploy.prototxt", "TEST")
    weights = {name: [np.array(b.data) for b in net.layer(name).blobs]
               for name in net.layer_names if net.layer(name).blobs}
    return net, weights


def test_v1_and_v0_caffemodels_load_the_same_weights(tmp_path, capsys):
    source, weights = _lenet_deploy(tmp_path)
    source.close()
    v1 = caffe_pb2.NetParameter(name="LeNet")
    v0 = caffe_pb2.NetParameter(name="LeNet")
    v1_types = {"conv": caffe_pb2.V1LayerParameter.CONVOLUTION, "ip": caffe_pb2.V1LayerParameter.INNER_PRODUCT}
    v0_types = {"conv": "conv", "ip": "innerproduct"}
    for name, arrays in weights.items():
        kind = "conv" if name.startswith("conv") else "ip"
        old = v1.layers.add(name=name, type=v1_types[kind])
        older = v0.layers.add()
        older.layer.name, older.layer.type = name, v0_types[kind]
        for a in arrays:  # old files hold the legacy 4-d shape (InnerProduct weights as 1 x 1 x out x in)
            sio.array_to_blobproto(a.reshape((1,) * (4 - a.ndim) + a.shape), blob=old.blobs.add(), legacy_4d=True)
            older.layer.blobs.add().CopyFrom(old.blobs[-1])
    for model, path in ((v1, tmp_path / "lenet_v1.caffemodel"), (v0, tmp_path / "lenet_v0.caffemodel")):
        sio.write_net_binary(model, path)
        with Net.from_file(MNIST / "lenet_deploy.prototxt", "TEST") as net:
            net.copy_trained_layers_from(path)
            for name, arrays in weights.items():
                for blob, a in zip(net.layer(name).blobs, arrays):
                    np.testing.assert_array_equal(blob.data, a)
        assert [l.type for l in sio.read_net_binary(path).layer] == ["Convolution", "Convolution",
                                                                      "InnerProduct", "InnerProduct"]
    # The command writes the upgraded model; reading it back raw shows today's format.
    assert main(["upgrade_net_proto_binary", str(tmp_path / "lenet_v1.caffemodel"), str(tmp_path / "new.caffemodel")]) == 0
    new = sio.read_binary_proto(tmp_path / "new.caffemodel", caffe_pb2.NetParameter)
    assert not len(new.layers) and [l.name for l in new.layer] == list(weights)
    assert new.layer[2].blobs[0] == v1.layers[2].blobs[0]


def test_old_solver_fields(tmp_path):
    assert sio.parse_solver_text("solver_type: ADAM base_lr: 0.001").type == "Adam"
    solver = sio.parse_solver_text('solver_type: NESTEROV net_param { layers { name: "r" type: RELU } }')
    assert solver.type == "Nesterov" and not solver.HasField("solver_type")
    assert solver.net_param.layer[0].type == "ReLU" and not len(solver.net_param.layers)
    with pytest.raises(sio.CaffeFormatError, match="keep only 'type'"):
        sio.parse_solver_text('solver_type: ADAM type: "SGD"')


def test_upgrade_text_commands(tmp_path, capsys):
    (tmp_path / "old.prototxt").write_text(LENET_V1)
    assert main(["upgrade_net_proto_text", str(tmp_path / "old.prototxt"), str(tmp_path / "new.prototxt")]) == 0
    raw = sio.read_text_proto(tmp_path / "new.prototxt", caffe_pb2.NetParameter)
    assert raw == sio.read_net_prototxt(MNIST / "lenet_train_test.prototxt")
    # An up-to-date file is written back unchanged, as Caffe's tool does (with a note).
    assert main(["upgrade_net_proto_text", str(tmp_path / "new.prototxt"), str(tmp_path / "again.prototxt")]) == 0
    assert "already in latest proto format" in capsys.readouterr().err
    assert sio.read_text_proto(tmp_path / "again.prototxt", caffe_pb2.NetParameter) == raw
    # A field lost on the way: the file is still written, the exit status says so.
    (tmp_path / "lossy.prototxt").write_text('layers { layer { name: "r" type: "relu" num_output: 3 } }')
    assert main(["upgrade_net_proto_text", str(tmp_path / "lossy.prototxt"), str(tmp_path / "l.prototxt")]) == 1
    assert (tmp_path / "l.prototxt").exists()
    (tmp_path / "solver.prototxt").write_text('net: "x.prototxt" solver_type: ADAM base_lr: 0.001\n')
    assert main(["upgrade_solver_proto_text", str(tmp_path / "solver.prototxt"), str(tmp_path / "s.prototxt")]) == 0
    text = (tmp_path / "s.prototxt").read_text()
    assert 'type: "Adam"' in text and "solver_type" not in text
    capsys.readouterr()
    assert main(["upgrade_net_proto_text", str(tmp_path / "missing.prototxt"), str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.prototxt" in err[0]
    assert main(["upgrade_net_proto_text", str(tmp_path / "old.prototxt")]) == 1
