"""GPU training under the cupy stand-in: fused solver steps, schedules on device arrays, the threads' devices,
and P ranks on "GPUs" (mpiexec) against one rank with P x batch."""
import re
import subprocess
import sys
import threading

import numpy
import pytest

from scaffe.io import to_host
from scaffe.proto import caffe_pb2
from scaffe.solvers import create_solver
import test_cupy_cli
from test_cupy_nets import input_net
from lenet_runs import MPIEXEC, ROOT, WORKER, case_args, case_file, side_by_side
lenet_dir = test_cupy_cli.lenet_dir  # the fixture: LeNet at batch 8 on the bundled digits, solver_gpu.prototxt

SOLVERS = {
    "SGD": {"momentum": 0.9},
    "Nesterov": {"momentum": 0.9},
    "AdaGrad": {},
    "RMSProp": {"rms_decay": 0.9},
    "AdaDelta": {"momentum": 0.95, "delta": 1e-6, "base_lr": 1.0},
    "Adam": {"momentum": 0.9, "momentum2": 0.999, "base_lr": 0.001},
}


def lenet_solvers(cupy, solver_type, **fields):
    """The same LeNet solver (batch 4, an Input layer) on numpy and on cupy, with the same weights and data.
    Biases get decay_mult 0, so lr_mult and decay_mult both differ between blobs."""
    net = input_net("mnist/lenet_train_test.prototxt", 4, (1, 28, 28))
    for layer in net.layer:
        if len(layer.param) == 2:
            layer.param[1].decay_mult = 0
    settings = dict({"base_lr": 0.01, "weight_decay": 0.005, "lr_policy": "fixed", "max_iter": 100, "display": 0,
                     "random_seed": 3, "snapshot_after_train": False}, **SOLVERS[solver_type], **fields)
    param = caffe_pb2.SolverParameter(type=solver_type, **settings)
    param.net_param.CopyFrom(net)
    host = create_solver(param)
    device = create_solver(param, net_kwargs={"xp": cupy})
    device.net.copy_trained_layers_from(host.net.to_proto())
    rng = numpy.random.default_rng(0)
    images = rng.uniform(0, 1, (4, 1, 28, 28)).astype(numpy.float32)
    labels = rng.integers(0, 10, 4).astype(numpy.float32)
    for solver, xp in ((host, numpy), (device, cupy)):
        solver.net.blobs["data"].data[...] = xp.asarray(images)
        solver.net.blobs["label"].data[...] = xp.asarray(labels)
    return host, device


