"""scaffe.coord_map (pycaffe's caffe.coord_map): coordinate maps through NetSpec layers, checked against where
an impulse actually lands in a built net, and `crop` against the offsets of the FCN models Caffe users know."""
import numpy as np
import pytest

import scaffe
from scaffe import layers as L
from scaffe import params as P
from scaffe.coord_map import UncroppableError, coord_map_from_to, crop


def _impulse_net(tmp_path, n):
    """Writes NetSpec `n`, loads it, and sets every convolution's and deconvolution's kernel to a centred one-hot,
    so an impulse at input pixel u lands at the output pixel that the layer's centre maps u to."""
    path = tmp_path / "net.prototxt"
    path.write_text(str(n.to_proto()))
    net = scaffe.Net(str(path), scaffe.TEST)
    for weights in net.params.values():
        kernel = weights[0].data
        kernel[...] = 0
        kernel[:, :, kernel.shape[2] // 2, kernel.shape[3] // 2] = 1
        weights[1].data[...] = 0
    return net


def _is_pixel_of(coordinates, image):
    return np.all(coordinates == np.round(coordinates)) and np.all((0 <= coordinates) & (coordinates < image.shape))


@pytest.mark.parametrize("ks, stride, pad, dks, dstride, dpad", [(3, 1, 0, 3, 2, 1), (5, 2, 4, 5, 2, 0),
                                                                  (3, 1, 2, 3, 1, 1)])
def test_map_is_where_an_impulse_lands(tmp_path, ks, stride, pad, dks, dstride, dpad):
    n = scaffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 24, 24]))
    n.conv = L.Convolution(n.data, num_output=1, kernel_size=ks, stride=stride, pad=pad)
    n.relu = L.ReLU(n.conv, in_place=True)
    n.up = L.Deconvolution(n.relu, convolution_param=dict(num_output=1, kernel_size=dks, stride=dstride, pad=dpad))
    axis, scale, shift = coord_map_from_to(n.data, n.up)  # data coordinate x -> up coordinate scale * x + shift
    assert axis == 1
    _, conv_scale, conv_shift = coord_map_from_to(n.data, n.conv)
    net = _impulse_net(tmp_path, n)
    landed = 0
    for row in range(24):
        image = np.zeros((1, 1, 24, 24), np.float32)
        column = (row * 7) % 24
        image[0, 0, row, column] = 1
        up = net.forward(data=image)["up"][0, 0]
        conv = net.blobs["conv"].data[0, 0]
        in_conv = conv_scale * np.array([row, column]) + conv_shift
        expected = scale * np.array([row, column]) + shift
        if _is_pixel_of(in_conv, conv) and _is_pixel_of(expected, up):
            assert up[tuple(expected.astype(int))] == 1 and up.sum() == 1, (row, column)
            landed += 1
        elif not _is_pixel_of(in_conv, conv):  # between the convolution's samples or outside it
            assert conv.max() == 0 and up.max() == 0, (row, column)
    assert landed > 0
    # Mapped the other way, the result is the inverse map.
    _, back_scale, back_shift = coord_map_from_to(n.up, n.data)
    np.testing.assert_allclose(back_scale * scale, 1)
    np.testing.assert_allclose(back_scale * shift + back_shift, 0)


def test_maps_per_axis_with_legacy_and_nd_forms():
    n = scaffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 40, 40, 40]))
    n.conv = L.Convolution(n.data, num_output=1, kernel_size=[3, 5, 1], stride=[1, 2, 1], pad=[0, 1, 2],
                           dilation=2)
    _, scale, shift = coord_map_from_to(n.data, n.conv)
    np.testing.assert_allclose(scale, [1, 0.5, 1])
    np.testing.assert_allclose(shift, [-2, -1.5, 2])  # (pad - (extent - 1) / 2) / stride, extent = 2k - 1
    n.pool = L.Pooling(n.data, pooling_param=dict(pool=P.Pooling.AVE, kernel_h=3, kernel_w=2, stride_h=1,
                                                  stride_w=2, pad_h=1))
    _, scale, shift = coord_map_from_to(n.data, n.pool)
    np.testing.assert_allclose(scale, [1, 0.5])
    np.testing.assert_allclose(shift, [0, -0.25])


