"""LeNet on the GPU path under the cupy stand-in: its Data layer's uploads, and `scaffe train|test|time
--gpu 0`, which compute on cupy and give the CPU run's numbers."""
import re
import subprocess
import sys

import numpy
import pytest

from scaffe import io as sio
from scaffe.cli import main
from scaffe.proto import caffe_pb2
from test_cupy_nets import EXAMPLES

SOLVER = """net: "lenet.prototxt"
test_iter: 1 test_interval: 2 base_lr: 0.01 momentum: 0.9 weight_decay: 0.0005
lr_policy: "inv" gamma: 0.0001 power: 0.75 display: 1 max_iter: 2 snapshot: 2 random_seed: 1
snapshot_prefix: "%s"
"""


@pytest.fixture(scope="module")
def lenet_dir(tmp_path_factory):
    """LeNet (examples/mnist) at batch 8 on the bundled digits, with a solver for 2 iterations."""
    from scaffe.tools.convert_mnist import ensure_mnist_lmdb
    work = tmp_path_factory.mktemp("lenet_gpu")
    train_db, test_db = ensure_mnist_lmdb(work)
    net = sio.read_net_prototxt(EXAMPLES / "mnist" / "lenet_train_test.prototxt")
    for layer in net.layer:
        if layer.type == "Data":
            train = layer.include[0].phase == caffe_pb2.TRAIN
            layer.data_param.source = train_db if train else test_db
            layer.data_param.batch_size = 8
    (work / "lenet.prototxt").write_text(str(net))
    for prefix in ("cpu", "gpu"):
        (work / f"solver_{prefix}.prototxt").write_text(SOLVER % prefix)
    return work


def test_data_layer_uploads_batches_from_pinned_memory_in_its_thread(cupy_stand_in, lenet_dir):
    from scaffe.net import Net
    counters = cupy_stand_in._stand_in.counters
    host = Net.from_file(lenet_dir / "lenet.prototxt", "TRAIN")
    device = Net.from_file(lenet_dir / "lenet.prototxt", "TRAIN", xp=cupy_stand_in)
    try:
        for _ in range(3):
            before = dict(counters)
            host.forward_from_to(0, 0)
            device.forward_from_to(0, 0)
            # data and labels, each from a pinned buffer, each checked against the CPU's batch
            numpy.testing.assert_array_equal(device.blobs["data"].data.get(), host.blobs["data"].data)
            numpy.testing.assert_array_equal(device.blobs["label"].data.get(), host.blobs["label"].data)
            assert counters["pageable_upload"] == before.get("pageable_upload", 0)
            assert counters["synchronize"] == before.get("synchronize", 0)  # the helper thread waits, if anyone
    finally:
        host.close()
        device.close()
    assert counters["pinned_upload"] >= 6


def test_the_stand_in_catches_a_missing_wait_for_the_upload(cupy_stand_in, lenet_dir, monkeypatch):
    monkeypatch.setattr(cupy_stand_in.cuda.Stream, "wait_event", lambda stream, event: None)
    with pytest.raises(AssertionError, match="Arrays are not equal"):
        test_data_layer_uploads_batches_from_pinned_memory_in_its_thread(cupy_stand_in, lenet_dir)


def run(capsys, *argv):
    code = main(list(argv))
    err = capsys.readouterr().err
    assert code == 0, err
    return err


def values(err, pattern):
    return [float(v) for v in re.findall(pattern, err)]


def test_train_on_the_gpu_matches_the_cpu(cupy_stand_in, lenet_dir, monkeypatch, capsys):
    monkeypatch.chdir(lenet_dir)
    cpu = run(capsys, "train", "--solver=solver_cpu.prototxt")
    gpu = run(capsys, "train", "--solver=solver_gpu.prototxt", "--gpu", "0")
    assert "Use GPU with device ID 0" in gpu
    assert cupy_stand_in._stand_in.counters["launch:scaffe_im2col"] > 0
    for pattern in (r"Iteration \d+ \(.*\), loss = ([\d.e+-]+)", r"Test net output #0: accuracy = ([\d.e+-]+)",
                    r"Test net output #1: loss = ([\d.e+-]+)"):
        assert values(gpu, pattern) == pytest.approx(values(cpu, pattern), rel=1e-4), pattern
    for name, arrays in sio.read_weights(lenet_dir / "cpu_iter_2.caffemodel").items():
        for a, b in zip(sio.read_weights(lenet_dir / "gpu_iter_2.caffemodel")[name], arrays):
            numpy.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_test_command_computes_on_the_gpu(cupy_stand_in, lenet_dir, monkeypatch, capsys):
    monkeypatch.chdir(lenet_dir)
    if not (lenet_dir / "cpu_iter_2.caffemodel").exists():
        run(capsys, "train", "--solver=solver_cpu.prototxt")
    argv = ("test", "--model=lenet.prototxt", "--weights=cpu_iter_2.caffemodel", "--iterations=2")
    cpu = run(capsys, *argv)
    cupy_stand_in._stand_in.reset()
    gpu = run(capsys, *argv, "--gpu=0")
    assert "Use GPU with device ID 0" in gpu
    assert cupy_stand_in._stand_in.counters["launch:scaffe_im2col"] == 2 * 2  # two convolutions, two batches
    for pattern in (r"Batch \d+, accuracy = ([\d.e+-]+)", r"Loss: ([\d.e+-]+)", r"accuracy = ([\d.e+-]+)\n"):
        assert values(gpu, pattern) == pytest.approx(values(cpu, pattern), rel=1e-4), pattern


def test_time_command_computes_on_the_gpu_and_waits_for_it(cupy_stand_in, lenet_dir, monkeypatch, capsys):
    monkeypatch.chdir(lenet_dir)
    err = run(capsys, "time", "--model=lenet.prototxt", "--iterations=2", "--gpu", "0")
    assert "Use GPU with device ID 0" in err
    counters = cupy_stand_in._stand_in.counters
    assert counters["launch:scaffe_im2col"] >= 2 * 2
    layers = len(re.findall(r"\tforward: ", err))
    # Each layer's time is read after the device finished it: a wait before and after each layer's pass.
    assert counters["synchronize"] >= 2 * 2 * layers


def test_processes_a_test_starts_see_the_stand_in_too(cupy_stand_in):
    done = subprocess.run([sys.executable, "-m", "scaffe", "device_query", "--gpu", "0"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "Name:                          cupy stand-in (numpy)" in done.stderr
