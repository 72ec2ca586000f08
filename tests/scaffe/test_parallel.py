"""Data-parallel training: P ranks x batch B reach the weights of 1 rank x batch P*B on the same samples."""
import os
import subprocess
import sys
from pathlib import Path

import numpy
import pytest

from lenet_runs import MPIEXEC, ROOT, WORKER, case_args, case_file, side_by_side


@pytest.fixture(scope="module")
def mnist():
    from scaffe.tools.convert_mnist import ensure_mnist_lmdb
    ensure_mnist_lmdb(str(ROOT / "examples" / "mnist"))


def _run(ranks, args, timeout=240, env=None):
    return side_by_side([(ranks, args, env)], timeout)[0]


# Each case: a schedule and the solver's settings (the LeNet solver's SGD with momentum, weight decay and
# lr_mult 2 on the biases when none). The scaffe schedule's root, and every rank of the allreduce schedule,
# update each piece of a layer as its sum arrives: with every solver type (history included), and with
# clipping, which needs every gradient first.
CASES = [("scaffe", []), ("allreduce", []), ("native", []),
         ("scaffe", ["type=Nesterov"]),
         ("scaffe", ["type=AdaGrad", "momentum=0", "delta=0.0001"]),
         ("scaffe", ["type=RMSProp", "momentum=0", "rms_decay=0.98", "base_lr=0.001", "delta=0.0001"]),
         ("scaffe", ["type=AdaDelta", "momentum=0.95", "delta=0.000001", "base_lr=1"]),
         ("scaffe", ["type=Adam", "base_lr=0.001", "momentum2=0.999"]),
         ("scaffe", ["clip_gradients=0.5"]),
         ("allreduce", ["type=Adam", "base_lr=0.001", "momentum2=0.999"]),
         ("allreduce", ["type=AdaDelta", "momentum=0.95", "delta=0.000001", "base_lr=1"]),
         ("allreduce", ["clip_gradients=0.5"])]
# Pieces (and allreduce buckets) of 60000 bytes: ip1's weights travel in 27 pieces, conv2's in 2, and no piece
# ends on a blob's end.
PIECE_BYTES = "60000"
# The scaffe and allreduce schedules reduce the pieces that fit in 100000 bytes during backward; the rest
# start after backward, lowest layer first, and are updated during the next forward.
BACKWARD_BYTES = "100000"


def test_p_ranks_equal_one_rank_big_batch(mnist, tmp_path):
    """Every case in one job of 1 rank with batch P*B and one of P ranks with batch B, pieces on."""
    iterations, ranks, batch = 4, 2, 32
    single, multi = tmp_path / "single.npz", tmp_path / "multi.npz"
    cases = case_args(CASES)
    side_by_side([(1, [str(WORKER), cases[0], str(iterations), str(ranks * batch), str(single), *cases[1:]], None),
                  (ranks, [str(WORKER), cases[0], str(iterations), str(batch), str(multi), *cases[1:]],
                   {"SCAFFE_PIECE_BYTES": PIECE_BYTES, "SCAFFE_BACKWARD_BYTES": BACKWARD_BYTES})])
    for k, case in enumerate(CASES):
        a, b = (numpy.load(case_file(path, k)) for path in (single, multi))
        if case[0] != "native":  # clipping needs every sum in the iteration: nothing is held back then
            held = int(b["held_updates_in_forward"])
            assert (held == 0) if "clip_gradients=0.5" in case[1] else (held > 0), f"{case}: {held} held"
        assert a.files == [name for name in b.files if name != "held_updates_in_forward"]
        for name in a.files:
            scale = max(1.0, float(numpy.abs(a[name]).max()))
            numpy.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=1e-5 * scale, err_msg=f"{case} {name}")
        # The run moved the weights: equality is not the trivial one of two untouched nets.
        assert any(numpy.abs(a[n]).sum() > 0 for n in a.files)


def _assert_same_weights(single, multi, cases):
    for k, case in enumerate(cases):
        a, b = (numpy.load(case_file(path, k)) for path in (single, multi))
        for name in a.files:
            scale = max(1.0, float(numpy.abs(a[name]).max()))
            numpy.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=1e-5 * scale, err_msg=f"{case} {name}")


