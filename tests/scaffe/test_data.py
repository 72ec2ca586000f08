"""Data input: LMDB reading and sharding, Datum decoding, the transformer, prefetching, the data
layers and the conversion tools, checked against the LMDB and idx files written for Caffe."""
import hashlib
import os
import threading
import time
from pathlib import Path

import numpy
import pytest

from scaffe import io
from scaffe.blob import Blob
from scaffe.data import (DataTransformer, LMDBDatabase, Prefetcher, PrefetchError, ShardedCursor, ShardSpec,
                         array_to_datum, datum_to_array, encode_image, rank_batch_positions)
from scaffe.data.resize import resize_linear
from scaffe.layer_impls import create_layer
from scaffe.log import setup_logging
from scaffe.proto import caffe_pb2
from scaffe.tools import compute_image_mean, convert_imageset, convert_mnist

REPO = Path(__file__).resolve().parents[2]
REF = REPO.parent / "shared" / "caffe-reference"
needs_ref = pytest.mark.skipif(not REF.is_dir(), reason="caffe-reference folder not present")
TRAIN, TEST = caffe_pb2.TRAIN, caffe_pb2.TEST


@pytest.fixture(scope="module")
def digits():
    """The 256 reference digits (uint8 N x 1 x 28 x 28) and labels, from the idx files."""
    if not REF.is_dir():
        pytest.skip("caffe-reference folder not present")
    images = convert_mnist.read_idx_images(REF / "digits-images-idx3-ubyte.gz")[:, None]
    labels = convert_mnist.read_idx_labels(REF / "digits-labels-idx1-ubyte.gz")
    return images, labels


def data_layer(source, batch_size=8, phase=TRAIN, tops=("data", "label"), transform="scale: 0.00390625", **attrs):
    param = io.parse_net_text(f'layer {{ name: "digits" type: "Data" {" ".join(f"top: {t!r}" for t in tops)}'
                              f' transform_param {{ {transform} }}'
                              f' data_param {{ source: "{source}" batch_size: {batch_size} backend: LMDB }} }}'
                              .replace("'", '"')).layer[0]
    layer = create_layer(param, phase)
    for k, v in attrs.items():
        setattr(layer, k, v)
    top = [Blob() for _ in tops]
    layer.setup([], top)
    return layer, top


# ---------------------------------------------------------------- LMDB, Datum, conversion

@needs_ref
def test_reference_lmdb_decodes_to_the_idx_pixels(digits):
    images, labels = digits
    with LMDBDatabase(REF / "digits_lmdb") as db:
        items = list(db.items())
    assert len(items) == 256 and [k for k, _ in items] == [b"%08d" % i for i in range(256)]
    for i, (_, value) in enumerate(items):
        assert len(value) == 795
        array, label = datum_to_array(value)
        assert array.dtype == numpy.uint8 and label == labels[i]
        numpy.testing.assert_array_equal(array, images[i])


@needs_ref
def test_convert_mnist_writes_caffes_exact_records(tmp_path):
    rc = convert_mnist.main([str(REF / "digits-images-idx3-ubyte.gz"), str(REF / "digits-labels-idx1-ubyte.gz"),
                             str(tmp_path / "db")])
    assert rc == 0
    with LMDBDatabase(REF / "digits_lmdb") as caffe_db, LMDBDatabase(tmp_path / "db") as ours:
        assert list(ours.items()) == list(caffe_db.items())
    assert convert_mnist.main([str(REF / "digits-images-idx3-ubyte.gz"), str(REF / "digits-labels-idx1-ubyte.gz"),
                               str(tmp_path / "db")]) == 1  # refuses to overwrite, like Caffe


