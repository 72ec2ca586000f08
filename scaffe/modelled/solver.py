"""A solver over a modelled net (scaffe.modelled.net): the solver type the prototxt names, with its real,
full-size history, whose update of a piece is a wait of the profile's time on the modelled device, a check
of the reduced gradient, and the parameters the values module expects (scaffe.modelled.values).
"""
import os
import resource
import time

from scaffe.log import get_logger
from scaffe.modelled import values
from scaffe.modelled.net import ModelledNet
from scaffe.solvers import solver_class
from scaffe.solvers.callbacks import SolverCallback

log = get_logger(__name__)


def compute_profile_setting(flag=""):
    """The compute profile asked for: --compute-profile, else SCAFFE_COMPUTE_PROFILE; "" for none."""
    return flag or os.environ.get("SCAFFE_COMPUTE_PROFILE", "").strip()


def _resolved(path, source):
    """A path of the solver file `source`: as given, else beside the solver file (as Solver._resolve)."""
    if source and not os.path.exists(path):
        return os.path.join(os.path.dirname(os.path.abspath(source)), path)
    return path


def _data_shape(net_param, source):
    """(C, H, W) of the first Data layer's first record, or None without a Data layer."""
    from scaffe.data.datum import datum_to_array
    from scaffe.data.lmdb_reader import open_database
    for layer in net_param.layer:
        if layer.type == "Data":
            with open_database(_resolved(layer.data_param.source, source)) as database:
                for _, value in database.items():
                    return datum_to_array(value)[0].shape
    return None


class ModelledUpdates:
    """Mixed into the solver's class: the update of a piece, modelled and checked."""

    def _update_elements(self, segments, rate, grad_scale, scalars_on_device):
        net = self.net
        count = 0
        for pid, start, stop in segments:
            diff = self.diff_of(pid, slice(start, stop))
            values.check_gradient(net, pid, start, stop, diff, float(grad_scale), self.update_iter,
                                  self.param.iter_size)
            count += stop - start
        net.wait_update(net.profile.update(count))
        for pid, start, stop in segments:
            self.data_of(pid, slice(start, stop))[...] = values.parameter(self.update_iter, pid)

    def iteration_passes(self, fetch=True):
        self.net.start_iteration(self.iter)
        return super().iteration_passes(fetch)

    def parameters_read(self):
        super().parameters_read()
        self.net.iteration = self.iter  # a forward now (the solve's last) reads the last update's parameters

    def snapshot(self):
        log.info("A modelled run writes no snapshots (its parameters are check values)")


def modelled_solver(param, spec, source=None, rank=0, size=1):
    """The solver of SolverParameter `param` over its train net, modelled with profile `spec`; no test nets."""
    from scaffe import io as sio
    from scaffe.proto import caffe_pb2
    net_param = caffe_pb2.NetParameter()
    if param.HasField("net_param"):
        net_param.CopyFrom(param.net_param)
    elif param.HasField("train_net_param"):
        net_param.CopyFrom(param.train_net_param)
    else:
        net_param = sio.read_net_prototxt(_resolved(param.net or param.train_net, source))
    cls = solver_class(param.type)
    net = ModelledNet(net_param, spec, _data_shape(net_param, source), cls.history_sets)
    net.rank, net.size = rank, size
    values.initial_values(net)
    param = caffe_pb2.SolverParameter.FromString(param.SerializeToString())
    param.test_interval = 0
    del param.test_iter[:]
    param.snapshot = 0
    param.snapshot_after_train = False
    modelled = type(f"Modelled{cls.__name__}", (ModelledUpdates, cls), {})
    solver = modelled(param, source=source, train_net=net, test_nets=[], root_solver=rank == 0, rank=rank)
    if rank == 0:
        log.info("Compute modelled from %s: one rank's iteration %.1f ms (forward, backward and update, "
                 "scale and dilation included)", net.profile.source, 1000 * net.iteration_s)
        if net.profile.unnamed:
            log.info("The log names no time for %d layer(s), which take none: %s", len(net.profile.unnamed),
                     ", ".join(net.profile.unnamed))
    return solver


class ModelledReport(SolverCallback):
    """Solver callback: the modelled run's iteration time after the first WARMUP iterations, and, at the end,
    every rank's CPU seconds over the host's cores times the wall time (how busy the CPU was), the largest
    rank's peak memory and all ranks' memory together (what a machine must hold for them)."""
    WARMUP = 2

    def __init__(self, solver, comm=None):
        self.solver, self.comm = solver, comm
        self._started = None
        solver.callbacks.append(self)

    def on_start(self):
        if self._started is None and self.solver.iter >= self.WARMUP:
            self._started = (time.perf_counter(), _cpu_seconds(), self.solver.iter)

    def finish(self):
        """(seconds per iteration undilated, cpu_busy) on every rank (collective when distributed)."""
        from scaffe.modelled.profile import time_dilation
        if self._started is None:
            return None, None
        self.solver.parameters_read()
        wall0, cpu0, first = self._started
        wall = time.perf_counter() - wall0
        cpu = _cpu_seconds() - cpu0
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux
        shared_mb = _proportional_mb()
        if self.comm is not None:
            from mpi4py import MPI
            cpu = self.comm.allreduce(cpu)
            wall = self.comm.allreduce(wall, op=MPI.MAX)
            rss_mb = self.comm.allreduce(rss_mb, op=MPI.MAX)
            shared_mb = self.comm.allreduce(shared_mb)
        iterations = max(1, self.solver.iter - first)
        busy = cpu / (len(os.sched_getaffinity(0)) * wall) if wall > 0 else 0.0
        per_iteration = wall / iterations / time_dilation()
        if self.solver.root_solver:
            net = self.solver.net
            log.info("Modelled: %.2f ms per iteration (undilated, %d iterations after %d), one rank's compute "
                     "%.2f ms, gradients %d bytes, cpu_busy %.3f, dilation %g, largest rank's memory %.0f MB, "
                     "all ranks' %.0f MB", 1000 * per_iteration, iterations, first,
                     1000 * net.iteration_s / time_dilation(), sum(blob.data.nbytes for blob in net.learnable_params),
                     busy, time_dilation(), rss_mb, shared_mb)
        return per_iteration, busy


def _proportional_mb():
    """This process's share of the machine's memory (Linux's proportional set size: pages shared with
    other processes, the ranks' libraries among them, counted once in all), 0 where unknown."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Pss:")) / 1024
    except (OSError, StopIteration):
        return 0.0


def _cpu_seconds():
    times = os.times()
    return times.user + times.system
