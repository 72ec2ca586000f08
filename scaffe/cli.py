"""The `scaffe` command: Caffe's `caffe train|test|time|device_query` with its flags and log lines,
plus Caffe's tools (`convert_imageset`, `convert_mnist_data` (also `convert imageset|mnist`),
`compute_image_mean`, `extract_features`, `upgrade_net_proto_text|binary`, `upgrade_solver_proto_text`,
and `parse_log` from tools/extra), which are also commands of their own under those names (TOOL_SCRIPTS).

Flags are accepted in Caffe's gflags spelling (`-solver x`, `-solver=x`) and in GNU spelling
(`--solver=x`); glog's flags (`--minloglevel`, `--logtostderr`, `--log_dir`) work with every
command and tool, and so do their GLOG_* variables (scaffe.log). Every failure ends with one line
on stderr naming the file or layer concerned and exit status 1 (2 for a bad command line).
"""
import argparse
import csv
import importlib
import importlib.metadata
import os
import platform
import sys
import typing

import numpy

from kernels._threads import num_threads
from scaffe.elastic.growth import EXIT_GROW, GrowRequested
from scaffe.log import fmt, get_logger, output_line, setup_logging, take_glog_flags, warnings_logged
from scaffe.solvers.callbacks import SolverCallback

log = get_logger("scaffe.cli")


class CliError(Exception):
    """A user-facing failure; its text is printed as the one error line."""


# ---------------------------------------------------------------- the command registry

class Command(typing.NamedTuple):
    """A `scaffe` command, registered with `command` as Caffe's brew functions are with RegisterBrewFunction."""
    name: str
    handler: typing.Callable
    summary: str
    arguments: str  # an example of its flags (Caffe's commands) or its positional synopsis (the tools)
    flags: tuple  # (name, argparse options) pairs; empty for the tools
    parses_own_flags: bool  # Caffe's tools take the argument list as it is (gflags spellings, anywhere)


_COMMANDS = {}  # name -> Command, in the order of the usage text


def command(name, summary, arguments="", flags=(), parses_own_flags=False):
    """Registers the decorated handler as `scaffe NAME`: it gets the parsed `flags`, or with
    `parses_own_flags` the argument list after NAME; it returns the exit status."""
    def register(handler):
        _COMMANDS[name] = Command(name, handler, summary, arguments, tuple(flags), parses_own_flags)
        return handler
    return register


def flag(name, **options):
    """One flag of a command, with argparse's `add_argument` options."""
    return name, options


def _usage():
    lines = ["usage: scaffe <command> [flags]", "", "commands:"]
    for cmd in _COMMANDS.values():
        if not cmd.parses_own_flags:
            example = f"{cmd.summary + ':':<28}scaffe {cmd.name} {cmd.arguments}" if cmd.arguments else cmd.summary
            lines.append(f"  {cmd.name:<20}{example}")
            continue
        synopsis = f"  {cmd.name} {cmd.arguments}"
        lines.append(f"{synopsis:<34}{cmd.summary}" if len(synopsis) <= 32 else f"{synopsis}\n{'':34}{cmd.summary}")
    lines.append("(the tools take Caffe's flags: -backend=lmdb, --backend lmdb, -gray, --shuffle=false, ...)")
    return "\n".join(lines) + "\n"


def _parser():
    # argparse prints "usage: " itself; subcommands get "scaffe <command>" as their prog.
    p = argparse.ArgumentParser(prog="scaffe", usage=_usage().removeprefix("usage: "))
    sub = p.add_subparsers(dest="command", prog="scaffe")
    for cmd in _COMMANDS.values():
        if not cmd.parses_own_flags:
            s = sub.add_parser(cmd.name)
            for name, options in cmd.flags:
                s.add_argument(name, **options)
    return p


def _gflags_to_gnu(argv):
    """Rewrites Caffe's single-dash long flags (-solver, -gpu=0) to --solver, --gpu=0."""
    return ["-" + arg if len(arg) > 2 and arg[0] == "-" and arg[1].isalpha() else arg for arg in argv]