def test_held_messages_of_one_layer_keep_their_own_gradients(mnist, tmp_path):
    """Pieces of 60000 bytes joined into messages of 120000 with a budget: ip1 alone makes 13 messages, most
    held back after backward; each keeps its own staged gradient (they once shared one, keyed by layer and
    a joined message's index 0, and ip1 came out 1e-2 off)."""
    iterations, ranks, batch = 4, 2, 32
    cases = [("scaffe", []), ("scaffe", ["type=Adam", "base_lr=0.001", "momentum2=0.999"]), ("allreduce", [])]
    single, multi = tmp_path / "single.npz", tmp_path / "multi.npz"
    args = case_args(cases)
    side_by_side([(1, [str(WORKER), args[0], str(iterations), str(ranks * batch), str(single), *args[1:]], None),
                  (ranks, [str(WORKER), args[0], str(iterations), str(batch), str(multi), *args[1:]],
                   {"SCAFFE_PIECE_BYTES": PIECE_BYTES, "SCAFFE_BACKWARD_BYTES": BACKWARD_BYTES,
                    "SCAFFE_MESSAGE_BYTES": "120000"})])
    for k in range(len(cases)):
        held = numpy.load(case_file(multi, k))["held_updates_in_forward"]
        assert int(held) >= 10, f"{cases[k]}: {held} held"
    _assert_same_weights(single, multi, cases)


def test_hundreds_of_small_messages_finish(mnist, tmp_path):
    """Pieces of 20000 bytes, each its own message, and a budget: LeNet's backward asks for about 160
    collectives on each communicator, which once hung MPICH over UCX in 5 of 6 runs; 10 trainings in a
    row finish (SCAFFE_REQUESTS_IN_FLIGHT bounds what is in flight) with one rank's weights."""
    iterations, ranks, batch = 3, 2, 32
    cases = [("scaffe", [])] * 9 + [("allreduce", [])]
    single, multi = tmp_path / "single.npz", tmp_path / "multi.npz"
    args = case_args(cases)
    small = {"SCAFFE_PIECE_BYTES": "20000", "SCAFFE_BACKWARD_BYTES": BACKWARD_BYTES, "SCAFFE_MESSAGE_BYTES": "1"}
    side_by_side([(1, [str(WORKER), "scaffe", str(iterations), str(ranks * batch), str(single)], None),  # one rank
                  (ranks, [str(WORKER), args[0], str(iterations), str(batch), str(multi), *args[1:]], small)],
                 timeout=180)
    a = numpy.load(single)
    for k, case in enumerate(cases):
        b = numpy.load(case_file(multi, k))
        for name in a.files:
            scale = max(1.0, float(numpy.abs(a[name]).max()))
            numpy.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=1e-5 * scale, err_msg=f"{k} {case} {name}")


SHARE_CORES = """
import os, sys
from mpi4py import MPI
from threadpoolctl import threadpool_info
from scaffe.parallel.launch import host_place, share_cores
got = share_cores(host_place(MPI.COMM_WORLD)[1])
blas = sorted({pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"})
with open(f"{sys.argv[1]}.{MPI.COMM_WORLD.Get_rank()}", "w") as report:  # the ranks' stdout may interleave
    print(got, blas, len(os.sched_getaffinity(0)), file=report)
"""


