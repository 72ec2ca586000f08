"""caffe.proto and scaffe.io against files written by real BVLC Caffe (../shared/caffe-reference)."""
import filecmp
import glob
import os
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
from google.protobuf import text_format
from google.protobuf.unknown_fields import UnknownFieldSet

from scaffe import io
from scaffe.proto import caffe_pb2

REPO = Path(__file__).resolve().parents[2]
REF = REPO.parent / "shared" / "caffe-reference"
needs_ref = pytest.mark.skipif(not REF.is_dir(), reason="caffe-reference folder not present")


def unknown_field_paths(msg, path="root"):
    """Every sub-message that holds fields our schema does not declare (they would be opaque)."""
    found = [path] if len(UnknownFieldSet(msg)) else []
    for fd, value in msg.ListFields():
        if fd.type == fd.TYPE_MESSAGE:
            items = value if fd.is_repeated else [value]
            for i, v in enumerate(items):
                found += unknown_field_paths(v, f"{path}.{fd.name}[{i}]")
    return found


def test_generated_module_is_up_to_date(tmp_path):
    pytest.importorskip("grpc_tools")
    proto_dir = REPO / "scaffe" / "proto"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{proto_dir}", f"--python_out={tmp_path}",
                    str(proto_dir / "caffe.proto")], check=True, capture_output=True)
    assert filecmp.cmp(tmp_path / "caffe_pb2.py", proto_dir / "caffe_pb2.py", shallow=False), (
        "scaffe/proto/caffe_pb2.py is stale: regenerate it (see scaffe/proto/README.md)")


def test_field_numbers_that_files_depend_on():
    def number(msg, field):
        return msg.DESCRIPTOR.fields_by_name[field].number

    assert [number(caffe_pb2.Datum, f) for f in ("channels", "height", "width", "data", "label")] == [1, 2, 3, 4, 5]
    assert number(caffe_pb2.NetParameter, "layer") == 100 and number(caffe_pb2.NetParameter, "layers") == 2
    assert [number(caffe_pb2.BlobProto, f) for f in ("shape", "data", "double_data")] == [7, 5, 8]
    assert [number(caffe_pb2.SolverState, f) for f in ("iter", "learned_net", "history", "current_step")] == [1, 2, 3, 4]
    lp = caffe_pb2.LayerParameter
    assert (number(lp, "swish_param"), number(lp, "clip_param"), number(lp, "recurrent_param")) == (147, 148, 146)
    assert caffe_pb2.SolverParameter().solver_mode == caffe_pb2.SolverParameter.GPU
    assert caffe_pb2.DataParameter().backend == caffe_pb2.DataParameter.LEVELDB
    assert caffe_pb2.LossParameter().normalization == caffe_pb2.LossParameter.VALID
    assert caffe_pb2.SolverParameter().clip_gradients == -1 and caffe_pb2.SolverParameter().random_seed == -1


@needs_ref
def test_layer_zoo_prototxt_parses_with_every_field():
    net = io.read_net_prototxt(REF / "layer_zoo.prototxt")
    assert net.name == "LayerZoo" and len(net.layer) == 71
    by_name = {l.name: l for l in net.layer}
    assert by_name["pool_c"].pooling_param.round_mode == caffe_pb2.PoolingParameter.FLOOR
    assert by_name["pool1"].pooling_param.round_mode == caffe_pb2.PoolingParameter.CEIL
    assert by_name["swish"].swish_param.beta == pytest.approx(1.5)
    assert (by_name["clip"].clip_param.min, by_name["clip"].clip_param.max) == pytest.approx((-0.2, 0.8))
    assert by_name["loss_ign"].loss_param.ignore_label == 3
    assert list(by_name["conv1"].propagate_down) == [True]
    assert by_name["ip1"].inner_product_param.weight_filler.variance_norm == caffe_pb2.FillerParameter.AVERAGE
    assert [p.lr_mult for p in by_name["ip1"].param] == [1, 2]
    assert by_name["thr"].exclude[0].stage == ["timing"]
    assert by_name["drop_ip1"].include[0].phase == caffe_pb2.TEST
    assert by_name["hinge"].hinge_loss_param.norm == caffe_pb2.HingeLossParameter.L2
    assert list(by_name["slice2"].slice_param.slice_point) == [8, 20]
    assert list(by_name["flat_b"].reshape_param.shape.dim) == [0, -1]
    data = net.layer[0]
    assert data.data_param.backend == caffe_pb2.DataParameter.LMDB and data.data_param.batch_size == 8
    assert data.transform_param.scale == pytest.approx(1 / 256)
    assert unknown_field_paths(net) == []


