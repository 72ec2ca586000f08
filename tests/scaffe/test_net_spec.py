"""pycaffe's NetSpec (scaffe.net_spec): layers as calls (L), enum constants (P), naming, in-place layers,
parameter routing and repeated fields as Caffe documents them; nets built this way load and train."""
from pathlib import Path

import numpy as np
import pytest

import scaffe
from scaffe import layers as L
from scaffe import params as P
from scaffe.proto import caffe_pb2
from scaffe.tools.convert_mnist import ensure_mnist_lmdb

MNIST = Path(__file__).resolve().parents[2] / "examples" / "mnist"


def lenet(source, batch_size):
    """LeNet as Caffe's "learning LeNet" tutorial writes it with NetSpec."""
    n = scaffe.NetSpec()
    n.data, n.label = L.Data(batch_size=batch_size, backend=P.Data.LMDB, source=source,
                             transform_param=dict(scale=1. / 255), ntop=2)
    n.conv1 = L.Convolution(n.data, kernel_size=5, num_output=20, weight_filler=dict(type="xavier"))
    n.pool1 = L.Pooling(n.conv1, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.conv2 = L.Convolution(n.pool1, kernel_size=5, num_output=50, weight_filler=dict(type="xavier"))
    n.pool2 = L.Pooling(n.conv2, kernel_size=2, stride=2, pool=P.Pooling.MAX)
    n.fc1 = L.InnerProduct(n.pool2, num_output=500, weight_filler=dict(type="xavier"))
    n.relu1 = L.ReLU(n.fc1, in_place=True)
    n.score = L.InnerProduct(n.relu1, num_output=10, weight_filler=dict(type="xavier"))
    n.loss = L.SoftmaxWithLoss(n.score, n.label)
    return n.to_proto()


def _layers(net):
    return {layer.name: layer for layer in net.layer}


def test_netspec_names_layers_and_tops_after_their_attributes():
    net = lenet("train_lmdb", 64)
    assert [layer.name for layer in net.layer] == ["data", "conv1", "pool1", "conv2", "pool2", "fc1", "relu1",
                                                   "score", "loss"]
    layers = _layers(net)
    assert list(layers["data"].top) == ["data", "label"]
    assert list(layers["conv2"].bottom) == ["pool1"] and list(layers["conv2"].top) == ["conv2"]
    # In place: relu1 reads and writes fc1's blob, and the next layer reads that blob.
    assert list(layers["relu1"].bottom) == list(layers["relu1"].top) == ["fc1"]
    assert list(layers["score"].bottom) == ["fc1"]
    assert list(layers["loss"].bottom) == ["score", "label"]


def test_keywords_go_to_the_layers_own_parameter_message():
    layers = _layers(lenet("train_lmdb", 64))
    assert layers["data"].data_param.batch_size == 64 and layers["data"].data_param.source == "train_lmdb"
    assert layers["data"].data_param.backend == caffe_pb2.DataParameter.LMDB
    assert layers["data"].transform_param.scale == pytest.approx(1 / 255)
    conv = layers["conv1"].convolution_param
    assert (conv.num_output, list(conv.kernel_size), conv.weight_filler.type) == (20, [5], "xavier")
    pool = layers["pool1"].pooling_param
    assert (pool.pool, pool.kernel_size, pool.stride) == (caffe_pb2.PoolingParameter.MAX, 2, 2)
    assert layers["fc1"].inner_product_param.num_output == 500
    python = L.Python(L.Input(shape=dict(dim=np.array([2, 3]))), module="my_layers", layer="Square",
                      param_str="{'scale': 2}", loss_weight=1)
    python_layer = python.to_proto().layer[1]
    assert (python_layer.python_param.module, python_layer.python_param.layer) == ("my_layers", "Square")
    assert python_layer.python_param.param_str == "{'scale': 2}" and list(python_layer.loss_weight) == [1]
    assert list(python.to_proto().layer[0].input_param.shape[0].dim) == [2, 3]


def test_layer_fields_repeated_messages_and_shared_parameter_messages():
    data = L.Input(shape=[dict(dim=[2, 3, 8, 8]), dict(dim=(2,))], ntop=2)
    conv = L.Convolution(data[0], num_output=4, kernel_size=[3, 1], pad=1, name="c",
                         param=[dict(lr_mult=1, decay_mult=1), dict(lr_mult=2, decay_mult=0)],
                         include=dict(phase=caffe_pb2.TRAIN), loss_weight=0.5, propagate_down=True)
    up = L.Deconvolution(conv, num_output=4, kernel_size=4, stride=2)
    silence = L.Silence(up, data[1], ntop=0)
    layers = _layers(scaffe.to_proto(silence))
    assert [list(shape.dim) for shape in layers["Input1"].input_param.shape] == [[2, 3, 8, 8], [2]]
    conv_layer = layers["c"]
    assert list(conv_layer.convolution_param.kernel_size) == [3, 1]
    assert list(conv_layer.convolution_param.pad) == [1]  # a lone value fills a repeated field
    assert [(p.lr_mult, p.decay_mult) for p in conv_layer.param] == [(1, 1), (2, 0)]
    assert [rule.phase for rule in conv_layer.include] == [caffe_pb2.TRAIN]
    assert list(conv_layer.loss_weight) == [0.5] and list(conv_layer.propagate_down) == [True]
    # Deconvolution's own keywords go to convolution_param, the message Caffe's Deconvolution reads.
    deconv = layers["Deconvolution1"].convolution_param
    assert (deconv.num_output, list(deconv.kernel_size), list(deconv.stride)) == (4, [4], [2])


def test_unnamed_tops_and_layers_get_type_and_counter():
    data, label = L.DummyData(shape=dict(dim=[2, 4]), ntop=2)
    first = L.ReLU(data)
    second = L.ReLU(first)
    net = scaffe.to_proto(second, L.Silence(label, ntop=0))
    assert [(layer.name, list(layer.bottom), list(layer.top)) for layer in net.layer] == [
        ("DummyData1", [], ["DummyData1", "DummyData2"]),
        ("ReLU1", ["DummyData1"], ["ReLU1"]),
        ("ReLU2", ["ReLU1"], ["ReLU2"]),
        ("Silence1", ["DummyData2"], [])]
    assert second.to_proto() == scaffe.to_proto(second)


def test_ntop_chooses_what_a_layer_call_returns():
    assert isinstance(L.ReLU(L.Input(shape=dict(dim=[1]))), scaffe.net_spec.Top)
    tops = L.DummyData(ntop=3)
    assert isinstance(tops, tuple) and [top.n for top in tops] == [0, 1, 2]
    assert {top.fn for top in tops} == {tops[0].fn}
    silence = L.Silence(*tops, ntop=0)
    assert isinstance(silence, scaffe.net_spec.Function) and silence.tops == ()
    assert silence.params == {}  # ntop and in_place are not layer parameters


def test_a_netspec_built_net_loads_and_runs_with_its_names(tmp_path):
    n = scaffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[2, 3]))
    n.fc = L.InnerProduct(n.data, num_output=4, weight_filler=dict(type="constant", value=0.5),
                          bias_filler=dict(type="constant", value=1))
    n["act"] = L.TanH(n.fc)
    n.silence = L.Silence(n.act, ntop=0)
    net_file = tmp_path / "net.prototxt"
    net_file.write_text(str(n.to_proto()))
    net = scaffe.Net(str(net_file), scaffe.TEST)
    assert list(net._layer_names) == ["data", "fc", "act", "silence"]
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    net.forward(data=x)
    np.testing.assert_allclose(net.blobs["act"].data, np.tanh(x.sum(1, keepdims=True) * 0.5 + 1).repeat(4, 1),
                               rtol=1e-6)
    assert net.outputs == []


