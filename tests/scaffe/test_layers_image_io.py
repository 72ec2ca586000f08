"""ImageData, WindowData and HDF5Output: tiny images and files written here, read back as Caffe's layers
read and write them (list and window file formats, resizing, shuffling, fg/bg sampling, context padding,
the data/label datasets)."""
import h5py
import numpy
import pytest
from PIL import Image

from scaffe.blob import Blob
from scaffe.data.resize import resize_linear
from scaffe.layer_impls import create_layer
from scaffe.layer_impls.window_data import window_geometry
from scaffe.net import Net
from scaffe.io import parse_net_text
from scaffe.proto import caffe_pb2

TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST


def layer(text, phase=TRAIN, bottoms=(), num_tops=2, **attrs):
    """A layer from prototxt text, set up on float32 blobs; returns (layer, tops)."""
    lp = parse_net_text(f"layer {{ {text} }}").layer[0]
    instance = create_layer(lp, phase)
    for name, value in attrs.items():
        setattr(instance, name, value)
    tops = [Blob(()) for _ in range(num_tops)]
    instance.setup(list(bottoms), tops)
    instance.reshape(list(bottoms), tops)
    return instance, tops


def forward(instance, tops, bottoms=()):
    instance.reshape(list(bottoms), tops)
    instance.forward(list(bottoms), tops)
    return [t.data.copy() for t in tops]


def write_rgb(path, rgb):
    Image.fromarray(rgb.astype(numpy.uint8), mode="RGB").save(path)


def bgr_chw(rgb):
    return rgb[:, :, ::-1].transpose(2, 0, 1).astype(numpy.float32)


@pytest.fixture
def image_list(tmp_path):
    """Three 4 x 5 RGB images under tmp_path/images and a list file naming them with labels 10, 11, 12."""
    rng = numpy.random.default_rng(0)
    (tmp_path / "images").mkdir()
    images = [rng.integers(0, 256, (4, 5, 3)) for _ in range(3)]
    for k, rgb in enumerate(images):
        write_rgb(tmp_path / "images" / f"im{k}.png", rgb)
    (tmp_path / "list.txt").write_text("".join(f"im{k}.png {10 + k}\n" for k in range(3)))
    return tmp_path, images


def image_data(tmp_path, extra="", transform="", batch_size=2, **attrs):
    return layer(f'type: "ImageData" top: "data" top: "label" transform_param {{ {transform} }} '
                 f'image_data_param {{ source: "{tmp_path}/list.txt" root_folder: "{tmp_path}/images/" '
                 f'batch_size: {batch_size} {extra} }}', **attrs)


def test_image_data_reads_the_list_in_order_and_wraps_around(image_list):
    tmp_path, images = image_list
    instance, tops = image_data(tmp_path)
    assert tops[0].shape == (2, 3, 4, 5) and tops[1].shape == (2,)
    data, labels = forward(instance, tops)
    numpy.testing.assert_array_equal(data, [bgr_chw(images[0]), bgr_chw(images[1])])
    numpy.testing.assert_array_equal(labels, [10, 11])
    data, labels = forward(instance, tops)
    numpy.testing.assert_array_equal(data, [bgr_chw(images[2]), bgr_chw(images[0])])
    numpy.testing.assert_array_equal(labels, [12, 10])


def test_image_data_resizes_converts_to_grey_and_transforms(image_list):
    tmp_path, images = image_list
    instance, tops = image_data(tmp_path, "new_height: 6 new_width: 8 is_color: false",
                                "scale: 0.5 mean_value: 100", batch_size=1)
    (data, _) = forward(instance, tops)
    grey = numpy.asarray(Image.fromarray(images[0].astype(numpy.uint8)).convert("L"))
    resized = resize_linear(grey[None], 6, 8)[0]  # OpenCV's bilinear resize, as Caffe's (test_resize.py)
    numpy.testing.assert_allclose(data[0, 0], (resized.astype(numpy.float32) - 100) * 0.5)
    assert data.shape == (1, 1, 6, 8)


def test_image_data_shuffles_every_pass_keeping_labels_with_images(image_list):
    tmp_path, images = image_list
    instance, tops = image_data(tmp_path, "shuffle: true", batch_size=3, random_seed=5)
    orders = []
    for _ in range(4):
        data, labels = forward(instance, tops)
        order = labels.astype(int) - 10
        assert sorted(order) == [0, 1, 2]
        numpy.testing.assert_array_equal(data, [bgr_chw(images[k]) for k in order])
        orders.append(tuple(order))
    assert len(set(orders)) > 1