@needs_ref
def test_solver_prototxts():
    sgd = io.read_solver_prototxt(REF / "solver_sgd.prototxt")
    assert (sgd.type, sgd.lr_policy, sgd.stepsize, sgd.max_iter, sgd.snapshot_prefix) == ("SGD", "step", 10, 20, "layer_zoo")
    assert (sgd.gamma, sgd.momentum, sgd.weight_decay, sgd.clip_gradients) == pytest.approx((0.5, 0.9, 5e-4, 4))
    assert sgd.solver_mode == caffe_pb2.SolverParameter.CPU and sgd.random_seed == 1234 and sgd.net == "layer_zoo.prototxt"
    adam = io.read_solver_prototxt(REF / "solver_adam.prototxt")
    assert adam.type == "Adam" and adam.momentum2 == pytest.approx(0.999) and adam.delta == pytest.approx(1e-8)
    for path in glob.glob(str(REF / "solver_*.prototxt")):
        assert unknown_field_paths(io.read_solver_prototxt(path)) == []


@needs_ref
@pytest.mark.parametrize("name", ["layer_zoo_init", "layer_zoo_sgd_iter_1", "layer_zoo_iter_20",
                                  "layer_zoo_adam_iter_1", "layer_zoo_adam_iter_10"])
def test_caffemodels_round_trip_byte_for_byte(name):
    raw = (REF / f"{name}.caffemodel").read_bytes()
    net = io.read_net_binary(REF / f"{name}.caffemodel")
    assert len(net.layer) == 84 and unknown_field_paths(net) == []
    assert net.SerializeToString() == raw
    # Rebuilding the blobs from numpy through the fast packed path gives the same bytes.
    rebuilt = io.copy_message(net)
    for layer in rebuilt.layer:
        io.set_layer_blobs(layer, [io.blobproto_to_array(b) for b in layer.blobs])
    assert rebuilt.SerializeToString() == raw


@needs_ref
def test_caffemodel_weights_equal_the_reference_arrays():
    weights = io.read_weights(REF / "layer_zoo_init.caffemodel")
    files = sorted(glob.glob(str(REF / "reference" / "train0__param__*.npy")))
    assert files
    for path in files:
        _, _, layer, index = Path(path).stem.split("__")
        expected = numpy.load(path)
        got = weights[layer][int(index)]
        assert got.dtype == numpy.float32 and got.shape == expected.shape
        numpy.testing.assert_array_equal(got, expected)


@needs_ref
@pytest.mark.parametrize("name,iteration,history", [("layer_zoo_iter_20", 20, 24), ("layer_zoo_adam_iter_10", 10, 48)])
def test_solverstates(tmp_path, name, iteration, history):
    path = REF / f"{name}.solverstate"
    state = io.read_solverstate(path)
    assert (state.iter, state.learned_net, len(state.history)) == (iteration, f"{name}.caffemodel", history)
    assert unknown_field_paths(state) == [] and state.SerializeToString() == path.read_bytes()
    # Binary -> HDF5 -> SolverState keeps everything.
    io.write_solverstate(state, tmp_path / "s.solverstate.h5", hdf5=True)
    again = io.read_solverstate(tmp_path / "s.solverstate.h5")
    assert again.SerializeToString() == state.SerializeToString()
    io.write_solverstate(state, tmp_path / "s.solverstate")
    assert (tmp_path / "s.solverstate").read_bytes() == path.read_bytes()


