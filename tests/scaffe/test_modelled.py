"""The compute model (scaffe.modelled): modelled runs of a small net over 2 ranks with every schedule, their
checks of every reduced sum and propagated parameter, and the shapes and times they model."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = Path(sys.executable).with_name("mpiexec")

# A worker: LeNet's solver, modelled on a k80, 2 ranks; argv: schedule, then "plant" to make rank 1's
# gradient of blob 4 (ip1's weights) wrong in iteration 3, or "silent" for a run that must pass its checks.
WORKER = """
import sys
from mpi4py import MPI
import collectives
from scaffe.modelled import values
from scaffe.modelled.solver import modelled_solver
from scaffe.parallel.launch import make_distributed
from scaffe.solvers import read_solver_file
collectives.install_abort_hook()
comm = MPI.COMM_WORLD
schedule, mode = sys.argv[1], sys.argv[2]
if mode == "plant":
    right = values.gradient
    values.gradient = lambda rank, t, pid: right(rank, t, pid) + (1.0 if (rank, t, pid) == (1, 3, 4) else 0.0)
param = read_solver_file("examples/mnist/lenet_solver.prototxt")
param.max_iter, param.display = 6, 0
solver = modelled_solver(param, "k80", source="examples/mnist/lenet_solver.prototxt", rank=comm.rank,
                         size=comm.size)
make_distributed(solver, comm.Dup(), schedule)
solver.solve()
if mode == "silent" and comm.rank == 0:
    sys.stdout.write(f"activations: {sum(blob.count for blob in getattr(solver.net, 'blobs_list', []))}\\n")