_NET_FLAGS = (
    flag("--gpu", default="", help="GPU id(s) to use, e.g. 0 or 0,1 or all; default: CPU"),
    flag("--stage", default="", help="comma-separated net stages (NetState.stage)"),
    flag("--level", type=int, default=0, help="net level (NetState.level)"))
_MODEL_FLAGS = _NET_FLAGS + (
    flag("--model", default="", help="the model definition (.prototxt)"),
    flag("--phase", default="", help="TRAIN or TEST"))


def _stages(args):
    return [s for s in args.stage.split(",") if s]


def _phase(args, default):
    if not args.phase:
        return default
    if args.phase not in ("TRAIN", "TEST"):
        raise CliError(f"--phase={args.phase}: must be TRAIN or TEST")
    return args.phase


# ---------------------------------------------------------------- devices

def _gpu_ids(gpu_flag, count):
    """The device ids --gpu names (all of them for "all" or no flag), each checked to exist."""
    try:
        ids = list(range(count)) if gpu_flag in ("", "all") else [int(g) for g in gpu_flag.split(",") if g != ""]
        if not ids:
            raise ValueError(gpu_flag)
    except ValueError:
        raise CliError(f"--gpu={gpu_flag}: give device ids like 0 or 0,1, or all") from None
    for g in ids:
        if not 0 <= g < count:
            raise CliError(f"--gpu={gpu_flag}: device {g} does not exist ({count} GPU(s) here)")
    return ids


def _select_device(gpu_flag, solver_mode_gpu=False, device_id=0, local_rank=None):
    """numpy for the CPU, cupy on the chosen device for a GPU; logs like Caffe.

    An explicit --gpu requires a GPU. `solver_mode: GPU` without the flag (what Caffe's example
    solvers say) uses device `device_id` when there is one and the CPU otherwise. Under an MPI launcher,
    the rank of local rank r takes device r % GPUs (of those --gpu lists, or of all without the flag);
    `local_rank` None: the launcher's. SCAFFE_GPU, where set, is every rank's device (collectives.settings).
    """
    from kernels.backend import cupy_or_none
    from scaffe.parallel.launch import launcher_local_rank
    local_rank = launcher_local_rank() if local_rank is None else local_rank
    if not gpu_flag:
        if not solver_mode_gpu or cupy_or_none() is None:
            log.info("Use CPU.")
            return numpy
        # The solver's one device_id would put every rank of a host on the same GPU.
        gpu_flag = str(device_id) if local_rank is None and not os.environ.get("SCAFFE_GPU") else "all"
    cupy = cupy_or_none()
    if cupy is None:
        raise CliError(f"--gpu={gpu_flag}: no CUDA GPU is usable here (cupy missing or no device); "
                       f"leave out --gpu to run on the CPU")
    device = _device_of_rank(gpu_flag, local_rank, cupy.cuda.runtime.getDeviceCount())
    cupy.cuda.Device(device).use()
    log.info("Use GPU with device ID %d", device)
    return cupy


def _device_of_rank(gpu_flag, local_rank, count):
    """The one device of --gpu's list this process drives (collectives.settings.gpu_for says which)."""
    from collectives import settings
    ids = _gpu_ids(gpu_flag, count)
    try:
        chosen = settings.gpu(count)
        if len(ids) != 1 and local_rank is None and chosen is None:
            raise CliError(f"--gpu={gpu_flag}: one process drives one GPU; for several, launch one process per "
                           f"GPU with mpirun (see jobs/)")
        return settings.gpu_for(local_rank or 0, ids, count)
    except ValueError as error:
        raise CliError(str(error)) from None


# ---------------------------------------------------------------- train

