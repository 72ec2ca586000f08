"""Caffe workflows without surprises: bad LMDB records, weights that miss layers, --help, `scaffe time`."""
import re

import numpy as np
import pytest

from scaffe import io as sio
from scaffe.cli import COMMANDS, main
from scaffe.data.datum import array_to_datum
from scaffe.data.lmdb_writer import LMDBWriter
from scaffe.net import Net, NetError

DATA_NET = """
layer {{ name: "db" type: "Data" top: "data" top: "label" transform_param {{ {transform} }}
  data_param {{ source: "{source}" batch_size: 4 backend: LMDB }} }}
layer {{ name: "fc" type: "InnerProduct" bottom: "data" top: "y" inner_product_param {{ num_output: 2 }} }}
layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "y" bottom: "label" top: "loss" }}
"""


def write_lmdb(path, values):
    with LMDBWriter(path) as writer:
        for i, value in enumerate(values):
            writer.put(f"{i:08d}", value)
    return str(path)


def digit(shape=(1, 4, 4), label=0):
    return array_to_datum(np.full(shape, 7, np.uint8), label).SerializeToString()


def data_net(source, transform=""):
    return Net(sio.parse_net_text(DATA_NET.format(source=source, transform=transform)), "TRAIN", source="net.prototxt")


# ---------------------------------------------------------------- records that are not Datums