@needs_ref
def test_infogain_binaryproto_matches_its_text_source():
    blob = io.read_blobproto(REF / "infogain_H.binaryproto")
    text = text_format.Parse((REF / "infogain_H.prototxt").read_text(), caffe_pb2.BlobProto())
    assert unknown_field_paths(blob) == []
    numpy.testing.assert_array_equal(io.blobproto_to_array(blob), io.blobproto_to_array(text))
    assert io.blobproto_to_array(blob).shape == (10, 10)


def test_blobproto_legacy_shape_double_and_matching():
    legacy = caffe_pb2.BlobProto(num=1, channels=1, height=2, width=3, data=[0, 1, 2, 3, 4, 5])
    assert io.blobproto_shape(legacy) == (1, 1, 2, 3)
    assert io.blobproto_matches_shape(legacy, (2, 3)) and not io.blobproto_matches_shape(legacy, (3, 2))
    numpy.testing.assert_array_equal(io.blobproto_to_array(legacy, shape=(2, 3)), numpy.arange(6).reshape(2, 3))
    with pytest.raises(ValueError, match="expected"):
        io.blobproto_to_array(legacy, shape=(6,))
    doubles = io.array_to_blobproto(numpy.linspace(0, 1, 4, dtype=numpy.float64).reshape(2, 2))
    assert len(doubles.double_data) == 4 and not len(doubles.data)
    assert io.blobproto_to_array(doubles).dtype == numpy.float64
    with_diff = io.array_to_blobproto(numpy.ones((2, 2), numpy.float32), diff=numpy.full((2, 2), 3, numpy.float32))
    numpy.testing.assert_array_equal(io.blobproto_to_array(with_diff, return_diff=True), numpy.full((2, 2), 3))
    as_legacy = io.array_to_blobproto(numpy.zeros((4, 5), numpy.float32), legacy_4d=True)
    assert (as_legacy.num, as_legacy.channels, as_legacy.height, as_legacy.width) == (1, 1, 4, 5)
    scalar = io.array_to_blobproto(numpy.float32(2.5))
    assert io.blobproto_to_array(scalar).shape == () and float(io.blobproto_to_array(scalar)) == 2.5
    with pytest.raises(ValueError, match="needs 6 data values"):
        io.blobproto_to_array(caffe_pb2.BlobProto(shape=caffe_pb2.BlobShape(dim=[2, 3]), data=[1.0]))


def test_fast_blob_encoding_equals_protobufs_own():
    values = numpy.random.RandomState(0).standard_normal((3, 4, 5)).astype(numpy.float32)
    slow = caffe_pb2.BlobProto()
    slow.shape.dim.extend(values.shape)
    slow.data.extend(values.ravel().tolist())
    assert io.array_to_blobproto(values).SerializeToString() == slow.SerializeToString()


@needs_ref
def test_hdf5_model_layout_and_round_trip(tmp_path):
    h5py = pytest.importorskip("h5py")
    weights = io.read_weights(REF / "layer_zoo_init.caffemodel")
    path = tmp_path / "m.caffemodel.h5"
    io.write_hdf5_weights(path, weights.items())
    with h5py.File(path, "r") as f:
        assert f["data/conv2a/1"].shape == (8,) and f["data/conv1/0"].shape == (4, 1, 5, 5)
    back = io.read_weights(path)
    assert list(back) == list(weights)
    for name in weights:
        for a, b in zip(weights[name], back[name]):
            numpy.testing.assert_array_equal(a, b)
    with h5py.File(tmp_path / "s.h5", "w") as f:  # Caffe's own solver-state layout, written by hand
        f["iter"] = numpy.array([7], numpy.int32)
        f["learned_net"] = numpy.bytes_(b"x_iter_7.caffemodel.h5")
        f["current_step"] = numpy.array([1], numpy.int32)
        f.create_group("history")
        for i in range(12):
            f[f"history/{i}"] = numpy.full((2,), i, numpy.float32)
    state = io.read_solverstate(tmp_path / "s.h5")
    assert (state.iter, state.learned_net, state.current_step) == (7, "x_iter_7.caffemodel.h5", 1)
    assert [io.blobproto_to_array(h)[0] for h in state.history] == list(range(12))  # numeric, not string, order