def test_bundled_mnist_subset_and_ensure_lmdb(tmp_path):
    data_dir = convert_mnist.bundled_mnist_dir()
    sums = {"train-images-idx3-ubyte.gz": "864800e87d207bc1d324dd9212ce9d4a7e3ed41535abaa96f103d0f397313a3e",
            "t10k-labels-idx1-ubyte.gz": "e1a33a5c06597bf4203dfa75ff7c8a2818c96e1b4769be0a9b93a7098d671351"}
    for name, digest in sums.items():
        assert hashlib.sha256((data_dir / name).read_bytes()).hexdigest() == digest
    train_labels = convert_mnist.read_idx_labels(data_dir / "train-labels-idx1-ubyte.gz")
    test_images = convert_mnist.read_idx_images(data_dir / "t10k-images-idx3-ubyte.gz")
    assert len(train_labels) == 4000 and test_images.shape == (1000, 28, 28)
    assert (numpy.bincount(train_labels) == 400).all()
    train_db, test_db = convert_mnist.ensure_mnist_lmdb(tmp_path / "mnist")
    with LMDBDatabase(train_db) as a, LMDBDatabase(test_db) as b:
        assert (len(a), len(b)) == (4000, 1000)
        array, label = datum_to_array(b.get("00000007"))
        numpy.testing.assert_array_equal(array[0], test_images[7])
    stamp = os.stat(Path(train_db) / "data.mdb").st_mtime_ns
    assert convert_mnist.ensure_mnist_lmdb(tmp_path / "mnist") == (train_db, test_db)  # second call: no rebuild
    assert os.stat(Path(train_db) / "data.mdb").st_mtime_ns == stamp
    assert sorted(os.listdir(tmp_path / "mnist")) == ["mnist_test_lmdb", "mnist_train_lmdb"]


def test_datum_forms():
    pytest.importorskip("PIL")
    bgr = numpy.random.RandomState(0).randint(0, 256, (3, 5, 7)).astype(numpy.uint8)
    png = array_to_datum(None, 4, encoded_bytes=encode_image(bgr, "PNG"))
    assert png.encoded and not png.HasField("channels")
    decoded, label = datum_to_array(png.SerializeToString())
    numpy.testing.assert_array_equal(decoded, bgr)
    assert label == 4
    grey, _ = datum_to_array(png, color=False)  # force_gray
    assert grey.shape == (1, 5, 7)
    floats = array_to_datum(numpy.arange(6, dtype=numpy.float32).reshape(1, 2, 3) / 7, 2)
    arr, _ = datum_to_array(floats)
    assert arr.dtype == numpy.float32 and arr.shape == (1, 2, 3) and len(floats.float_data) == 6
    with pytest.raises(ValueError, match="bytes for shape"):
        datum_to_array(caffe_pb2.Datum(channels=1, height=2, width=2, data=b"abc"))


@needs_ref
def test_compute_image_mean_matches_numpy(tmp_path, digits, capsys):
    images, _ = digits
    setup_logging()  # as the command line does before the tool runs
    assert compute_image_mean.main([str(REF / "digits_lmdb"), str(tmp_path / "mean.binaryproto")]) == 0
    blob = io.read_blobproto(tmp_path / "mean.binaryproto")
    assert (blob.num, blob.channels, blob.height, blob.width) == (1, 1, 28, 28)  # Caffe's legacy header
    numpy.testing.assert_allclose(io.read_mean_file(tmp_path / "mean.binaryproto"),
                                  images.mean(axis=0, dtype=numpy.float64), rtol=1e-6)
    assert "mean_value channel [0]:" in capsys.readouterr().err  # glog lines, on stderr as Caffe's tool


def test_convert_imageset_raw_and_encoded(tmp_path):
    Image = pytest.importorskip("PIL.Image")
    rng = numpy.random.RandomState(3)
    pictures = [rng.randint(0, 256, (6, 9, 3)).astype(numpy.uint8) for _ in range(5)]
    (tmp_path / "img dir").mkdir()
    lines = []
    for i, rgb in enumerate(pictures):
        Image.fromarray(rgb).save(tmp_path / "img dir" / f"p {i}.png")
        lines.append(f"img dir/p {i}.png {i % 3}")
    (tmp_path / "list.txt").write_text("\n".join(lines) + "\n")
    root = str(tmp_path) + os.sep
    assert convert_imageset.main([root, str(tmp_path / "list.txt"), str(tmp_path / "raw")]) == 0
    assert convert_imageset.main(["--encoded", "--shuffle", root, str(tmp_path / "list.txt"), str(tmp_path / "enc")]) == 0
    assert convert_imageset.main(["-gray", "--resize_height=3", "--resize_width=4", root,
                                  str(tmp_path / "list.txt"), str(tmp_path / "small")]) == 0
    with LMDBDatabase(tmp_path / "raw") as raw, LMDBDatabase(tmp_path / "enc") as enc, \
            LMDBDatabase(tmp_path / "small") as small:
        raw_items = list(raw.items())
        assert [k for k, _ in raw_items] == [f"{i:08d}_img dir/p {i}.png".encode() for i in range(5)]
        for i, (_, value) in enumerate(raw_items):
            array, label = datum_to_array(value)
            numpy.testing.assert_array_equal(array, pictures[i][:, :, ::-1].transpose(2, 0, 1))  # BGR, C x H x W
            assert label == i % 3
        for key, value in enc.items():
            i = int(key.decode().rsplit(" ", 1)[1].split(".")[0])
            datum = caffe_pb2.Datum.FromString(value)
            assert datum.encoded and datum.data == (tmp_path / "img dir" / f"p {i}.png").read_bytes()
        grey = numpy.asarray(Image.fromarray(pictures[0]).convert("L"))[None]
        # resized as Caffe's OpenCV does (scaffe.data.resize, tests/scaffe/test_resize.py)
        numpy.testing.assert_array_equal(datum_to_array(next(small.items())[1])[0], resize_linear(grey, 3, 4))
    (tmp_path / "bad.txt").write_text("no_label_here\n")
    assert convert_imageset.main([root, str(tmp_path / "bad.txt"), str(tmp_path / "x")]) == 1