def test_lmdb_of_non_datums_is_one_line_naming_database_and_key(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    write_lmdb(tmp_path / "x_lmdb", [b"\xff\xff\xff\xff"] * 3)
    (tmp_path / "net.prototxt").write_text(DATA_NET.format(source="x_lmdb", transform=""))
    (tmp_path / "solver.prototxt").write_text('net: "net.prototxt" base_lr: 0.1 lr_policy: "fixed" max_iter: 1\n')
    code = main(["train", "--solver=solver.prototxt"])
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert last.startswith("scaffe train: error: ")
    assert re.search(r"x_lmdb: record '00000000': not a Caffe Datum \(.+\)$", last), last


def test_a_later_non_datum_record_names_its_key(tmp_path):
    source = write_lmdb(tmp_path / "db", [digit()] * 5 + [b"\xff\xff"] + [digit()] * 2)
    net = data_net(source)
    try:
        net.forward()  # records 0..3
        with pytest.raises(sio.CaffeFormatError, match=r"'.*db'.*record '00000005': not a Caffe Datum"):
            net.forward()
    finally:
        net.close()


def test_a_parsable_value_without_a_shape_is_not_a_datum(tmp_path):
    # Protobuf reads these bytes as unknown fields, giving an empty Datum.
    source = write_lmdb(tmp_path / "db", [b"\x08\x00" * 4])
    with pytest.raises(NetError, match=r"db: record '00000000': not a Caffe Datum \(no channels"):
        data_net(source)


# ---------------------------------------------------------------- record sizes, checked at set-up

def test_first_record_of_the_wrong_size_fails_at_set_up_naming_the_key(tmp_path):
    bad = array_to_datum(np.zeros((1, 4, 4), np.uint8))
    bad.data = bad.data[:10]
    source = write_lmdb(tmp_path / "db", [bad.SerializeToString(), digit()])
    with pytest.raises(NetError, match=r"layer 'db' \(Data\): .*db: record '00000000': Datum holds 10 bytes"):
        data_net(source)


def test_first_record_that_does_not_fit_the_mean_file_fails_at_set_up(tmp_path):
    sio.write_blobproto(sio.array_to_blobproto(np.zeros((1, 1, 5, 5), np.float32)), str(tmp_path / "mean.binaryproto"))
    source = write_lmdb(tmp_path / "db", [digit()] * 4)
    with pytest.raises(NetError, match=r"db: record '00000000': mean_file holds shape"):
        data_net(source, transform=f'mean_file: "{tmp_path / "mean.binaryproto"}"')


def test_a_later_record_of_another_size_names_its_key(tmp_path):
    source = write_lmdb(tmp_path / "db", [digit()] * 6 + [digit((1, 5, 5))] + [digit()])
    net = data_net(source)
    try:
        assert net.blobs["data"].shape == (4, 1, 4, 4)
        net.forward()
        with pytest.raises(sio.CaffeFormatError, match=r"record '00000006': sample of shape \(1, 5, 5\) in a "
                                                       r"batch whose first sample has shape \(1, 4, 4\)"):
            net.forward()
    finally:
        net.close()


# ---------------------------------------------------------------- weights that miss layers

TWO_LAYERS = """
layer { name: "in" type: "DummyData" top: "a" top: "t"
  dummy_data_param { shape { dim: 2 dim: 3 } shape { dim: 2 dim: 2 } } }
layer { name: "fc1" type: "InnerProduct" bottom: "a" top: "h" inner_product_param { num_output: 4 } }
layer { name: "relu" type: "ReLU" bottom: "h" top: "h" }
layer { name: "%s" type: "InnerProduct" bottom: "h" top: "y" inner_product_param { num_output: 2 } }
layer { name: "loss" type: "EuclideanLoss" bottom: "y" bottom: "t" top: "loss" }
"""


@pytest.mark.parametrize("save", ["save", "save_hdf5"])
def test_weights_without_a_learnable_layer_log_a_warning_naming_it(tmp_path, monkeypatch, capsys, save):
    monkeypatch.chdir(tmp_path)
    weights = f"old.caffemodel{'.h5' if save == 'save_hdf5' else ''}"
    getattr(Net(sio.parse_net_text(TWO_LAYERS % "fc2"), "TEST"), save)(weights)
    (tmp_path / "net.prototxt").write_text(TWO_LAYERS % "fc2_renamed")
    code = main(["test", "--model=net.prototxt", f"--weights={weights}", "--iterations=1"])
    err = capsys.readouterr().err
    assert code == 0, err
    warnings = [line.split("] ", 1)[1] for line in err.splitlines() if line.startswith("W")]
    assert warnings == [f"{weights} has no weights for layer(s) 'fc2_renamed' of net.prototxt: "
                        f"they keep their filler values"]
    # Loading a file that has every layer stays quiet.
    (tmp_path / "net.prototxt").write_text(TWO_LAYERS % "fc2")
    assert main(["test", "--model=net.prototxt", f"--weights={weights}", "--iterations=1"]) == 0
    assert not [line for line in capsys.readouterr().err.splitlines() if line.startswith("W") and "fc2" in line]


# ---------------------------------------------------------------- the command line

@pytest.mark.parametrize("command", COMMANDS)
def test_every_subcommand_help_has_one_usage_prefix(capsys, command):
    code = main([command, "--help"])
    captured = capsys.readouterr()
    text = captured.out + captured.err
    # Caffe's own tools (extract_features, upgrade_*) print their usage and exit 1, as Caffe does.
    assert code in (0, 1) and text.startswith("usage: ") and command in text.splitlines()[0], text
    assert "usage: usage:" not in text
    if command in ("train", "test", "time", "device_query"):
        assert code == 0 and text.startswith(f"usage: scaffe {command} ")


def test_time_states_its_backward_convention_and_follows_it(tmp_path, monkeypatch, capsys):
    """Like Caffe's `caffe time`, every layer's Backward runs with the net's propagate_down flags
    (all False in a deploy net), and the log says so."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "deploy.prototxt").write_text("""
        layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
        layer { name: "fc" type: "InnerProduct" bottom: "data" top: "h" inner_product_param { num_output: 4 } }
        layer { name: "relu" type: "ReLU" bottom: "h" top: "h" }
        layer { name: "prob" type: "Softmax" bottom: "h" top: "prob" }""")
    calls = []
    from_file = Net.from_file.__func__

    def recording_from_file(cls, *args, **kwargs):
        net = from_file(cls, *args, **kwargs)
        for layer in net.layers:
            def backward(top, propagate_down, bottom, layer=layer, run=layer.backward):
                calls.append((layer.name, list(propagate_down)))
                return run(top, propagate_down, bottom)
            layer.backward = backward
        return net

    monkeypatch.setattr(Net, "from_file", classmethod(recording_from_file))
    assert main(["time", "--model=deploy.prototxt", "--iterations=2"]) == 0
    err = capsys.readouterr().err
    assert ("Backward times call every layer's Backward with this net's propagate_down flags, as Caffe's "
            "`caffe time` does") in err
    # net.backward() before the benchmark runs no layer of a deploy net; the benchmark runs each one.
    assert calls == [("prob", [False]), ("relu", [False]), ("fc", [False]), ("data", [])] * 2
