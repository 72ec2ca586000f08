"""scaffe.draw (pycaffe's caffe.draw): the Graphviz graph of a net through pydot; drawing it needs Graphviz's
`dot`, which a pip-only machine lacks, so those cases skip there while the graph itself is checked wherever
pydot (the `draw` extra, which the test install has) is installed."""
import shutil
from pathlib import Path

import pytest
from google.protobuf import text_format

from scaffe.proto import caffe_pb2

pytest.importorskip("pydot")
from scaffe import draw  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LENET = EXAMPLES / "mnist" / "lenet_train_test.prototxt"
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")


def _net(path):
    return text_format.Parse(path.read_text(), caffe_pb2.NetParameter())


def _nodes(graph):
    return {node.get_name().strip('"'): node for node in graph.get_nodes()}


def _edges(graph):
    return {(edge.get_source().strip('"'), edge.get_destination().strip('"')): edge.get_label()
            for edge in graph.get_edges()}


def test_graph_has_a_node_per_layer_and_blob_and_edges_through_layers():
    net = _net(LENET)
    graph = draw.get_pydot_graph(net, "LR")
    nodes = _nodes(graph)
    for layer in net.layer:
        assert f"{layer.name}_{layer.type}" in nodes
        assert all(f"{blob}_blob" in nodes for blob in list(layer.bottom) + list(layer.top))
    assert len(nodes) == len(net.layer) - 1 + len({blob for layer in net.layer
                                                   for blob in list(layer.bottom) + list(layer.top)})  # 2 "mnist"
    assert len(graph.get_edges()) == sum(len(layer.bottom) + len(layer.top) for layer in net.layer)
    edges = _edges(draw.get_pydot_graph(net, "LR", phase=caffe_pb2.TRAIN))
    assert edges[("data_blob", "conv1_Convolution")] == '""'
    assert edges[("conv1_Convolution", "conv1_blob")] == "20"          # a learning layer's outputs
    assert edges[("ip1_InnerProduct", "ip1_blob")] == "500"
    assert edges[("mnist_Data", "data_blob")] == "Batch 64"             # TRAIN's Data layer
    assert edges[("relu1_ReLU", "ip1_blob")] == '""'
    styles = {name: node.get("fillcolor") for name, node in nodes.items()}
    assert styles["conv1_Convolution"] == "#FF5050" and styles["pool1_Pooling"] == "#FF9900"
    assert styles["ip1_InnerProduct"] == "#CC33FF" and styles["relu1_ReLU"] == "#90EE90"  # in place
    assert styles["loss_SoftmaxWithLoss"] == "#6495ED" and styles["data_blob"] == "#E0E0E0"


def test_labels_describe_layers_in_the_layout_direction():
    net = _net(LENET)
    layers = {layer.name: layer for layer in net.layer}
    assert draw.get_layer_label(layers["pool1"], "LR") == r'"pool1\n(Pooling MAX)\nkernel size: 2\nstride: 2\npad: 0"'
    assert draw.get_layer_label(layers["conv1"], "TB", display_lrm=True) == (
        '"conv1 (Convolution) kernel size: 5 stride: 1 pad: 0 lr mult: 1.0, 2.0"')
    assert draw.get_layer_lr_mult(layers["ip2"]) == (1.0, 2.0)
    assert draw.get_layer_lr_mult(caffe_pb2.LayerParameter(type="InnerProduct")) == (1.0, 1.0)
    with pytest.raises(ValueError, match="ReLU layers do not have a learning rate multiplier"):
        draw.get_layer_lr_mult(layers["relu1"])
    assert draw.get_pooling_types_dict() == {0: "MAX", 1: "AVE", 2: "STOCHASTIC"}


def test_phase_keeps_only_that_phases_layers():
    net = _net(LENET)
    train = _nodes(draw.get_pydot_graph(net, "LR", phase=caffe_pb2.TRAIN))
    test = _nodes(draw.get_pydot_graph(net, "LR", phase=caffe_pb2.TEST))
    assert "accuracy_Accuracy" in test and "accuracy_Accuracy" not in train
    assert "loss_SoftmaxWithLoss" in train and "loss_SoftmaxWithLoss" in test
    both = caffe_pb2.LayerParameter(name="odd", type="ReLU", include=[dict(phase=0)], exclude=[dict(phase=1)])
    with pytest.raises(ValueError, match="layer odd has both include and exclude"):
        draw.get_pydot_graph(caffe_pb2.NetParameter(layer=[both]), "LR", phase=caffe_pb2.TRAIN)


def test_every_bundled_net_builds_a_graph_and_raw_is_its_dot_text():
    nets = [path for path in EXAMPLES.rglob("*.prototxt") if "solver" not in path.name]
    assert len(nets) >= 5
    for path in nets:
        net = _net(path)
        text = draw.draw_net(net, "TB", ext="raw").decode()
        assert text == draw.get_pydot_graph(net, "TB").to_string() and text.startswith("digraph")
        assert all(f'"{layer.name}_{layer.type}" [label=' in text for layer in net.layer), path


@needs_dot
def test_draw_net_to_file_renders_png_and_svg(tmp_path):
    net = _net(LENET)
    draw.draw_net_to_file(net, str(tmp_path / "lenet.png"), phase=caffe_pb2.TEST)
    assert (tmp_path / "lenet.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    svg = draw.draw_net(net, "BT", ext="svg").decode()
    assert "<svg" in svg and "conv1" in svg and "Batch 64" in svg


def test_draw_net_without_dot_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PATH", "")
    with pytest.raises(RuntimeError, match="Graphviz's dot program is not on PATH"):
        draw.draw_net(_net(LENET), "LR")