class CsvLog(SolverCallback):
    """--log_csv: one row per training iteration (iteration, seconds since start, loss, smoothed
    loss, lr, images/s) with the test scores of that iteration in extra columns; a final test
    after the last iteration gets a row of its own."""

    def __init__(self, path, test_columns):
        self.path = path
        self.columns = ["iteration", "seconds", "loss", "smoothed_loss", "lr", "images_per_s"] + test_columns
        self._file = open(path, "w", newline="", encoding="utf-8")
        self._writer = csv.DictWriter(self._file, fieldnames=self.columns, restval="")
        self._writer.writeheader()
        self._pending = {}

    def on_test(self, iteration, test_net_id, scores):
        row = self._pending.setdefault(iteration, {})
        for name, value in scores.items():
            row[f"test{test_net_id}_{name}"] = _g(value)

    def on_iteration(self, record):
        row = self._pending.pop(record["iteration"], {})
        row.update({"iteration": record["iteration"], "seconds": f"{record['seconds']:.4f}",
                    "loss": _g(record["loss"]), "smoothed_loss": _g(record["smoothed_loss"]),
                    "lr": _g(record["lr"]), "images_per_s": f"{record['images_per_s']:.1f}"})
        self._writer.writerow(row)
        self._file.flush()

    def close(self):
        for iteration in sorted(self._pending):
            row = self._pending[iteration]
            row["iteration"] = iteration
            self._writer.writerow(row)
        self._pending.clear()
        self._file.close()


def _g(value):
    return "" if value is None else f"{float(value):.9g}"


def _solver_param(args):
    """The SolverParameter of --solver with the command line's overrides."""
    from scaffe.solvers import read_solver_file
    if not args.solver:
        raise CliError("need a solver definition to train: --solver=solver.prototxt")
    if sum(map(bool, (args.snapshot, args.weights, args.resume_commit))) > 1:
        raise CliError("give --snapshot or --resume-commit to resume training, or --weights to finetune, not both")
    param = read_solver_file(args.solver)
    param.train_state.level = args.level
    param.train_state.stage.extend(_stages(args))
    if args.iterations is not None:
        param.max_iter = args.iterations
    if args.snapshot or args.weights or args.resume_commit:  # they replace the solver's weights
        del param.weights[:]
        param.weights.extend([args.weights] if args.weights else [])
    return param


@command("train", "train or finetune a model", "--solver=S [--weights=W | --snapshot=S]", _NET_FLAGS + (
    flag("--solver", default="", help="the solver definition (.prototxt)"),
    flag("--weights", default="", help="comma-separated .caffemodel files to finetune from"),
    flag("--snapshot", default="", help="a .solverstate to resume from"),
    flag("--resume-commit", dest="resume_commit", default="",
         help="a commit directory (scaffe commits) to resume from, at any rank count (scaffe.elastic)"),
    flag("--iterations", type=int, default=None, help="override the solver's max_iter"),
    flag("--log_csv", default="", help="write per-iteration loss, lr, images/s and test scores here"),
    flag("--sigint_effect", default="stop",
         help="on SIGINT: stop, snapshot or none (SIGTERM always snapshots and stops)"),
    flag("--sighup_effect", default="snapshot", help="on SIGHUP: stop, snapshot or none"),
    flag("--schedule", default="scaffe", choices=("scaffe", "allreduce", "native"),
         help="under an MPI launcher: S-Caffe's per-layer bcast/reduce (root updates), "
              "bucketed allreduce (every rank updates) or native (MPI Allreduce after backward, "
              "no overlap: a baseline)"),
    flag("--timeline", default="", help="write a Chrome trace of training here (all ranks, one file; "
                                        "open in ui.perfetto.dev) and log the hidden communication"),
    flag("--compute-profile", dest="compute_profile", default="",
         help="model the compute instead of running it: k80, v100, h100 or a `caffe time` log "
              "(also SCAFFE_COMPUTE_PROFILE; scaffe.modelled)")))
def _train(args):
    from scaffe.parallel.launch import quiet_non_root, world
    from scaffe.solvers.signals import SignalHandler, keep_sighup_from_ucx
    param = _solver_param(args)
    keep_sighup_from_ucx()  # before MPI starts (world() below)
    from scaffe.modelled.solver import compute_profile_setting
    profile = compute_profile_setting(args.compute_profile)  # a modelled run uses no device
    xp = None if profile else _training_device(args, param)
    handler = SignalHandler(args.sigint_effect, args.sighup_effect)
    csv_log = solver = timeline = report = committer = None
    comm, rank, size = world()
    quiet_non_root(rank)
    finished = False  # whether the commits still being written are waited for
    try:
        solver, report, committer = _training_solver(args, param, profile, xp, comm)
        if args.timeline:
            from scaffe.timeline import Timeline
            timeline = Timeline(solver, comm)
            timeline.start()
        solver.action_function = handler.action
        csv_log = _csv_log(args.log_csv, solver) if rank == 0 else None  # the root records for everyone
        if args.snapshot:
            log.info("Resuming from %s", args.snapshot)
            solver.restore(args.snapshot)
        log.info("Starting Optimization")
        solver.solve()
        if report is not None:
            report.finish()
        log.info("Optimization Done.")  # caffe.cpp prints it again after Solver::Solve
        if timeline is not None:
            timeline.finish(args.timeline)
        finished = True
    except GrowRequested:
        finished = True
        return EXIT_GROW
    finally:
        if timeline is not None:
            timeline.stop()
        handler.restore()
        if committer is not None:
            committer.close(wait=finished)
        for resource in (csv_log, solver):
            if resource is not None:
                resource.close()
    return 0