def test_image_data_shards_the_line_stream(image_list):
    tmp_path, _ = image_list
    labels = [forward(*image_data(tmp_path, batch_size=3, shard_rank=r, shard_count=2))[1] for r in (0, 1)]
    numpy.testing.assert_array_equal(labels, [[10, 12, 11], [11, 10, 12]])


def test_image_data_takes_names_with_spaces_and_sizes_each_batch_by_its_image(image_list):
    tmp_path, images = image_list
    write_rgb(tmp_path / "images" / "big cat.png", numpy.zeros((6, 7, 3)))
    (tmp_path / "list.txt").write_text("im0.png 1\nbig cat.png 2\n")
    instance, tops = image_data(tmp_path, batch_size=1)
    assert forward(instance, tops)[0].shape == (1, 3, 4, 5)
    data, labels = forward(instance, tops)
    assert data.shape == (1, 3, 6, 7) and labels[0] == 2


def test_image_data_names_what_is_wrong(image_list):
    tmp_path, _ = image_list
    with pytest.raises(ValueError, match="new_height and new_width together"):
        image_data(tmp_path, "new_height: 6")
    (tmp_path / "list.txt").write_text("missing.png 1\n")
    with pytest.raises(FileNotFoundError, match="missing.png"):
        image_data(tmp_path)


def test_image_data_in_a_net_feeds_a_classifier(image_list):
    tmp_path, _ = image_list
    net = Net(parse_net_text(f"""
        layer {{ name: "in" type: "ImageData" top: "data" top: "label"
                image_data_param {{ source: "{tmp_path}/list.txt" root_folder: "{tmp_path}/images/" batch_size: 3 }} }}
        layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
                inner_product_param {{ num_output: 13 weight_filler {{ type: "xavier" }} }} }}
        layer {{ name: "loss" type: "SoftmaxWithLoss" bottom: "ip" bottom: "label" top: "loss" }}"""), TRAIN)
    net.forward()
    net.backward()
    assert numpy.isfinite(net.blobs_list[net.blob_names_index["loss"]].data).all()


# ---------------------------------------------------------------- WindowData

def test_window_geometry_follows_caffes_arithmetic():
    # warp without context: the window itself, warped to the whole crop
    assert window_geometry((2, 3, 5, 6), (10, 10), 4, 0, False, False) == ((2, 3, 5, 6), (4, 4), (0, 0))
    # square: a 4 x 2 window grows to a square around its centre (Caffe's +1 makes it 5 x 5)
    assert window_geometry((2, 3, 5, 4), (10, 10), 5, 0, True, False) == ((2, 2, 6, 6), (5, 5), (0, 0))
    # context_pad 1 at the top-left corner: the part outside the image becomes padding
    assert window_geometry((0, 0, 3, 3), (8, 8), 6, 1, False, False) == ((0, 0, 5, 5), (5, 5), (1, 1))
    # ... which moves to the right edge when the crop is mirrored
    assert window_geometry((0, 0, 3, 3), (8, 8), 6, 1, False, True) == ((0, 0, 5, 5), (5, 5), (1, 0))


@pytest.fixture
def window_file(tmp_path):
    """One 8 x 10 image with a foreground (label 3), a background and an unused window."""
    rgb = numpy.random.default_rng(1).integers(0, 256, (8, 10, 3))
    write_rgb(tmp_path / "scene.png", rgb)
    (tmp_path / "windows.txt").write_text(
        "# 0\nscene.png\n3\n8\n10\n3\n"
        "3 0.9 1 2 4 5\n"     # foreground: x 1..4, y 2..5
        "5 0.1 5 0 8 3\n"     # background (its label becomes 0)
        "2 0.4 0 0 3 3\n")    # between the thresholds: unused
    return tmp_path, rgb


def window_data(tmp_path, extra="", transform="crop_size: 4", batch_size=4, fg_fraction=0.5, **attrs):
    return layer(f'type: "WindowData" top: "data" top: "label" transform_param {{ {transform} }} '
                 f'window_data_param {{ source: "{tmp_path}/windows.txt" root_folder: "{tmp_path}/" '
                 f'batch_size: {batch_size} fg_threshold: 0.5 bg_threshold: 0.3 fg_fraction: {fg_fraction} {extra} }}',
                 **attrs)


def test_window_data_samples_background_then_foreground_windows(window_file):
    tmp_path, rgb = window_file
    instance, tops = window_data(tmp_path, "scale: 0.5", "crop_size: 4 mean_value: 7", random_seed=0)
    assert tops[0].shape == (4, 3, 4, 4)
    data, labels = forward(instance, tops)
    numpy.testing.assert_array_equal(labels, [0, 0, 3, 3])
    pixels = bgr_chw(rgb)
    for item, (x1, y1) in enumerate([(5, 0), (5, 0), (1, 2), (1, 2)]):
        numpy.testing.assert_allclose(data[item], (pixels[:, y1:y1 + 4, x1:x1 + 4] - 7) * 0.5)