# ---------------------------------------------------------------- sharding

@needs_ref
def test_sharded_cursors_partition_the_single_rank_stream():
    with LMDBDatabase(REF / "digits_lmdb") as db:
        single = ShardedCursor(db)
        stream = [int(single.next()[0]) for _ in range(600)]
        assert stream == [i % 256 for i in range(600)]  # key order, wrapping around
        ranks, batch = 3, 8
        cursors = [ShardedCursor(db, ShardSpec(r, ranks)) for r in range(ranks)]
        for k in range(25):  # 25 batches of 24 records cross the end of the 256 records twice
            got = {r: [int(cursors[r].next()[0]) for _ in range(batch)] for r in range(ranks)}
            big_batch = stream[k * ranks * batch:(k + 1) * ranks * batch]
            assert sorted(sum(got.values(), [])) == sorted(big_batch)
            for r in range(ranks):  # the exact mapping documented in scaffe.data.sharding
                assert got[r] == [stream[g] for g in rank_batch_positions(k, batch, r, ranks)]
                assert got[r] == big_batch[r::ranks]
        for c in cursors + [single]:
            c.close()
    with pytest.raises(ValueError):
        ShardSpec(3, 3)


@needs_ref
def test_data_layer_batches_equal_caffes(digits):
    images, labels = digits
    layer, top = data_layer("digits_lmdb", data_root=str(REF))
    assert top[0].shape == (8, 1, 28, 28) and top[1].shape == (8,)
    for k in range(33):  # one wrap-around: batch 32 is records 0..7 again
        layer.forward([], top)
        rows = numpy.arange(8 * k, 8 * k + 8) % 256
        numpy.testing.assert_array_equal(top[0].data, images[rows].astype(numpy.float32) / 256)
        numpy.testing.assert_array_equal(top[1].data, labels[rows].astype(numpy.float32))
    layer.close()
    test_layer, test_top = data_layer("digits_lmdb", phase=TEST, data_root=str(REF))
    test_layer.forward([], test_top)
    numpy.testing.assert_array_equal(test_top[0].data, numpy.load(REF / "reference" / "test20__fwd__digits__data.npy"))
    numpy.testing.assert_array_equal(test_top[1].data, numpy.load(REF / "reference" / "train0__fwd__digits__label.npy"))
    test_layer.close()


@needs_ref
def test_sharded_data_layers_see_the_single_rank_samples(digits):
    images, _ = digits
    single, single_top = data_layer("digits_lmdb", batch_size=12, data_root=str(REF))
    ranks = [data_layer("digits_lmdb", batch_size=4, data_root=str(REF), shard_rank=r, shard_count=3)
             for r in range(3)]
    for _ in range(23):  # 23 x 12 = 276 > 256 records: wraps
        single.forward([], single_top)
        parts = []
        for layer, top in ranks:
            layer.forward([], top)
            parts.append(top[0].data.copy())
        interleaved = numpy.stack(parts, axis=1).reshape(single_top[0].shape)  # rank r holds column r
        numpy.testing.assert_array_equal(interleaved, single_top[0].data)
    for layer, _ in ranks + [(single, None)]:
        layer.close()