def _csv_log(path, solver):
    """The --log_csv recorder of `solver`, added to its callbacks; None without the flag."""
    from scaffe.solvers.solver import test_output_keys
    if not path:
        return None
    columns = [f"test{k}_{key}" for k, net in enumerate(solver.test_nets) for key in test_output_keys(net)]
    csv_log = CsvLog(path, columns)
    solver.callbacks.append(csv_log)
    return csv_log


def _training_device(args, param):
    """The array module this rank trains on. The GPU is picked before MPI starts (CUDA-aware MPIs want that)
    where the launcher gives the local rank; a launcher that does not is asked through MPI's node split."""
    from scaffe.parallel.launch import launcher_local_rank, node_local_rank, world
    local_rank = launcher_local_rank()
    if local_rank is None:
        local_rank = node_local_rank(world()[0])
    return _select_device(args.gpu, param.HasField("solver_mode") and param.solver_mode == param.GPU,
                          param.device_id, local_rank)


def _training_solver(args, param, profile, xp, comm):
    """(the solver, the modelled run's report or None, its scaffe.elastic committer or None), made distributed
    under an MPI launcher: a modelled solver (scaffe.modelled) with a compute profile, else one on array module
    `xp`, resumed from --resume-commit where given."""
    from scaffe.elastic.committer import start_committing
    from scaffe.parallel.launch import make_distributed
    from scaffe.solvers import create_solver
    rank, size = comm.Get_rank(), comm.Get_size()
    report = schedule = None
    if profile:
        if args.resume_commit:
            raise CliError("--resume-commit resumes real training, not a modelled run (--compute-profile)")
        from scaffe.modelled.solver import modelled_solver
        solver = modelled_solver(param, profile, source=args.solver, rank=rank, size=size)
    else:
        solver = create_solver(param, source=args.solver, net_kwargs={"xp": xp}, root_solver=rank == 0)
    if args.resume_commit:
        from scaffe.elastic.resume import resume_from_commit
        resume_from_commit(solver, args.resume_commit, rank, size)
    if size > 1:
        schedule = make_distributed(solver, comm, args.schedule)
    if profile:
        from scaffe.modelled.solver import ModelledReport
        report = ModelledReport(solver, comm if size > 1 else None)
    committer = start_committing(solver, args.solver, *((comm, schedule.comm.node_topology) if schedule else ()))
    return solver, report, committer


# ---------------------------------------------------------------- test

@command("test", "score a model", "--model=M --weights=W [--iterations=50]", _MODEL_FLAGS + (
    flag("--weights", default="", help="the trained .caffemodel"),
    flag("--iterations", type=int, default=50, help="number of batches")))
def _test(args):
    """Caffe's `caffe test`. Under an MPI launcher the ranks share the batches (scaffe.parallel.
    sharded_testing) and the root prints the one report a single process would."""
    from scaffe.net import Net
    from scaffe.parallel.launch import quiet_non_root, world
    from scaffe.parallel.sharded_testing import ShardedTesting, shardable
    if not args.model:
        raise CliError("need a model definition to score: --model=net.prototxt")
    if not args.weights:
        raise CliError("need model weights to score: --weights=net.caffemodel")
    comm, rank, size = world()
    quiet_non_root(rank)
    xp = _select_device(args.gpu)
    net = Net.from_file(args.model, _phase(args, "TEST"), _stages(args), args.level, xp=xp)
    try:
        sharding = ShardedTesting(comm, [net]) if size > 1 and shardable(net) else None
        if size > 1 and sharding is None:
            log.warning("%s reads from a source that cannot be sharded: the root scores alone", args.model)
            if rank != 0:
                return 0
        net.copy_trained_layers_from(args.weights)
        log.info("Running for %d iterations.", args.iterations)
        rows = ((_forward_row(net) for _ in range(args.iterations)) if sharding is None
                else sharding.rounds(0, args.iterations, lambda: _forward_row(net)))
        if rank == 0:  # the root reports for everyone
            _report_scores(net, rows, args.iterations)
        else:
            for _ in rows:  # runs this rank's batches and their rounds' gathers
                pass
    finally:
        net.close()
    return 0