def test_ranks_sharing_a_host_share_its_cores_in_blas(tmp_path):
    """Each of 2 ranks on a host gets half its cores for BLAS (OpenBLAS would start one thread per core in
    each and spin them), unless OPENBLAS_NUM_THREADS says otherwise."""
    env = {name: value for name, value in os.environ.items() if name not in ("OPENBLAS_NUM_THREADS",
                                                                           "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    cores = len(os.sched_getaffinity(0))
    share = max(1, cores // 2)
    for chosen, expected in ((None, f"{share} [{share}] {cores}"), (str(cores), f"None [{cores}] {cores}")):
        job_env = env if chosen is None else dict(env, OPENBLAS_NUM_THREADS=chosen)
        report = tmp_path / f"threads-{chosen}"
        done = subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "-c", SHARE_CORES, str(report)], cwd=ROOT,
                              env=job_env, capture_output=True, text=True, timeout=120, start_new_session=True)
        assert done.returncode == 0, done.stderr[-3000:]
        lines = [Path(f"{report}.{rank}").read_text().strip() for rank in range(2)]
        assert lines == [expected, expected], lines


def test_mpiexec_scaffe_train_lenet(mnist, tmp_path):
    """`mpiexec -n 2 scaffe train` trains LeNet on the bundled MNIST to >= 0.95 test accuracy, and leaves no
    request of its collectives behind."""
    solver = tmp_path / "solver.prototxt"
    text = (ROOT / "examples" / "mnist" / "lenet_solver.prototxt").read_text()
    text = text.replace('snapshot_prefix: "examples/mnist/lenet"', f'snapshot_prefix: "{tmp_path}/lenet"')
    text = text.replace('net: "examples/mnist/lenet_train_test.prototxt"',
                        f'net: "{ROOT}/examples/mnist/lenet_train_test.prototxt"')
    text = text.replace("test_interval: 500", "test_interval: 300")  # 0.962-0.969 measured at 250-300
    solver.write_text(text)
    done = _run(2, ["-m", "scaffe", "train", f"--solver={solver}", "--iterations=300"], timeout=400)
    log = done.stdout + done.stderr
    assert "Data-parallel training on 2 ranks" in log
    accuracy = [float(line.rsplit("=", 1)[1]) for line in log.splitlines() if "Test net output #0: accuracy" in line]
    assert accuracy and accuracy[-1] >= 0.95, log[-2000:]
    assert "Optimization Done." in log
    assert (tmp_path / "lenet_iter_300.caffemodel").exists()
    # Every request the schedule started was waited for: MPICH names a communicator left with some at its end.
    assert "has pending" not in log, log[-2000:]


def _snapshot_arrays(prefix, iteration):
    """The weights, then the solver's history, of snapshot `prefix`_iter_`iteration`."""
    from scaffe import io as sio
    model = sio.read_net_binary(f"{prefix}_iter_{iteration}.caffemodel")
    state = sio.read_solverstate(f"{prefix}_iter_{iteration}.solverstate")
    return ([sio.blobproto_to_array(blob) for layer in model.layer for blob in layer.blobs]
            + [sio.blobproto_to_array(blob) for blob in state.history])


def test_held_pieces_land_before_a_snapshot(mnist, tmp_path):
    """A snapshot in the middle of training, with pieces held back from the iteration before it (the scaffe
    schedule, SGD and Adam; the allreduce schedule, Adam), holds what one rank with batch P*B saves, and
    training goes on from there."""
    iterations, ranks, batch = 4, 2, 32
    jobs = []
    for run, count, size in (("single", 1, ranks * batch), ("multi", ranks, batch)):
        cases = case_args([(schedule, settings + ["snapshot=2", f"snapshot_prefix={tmp_path / run}{k}"])
                            for k, (schedule, settings) in enumerate(CASES[:1] + CASES[7:8] + CASES[9:10])])
        jobs.append((count, [str(WORKER), cases[0], str(iterations), str(size), str(tmp_path / f"{run}.npz"),
                             *cases[1:]], {"SCAFFE_PIECE_BYTES": PIECE_BYTES, "SCAFFE_BACKWARD_BYTES": BACKWARD_BYTES}))
    side_by_side(jobs)
    for k, suffix in enumerate((".npz", ".1.npz", ".2.npz")):
        for a, b in zip(_snapshot_arrays(tmp_path / f"single{k}", 2), _snapshot_arrays(tmp_path / f"multi{k}", 2)):
            numpy.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5 * max(1.0, float(numpy.abs(a).max())))
        a, b = (numpy.load(tmp_path / f"{run}{suffix}") for run in ("single", "multi"))
        assert int(b["held_updates_in_forward"]) > 0
        for name in a.files:
            numpy.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=1e-5 * max(1.0, float(numpy.abs(a[name]).max())))