def test_crop_gives_the_fcn_offsets():
    """The Crop offsets of FCN-32s and FCN-16s on VGG16 (pad 100 on conv1_1), as their published nets have."""
    n = scaffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 3, 64, 64]))
    top = n.data
    pools = []
    for block, convs in enumerate([2, 2, 3, 3, 3]):
        for _ in range(convs):
            top = L.ReLU(L.Convolution(top, num_output=1, kernel_size=3, pad=100 if top is n.data else 1),
                         in_place=True)
        top = L.Pooling(top, pool=P.Pooling.MAX, kernel_size=2, stride=2)
        pools.append(top)
    fc6 = L.ReLU(L.Convolution(top, num_output=1, kernel_size=7), in_place=True)
    score_fr = L.Convolution(L.Dropout(fc6), num_output=21, kernel_size=1)
    upscore = L.Deconvolution(score_fr, convolution_param=dict(num_output=21, kernel_size=64, stride=32))
    n.score = crop(upscore, n.data)
    assert (n.score.fn.params["crop_param"]) == {"axis": 2, "offset": [19]}

    upscore2 = L.Deconvolution(score_fr, convolution_param=dict(num_output=21, kernel_size=4, stride=2))
    score_pool4c = crop(L.Convolution(pools[3], num_output=21, kernel_size=1), upscore2)
    fuse = L.Eltwise(upscore2, score_pool4c, operation=P.Eltwise.SUM)
    upscore16 = L.Deconvolution(fuse, convolution_param=dict(num_output=21, kernel_size=32, stride=16))
    score16 = crop(upscore16, n.data)
    assert score_pool4c.fn.params["crop_param"]["offset"] == [5]
    assert score16.fn.params["crop_param"]["offset"] == [27]
    # The map through a Crop layer adds its offset.
    _, _, shift = coord_map_from_to(n.score, n.data)
    _, _, uncropped = coord_map_from_to(upscore, n.data)
    np.testing.assert_allclose(shift, uncropped + 19)


def test_crop_layer_aligns_a_built_net(tmp_path):
    n = scaffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 20, 20]))
    n.conv = L.Convolution(n.data, num_output=1, kernel_size=3, pad=3)  # 24 x 24, pixel x + 2 over data's x
    n.aligned = crop(n.conv, n.data)
    net = _impulse_net(tmp_path, n)
    image = np.random.RandomState(0).rand(1, 1, 20, 20).astype(np.float32)
    np.testing.assert_array_equal(net.forward(data=image)["aligned"], image)


def test_what_cannot_be_mapped_or_cropped_is_an_error():
    n = scaffe.NetSpec()
    n.data = L.Input(shape=dict(dim=[1, 1, 20, 20]))
    n.other = L.Input(shape=dict(dim=[1, 1, 20, 20]))
    n.pool = L.Pooling(n.data, pool=P.Pooling.MAX, kernel_size=3, stride=3)
    n.up = L.Deconvolution(n.pool, convolution_param=dict(num_output=1, kernel_size=4, stride=2))
    n.ip = L.InnerProduct(n.data, num_output=3)
    with pytest.raises(RuntimeError, match="not connected through layers that keep spatial coordinates"):
        coord_map_from_to(n.ip, n.data)
    with pytest.raises(RuntimeError):
        coord_map_from_to(n.other, n.data)
    with pytest.raises(UncroppableError, match="scales differ"):
        crop(n.up, n.data)
    n.wide = L.Deconvolution(n.data, convolution_param=dict(num_output=1, kernel_size=3, pad=2))
    with pytest.raises(AssertionError, match="outside the cropped one"):  # pycaffe's callers catch this
        crop(n.wide, n.data)
