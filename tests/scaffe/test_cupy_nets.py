"""LeNet and cifar10_quick (examples/) on the cupy path, under the cupy stand-in, against the numpy path:
the same loss, outputs and every blob's data and gradient after forward and backward, and no host sync
in the pass."""
from pathlib import Path

import numpy
import pytest

from scaffe import io as sio
from scaffe.io import to_host
from scaffe.net import Net

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def input_net(path, batch, image_shape):
    """The example's train/test net with its Data layers replaced by one Input layer (data, label)."""
    param = sio.read_net_prototxt(EXAMPLES / path)
    layers = [lp for lp in param.layer if lp.type != "Data"]
    del param.layer[:]
    feed = param.layer.add()
    feed.CopyFrom(sio.parse_net_text(
        'layer { name: "feed" type: "Input" top: "data" top: "label" input_param { '
        f'shape {{ {" ".join(f"dim: {d}" for d in (batch,) + image_shape)} }} shape {{ dim: {batch} }} }} }}').layer[0])
    param.layer.extend(layers)
    return param


def feed(net, xp, images, labels):
    net.blobs["data"].data[...] = xp.asarray(images)
    net.blobs["label"].data[...] = xp.asarray(labels)


@pytest.mark.parametrize("path,image_shape", [("mnist/lenet_train_test.prototxt", (1, 28, 28)),
                                              ("cifar10/cifar10_quick_train_test.prototxt", (3, 32, 32))])
def test_example_net_on_the_cupy_path_matches_numpy(cupy_stand_in, path, image_shape):
    phase = "TRAIN"
    param = input_net(path, 4, image_shape)
    rng = numpy.random.default_rng(0)
    images = rng.uniform(0, 1, (4,) + image_shape).astype(numpy.float32)
    labels = rng.integers(0, 10, 4).astype(numpy.float32)
    host = Net(param, phase)
    device = Net(param, phase, xp=cupy_stand_in)
    device.copy_trained_layers_from(host.to_proto())
    for net, xp in ((host, numpy), (device, cupy_stand_in)):
        feed(net, xp, images, labels)
    host_loss = host.forward_backward()
    syncs = cupy_stand_in._stand_in.host_syncs()
    device_loss = device.forward_backward()
    assert cupy_stand_in._stand_in.host_syncs() == syncs  # the pass never waited for the device
    assert float(device_loss) == pytest.approx(host_loss, rel=1e-5)
    for name in host.blobs:
        for what in ("data", "diff"):
            numpy.testing.assert_allclose(to_host(getattr(device.blobs[name], what)),
                                          getattr(host.blobs[name], what), rtol=1e-4, atol=1e-6,
                                          err_msg=f"{path} {phase}: blob {name} {what}")
    for a, b in zip(device.learnable_params, host.learnable_params):
        numpy.testing.assert_allclose(to_host(a.diff), b.diff, rtol=1e-4, atol=1e-6)
    assert isinstance(device.blobs["loss"].data, cupy_stand_in.ndarray)