def test_data_layer_errors_name_layer_and_path(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"layer 'digits' \(Data\).*nowhere_lmdb"):
        data_layer(str(tmp_path / "nowhere_lmdb"))
    (tmp_path / "ldb").mkdir()
    (tmp_path / "ldb" / "CURRENT").write_text("MANIFEST-000001\n")
    with pytest.raises(ValueError, match="LevelDB"):
        data_layer(str(tmp_path / "ldb"))


@needs_ref
def test_data_layer_crop_mirror_mean_value(digits):
    images, _ = digits
    layer, top = data_layer("digits_lmdb", phase=TEST, transform="crop_size: 20 mean_value: 10 scale: 0.5",
                            tops=("data",), data_root=str(REF))
    layer.forward([], top)
    assert top[0].shape == (8, 1, 20, 20)
    numpy.testing.assert_array_equal(top[0].data, (images[:8, :, 4:24, 4:24].astype(numpy.float32) - 10) * 0.5)
    layer.close()


# ---------------------------------------------------------------- transformer

def test_transformer_semantics(tmp_path):
    sample = numpy.arange(2 * 6 * 8, dtype=numpy.uint8).reshape(2, 6, 8)
    mean = numpy.random.RandomState(0).uniform(0, 5, sample.shape).astype(numpy.float32)
    io.write_blobproto(io.array_to_blobproto(mean[None], legacy_4d=True), tmp_path / "mean.binaryproto")
    param = caffe_pb2.TransformationParameter(crop_size=4, mean_file=str(tmp_path / "mean.binaryproto"), scale=2)
    center = DataTransformer(param, TEST).transform(sample)
    numpy.testing.assert_array_equal(center, (sample[:, 1:5, 2:6].astype(numpy.float32) - mean[:, 1:5, 2:6]) * 2)
    train = DataTransformer(param, TRAIN, rng=numpy.random.RandomState(1))
    seen = set()
    for _ in range(200):
        out = train.transform(sample)
        # locate the window from its first value: every crop is a true window of (sample - mean) * 2
        full = (sample.astype(numpy.float32) - mean) * 2
        hits = [(h, w) for h in range(3) for w in range(5) if numpy.array_equal(full[:, h:h + 4, w:w + 4], out)]
        assert len(hits) == 1
        seen.add(hits[0])
    assert len(seen) == 15  # every offset (H - crop + 1) x (W - crop + 1) occurs
    mirror = DataTransformer(caffe_pb2.TransformationParameter(mirror=True), TEST, rng=numpy.random.RandomState(2))
    flips = [numpy.array_equal(mirror.transform(sample), sample[:, :, ::-1]) for _ in range(100)]
    assert 20 < sum(flips) < 80  # random in TEST too, as in Caffe
    per_channel = DataTransformer(caffe_pb2.TransformationParameter(mean_value=[1, 2]), TEST).transform(sample)
    numpy.testing.assert_array_equal(per_channel[1], sample[1] - 2.0)
    with pytest.raises(ValueError, match="mean_value"):
        DataTransformer(caffe_pb2.TransformationParameter(mean_value=[1, 2, 3]), TEST).transform(sample)
    with pytest.raises(ValueError, match="cannot both"):
        DataTransformer(caffe_pb2.TransformationParameter(mean_value=[1], mean_file="m"), TEST)
    assert DataTransformer(param, TEST).output_shape((2, 6, 8)) == (2, 4, 4)


# ---------------------------------------------------------------- prefetch

def test_prefetcher_order_and_error_propagation():
    counter = iter(range(100))
    with Prefetcher(lambda: next(counter), depth=3) as p:
        assert [p.next() for _ in range(10)] == list(range(10))

    calls = []

    def failing():
        calls.append(1)
        if len(calls) == 3:
            raise OSError("disk went away")
        return len(calls)

    p = Prefetcher(failing, depth=2)
    assert p.next() == 1 and p.next() == 2
    with pytest.raises(PrefetchError, match="disk went away") as err:
        p.next()
    assert isinstance(err.value.__cause__, OSError)
    with pytest.raises(PrefetchError):
        p.next()
    p.close()

    blocked = Prefetcher(lambda: time.sleep(0.01) or 1, depth=1)
    blocked.next()
    blocked.close()
    assert not blocked.alive
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("scaffe-"))


# ---------------------------------------------------------------- other data layers

