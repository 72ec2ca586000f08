"""Train LeNet for a few iterations (under mpiexec or alone) and save the root's weights.

argv: schedule iterations batch_per_rank out.npz [solver_field=value ...] [+ schedule [solver_field=value ...]]...
      [--gpu]

Each `+` starts one more case, trained after the others in the same job (one mpiexec for several
cases); case k > 0 saves its weights in out.npz with `.k` before the suffix (out.1.npz, ...).

With --gpu the net lives on cupy (the stand-in, in CI), and the file also holds `host_syncs`: how often
the training thread waited for the device inside the iterations between the first and the last, and
`graph_launches`: how many CUDA graphs replayed iterations (scaffe.capture) launched.
The scaffe and allreduce schedules add `held_updates_in_forward`: how many pieces (buckets) held back after a backward they
updated during the next forward.
"""
import sys
import threading

import numpy
from mpi4py import MPI

import collectives
from scaffe import io as sio
from scaffe.parallel.launch import make_distributed
from scaffe.solvers import create_solver, read_solver_file
from scaffe.solvers.callbacks import SolverCallback


class HostSyncs(SolverCallback):
    """Counts the stand-in's host syncs made by the training thread inside iterations 1 .. max_iter - 2."""

    def __init__(self, solver, stand_in):
        self.solver, self.count, self._inside = solver, 0, False
        counted, training = stand_in.count, threading.current_thread()

        def count(kind):
            counted(kind)
            if self._inside and threading.current_thread() is training and kind in ("device_to_host", "synchronize"):
                self.count += 1
        stand_in.count = count

    def on_start(self):
        self._inside = 0 < self.solver.iter < self.solver.param.max_iter - 1

    def on_iteration(self, record):
        self._inside = False


def train(schedule, settings, out):
    param = read_solver_file("examples/mnist/lenet_solver.prototxt")
    param.max_iter = iterations
    param.test_interval = 0
    del param.test_iter[:]
    param.snapshot = 0
    param.snapshot_after_train = False
    param.display = 0
    param.random_seed = 5
    for setting in settings:
        field, value = setting.split("=")
        setattr(param, field, type(getattr(param, field))(value))
    net = sio.read_net_prototxt("examples/mnist/lenet_train_test.prototxt")
    for layer in net.layer:
        if layer.type == "Data":
            layer.data_param.batch_size = batch
    param.ClearField("net")
    param.net_param.CopyFrom(net)
    xp = numpy
    if gpu:
        import cupy
        xp = cupy
    solver = create_solver(param, source="examples/mnist/lenet_solver.prototxt", root_solver=comm.rank == 0,
                           net_kwargs={"xp": xp})
    if gpu:
        # Fillers draw from the device generator: start from the numpy fillers' weights, as the CPU runs do.
        host = create_solver(param, root_solver=False)
        solver.net.copy_trained_layers_from(host.net.to_proto())
        host.close()
        syncs = HostSyncs(solver, cupy._stand_in)
        solver.callbacks.insert(0, syncs)  # around every other callback's work
    case_comm = comm.Dup() if comm.size > 1 else None
    attached = make_distributed(solver, case_comm, schedule) if case_comm is not None else None
    solver.solve()
    solver.close()
    if comm.rank == 0:
        extra = {"host_syncs": syncs.count, "graph_launches": cupy._stand_in.counters["graph_launches"]} if gpu else {}
        if hasattr(attached, "held_updates_in_forward"):
            extra["held_updates_in_forward"] = attached.held_updates_in_forward
        numpy.savez(out, *[sio.to_host(b.data) for b in solver.net.learnable_params], **extra)


collectives.install_abort_hook()
gpu = "--gpu" in sys.argv
args = [arg for arg in sys.argv[1:] if arg != "--gpu"]
iterations, batch, out = int(args[1]), int(args[2]), args[3]
comm = MPI.COMM_WORLD
cases, case = [], [args[0]]
for arg in args[4:] + ["+"]:
    if arg == "+":
        cases.append(case)
        case = []
    else:
        case.append(arg)
for k, (schedule, *settings) in enumerate(cases):
    train(schedule, settings, out if k == 0 else out.replace(".npz", f".{k}.npz"))