def _forward_row(net):
    """One batch: its loss, then every output value."""
    from scaffe.io import to_host
    loss = float(net.forward())
    row = [loss] + [float(v) for b in net.output_blobs for v in numpy.asarray(to_host(b.data)).ravel()]
    net.check_deferred_errors()  # the host has just read the outputs anyway
    return row


def _report_scores(net, rows, iterations):
    """Caffe's `caffe test` report: every batch's outputs as the batch ends, the mean loss, the mean of
    every output."""
    outputs = [(net.blob_names[blob_id], net.blob_loss_weights[blob_id])
               for blob_id in net.output_blob_ids for _ in range(net.blobs_list[blob_id].count)]
    totals = None
    loss = 0.0
    for i, row in enumerate(rows):
        loss += row[0]
        for (name, _), value in zip(outputs, row[1:]):
            log.info("Batch %d, %s = %s", i, name, fmt(numpy.float32(value)))
        totals = list(row[1:]) if totals is None else [a + b for a, b in zip(totals, row[1:])]
    log.info("Loss: %s", fmt(numpy.float32(loss / max(iterations, 1))))
    for index, (name, weight) in enumerate(outputs):
        log.info(output_line(name, numpy.float32(totals[index] / iterations) if totals else numpy.float32("nan"),
                             weight))


# ---------------------------------------------------------------- time

@command("time", "benchmark layer by layer", "--model=M [--iterations=50]", _MODEL_FLAGS + (
    flag("--weights", default="", help="optional .caffemodel (default: filler weights)"),
    flag("--iterations", type=int, default=50, help="number of forward-backward passes")))
def _time(args):
    from scaffe.net import Net
    if not args.model:
        raise CliError("need a model definition to time: --model=net.prototxt")
    xp = _select_device(args.gpu)
    net = Net.from_file(args.model, _phase(args, "TRAIN"), _stages(args), args.level, xp=xp)
    try:
        if args.weights:
            net.copy_trained_layers_from(args.weights)
        log.info("Performing Forward")
        initial_loss = float(net.forward())
        log.info("Initial loss: %s", fmt(initial_loss))
        log.info("Performing Backward")
        net.backward()
        iterations = args.iterations
        log.info("Backward times call every layer's Backward with this net's propagate_down flags, as Caffe's "
                 "`caffe time` does: bottom gradients that nothing needs (all of them in a net without a loss) "
                 "are skipped, parameter gradients are computed.")
        log.info("*** Benchmark begins ***")
        log.info("Testing for %d iterations.", iterations)
        layers = net.layers
        # Integer microseconds and milliseconds, as Caffe's CPU timer reports them; net.clock() waits for
        # the device first, or a GPU layer's time would be its kernel launches only.
        fwd_us = [0] * len(layers)
        bwd_us = [0] * len(layers)
        forward_us = backward_us = 0
        total_start = net.clock()
        for j in range(iterations):
            iter_start = net.clock()
            for i, layer in enumerate(layers):
                t0 = net.clock()
                net.forward_from_to(i, i)
                fwd_us[i] += int((net.clock() - t0) * 1e6)
            forward_us += int((net.clock() - iter_start) * 1e6)
            back_start = net.clock()
            for i in range(len(layers) - 1, -1, -1):
                t0 = net.clock()
                # Like caffe time: every layer's backward, needed or not.
                try:
                    layers[i].backward(net.top_vecs[i], net.bottom_need_backward[i], net.bottom_vecs[i])
                except NotImplementedError as e:
                    raise CliError(f"{args.model}: layer '{layers[i].name}' ({layers[i].param.type}) has no "
                                   f"backward ({' '.join(str(e).split())}); exclude it from timing with a "
                                   f"stage rule and --stage") from None
                bwd_us[i] += int((net.clock() - t0) * 1e6)
            backward_us += int((net.clock() - back_start) * 1e6)
            log.info("Iteration: %d forward-backward time: %d ms.", j + 1, int((net.clock() - iter_start) * 1e3))
        total_ms = int((net.clock() - total_start) * 1e3)
        n = max(iterations, 1)
        log.info("Average time per layer: ")
        for i, layer in enumerate(layers):
            log.info("%10s\tforward: %s ms.", layer.name, fmt(fwd_us[i] / 1000 / n))
            log.info("%10s\tbackward: %s ms.", layer.name, fmt(bwd_us[i] / 1000 / n))
        log.info("Average Forward pass: %s ms.", fmt(forward_us / 1000 / n))
        log.info("Average Backward pass: %s ms.", fmt(backward_us / 1000 / n))
        log.info("Average Forward-Backward: %s ms.", fmt(total_ms / n))
        log.info("Total Time: %d ms.", total_ms)
        log.info("*** Benchmark ends ***")
    finally:
        net.close()
    return 0