def test_hdf5_data_layer(tmp_path):
    h5py = pytest.importorskip("h5py")
    rows = []
    for f in range(2):
        data = numpy.arange(5 * 3, dtype=numpy.float64).reshape(5, 3) + 100 * f
        with h5py.File(tmp_path / f"part{f}.h5", "w") as h:
            h["data"] = data
            h["label"] = numpy.arange(5, dtype=numpy.int32)[:, None] + 10 * f
        rows += list(data)
    (tmp_path / "list.txt").write_text("part0.h5\n\npart1.h5\n")  # relative to the list file
    param = io.parse_net_text(f'layer {{ name: "h" type: "HDF5Data" top: "data" top: "label" '
                              f'hdf5_data_param {{ source: "{tmp_path / "list.txt"}" batch_size: 4 }} }}').layer[0]
    layer, top = create_layer(param, TRAIN), [Blob(), Blob()]
    layer.setup([], top)
    assert top[0].shape == (4, 3) and top[1].shape == (4, 1)
    got = []
    for _ in range(5):
        layer.forward([], top)
        got += list(top[0].data.copy())
    numpy.testing.assert_array_equal(numpy.array(got), numpy.array((rows * 2)[:20], dtype=numpy.float32))
    # Two shards split the row stream round-robin.
    shards = []
    for r in range(2):
        l, t = create_layer(param, TRAIN), [Blob(), Blob()]
        l.shard_rank, l.shard_count = r, 2
        l.setup([], t)
        l.forward([], t)
        shards.append(t[0].data.copy())
    numpy.testing.assert_array_equal(numpy.stack(shards, 1).reshape(8, 3), numpy.array(rows[:8], numpy.float32))
    # shuffle: one pass over 10 rows still yields every row exactly once
    param.hdf5_data_param.shuffle = True
    param.hdf5_data_param.batch_size = 10
    l, t = create_layer(param, TRAIN), [Blob(), Blob()]
    l.random_seed = 3
    l.setup([], t)
    l.forward([], t)
    assert sorted(map(tuple, t[0].data)) == sorted(map(tuple, numpy.array(rows, numpy.float32)))
    param.hdf5_data_param.source = str(tmp_path / "missing.txt")
    with pytest.raises(FileNotFoundError, match=r"layer 'h' \(HDF5Data\).*missing.txt"):
        create_layer(param, TRAIN).setup([], [Blob(), Blob()])


def test_input_dummy_and_memory_layers():
    net = io.parse_net_text('''
        layer { name: "in" type: "Input" top: "a" top: "b" input_param { shape { dim: 2 dim: 3 } shape { dim: 4 } } }
        layer { name: "dummy" type: "DummyData" top: "c" top: "d"
                dummy_data_param { shape { dim: 2 dim: 5 } data_filler { type: "constant" value: 7 }
                                   data_filler { type: "gaussian" std: 1 } } }
        layer { name: "legacy" type: "DummyData" top: "e" dummy_data_param { num: 2 channels: 1 height: 3 width: 3 } }
        layer { name: "mem" type: "MemoryData" top: "x" top: "y"
                memory_data_param { batch_size: 2 channels: 1 height: 2 width: 2 } }''')
    layers = {l.name: create_layer(l, TRAIN) for l in net.layer}
    a, b = Blob(), Blob()
    layers["in"].setup([], [a, b])
    assert a.shape == (2, 3) and b.shape == (4,)
    c, d = Blob(), Blob()
    layers["dummy"].random_seed = 0
    layers["dummy"].setup([], [c, d])
    assert c.shape == d.shape == (2, 5) and (c.data == 7).all()
    before = d.data.copy()
    layers["dummy"].forward([], [c, d])
    assert not numpy.array_equal(before, d.data) and (c.data == 7).all()  # random tops refill
    e = Blob()
    layers["legacy"].setup([], [e])
    assert e.shape == (2, 1, 3, 3) and (e.data == 0).all()
    x, y = Blob(), Blob()
    mem = layers["mem"]
    mem.setup([], [x, y])
    with pytest.raises(RuntimeError, match="set_input_arrays"):
        mem.forward([], [x, y])
    data = numpy.arange(6 * 4, dtype=numpy.float32).reshape(6, 1, 2, 2)
    mem.set_input_arrays(data, numpy.arange(6))
    for k in (0, 2, 4, 0):
        mem.forward([], [x, y])
        numpy.testing.assert_array_equal(x.data, data[k:k + 2])
        numpy.testing.assert_array_equal(y.data, [k, k + 1])
    with pytest.raises(ValueError, match="multiple of batch_size"):
        mem.set_input_arrays(data[:3], numpy.arange(3))