sys.stdout.write(f"done {comm.rank} {solver.iter}\\n"); sys.stdout.flush()
"""
SETTINGS = {"SCAFFE_PIECE_BYTES": "60000", "SCAFFE_MESSAGE_BYTES": "120000", "SCAFFE_BACKWARD_BYTES": "100000",
            "OPENBLAS_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def mnist():
    from scaffe.tools.convert_mnist import ensure_mnist_lmdb
    ensure_mnist_lmdb(str(ROOT / "examples" / "mnist"))


def _run(schedule, mode, **settings):
    return subprocess.run([str(MPIEXEC), "-n", "2", sys.executable, "-c", WORKER, schedule, mode], cwd=ROOT,
                          env=dict(os.environ, **SETTINGS, **settings), capture_output=True, text=True, timeout=120,
                          start_new_session=True)


@pytest.mark.parametrize("schedule", ["scaffe", "allreduce", "native"])
def test_modelled_run_checks_every_sum(mnist, schedule):
    """Held messages, pieces and every schedule: all sums and parameters as expected for 6 iterations; the net
    holds no activations."""
    done = _run(schedule, "silent")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "activations: 0" in done.stdout
    assert sorted(line for line in done.stdout.splitlines() if line.startswith("done")) == ["done 0 6", "done 1 6"]


@pytest.mark.parametrize("schedule", ["scaffe", "allreduce"])
def test_napping_waits_with_a_window_of_one_finish(mnist, schedule):
    """Napping waits (the modelled bed's) and one collective in flight per communicator, so that nearly every
    piece queues: three runs finish. A wait once napped forever on an empty list when the oldest collective
    completed between its two looks (AlexNet b128 on 8 ranks stopped in its first iteration; here 2 ranks
    stopped in most runs)."""
    for _ in range(3):
        done = _run(schedule, "silent", SCAFFE_WAIT="nap", SCAFFE_REQUESTS_IN_FLIGHT="1", SCAFFE_STALL_S="20")
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


@pytest.mark.parametrize("schedule", ["scaffe", "allreduce"])
def test_planted_wrong_gradient_stops_the_run(mnist, schedule):
    """One rank's gradient of one blob off by 1 in one iteration: the run stops with one line naming the
    layer, the piece, the rank that checked and the iteration."""
    done = _run(schedule, "plant")
    assert done.returncode != 0
    line = next((line for line in done.stderr.splitlines() if "ModelCheckError: " in line), "")
    assert "layer 'ip1' blob 4 piece [" in line and "gradient of iteration 3" in line, done.stderr[-3000:]


def test_shapes_and_the_gpu_models():
    """AlexNet's and GoogLeNet's learnable values and forward FLOPs from their prototxts; the GPU models'
    order: an h100 is faster than a v100, which is faster than a k80."""
    import math
    from perf.train_scaling import deploy_train_net
    from scaffe.modelled.profile import ComputeProfile
    from scaffe.modelled.shapes import layer_models
    alexnet = layer_models(deploy_train_net("alexnet", 128))
    assert sum(math.prod(shape) for layer in alexnet for shape, _, _ in layer.params) == 60965224
    assert sum(layer.flops[0] for layer in alexnet) / 128 == pytest.approx(1.45e9, rel=0.02)  # 2 x 724 M MACs
    googlenet = layer_models(deploy_train_net("googlenet", 32))
    assert sum(math.prod(shape) for layer in googlenet for shape, _, _ in layer.params) == 6998552
    times = [ComputeProfile(gpu, googlenet, 32, scale=1, dilation=1).iteration_seconds(googlenet, 6998552)
             for gpu in ("k80", "v100", "h100")]
    assert times[0] > times[1] > times[2] > 0


def test_a_time_log_is_scaled_to_the_batch(tmp_path):
    from scaffe.modelled.profile import read_time_log
    log = tmp_path / "time.log"
    log.write_text("I1128 caffe.cpp] Top shape: 10 1 28 28 (7840)\n"
                   "I1128 caffe.cpp]      conv1\tforward: 2.5 ms.\nI1128 caffe.cpp]      conv1\tbackward: 4 ms.\n")
    forward, backward = read_time_log(str(log), 40)
    assert forward == {"conv1": pytest.approx(0.010)} and backward == {"conv1": pytest.approx(0.016)}


def test_cluster_sim_bounds_and_saved_results(tmp_path):
    """perf/cluster_sim.py: each schedule's bound as its docstring states it, and RESULT lines read back from
    a saved run (what `--results ... --plot` draws)."""
    from perf.cluster_sim import bound_ms, read_results
    link = 1e9  # bytes per second
    assert bound_ms("native", 10.0, 10_000_000, 2, link) == pytest.approx(20.0)   # C + 2 (H-1)/H B / T
    assert bound_ms("allreduce", 10.0, 10_000_000, 4, link) == pytest.approx(15.0)  # max(C, 2 (H-1)/H B / T)
    assert bound_ms("scaffe", 10.0, 10_000_000, 1, link) == 10.0                    # one host: no link
    assert bound_ms("scaffe", 10.0, 30_000_000, 2, link) == pytest.approx(30.0)     # B both ways between hosts
    assert bound_ms("scaffe", 10.0, 30_000_000, 4, link) == pytest.approx(50.0)     # (2H-3)/(H-1) B: chains in turn
    saved = tmp_path / "run.txt"
    saved.write_text("noise\nRESULT net=googlenet gpu=h100 hosts=2 per_host=8 link=100gbit schedule=scaffe "
                     "iter_ms=13.28 x_bound=1.069 efficiency=0.935\n")
    (row,) = read_results(saved)
    assert (row["hosts"], row["per_host"], row["schedule"], row["efficiency"]) == (2, 8, "scaffe", "0.935")


def test_cluster_sim_launches_as_mpirun_rsh(tmp_path):
    """perf/cluster_sim.py --launcher mpirun_rsh: jobs/mpirun_rsh.sh with mpirun_rsh's own arguments (-np, a
    hostfile of the bed's addresses with the ranks per host, settings as VAR=VALUE), hydra through the bed."""
    from perf.cluster_sim import launch
    hosts = tmp_path / "hosts"
    hosts.write_text("10.1.2.1 csimh1\n10.1.2.2 csimh2\n")
    command, env = launch("mpirun_rsh", hosts, 16, {"SCAFFE_TIME_DILATION": "1000"}, ["python", "-m", "scaffe"])
    assert command[1].endswith("jobs/mpirun_rsh.sh") and command[2:4] == ["-np", "32"] and command[4] == "-hostfile"
    assert command[6:] == ["SCAFFE_TIME_DILATION=1000", "python", "-m", "scaffe"]
    assert Path(command[5]).read_text() == "10.1.2.1:16\n10.1.2.2:16\n"
    assert env["HYDRA_LAUNCHER_EXEC"] == str(tmp_path / "launch") and env["HYDRA_LAUNCHER"] == "ssh"
    bed, bed_env = launch("bed", hosts, 16, {"SCAFFE_TIME_DILATION": "1000"}, ["python"])
    assert bed[2:] == ["run", "-n", "16", "python"] and bed_env["SCAFFE_TIME_DILATION"] == "1000"


def test_timer_slack_reaches_the_command():
    """perf/timer_slack.py: the command it runs (across exec) sleeps with the timer slack it was given, as the
    native schedule's ranks on the dilated bed do."""
    done = subprocess.run([sys.executable, str(ROOT / "perf" / "timer_slack.py"), "2400000", "cat",
                           "/proc/self/timerslack_ns"], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "2400000"


def test_queued_collectives_start_while_the_modelled_device_computes(mnist, monkeypatch):
    """A collective queued behind a full window (scaffe.parallel.window) starts once room frees while the
    modelled device computes, as a GPU's host thread waiting in the schedule would start it, not at the
    schedule's next start or wait: the S-Caffe schedule's other ranks once left the wire idle through whole
    layers' backward that way (AlexNet b8 on the modelled bed: 26 MB/s of a 34 MB/s link)."""
    import numpy
    from mpi4py import MPI
    from scaffe.modelled.solver import modelled_solver
    from scaffe.parallel.launch import make_distributed
    from scaffe.solvers import read_solver_file
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("SCAFFE_REQUESTS_IN_FLIGHT", "1")
    param = read_solver_file("examples/mnist/lenet_solver.prototxt")
    solver = modelled_solver(param, "k80", source="examples/mnist/lenet_solver.prototxt", rank=0, size=1)
    schedule = make_distributed(solver, MPI.COMM_SELF.Dup(), "scaffe")
    comm = MPI.COMM_SELF.Dup()
    box, sent = numpy.zeros(1), numpy.ones(1)
    first = schedule.windows.start(comm, lambda stream: comm.Irecv(box, source=0, tag=7))
    second = schedule.windows.start(comm, lambda stream: comm.Ibarrier())
    assert first.handle is not None and second.handle is None  # the window holds one
    comm.Send(sent, dest=0, tag=7)  # the first completes; nothing of the schedule has looked yet
    solver.net.wait(0.01)  # modelled compute, dilated: the idle hooks run every POLL_S of it
    assert second.handle is not None
    schedule.windows.wait([first, second])
    comm.Free()