def assert_same_training(host, device, rtol=1e-5, atol=1e-7):
    for a, b in zip(device.net.learnable_params, host.net.learnable_params):
        numpy.testing.assert_allclose(to_host(a.data), b.data, rtol=rtol, atol=atol)
    for a, b in zip(device.history, host.history):
        numpy.testing.assert_allclose(to_host(a), b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("solver_type, fields", [(t, {}) for t in SOLVERS] + [
    ("SGD", {"regularization_type": "L1", "iter_size": 2})])
def test_fused_step_equals_the_per_blob_pipeline(cupy_stand_in, solver_type, fields):
    """A GPU solver step is one kernel launch over the flat buffers, with no host sync, and updates exactly as
    the CPU does (whose step is the per-blob pipeline's, test_cpu_fused_step_...) from the same gradients (the device's own differ in the last bits: the
    fused SoftmaxWithLoss sums its channels in another order than numpy, and AdaGrad and its kin divide by a
    gradient's own size)."""
    host, device = lenet_solvers(cupy_stand_in, solver_type, **fields)
    counters = cupy_stand_in._stand_in.counters
    counters.clear()
    step_on_the_hosts_gradients(host, device, cupy_stand_in, 3)
    assert_same_training(host, device)
    assert sum(n for kind, n in counters.items() if kind.endswith("_update")) == 3
    device.net.forward_backward()
    cupy_stand_in._stand_in.reset()
    device.apply_update()
    assert cupy_stand_in._stand_in.host_syncs() == 0


def step_on_the_hosts_gradients(host, device, cupy, steps):
    """`steps` updates of both solvers from the same gradients: the host net's, copied to the device."""
    for _ in range(steps):
        host.clear_param_diffs()
        device.clear_param_diffs()
        host.forward_backward()
        for on_host, on_device in zip(host.net.learnable_params, device.net.learnable_params):
            on_device.diff[...] = cupy.asarray(on_host.diff)
        for solver in (host, device):
            solver.apply_update()
            solver.iter += 1


@pytest.mark.gpu
@pytest.mark.parametrize("solver_type", list(SOLVERS))
def test_fused_kernels_on_a_gpu_equal_the_per_blob_pipeline(solver_type):
    """The CUDA kernels themselves, bit for bit: compiled without fused multiply-adds, with IEEE division and
    square root (kernels/cuda_sources.py), they round every operation as numpy's float32 does. Both get the
    host's gradients: the device's own differ in the last bits (its GEMMs sum in another order), and AdaGrad,
    RMSProp, AdaDelta and Adam divide by the gradient's own size, so a near-zero gradient's relative error,
    which has no bound, becomes a step error of that relative size times the rate."""
    import cupy
    host, device = lenet_solvers(cupy, solver_type)
    step_on_the_hosts_gradients(host, device, cupy, 3)
    assert_same_training(host, device, rtol=0, atol=0)


@pytest.mark.parametrize("schedule", ["allreduce", "scaffe"])
def test_schedules_take_device_gradients(cupy_stand_in, schedule):
    """Both schedules on one rank with device arrays train as the single process does on the device (the
    allreduce schedule's numpy packing raised "Implicit conversion to a NumPy array" at the first backward)."""
    import collectives
    from mpi4py import MPI

    from scaffe.parallel import attach
    _, alone = lenet_solvers(cupy_stand_in, "Adam")
    _, device = lenet_solvers(cupy_stand_in, "Adam")
    attach(device, collectives.Comm(MPI.COMM_WORLD), schedule)
    alone.step(3)
    device.step(3)
    pairs = list(zip([p.data for p in device.net.learnable_params] + list(device.history),
                     [p.data for p in alone.net.learnable_params] + list(alone.history)))
    for a, b in pairs:
        numpy.testing.assert_array_equal(to_host(a), to_host(b))


@pytest.mark.parametrize("schedule, threaded", [("scaffe", True), ("allreduce", True), ("scaffe", False)],
                         ids=["scaffe", "allreduce", "scaffe-without-MPI_THREAD_MULTIPLE"])
def test_collectives_wait_for_their_layer_alone(cupy_stand_in, monkeypatch, schedule, threaded):
    """A layer's gradient collective is ordered after that layer's backward, not after the backward queued
    since: each gets a stream of the schedule's own that waited for the layer's event (given no stream, a
    collective orders itself after the legacy default stream, the compute stream here, and the overlap with
    backward is lost on a GPU). Parameters go on the propagation stream."""
    import collectives
    from mpi4py import MPI

    from scaffe.parallel import attach
    stand_in, calls = cupy_stand_in._stand_in, []

    def recording(name):
        original = getattr(collectives.Comm, name)

        def call(self, *args, stream=None, **kwargs):
            if isinstance(args[-1 if name == "Ibcast" else 1], cupy_stand_in.ndarray) or \
                    isinstance(args[0], cupy_stand_in.ndarray):
                ordered = stream if stream is not None else cupy_stand_in.cuda.Stream.null  # as user_stream
                calls.append((name, stream, stand_in.ordered_after(ordered, compute)))
                # cupy's arrays name the current stream to whoever reads them (the staged path synchronises it)
                assert cupy_stand_in.cuda.get_current_stream() is ordered
            return original(self, *args, stream=stream, **kwargs)
        monkeypatch.setattr(collectives.Comm, name, call)
    for name in ("Ireduce", "Iallreduce", "Ibcast"):
        recording(name)
    monkeypatch.setenv("SCAFFE_MESSAGE_BYTES", "1")  # a message per layer, to see each layer's order
    _, device = lenet_solvers(cupy_stand_in, "SGD")
    compute = cupy_stand_in.cuda.get_current_stream()
    layer_done = {}
    device.net.add_hooks(on_grads_ready=lambda layer_id: layer_done.setdefault(layer_id, compute._queued))
    attach(device, collectives.Comm(MPI.COMM_WORLD), schedule)
    order = device.callbacks[-1].order
    order._threaded = threaded  # without MPI_THREAD_MULTIPLE the training thread starts them itself
    device.step(1)
    order.close()
    gradients = [(stream, ordered) for name, stream, ordered in calls if name != "Ibcast"]
    assert gradients and all(stream is order.communication for stream, _ in gradients)
    assert all(stream is order.propagation for name, stream, _ in calls if name == "Ibcast")
    if schedule == "scaffe":  # one reduce per layer with gradients, top down
        layers = [layer_id for layer_id in sorted(layer_done, reverse=True) if device.net.grads_ready_at(layer_id)]
        assert [ordered for _, ordered in gradients] == [layer_done[layer_id] for layer_id in layers]
    assert gradients[0][1] < compute._queued  # backward went on after the first collective's layer


@pytest.mark.parametrize("schedule", ["scaffe", "allreduce"])
def test_updates_run_beside_the_layers_and_before_their_forward(cupy_stand_in, monkeypatch, schedule):
    """The solver's updates of pieces go to the update stream, not behind the layers queued on the compute
    stream; each follows the iteration's clearing of the gradients (a held piece's update writes them); each
    layer's forward is ordered after its parameters' update; and training is that of one process (pieces held
    back by a budget included)."""
    import collectives
    from mpi4py import MPI

    from scaffe.parallel import attach
    from scaffe.solvers.callbacks import SolverCallback
    stand_in = cupy_stand_in._stand_in
    monkeypatch.setenv("SCAFFE_MESSAGE_BYTES", "1")
    monkeypatch.setenv("SCAFFE_BACKWARD_BYTES", "30000")  # ip2 during backward, the rest held
    _, alone = lenet_solvers(cupy_stand_in, "SGD")
    _, device = lenet_solvers(cupy_stand_in, "SGD")
    compute = cupy_stand_in.cuda.get_current_stream()
    attach(device, collectives.Comm(MPI.COMM_WORLD), schedule)
    order = device.callbacks[-1].order
    wrote, beside, cleared, ended = {}, [], [0], [0]

    class Cleared(SolverCallback):
        def on_start(self):  # after the schedule's own, right after the gradients were cleared
            assert stand_in.ordered_after(compute, order.update) >= ended[0]  # the updates read them first
            cleared[0] = compute._queued

        def on_gradients_ready(self):
            ended[0] = order.update._queued
    device.callbacks.append(Cleared())
    updated = order.updated

    def recording(layers):
        assert stand_in.ordered_after(order.update, compute) >= cleared[0]
        beside.append(stand_in.ordered_after(order.update, compute) < compute._queued)
        for layer_id in layers:
            wrote[layer_id] = order.update._queued
        return updated(layers)
    monkeypatch.setattr(order, "updated", recording)

    def forward_ordered(layer_id):
        if layer_id in wrote:
            assert stand_in.ordered_after(compute, order.update) >= wrote[layer_id], layer_id
    device.net.add_hooks(on_param_needed=forward_ordered)
    alone.step(3)
    device.step(3)
    assert any(beside) and order.update._queued > 0
    assert device.callbacks[-2].held_updates_in_forward > 0
    for a, b in zip([p.data for p in device.net.learnable_params] + list(device.history),
                    [p.data for p in alone.net.learnable_params] + list(alone.history)):
        numpy.testing.assert_allclose(to_host(a), to_host(b), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("schedule", ["scaffe", "allreduce"])
def test_a_measured_budget_times_the_backward_on_the_device(cupy_stand_in, monkeypatch, schedule):
    """The host queues a GPU's backward ahead of the device, so the measured budget times it by the compute
    stream's events once they have run, without waiting for them (no host synchronisation), and training is
    that of one process."""
    import collectives
    from mpi4py import MPI

    from scaffe.parallel import attach
    stand_in = cupy_stand_in._stand_in
    monkeypatch.setenv("SCAFFE_MESSAGE_BYTES", "1")
    syncs = {}
    for budget in ("none", "measured"):  # none, then measured: the same host synchronisations
        monkeypatch.setenv("SCAFFE_BACKWARD_BYTES", budget)
        _, device = lenet_solvers(cupy_stand_in, "SGD")
        attach(device, collectives.Comm(MPI.COMM_WORLD), schedule)
        order = device.callbacks[-1].order
        windows = []
        elapsed = order.elapsed
        monkeypatch.setattr(order, "elapsed", lambda start, end: windows.append(elapsed(start, end)) or windows[-1])
        before = stand_in.host_syncs()
        device.step(4)
        syncs[budget] = stand_in.host_syncs() - before
    assert syncs["measured"] == syncs["none"]
    assert windows and all(window is None or window >= 0 for window in windows)
    assert any(window is not None for window in windows)
    _, alone = lenet_solvers(cupy_stand_in, "SGD")
    alone.step(4)
    for a, b in zip([p.data for p in device.net.learnable_params] + list(device.history),
                    [p.data for p in alone.net.learnable_params] + list(alone.history)):
        numpy.testing.assert_allclose(to_host(a), to_host(b), rtol=1e-6, atol=1e-7)


def test_helper_threads_work_on_the_ranks_device(cupy_stand_in, monkeypatch):
    """The collectives' progress thread and the schedules' communication thread take the device of the thread
    that started them (a new thread would be on device 0)."""
    from mpi4py import MPI

    from collectives.events import Name
    from collectives.progress import Progress
    from scaffe.parallel.streams import DeviceOrder
    monkeypatch.setattr(cupy_stand_in.cuda.runtime, "DEVICE_COUNT", 2)
    cupy_stand_in.cuda.Device(1).use()
    seen = []
    progress = Progress()
    MPI.Request.Wait(progress.submit(lambda: seen.append(cupy_stand_in.cuda.Device().id), Name("probe", None), 0))
    progress.stop()
    order = DeviceOrder(cupy_stand_in, 1)
    seen.append(order.start(lambda stream: cupy_stand_in.cuda.Device().id, after=order.mark()).request())
    order.close()
    assert seen == [1, 1]
    assert threading.current_thread() is threading.main_thread()


def test_bench_train_synchronises_before_reading_the_clock(cupy_stand_in):
    from perf import bench_train
    cupy_stand_in._stand_in.reset()
    result = bench_train.bench("lenet", 2, 1, cupy_stand_in)
    # forward, backward: three readings per iteration, then two around the full steps
    assert cupy_stand_in._stand_in.counters["synchronize"] >= 3 * 2 + 2
    assert result["iter_ms"] > 0


@pytest.mark.parametrize("launcher_says", [True, False], ids=["launcher", "node split"])
def test_ranks_take_the_gpu_of_their_local_rank(cupy_stand_in, lenet_dir, monkeypatch, launcher_says):
    """`mpiexec -n 2 scaffe train --gpu=all` on a host of 2 GPUs: local rank r drives GPU r, told by the
    launcher or, where it says nothing, by MPI's node split (which failed: "one process drives one GPU")."""
    monkeypatch.setenv("CUPY_STAND_IN_DEVICES", "2")
    hide = [] if launcher_says else ["env", "-u", "MPI_LOCALRANKID", "-u", "PMI_LOCAL_RANK"]
    cmd = [str(MPIEXEC), "-n", "2", *hide, sys.executable, "-m", "scaffe", "train", "--solver=solver_gpu.prototxt",
           "--gpu=all", "--iterations=1"]
    done = subprocess.run(cmd, cwd=lenet_dir, capture_output=True, text=True, timeout=300, start_new_session=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    devices = sorted(re.findall(r"Use GPU with device ID (\d+)", done.stdout + done.stderr))
    assert devices == ["0", "1"]


@pytest.mark.parametrize("flag, local_rank", [("all", 0), ("", 1), ("", None)])
def test_scaffe_gpu_chooses_the_device_training_uses(cupy_stand_in, monkeypatch, flag, local_rank):
    """SCAFFE_GPU, documented as every rank's GPU, is the device training runs on (collectives.info alone
    read it, and reported a GPU the rank did not use)."""
    from collectives import settings
    from scaffe.cli import _select_device
    monkeypatch.setattr(cupy_stand_in.cuda.runtime, "DEVICE_COUNT", 2)
    monkeypatch.setenv("SCAFFE_GPU", "1")
    monkeypatch.delenv("MPI_LOCALRANKID", raising=False)
    monkeypatch.delenv("PMI_LOCAL_RANK", raising=False)
    assert _select_device(flag, solver_mode_gpu=True, local_rank=local_rank) is cupy_stand_in
    assert cupy_stand_in.cuda.Device().id == 1
    assert settings.gpu_for(0, range(2), 2) == 1  # what collectives.info reports for the rank


@pytest.fixture(scope="module")
def mnist():
    from scaffe.tools.convert_mnist import ensure_mnist_lmdb
    ensure_mnist_lmdb(str(ROOT / "examples" / "mnist"))


def _train(*jobs):
    """Each (ranks, train_lenet.py's words) job on the stand-in GPUs, side by side. The scaffe schedule reduces
    ip2's gradients during backward, holds the other layers' back until after it, and its root updates them
    during the next forward."""
    side_by_side([(ranks, [str(WORKER), *args, "--gpu"], {"SCAFFE_BACKWARD_BYTES": "30000"}) for ranks, args in jobs],
                 timeout=400)


SOLVER_CASES = {"SGD": [], "Adam": ["type=Adam", "base_lr=0.001"]}


def test_two_ranks_on_gpus_equal_one_rank_big_batch(cupy_stand_in, mnist, tmp_path):
    """2 ranks x batch 8 on "GPUs" (stand-in) reach the weights of 1 rank x batch 16, with every schedule and
    SGD and Adam, and the training thread never waits for the device inside an iteration (the communication
    thread does); the last two iterations are replayed from CUDA graphs, the schedules' hooks running between
    them. Every case of one rank count trains in one launch (train_lenet.py's `+`)."""
    iterations, ranks, batch = 4, 2, 8
    multi_cases = [(schedule, solver) for solver in SOLVER_CASES for schedule in ("scaffe", "allreduce", "native")]
    single = case_args([("scaffe", settings) for settings in SOLVER_CASES.values()])
    multi = case_args([(schedule, SOLVER_CASES[solver]) for schedule, solver in multi_cases])
    _train((1, [single[0], str(iterations), str(ranks * batch), str(tmp_path / "single.npz"), *single[1:]]),
           (ranks, [multi[0], str(iterations), str(batch), str(tmp_path / "multi.npz"), *multi[1:]]))
    for k, (schedule, solver) in enumerate(multi_cases):
        a = dict(numpy.load(case_file(tmp_path / "single.npz", list(SOLVER_CASES).index(solver))))
        assert a.pop("host_syncs") == 0 and a.pop("graph_launches") > 0  # the last 2 iterations are replayed
        b = dict(numpy.load(case_file(tmp_path / "multi.npz", k)))
        assert b.pop("host_syncs") == 0 and b.pop("graph_launches") > 0, (schedule, solver)
        assert b.pop("held_updates_in_forward", 1) > 0, (schedule, solver)
        assert sorted(b) == sorted(a)
        for name in b:
            scale = max(1.0, float(numpy.abs(a[name]).max()))
            numpy.testing.assert_allclose(b[name], a[name], rtol=1e-4, atol=1e-5 * scale,
                                          err_msg=f"{schedule} {solver}")


@pytest.mark.parametrize("solver_type, fields", [(t, {}) for t in SOLVERS] + [
    ("SGD", {"regularization_type": "L1"}), ("Adam", {"iter_size": 2})])
def test_cpu_fused_step_equals_the_per_blob_pipeline(solver_type, fields):
    """On the CPU the flat buffers' step (the kernels' numba twins, one pass per blob) updates bit for bit as
    the per-blob pipeline does (what runs without flat buffers) from the same gradients, history included."""
    fused, pipeline = lenet_solvers(numpy, solver_type, **fields)
    pipeline.flat = None  # its blobs stay views of the flat buffers; its steps take the per-blob pipeline
    for _ in range(3):
        for solver in (fused, pipeline):
            solver.clear_param_diffs()
        fused.forward_backward()
        for a, b in zip(fused.net.learnable_params, pipeline.net.learnable_params):
            b.diff[...] = a.diff
        for solver in (fused, pipeline):
            solver.apply_update()
            solver.iter += 1
    for a, b in zip(fused.net.learnable_params + fused.history, pipeline.net.learnable_params + pipeline.history):
        numpy.testing.assert_array_equal(getattr(a, "data", a), getattr(b, "data", b))
    assert any(numpy.abs(a.data).sum() for a in fused.net.learnable_params)
