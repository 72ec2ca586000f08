"""pycaffe's Net helpers (forward_all, forward_backward_all, set_input_arrays, HDF5 weights,
clear_param_diffs), Solver.apply_update, has_nccl, and the deploy classes Classifier and Detector,
against numpy oracles written from Caffe's documented behaviour."""
import os
import subprocess
import sys
from pathlib import Path

import numpy
import pytest
from PIL import Image

import scaffe
from scaffe import pycaffe

IP_NET = """force_backward: true
layer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ dim: {batch} dim: 3 dim: 4 dim: 4 }} }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "data" top: "ip"
  inner_product_param {{ num_output: 5 weight_filler {{ type: "gaussian" std: 0.5 }}
                         bias_filler {{ type: "uniform" min: -1 max: 1 }} }} }}
{head}
"""
SOFTMAX = 'layer { name: "prob" type: "Softmax" bottom: "ip" top: "prob" }'


def ip_net(tmp_path, batch=4, head=""):
    path = tmp_path / f"ip_{batch}_{len(head)}.prototxt"
    path.write_text(IP_NET.format(batch=batch, head=head))
    return scaffe.Net(str(path), scaffe.TEST)


def weights(net):
    w, b = (p.data.astype(numpy.float64) for p in net.params["ip"])
    return w, b


def softmax(z):
    e = numpy.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_forward_all_and_forward_backward_all(tmp_path):
    net = ip_net(tmp_path)
    w, b = weights(net)
    x = numpy.random.default_rng(0).standard_normal((10, 3, 4, 4)).astype(numpy.float32)
    out = net.forward_all(data=x)  # 10 items in batches of 4: the last one padded, the padding dropped
    assert set(out) == {"ip"} and out["ip"].shape == (10, 5)
    numpy.testing.assert_allclose(out["ip"], x.reshape(10, -1) @ w.T + b, rtol=1e-5, atol=1e-5)
    extra = net.forward_all(blobs=["data"], data=x)
    numpy.testing.assert_array_equal(extra["data"], x)
    top = numpy.random.default_rng(1).standard_normal((10, 5)).astype(numpy.float32)
    blobs, diffs = net.forward_backward_all(data=x, ip=top)
    numpy.testing.assert_allclose(blobs["ip"], out["ip"], rtol=1e-6)
    numpy.testing.assert_allclose(diffs["data"], (top @ w).reshape(x.shape), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="input arrays"):
        net.forward_all()
    with pytest.raises(ValueError, match="no blob named 'pixels'"):
        net.forward_all(pixels=x)
    with pytest.raises(ValueError, match="same number of items"):
        net.forward_backward_all(data=x, ip=top[:3])


def test_set_input_arrays(tmp_path):
    path = tmp_path / "memory.prototxt"
    path.write_text('layer { name: "d" type: "MemoryData" top: "data" top: "label" '
                    'memory_data_param { batch_size: 2 channels: 1 height: 2 width: 3 } }')
    net = scaffe.Net(str(path), scaffe.TEST)
    data = numpy.arange(24, dtype=numpy.float32).reshape(4, 1, 2, 3)
    labels = numpy.array([5, 6, 7, 8], dtype=numpy.float32)
    net.set_input_arrays(data, labels)
    for start in (0, 2, 0):  # batches in order, wrapping around
        out = net.forward()
        numpy.testing.assert_array_equal(out["data"], data[start:start + 2])
        numpy.testing.assert_array_equal(out["label"], labels[start:start + 2])
    with pytest.raises(RuntimeError, match="first layer is a MemoryData"):
        ip_net(tmp_path).set_input_arrays(data, labels)


def test_hdf5_weights_and_clear_param_diffs(tmp_path):
    net, other = ip_net(tmp_path), ip_net(tmp_path)
    stored = tmp_path / "weights_without_h5_suffix"
    net.save_hdf5(str(stored))
    other.load_hdf5(str(stored))
    for got, want in zip(other.params["ip"], net.params["ip"]):
        numpy.testing.assert_array_equal(got.data, want.data)
    net.save(str(tmp_path / "binary.caffemodel"))
    with pytest.raises(ValueError, match="not an HDF5"):
        other.load_hdf5(str(tmp_path / "binary.caffemodel"))
    net.forward(data=numpy.ones((4, 3, 4, 4), numpy.float32))
    net.backward(ip=numpy.ones((4, 5), numpy.float32))
    assert numpy.abs(net.params["ip"][0].diff).sum() > 0
    net.clear_param_diffs()
    assert all((p.diff == 0).all() for p in net.params["ip"])