def test_atomic_write_keeps_old_file_on_failure(tmp_path):
    target = tmp_path / "a.caffemodel"
    io.atomic_write_bytes(target, b"old")
    with pytest.raises(RuntimeError):
        with io.atomic_path(target) as tmp:
            Path(tmp).write_bytes(b"half")
            raise RuntimeError("crash while writing")
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["a.caffemodel"]
    io.write_net_binary(caffe_pb2.NetParameter(name="n"), target)
    assert io.read_net_binary(target).name == "n" and os.listdir(tmp_path) == ["a.caffemodel"]


def test_text_errors_are_one_line_and_name_the_file(tmp_path):
    bad = tmp_path / "bad.prototxt"
    bad.write_text('layer {\n  nmae: "x"\n}\n')
    with pytest.raises(io.CaffeFormatError) as err:
        io.read_net_prototxt(bad)
    assert str(bad) in str(err.value) and "\n" not in str(err.value) and "nmae" in str(err.value)
    with pytest.raises(io.CaffeFormatError, match="no such file"):
        io.read_net_prototxt(tmp_path / "missing.prototxt")
    with pytest.raises(io.CaffeFormatError, match="solver"):
        io.parse_solver_text("base_lr: fast", "s.prototxt")
    (tmp_path / "junk.caffemodel").write_bytes(b"\xff\xff\xff\xff")
    with pytest.raises(io.CaffeFormatError, match="junk.caffemodel"):
        io.read_net_binary(tmp_path / "junk.caffemodel")


def test_upgrades_of_old_but_current_format_nets():
    net = io.parse_net_text('input: "data" input_dim: 10 input_dim: 3 input_dim: 8 input_dim: 8\n'
                            'layer { name: "r" type: "ReLU" bottom: "data" top: "data" }')
    assert [l.type for l in net.layer] == ["Input", "ReLU"] and not len(net.input)
    assert list(net.layer[0].input_param.shape[0].dim) == [10, 3, 8, 8] and list(net.layer[0].top) == ["data"]
    net = io.parse_net_text('layer { name: "d" type: "Data" top: "data" data_param { source: "x" scale: 0.5 mirror: true } }')
    t = net.layer[0].transform_param
    assert t.scale == 0.5 and t.mirror and not net.layer[0].data_param.HasField("scale")
    assert io.parse_solver_text("solver_type: NESTEROV").type == "Nesterov"
    with pytest.raises(io.CaffeFormatError, match="keep only 'type'"):
        io.parse_solver_text('solver_type: ADAM type: "SGD"')


def test_layer_blobs_and_v1_models():
    net = caffe_pb2.NetParameter(name="n")
    io.set_layer_blobs(net.layer.add(name="ip", type="InnerProduct"),
                       [numpy.ones((2, 3), numpy.float32), numpy.zeros(2, numpy.float32)])
    assert io.net_weights(caffe_pb2.NetParameter.FromString(net.SerializeToString()))["ip"][0].shape == (2, 3)
    old = caffe_pb2.NetParameter()  # an old V1 .caffemodel: weights still load by name
    layer = old.layers.add(name="fc", type=caffe_pb2.V1LayerParameter.INNER_PRODUCT)
    io.array_to_blobproto(numpy.arange(6, dtype=numpy.float32).reshape(1, 1, 2, 3), blob=layer.blobs.add(), legacy_4d=True)
    w = io.net_weights(old)["fc"][0]
    assert w.shape == (1, 1, 2, 3)
    assert io.blobproto_to_array(old.layers[0].blobs[0], shape=(2, 3)).shape == (2, 3)