def test_window_data_pads_context_outside_the_image_with_zeros(tmp_path):
    write_rgb(tmp_path / "flat.png", numpy.full((8, 8, 3), 200))
    (tmp_path / "windows.txt").write_text("# 0 flat.png 3 8 8 2\n1 1.0 0 0 3 3\n1 0.0 4 4 7 7\n")
    instance, tops = window_data(tmp_path, "context_pad: 1", "crop_size: 6 mirror: true", batch_size=8,
                                 fg_fraction=1, random_seed=3)
    (data, labels) = forward(instance, tops)
    assert (labels == 1).all()
    # The window's top-left context lies outside the image: row 0 stays 0, and column 0, or column 5
    # when the crop is mirrored.
    assert not data[:, :, 0, :].any() and (data[:, :, 1:, 1:5] == 200).all()
    mirrored = data[:, 0, 1, 0] == 200
    assert mirrored.any() and not mirrored.all()
    assert not data[~mirrored][:, :, :, 0].any() and (data[~mirrored][:, :, 1:, 5] == 200).all()
    assert not data[mirrored][:, :, :, 5].any() and (data[mirrored][:, :, 1:, 0] == 200).all()


@pytest.mark.parametrize("lines,message", [
    ("# 0 scene.png 3 8 10 1\n0 0.9 1 2 4 5\n", "labels must be positive"),
    ("# 0 scene.png 3 8 10 1\n3 0.9 1 2 4 5\n", "0 background"),
    ("# 0 scene.png 3 8 10 2\n3 0.9 1 2 4 5\n", "file ends first"),
])
def test_window_data_names_a_bad_window_file(window_file, lines, message):
    tmp_path, _ = window_file
    (tmp_path / "windows.txt").write_text(lines)
    with pytest.raises(ValueError, match=message):
        window_data(tmp_path)


def test_window_data_needs_a_crop_size(window_file):
    with pytest.raises(ValueError, match="crop_size must be positive"):
        window_data(window_file[0], transform="")


# ---------------------------------------------------------------- HDF5Output

def test_hdf5_output_writes_data_and_label_in_caffes_4d_shape(tmp_path):
    path = tmp_path / "out.h5"
    data, label = Blob((2, 3, 2)), Blob((2,))
    data.data[...] = numpy.arange(12).reshape(2, 3, 2)
    label.data[...] = [4, 5]
    instance, _ = layer(f'type: "HDF5Output" hdf5_output_param {{ file_name: "{path}" }}', bottoms=[data, label],
                        num_tops=0)
    assert path.exists()
    forward(instance, [], [data, label])
    with h5py.File(path, "r") as f:
        numpy.testing.assert_array_equal(f["data"][()], numpy.arange(12).reshape(2, 3, 2, 1))
        numpy.testing.assert_array_equal(f["label"][()], numpy.array([4, 5]).reshape(2, 1, 1, 1))
    data.data[...] += 1
    forward(instance, [], [data, label])
    with h5py.File(path, "r") as f:
        numpy.testing.assert_array_equal(f["data"][()], 1 + numpy.arange(12).reshape(2, 3, 2, 1))


def test_what_hdf5_output_writes_hdf5_data_reads_back(tmp_path):
    out = tmp_path / "out.h5"
    writer = Net(parse_net_text(f"""
        layer {{ name: "in" type: "DummyData" top: "data" top: "label"
                dummy_data_param {{ shape {{ dim: 3 dim: 2 dim: 2 dim: 2 }} shape {{ dim: 3 }}
                                    data_filler {{ type: "gaussian" }} data_filler {{ type: "constant" value: 2 }} }} }}
        layer {{ name: "out" type: "HDF5Output" bottom: "data" bottom: "label"
                hdf5_output_param {{ file_name: "{out}" }} }}"""), TEST)
    writer.forward()
    written = writer.blobs_list[writer.blob_names_index["data"]].data.copy()
    (tmp_path / "list.txt").write_text(f"{out}\n")
    reader, tops = layer(f'type: "HDF5Data" top: "data" top: "label" '
                         f'hdf5_data_param {{ source: "{tmp_path}/list.txt" batch_size: 3 }}')
    data, labels = forward(reader, tops)
    numpy.testing.assert_array_equal(data, written)
    numpy.testing.assert_array_equal(labels.reshape(-1), [2, 2, 2])
