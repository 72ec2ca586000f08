"""Fillers: Caffe's distributions and parameters, checked against weights Caffe itself filled."""
import math
from pathlib import Path

import numpy
import pytest

from scaffe import io
from scaffe.blob import Blob
from scaffe.fillers import FILLER_TYPES, fan_in_out, fill, fill_array
from scaffe.proto import caffe_pb2

REF = Path(__file__).resolve().parents[2].parent / "shared" / "caffe-reference"
needs_ref = pytest.mark.skipif(not REF.is_dir(), reason="caffe-reference folder not present")


def filler(**kw):
    return caffe_pb2.FillerParameter(**kw)


@pytest.fixture(scope="module")
def caffe_init():
    """The layer_zoo weights as Caffe's fillers made them (random_seed 1234), and the net that says how."""
    return (io.read_weights(REF / "layer_zoo_init.caffemodel"),
            {l.name: l for l in io.read_net_prototxt(REF / "layer_zoo.prototxt").layer})


def test_fans_follow_caffe():
    assert fan_in_out((8, 4, 3, 3)) == (36, 72)
    assert fan_in_out((16, 128)) == (128, 16)
    assert fan_in_out((10,)) == (1, 10)


def test_constant_and_default():
    numpy.testing.assert_array_equal(fill_array((2, 3), filler(type="constant", value=0.25)), numpy.full((2, 3), 0.25))
    numpy.testing.assert_array_equal(fill_array((4,)), numpy.zeros(4))
    assert fill_array((3,), filler(value=1.0), dtype=numpy.float64).dtype == numpy.float64


def test_random_fillers_have_caffes_moments():
    rng = numpy.random.RandomState(0)
    u = fill_array((200, 250), filler(type="uniform", min=-2, max=3), rng)
    assert u.min() >= -2 and u.max() < 3 and abs(u.mean() - 0.5) < 0.02
    g = fill_array((200, 250), filler(type="gaussian", mean=1, std=0.5), rng)
    assert abs(g.mean() - 1) < 0.01 and abs(g.std() - 0.5) < 0.01
    # xavier: U(-a, a) with a = sqrt(3 / n): variance 1/n, n = fan_in / fan_out / their average.
    shape = (64, 32, 3, 3)
    fan_in, fan_out = fan_in_out(shape)
    for norm, n in ((caffe_pb2.FillerParameter.FAN_IN, fan_in), (caffe_pb2.FillerParameter.FAN_OUT, fan_out),
                    (caffe_pb2.FillerParameter.AVERAGE, (fan_in + fan_out) / 2)):
        x = fill_array(shape, filler(type="xavier", variance_norm=norm), rng)
        assert abs(x).max() <= math.sqrt(3 / n) and abs(x.var() * n - 1) < 0.05
        m = fill_array(shape, filler(type="msra", variance_norm=norm), rng)
        assert abs(m.mean()) < 0.01 and abs(m.var() * n / 2 - 1) < 0.05


def test_sparse_gaussian_keeps_sparse_over_outputs_weights():
    w = fill_array((100, 400), filler(type="gaussian", std=1, sparse=10), numpy.random.RandomState(1))
    assert abs((w != 0).mean() - 10 / 100) < 0.01
    with pytest.raises(ValueError, match="sparse"):
        fill_array((3, 3), filler(type="xavier", sparse=2))


def test_positive_unitball_and_bilinear():
    w = fill_array((5, 7), filler(type="positive_unitball"), numpy.random.RandomState(2))
    assert (w > 0).all()
    numpy.testing.assert_allclose(w.sum(axis=1), 1, rtol=1e-6)
    # kernel 4 (stride 2 upsampling): f = 2, c = 3/4 -> tent 0.25 0.75 0.75 0.25
    k = fill_array((2, 1, 4, 4), filler(type="bilinear"))
    numpy.testing.assert_allclose(k[1, 0], numpy.outer([0.25, 0.75, 0.75, 0.25], [0.25, 0.75, 0.75, 0.25]))
    with pytest.raises(ValueError, match="square"):
        fill_array((1, 1, 3, 4), filler(type="bilinear"))


def test_unknown_type_lists_known_ones():
    with pytest.raises(ValueError, match="known: bilinear, constant"):
        fill_array((2,), filler(type="orthogonal"))
    assert set(FILLER_TYPES) == {"constant", "uniform", "gaussian", "xavier", "msra", "positive_unitball", "bilinear"}


def test_fill_blob_in_place_and_reproducible():
    blob = Blob((3, 4))
    fill(blob, filler(type="gaussian", std=2), numpy.random.RandomState(5))
    again = fill_array((3, 4), filler(type="gaussian", std=2), numpy.random.RandomState(5))
    numpy.testing.assert_array_equal(blob.data, again)
    assert blob.data.dtype == numpy.float32
    fill(blob, filler(type="uniform", min=0, max=1), numpy.random.default_rng(0))  # a Generator works too
    assert (blob.data >= 0).all() and (blob.data < 1).all()


@needs_ref
def test_deterministic_fillers_equal_caffes_output(caffe_init):
    weights, layers = caffe_init
    cases = {  # (layer, blob index): the filler in layer_zoo.prototxt
        ("scale1", 1): layers["scale1"].scale_param.bias_filler,
        ("conv2b", 1): layers["conv2b"].convolution_param.bias_filler,
        ("se_fc", 1): layers["se_fc"].inner_product_param.bias_filler,
        ("prelu", 0): layers["prelu"].prelu_param.filler,
        ("bias_red", 0): layers["bias_red"].bias_param.filler,
        ("deconv", 0): layers["deconv"].convolution_param.weight_filler,  # bilinear
        ("deconv", 1): layers["deconv"].convolution_param.bias_filler,
        ("ip1", 1): layers["ip1"].inner_product_param.bias_filler,
    }
    for (name, i), param in cases.items():
        expected = weights[name][i]
        numpy.testing.assert_array_equal(fill_array(expected.shape, param), expected, err_msg=f"{name}[{i}]")


@needs_ref
def test_random_fillers_stay_in_caffes_ranges(caffe_init):
    weights, layers = caffe_init
    # Caffe's draws are not reproduced, but ours must come from the same distribution: the same
    # bounds, and Caffe's own values must be plausible draws of our parameters.
    conv1 = weights["conv1"][0]
    bound = math.sqrt(3 / fan_in_out(conv1.shape)[0])
    ours = fill_array(conv1.shape, layers["conv1"].convolution_param.weight_filler, numpy.random.RandomState(0))
    assert abs(conv1).max() <= bound and abs(ours).max() <= bound and abs(conv1).max() > 0.9 * bound
    ip1 = weights["ip1"][0]  # xavier AVERAGE: n = (128 + 16) / 2
    assert abs(ip1).max() <= math.sqrt(3 / 72) and abs(ip1).max() > 0.95 * math.sqrt(3 / 72)
    scale = weights["scale1"][0]
    assert (scale >= 0.8).all() and (scale <= 1.2).all()
    embed = weights["embed"][0]  # positive_unitball over each of the 10 rows
    assert (embed > 0).all()
    numpy.testing.assert_allclose(embed.sum(axis=1), 1, rtol=1e-6)
    conv2a = weights["conv2a"][0]  # msra: std sqrt(2 / fan_in)
    assert 0.5 < conv2a.std() / math.sqrt(2 / fan_in_out(conv2a.shape)[0]) < 1.5