# ---------------------------------------------------------------- device_query

@command("device_query", "show the CPU and any GPUs",
         flags=[flag("--gpu", default="", help="GPU id(s) to describe")])
def _device_query(args):
    cores = os.cpu_count() or 1
    log.info("CPU: %s, %d logical cores, %s", platform.processor() or platform.machine(), cores, platform.platform())
    log.info("numpy %s", numpy.__version__)
    log.info("numba %s (compiles the CPU kernels; %d threads run them)", importlib.metadata.version("numba"),
             num_threads())
    from kernels.backend import cupy_or_none
    cupy = cupy_or_none()
    if cupy is None:
        log.info("No CUDA GPU is usable (cupy missing or no device).")
        if args.gpu:
            raise CliError(f"--gpu={args.gpu}: no CUDA GPU is usable here")
        return 0
    for g in _gpu_ids(args.gpu, cupy.cuda.runtime.getDeviceCount()):
        props = cupy.cuda.runtime.getDeviceProperties(g)
        log.info("Querying GPUs %d", g)
        log.info("Device id:                     %d", g)
        log.info("Major revision number:         %d", props["major"])
        log.info("Minor revision number:         %d", props["minor"])
        name = props["name"]
        log.info("Name:                          %s", name.decode() if isinstance(name, bytes) else name)
        log.info("Total global memory:           %d", props["totalGlobalMem"])
        log.info("Total shared memory per block: %d", props["sharedMemPerBlock"])
        log.info("Warp size:                     %d", props["warpSize"])
        log.info("Maximum threads per block:     %d", props["maxThreadsPerBlock"])
        log.info("Clock rate:                    %d", props["clockRate"])
        log.info("Number of multiprocessors:     %d", props["multiProcessorCount"])
    return 0


# ---------------------------------------------------------------- data tools

def _tool(module, *leading):
    """A handler running `scaffe.tools.<module>.main(*leading, argv)`, imported when it runs."""
    return lambda argv: importlib.import_module(f"scaffe.tools.{module}").main(*leading, argv)


command("convert", "build LMDBs (no ARGS for mnist: the bundled digits into examples/mnist)", "mnist|imageset ARGS",
        parses_own_flags=True)(_tool("convert"))
for _name, _module, _arguments, _summary in (
        ("convert_imageset", "convert_imageset", "[flags] ROOT/ LIST DB", "Caffe's name for convert imageset"),
        ("convert_mnist_data", "convert_mnist", "IMAGES LABELS DB", "Caffe's name for convert mnist"),
        ("compute_image_mean", "compute_image_mean", "DB [OUT]", "the mean image of an LMDB, as a binaryproto"),
        ("extract_features", "extract_features",
         "WEIGHTS MODEL BLOB[,..] DB[,..] NUM_BATCHES lmdb [CPU|GPU] [DEVICE]",
         "store blobs of a forward pass, one Datum per sample"),
        ("parse_log", "parse_log", "[--plot=PNG] LOGFILE OUTPUT_DIR",
         "a training log as Caffe's <log>.train/.test CSV files (tools/extra/parse_log.py)")):
    command(_name, _summary, _arguments, parses_own_flags=True)(_tool(_module))