def test_params_gives_caffe_proto_enum_values():
    assert P.Pooling.MAX == caffe_pb2.PoolingParameter.MAX and P.Pooling.AVE == caffe_pb2.PoolingParameter.AVE
    assert P.Eltwise.SUM == caffe_pb2.EltwiseParameter.SUM
    assert P.Data.LMDB == caffe_pb2.DataParameter.LMDB
    with pytest.raises(AttributeError, match="PoolingParameter has no constant 'MIN'"):
        P.Pooling.MIN
    with pytest.raises(AttributeError, match="no NopeParameter message"):
        P.Nope


def test_wrong_inputs_and_keywords_are_clear_errors():
    data = L.DummyData(ntop=2)
    with pytest.raises(TypeError, match=r"^Silence input 0 is not a Top \(type is <class 'tuple'>\)$"):
        L.Silence(data, ntop=0)
    n = scaffe.NetSpec()
    n.conv = L.Convolution(data[0], num_output=2, kernel_sise=3)
    with pytest.raises(AttributeError, match="Convolution layer 'conv': 'kernel_sise' is a field of neither "
                                             "convolution_param nor LayerParameter"):
        n.to_proto()
    n.conv = L.Convolution(data[0], num_output=2, weight_filler=dict(tpye="xavier"))
    with pytest.raises(AttributeError, match="'conv', weight_filler: FillerParameter has no field 'tpye'"):
        n.to_proto()
    with pytest.raises(AttributeError, match="NetSpec has no top 'missing'"):
        n.missing


def test_netspec_lenet_trains_with_sgd_solver(tmp_path, monkeypatch):
    train_lmdb, test_lmdb = ensure_mnist_lmdb(MNIST)
    (tmp_path / "train.prototxt").write_text(str(lenet(train_lmdb, 64)))
    (tmp_path / "test.prototxt").write_text(str(lenet(test_lmdb, 100)))
    (tmp_path / "solver.prototxt").write_text(
        'train_net: "train.prototxt" test_net: "test.prototxt" test_iter: 10 test_interval: 1000 base_lr: 0.01 '
        'momentum: 0.9 weight_decay: 0.0005 lr_policy: "inv" gamma: 0.0001 power: 0.75 max_iter: 1000')
    monkeypatch.chdir(tmp_path)
    scaffe.set_random_seed(1)
    solver = scaffe.SGDSolver("solver.prototxt")
    try:
        solver.step(60)
        test_net = solver.test_nets[0]
        correct = 0
        for _ in range(10):
            test_net.forward()
            correct += int((test_net.blobs["score"].data.argmax(1) == test_net.blobs["label"].data).sum())
    finally:
        solver.close()
    assert correct / 1000 > 0.85