def test_apply_update_and_has_nccl(tmp_path):
    net_file = tmp_path / "train.prototxt"
    net_file.write_text('layer { name: "d" type: "DummyData" top: "x" dummy_data_param { shape { dim: 2 dim: 3 } } }\n'
                        'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "y" '
                        'inner_product_param { num_output: 2 } }')
    solver_file = tmp_path / "solver.prototxt"
    solver_file.write_text(f'net: "{net_file}" base_lr: 0.25 lr_policy: "fixed" momentum: 0.5 max_iter: 1\n')
    solver = scaffe.SGDSolver(str(solver_file))
    weight = solver.net.params["ip"][0]
    weight.data[...] = 1
    weight.diff[...] = 2
    solver.apply_update()  # w -= lr * diff; the history starts at zero
    numpy.testing.assert_allclose(weight.data, 1 - 0.25 * 2)
    weight.diff[...] = 2  # (the update left its step in diff, as Caffe's does)
    solver.apply_update()  # with momentum: step = 0.5 * 0.5 + 0.25 * 2
    numpy.testing.assert_allclose(weight.data, 0.5 - (0.5 * 0.5 + 0.25 * 2))
    assert solver.iter == 0
    assert scaffe.has_nccl() is False


def write_png(path, rgb):
    Image.fromarray((rgb * 255).round().astype(numpy.uint8)).save(path)
    return str(path)


def test_classifier_predict(tmp_path):
    net = ip_net(tmp_path, batch=3, head=SOFTMAX)
    weights_file = str(tmp_path / "ip.caffemodel")
    net.save(weights_file)
    w, b = weights(net)
    mean = numpy.array([0.1, 0.2, 0.3])
    classifier = scaffe.Classifier(str(tmp_path / f"ip_3_{len(SOFTMAX)}.prototxt"), weights_file, image_dims=(6, 6),
                                   mean=mean, raw_scale=2.0, channel_swap=(2, 1, 0))
    images = [numpy.random.default_rng(i).uniform(size=(5, 7, 3)).astype(numpy.float32) for i in range(2)]

    def oracle(crop):
        x = crop.transpose(2, 0, 1)[::-1] * 2.0 - mean[:, None, None]
        return softmax(x.reshape(-1) @ w.T + b)

    resized = [scaffe.io.resize_image(im, (6, 6)) for im in images]
    centre = classifier.predict(images, oversample=False)
    numpy.testing.assert_allclose(centre, [oracle(r[1:5, 1:5]) for r in resized], rtol=1e-4, atol=1e-6)
    averaged = classifier.predict(images)
    crops = scaffe.io.oversample(resized, (4, 4))
    expected = numpy.array([oracle(c) for c in crops]).reshape(2, 10, 5).mean(axis=1)
    numpy.testing.assert_allclose(averaged, expected, rtol=1e-4, atol=1e-6)
    numpy.testing.assert_allclose(averaged.sum(axis=1), 1, rtol=1e-5)


def test_detector_windows_and_context(tmp_path):
    net = ip_net(tmp_path, batch=2, head=SOFTMAX)
    weights_file = str(tmp_path / "ip.caffemodel")
    net.save(weights_file)
    w, b = weights(net)
    model = str(tmp_path / f"ip_2_{len(SOFTMAX)}.prototxt")
    image = numpy.random.default_rng(3).uniform(size=(8, 8, 3))
    path = write_png(tmp_path / "image.png", image)
    loaded = scaffe.io.load_image(path)
    windows = [numpy.array([0, 0, 4, 4]), numpy.array([2, 1, 8, 7]), numpy.array([3, 3, 5, 6])]
    detector = scaffe.Detector(model, weights_file)
    found = detector.detect_windows([(path, windows)])
    assert [d["filename"] for d in found] == [path] * 3
    for detection, (y0, x0, y1, x1) in zip(found, windows):
        warped = scaffe.io.resize_image(loaded[y0:y1, x0:x1], (4, 4)).transpose(2, 0, 1)
        numpy.testing.assert_allclose(detection["prediction"], softmax(warped.reshape(-1) @ w.T + b), rtol=1e-4)
    # context_pad 1 of a 4-pixel input doubles the window around its centre (R-CNN's warp): window
    # rows/cols 2..3 grow to 0..5, which lie inside the image, so nothing is filled with the mean.
    padded = scaffe.Detector(model, weights_file, context_pad=1)
    numpy.testing.assert_allclose(padded.crop(loaded, numpy.array([2, 2, 4, 4])),
                                  scaffe.io.resize_image(loaded[0:6, 0:6], (4, 4)), rtol=1e-6)
    with pytest.raises(RuntimeError, match="selective_search_ijcv_with_python"):
        detector.detect_selective_search([path])


def test_solver_count_and_rank(monkeypatch, tmp_path):
    monkeypatch.setattr(pycaffe, "_solvers", {"count": None, "rank": None})
    assert (scaffe.solver_rank(), scaffe.solver_count()) == (0, 1)  # MPI not started in this process
    scaffe.set_solver_count(4)
    scaffe.set_solver_rank(3)
    assert (scaffe.solver_rank(), scaffe.solver_count()) == (3, 4)
    # Under mpiexec, once MPI has started (scaffe train starts it before building nets): the MPI job.
    mpiexec = Path(sys.executable).with_name("mpiexec")
    code = ("import sys; from mpi4py import MPI; import scaffe; "
            "open(sys.argv[1] + str(scaffe.solver_rank()), 'w').write(str(scaffe.solver_count()))")
    done = subprocess.run([str(mpiexec), "-n", "2", sys.executable, "-c", code, str(tmp_path / "rank")],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"),
                          start_new_session=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [(tmp_path / f"rank{r}").read_text() for r in (0, 1)] == ["2", "2"]