for _name, _summary in (("upgrade_net_proto_text", "rewrite an old (V0/V1) net prototxt in today's format"),
                        ("upgrade_net_proto_binary", "the same for a .caffemodel"),
                        ("upgrade_solver_proto_text", 'the same for a solver (solver_type: ADAM -> type: "Adam")')):
    command(_name, _summary, "IN OUT", parses_own_flags=True)(_tool("upgrade_proto", _name))

for _name, _function, _arguments, _summary in (
        ("commits", "commits", "[--dir D]", "this host's training commits, newest first: <iteration> <path>"),
        ("commit-to-snapshot", "commit_to_snapshot", "PATH --prefix P",
         "a commit as a .caffemodel + .solverstate that train --snapshot resumes")):
    command(_name, _summary, _arguments, parses_own_flags=True)(
        lambda argv, function=_function: getattr(importlib.import_module("scaffe.elastic.commands"), function)(argv))
command("elastic", "run `scaffe train` through an MPI launcher, relaunched on the hosts left after a failure",
        "[--min-np N] [--max-np M] [--hostfile F] -- scaffe train ...", parses_own_flags=True)(
    lambda argv: importlib.import_module("scaffe.elastic.supervisor").main(argv))

COMMANDS = tuple(_COMMANDS)
# Caffe's tools under their own names (setup.py's console scripts): `convert_imageset ARGS` is
# `scaffe convert_imageset ARGS`.
TOOL_SCRIPTS = ("convert_imageset", "convert_mnist_data", "compute_image_mean", "extract_features",
                "upgrade_net_proto_text", "upgrade_net_proto_binary", "upgrade_solver_proto_text", "parse_log")


def main(argv=None, program="scaffe"):
    """Entry point of the `scaffe` console script and of `python -m scaffe`; returns the exit code.
    glog's flags (--minloglevel, --logtostderr, --log_dir) may stand anywhere in `argv`; `program`
    names glog's log files."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv, glog_flags = take_glog_flags(argv)
    except ValueError as e:
        sys.stderr.write(f"{program}: {e}\n")
        return 2
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(_usage())
        return 0 if argv else 2
    cmd = _COMMANDS.get(argv[0])
    if cmd is None:
        sys.stderr.write(f"scaffe: unknown command {argv[0]!r}; known: {', '.join(COMMANDS)}\n")
        return 2
    try:
        setup_logging(glog_flags, program)
        args = argv[1:] if cmd.parses_own_flags else _parser().parse_args([cmd.name] + _gflags_to_gnu(argv[1:]))
        with warnings_logged():
            return int(cmd.handler(args) or 0)
    except SystemExit as e:  # --help, or a command line a parser refused
        if isinstance(e.code, str):
            sys.stderr.write(e.code + "\n")
            return 2
        return int(e.code or 0)
    # NetError, SolverError and CaffeFormatError are ValueErrors or RuntimeErrors.
    except (CliError, ValueError, OSError, RuntimeError, KeyError, NotImplementedError, MemoryError) as e:
        _fail(_who(program, cmd.name), e)
    except KeyboardInterrupt:
        sys.stderr.write(f"{_who(program, cmd.name)}: interrupted\n")
        return 130
    return 1


def tool_script(name=None):
    """Entry point of the console scripts in TOOL_SCRIPTS (the script's own name is the command) and of
    `python -m scaffe.tools.<module>` (`name`: its command); returns the exit code."""
    name = name or os.path.splitext(os.path.basename(sys.argv[0]))[0]
    return main([name] + sys.argv[1:], program=name)


def _who(program, command_name):
    """What the error line names: `scaffe train`, or a tool script's own name."""
    return command_name if program == command_name else f"{program} {command_name}"


def _fail(who, err):
    text = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, KeyError):
        text = f"missing {text}"
    sys.stderr.flush()
    sys.stderr.write(f"{who}: error: {text}\n")
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
