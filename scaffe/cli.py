"""The `scaffe` command: Caffe's `caffe train|test|time|device_query` with its flags and log lines,
plus Caffe's tools (`convert mnist|imageset`, `compute_image_mean`, `extract_features`,
`upgrade_net_proto_text|binary`, `upgrade_solver_proto_text`).

Flags are accepted in Caffe's gflags spelling (`-solver x`, `-solver=x`) and in GNU spelling
(`--solver=x`). Every failure ends with one line on stderr naming the file or layer concerned
and exit status 1 (2 for a bad command line).
"""
import argparse
import csv
import functools
import os
import platform
import sys
import time

import numpy

from scaffe.log import fmt, get_logger, setup_logging

log = get_logger("scaffe.cli")

COMMANDS = ("train", "test", "time", "device_query", "convert", "compute_image_mean", "extract_features",
            "upgrade_net_proto_text", "upgrade_net_proto_binary", "upgrade_solver_proto_text")

_USAGE = """usage: scaffe <command> [flags]

commands:
  train               train or finetune a model:  scaffe train --solver=S [--weights=W | --snapshot=S]
  test                score a model:              scaffe test --model=M --weights=W [--iterations=50]
  time                benchmark layer by layer:   scaffe time --model=M [--iterations=50]
  device_query        show the CPU and any GPUs
  convert mnist|imageset ARGS     build LMDBs (no ARGS for mnist: the bundled digits into examples/mnist)
  compute_image_mean DB [OUT]     the mean image of an LMDB, as a binaryproto
  extract_features WEIGHTS MODEL BLOB[,..] DB[,..] NUM_BATCHES lmdb [CPU|GPU] [DEVICE]
                                  store blobs of a forward pass, one Datum per sample
  upgrade_net_proto_text IN OUT   rewrite an old (V0/V1) net prototxt in today's format
  upgrade_net_proto_binary IN OUT
                                  the same for a .caffemodel
  upgrade_solver_proto_text IN OUT
                                  the same for a solver (solver_type: ADAM -> type: "Adam")
(the tools take Caffe's flags: -backend=lmdb, --backend lmdb, -gray, --shuffle=false, ...)
"""


class CliError(Exception):
    """A user-facing failure; its text is printed as the one error line."""


# ---------------------------------------------------------------- argument parsing

def _gflags_to_gnu(argv):
    """Rewrites Caffe's single-dash long flags (-solver, -gpu=0) to --solver, --gpu=0."""
    out = []
    for arg in argv:
        if arg.startswith("-") and not arg.startswith("--") and len(arg) > 2 and arg[1].isalpha():
            arg = "-" + arg
        out.append(arg)
    return out


def _common(p, model=False):
    p.add_argument("--gpu", default="", help="GPU id(s) to use, e.g. 0 or 0,1 or all; default: CPU")
    p.add_argument("--stage", default="", help="comma-separated net stages (NetState.stage)")
    p.add_argument("--level", type=int, default=0, help="net level (NetState.level)")
    if model:
        p.add_argument("--model", default="", help="the model definition (.prototxt)")
        p.add_argument("--phase", default="", help="TRAIN or TEST")


def _parser():
    # argparse prints "usage: " itself; subcommands get "scaffe <command>" as their prog.
    p = argparse.ArgumentParser(prog="scaffe", usage=_USAGE.removeprefix("usage: "), add_help=True)
    sub = p.add_subparsers(dest="command", prog="scaffe")
    t = sub.add_parser("train", help="train or finetune a model")
    _common(t)
    t.add_argument("--solver", default="", help="the solver definition (.prototxt)")
    t.add_argument("--weights", default="", help="comma-separated .caffemodel files to finetune from")
    t.add_argument("--snapshot", default="", help="a .solverstate to resume from")
    t.add_argument("--iterations", type=int, default=None, help="override the solver's max_iter")
    t.add_argument("--log_csv", default="", help="write per-iteration loss, lr, images/s and test scores here")
    t.add_argument("--sigint_effect", default="stop",
                   help="on SIGINT: stop, snapshot or none (SIGTERM always snapshots and stops)")
    t.add_argument("--sighup_effect", default="snapshot", help="on SIGHUP: stop, snapshot or none")
    t.add_argument("--schedule", default="scaffe", choices=("scaffe", "allreduce", "native"),
                   help="under an MPI launcher: S-Caffe's per-layer bcast/reduce (root updates), "
                        "bucketed allreduce (every rank updates) or native (MPI Allreduce after backward, "
                        "no overlap: a baseline)")
    t.add_argument("--timeline", default="", help="write a Chrome trace of training here (all ranks, one file; "
                                                  "open in ui.perfetto.dev) and log the hidden communication")
    s = sub.add_parser("test", help="score a model")
    _common(s, model=True)
    s.add_argument("--weights", default="", help="the trained .caffemodel")
    s.add_argument("--iterations", type=int, default=50, help="number of batches")
    m = sub.add_parser("time", help="benchmark a model layer by layer")
    _common(m, model=True)
    m.add_argument("--weights", default="", help="optional .caffemodel (default: filler weights)")
    m.add_argument("--iterations", type=int, default=50, help="number of forward-backward passes")
    d = sub.add_parser("device_query", help="show the devices")
    d.add_argument("--gpu", default="", help="GPU id(s) to describe")
    return p


def _stages(args):
    return [s for s in args.stage.split(",") if s] if args.stage else []


# ---------------------------------------------------------------- devices

def _select_device(gpu_flag, solver_mode_gpu=False, device_id=0):
    """numpy for the CPU, cupy on the chosen device for a GPU; logs like Caffe.

    An explicit --gpu requires a GPU. `solver_mode: GPU` without the flag (what Caffe's example
    solvers say) uses device `device_id` when there is one and the CPU otherwise. Under an MPI launcher,
    the rank of local rank r takes device r % GPUs (of those --gpu lists, or of all without the flag).
    """
    from kernels.backend import cupy_or_none
    from scaffe.parallel.launch import device_for_rank, launcher_local_rank
    local_rank = launcher_local_rank()
    if not gpu_flag:
        if not solver_mode_gpu or cupy_or_none() is None:
            log.info("Use CPU.")
            return numpy
        # The solver's one device_id would put every rank of a host on the same GPU.
        gpu_flag = str(device_id) if local_rank is None else "all"
    cupy = cupy_or_none()
    if cupy is None:
        raise CliError(f"--gpu={gpu_flag}: no CUDA GPU is usable here (cupy missing or no device); "
                       f"leave out --gpu to run on the CPU")
    count = cupy.cuda.runtime.getDeviceCount()
    try:
        ids = list(range(count)) if gpu_flag == "all" else [int(g) for g in gpu_flag.split(",") if g != ""]
        if not ids:
            raise ValueError(gpu_flag)
    except ValueError:
        raise CliError(f"--gpu={gpu_flag}: give device ids like 0 or 0,1, or all") from None
    for g in ids:
        if not 0 <= g < count:
            raise CliError(f"--gpu={gpu_flag}: device {g} does not exist ({count} GPU(s) here)")
    if len(ids) != 1 and local_rank is None:
        raise CliError(f"--gpu={gpu_flag}: one process drives one GPU; for several, launch one process per "
                       f"GPU with mpirun (see jobs/)")
    device = device_for_rank(ids, local_rank or 0)
    cupy.cuda.Device(device).use()
    log.info("Use GPU with device ID %d", device)
    return cupy


# ---------------------------------------------------------------- train

class CsvLog:
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


def _train(args):
    from scaffe.solvers import create_solver, read_solver_file
    from scaffe.solvers.signals import SignalHandler, keep_sighup_from_ucx
    from scaffe.solvers.solver import test_output_keys
    if not args.solver:
        raise CliError("need a solver definition to train: --solver=solver.prototxt")
    if args.snapshot and args.weights:
        raise CliError("give --snapshot to resume training or --weights to finetune, not both")
    param = read_solver_file(args.solver)
    param.train_state.level = args.level
    param.train_state.stage.extend(_stages(args))
    if args.iterations is not None:
        param.max_iter = args.iterations
    xp = _select_device(args.gpu, param.HasField("solver_mode") and param.solver_mode == param.GPU, param.device_id)
    keep_sighup_from_ucx()  # before MPI starts (world() below)
    handler = SignalHandler(args.sigint_effect, args.sighup_effect)
    if args.snapshot:
        del param.weights[:]
    elif args.weights:
        del param.weights[:]
        param.weights.append(args.weights)
    csv_log = None
    solver = None
    timeline = None
    from scaffe.parallel.launch import make_distributed, quiet_non_root, world
    comm, rank, size = world()
    quiet_non_root(rank)
    try:
        solver = create_solver(param, source=args.solver, net_kwargs={"xp": xp}, root_solver=rank == 0)
        if size > 1:
            make_distributed(solver, comm, args.schedule)
        if args.timeline:
            from scaffe.timeline import Timeline
            timeline = Timeline(solver, comm)
            timeline.start()
        solver.action_function = handler.action
        if args.log_csv and rank == 0:  # the root records for everyone
            columns = [f"test{k}_{key}" for k, net in enumerate(solver.test_nets) for key in test_output_keys(net)]
            csv_log = CsvLog(args.log_csv, columns)
            solver.listeners.append(csv_log)
        if args.snapshot:
            log.info("Resuming from %s", args.snapshot)
            solver.restore(args.snapshot)
        log.info("Starting Optimization")
        solver.solve()
        log.info("Optimization Done.")  # caffe.cpp prints it again after Solver::Solve
        if timeline is not None:
            timeline.finish(args.timeline)
    finally:
        if timeline is not None:
            timeline.stop()
        handler.restore()
        if csv_log is not None:
            csv_log.close()
        if solver is not None:
            solver.close()
    return 0


# ---------------------------------------------------------------- test

def _phase(args, default):
    if not args.phase:
        return default
    if args.phase not in ("TRAIN", "TEST"):
        raise CliError(f"--phase={args.phase}: must be TRAIN or TEST")
    return args.phase


def _test(args):
    """Caffe's `caffe test`. Under an MPI launcher the ranks share the batches (scaffe.parallel.
    sharded_testing) and the root prints the one report a single process would."""
    from scaffe.io import to_host
    from scaffe.net import Net
    from scaffe.parallel.launch import quiet_non_root, world
    from scaffe.parallel.sharded_testing import ShardedTesting, shardable
    if not args.model:
        raise CliError("need a model definition to score: --model=net.prototxt")
    if not args.weights:
        raise CliError("need model weights to score: --weights=net.caffemodel")
    comm, rank, size = world()
    quiet_non_root(rank)
    _select_device(args.gpu)
    net = Net.from_file(args.model, _phase(args, "TEST"), _stages(args), args.level)
    try:
        sharding = ShardedTesting(comm, [net]) if size > 1 and shardable(net) else None
        if size > 1 and sharding is None:
            log.warning("%s reads from a source that cannot be sharded: the root scores alone", args.model)
            if rank != 0:
                return 0
        net.copy_trained_layers_from(args.weights)
        log.info("Running for %d iterations.", args.iterations)
        batches = range(args.iterations) if sharding is None else sharding.batches(0, args.iterations)
        rows = []  # per batch: its loss, then every output value
        for _ in batches:
            loss = net.forward()
            rows.append([loss] + [float(v) for blob_id in net.output_blob_ids
                                  for v in numpy.asarray(to_host(net.blobs_list[blob_id].data)).ravel()])
        if sharding is not None:
            rows = sharding.gather(batches, rows)
            if rows is None:  # not the root: it reports for everyone
                return 0
        scores = None
        loss = 0.0
        for i, row in enumerate(rows):
            loss += row[0]
            values = iter(row[1:])
            for blob_id in net.output_blob_ids:
                for _ in range(net.blobs_list[blob_id].count):
                    log.info("Batch %d, %s = %s", i, net.blob_names[blob_id], fmt(numpy.float32(next(values))))
            scores = list(row[1:]) if scores is None else [a + b for a, b in zip(scores, row[1:])]
        loss /= max(args.iterations, 1)
        log.info("Loss: %s", fmt(numpy.float32(loss)))
        index = 0
        for blob_id in net.output_blob_ids:
            name = net.blob_names[blob_id]
            weight = net.blob_loss_weights[blob_id]
            for _ in range(net.blobs_list[blob_id].count):
                mean = numpy.float32(scores[index] / args.iterations) if scores else numpy.float32("nan")
                extra = f" (* {fmt(weight)} = {fmt(numpy.float32(weight) * mean)} loss)" if weight else ""
                log.info("%s = %s%s", name, fmt(mean), extra)
                index += 1
    finally:
        net.close()
    return 0


# ---------------------------------------------------------------- time

def _time(args):
    from scaffe.net import Net
    if not args.model:
        raise CliError("need a model definition to time: --model=net.prototxt")
    _select_device(args.gpu)
    net = Net.from_file(args.model, _phase(args, "TRAIN"), _stages(args), args.level)
    try:
        if args.weights:
            net.copy_trained_layers_from(args.weights)
        log.info("Performing Forward")
        initial_loss = net.forward()
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
        # Integer microseconds and milliseconds, as Caffe's CPU timer reports them.
        fwd_us = [0] * len(layers)
        bwd_us = [0] * len(layers)
        forward_us = backward_us = 0
        total_start = time.perf_counter()
        for j in range(iterations):
            iter_start = time.perf_counter()
            for i, layer in enumerate(layers):
                t0 = time.perf_counter()
                net.forward_from_to(i, i)
                fwd_us[i] += int((time.perf_counter() - t0) * 1e6)
            forward_us += int((time.perf_counter() - iter_start) * 1e6)
            back_start = time.perf_counter()
            for i in range(len(layers) - 1, -1, -1):
                t0 = time.perf_counter()
                # Like caffe time: every layer's backward, needed or not.
                try:
                    layers[i].backward(net.top_vecs[i], net.bottom_need_backward[i], net.bottom_vecs[i])
                except NotImplementedError as e:
                    raise CliError(f"{args.model}: layer '{layers[i].name}' ({layers[i].param.type}) has no "
                                   f"backward ({' '.join(str(e).split())}); exclude it from timing with a "
                                   f"stage rule and --stage") from None
                bwd_us[i] += int((time.perf_counter() - t0) * 1e6)
            backward_us += int((time.perf_counter() - back_start) * 1e6)
            log.info("Iteration: %d forward-backward time: %d ms.", j + 1, int((time.perf_counter() - iter_start) * 1e3))
        total_ms = int((time.perf_counter() - total_start) * 1e3)
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

def _device_query(args):
    cores = os.cpu_count() or 1
    log.info("CPU: %s, %d logical cores, %s", platform.processor() or platform.machine(), cores, platform.platform())
    log.info("numpy %s", numpy.__version__)
    try:
        import numba
        log.info("numba %s (CPU kernels; %d threads)", numba.__version__, numba.config.NUMBA_NUM_THREADS)
    except ImportError:
        log.info("numba not installed: CPU kernels fall back to numpy")
    from kernels.backend import cupy_or_none
    cupy = cupy_or_none()
    if cupy is None:
        log.info("No CUDA GPU is usable (cupy missing or no device).")
        if args.gpu:
            raise CliError(f"--gpu={args.gpu}: no CUDA GPU is usable here")
        return 0
    count = cupy.cuda.runtime.getDeviceCount()
    ids = list(range(count)) if not args.gpu or args.gpu == "all" else [int(g) for g in args.gpu.split(",")]
    for g in ids:
        if not 0 <= g < count:
            raise CliError(f"--gpu={args.gpu}: device {g} does not exist ({count} GPU(s) here)")
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

def _convert(argv):
    kind, argv = (argv[0], argv[1:]) if argv else ("", [])
    if kind == "mnist":
        from scaffe.tools import convert_mnist
        if not argv:
            train, test = convert_mnist.ensure_mnist_lmdb(os.path.join("examples", "mnist"))
            log.info("MNIST LMDBs ready: %s, %s", train, test)
            return 0
        return convert_mnist.main(argv)
    if kind == "imageset":
        from scaffe.tools import convert_imageset
        return convert_imageset.main(argv)
    if kind in ("-h", "--help"):
        sys.stdout.write("usage: scaffe convert mnist [IMAGES LABELS DB] | imageset [flags] ROOT/ LIST DB\n"
                         "  (scaffe convert mnist --help, scaffe convert imageset --help: their flags)\n")
        return 0
    raise SystemExit(f"scaffe convert: say what to convert: mnist [IMAGES LABELS DB] or imageset ROOT/ LIST DB, "
                     f"got {kind!r}")


def _compute_image_mean(argv):
    from scaffe.tools import compute_image_mean
    return compute_image_mean.main(argv)


def _extract_features(argv):
    from scaffe.tools import extract_features
    return extract_features.main(argv)


def _upgrade_proto(tool, argv):
    from scaffe.tools import upgrade_proto
    return upgrade_proto.main(tool, argv)


_HANDLERS = {"train": _train, "test": _test, "time": _time, "device_query": _device_query}

# Caffe's tools parse their own arguments (flags in gflags spelling, anywhere on the line): they
# get the argument list as it is, never through the parser above.
_TOOLS = {"convert": _convert, "compute_image_mean": _compute_image_mean, "extract_features": _extract_features,
          **{name: functools.partial(_upgrade_proto, name) for name in ("upgrade_net_proto_text", "upgrade_net_proto_binary",
                                                    "upgrade_solver_proto_text")}}


def _run_tool(command, argv):
    try:
        return int(_TOOLS[command](argv) or 0)
    except SystemExit as e:  # --help, or a command line the tool's parser refused
        if isinstance(e.code, str):
            sys.stderr.write(e.code + "\n")
            return 2
        return int(e.code or 0)
    except (ValueError, OSError, RuntimeError) as e:
        _fail(command, e)
        return 1


def main(argv=None):
    """Entry point of the `scaffe` console script and of `python -m scaffe`; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        sys.stdout.write(_USAGE)
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        sys.stderr.write(f"scaffe: unknown command {argv[0]!r}; known: {', '.join(COMMANDS)}\n")
        return 2
    if argv[0] in _TOOLS:
        setup_logging()
        return _run_tool(argv[0], argv[1:])
    argv = [argv[0]] + _gflags_to_gnu(argv[1:])
    try:
        args = _parser().parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    setup_logging()
    from scaffe.io import CaffeFormatError
    from scaffe.net import NetError
    from scaffe.solvers.solver import SolverError
    try:
        return int(_HANDLERS[args.command](args) or 0)
    except (CliError, NetError, SolverError, CaffeFormatError) as e:
        _fail(args.command, e)
    except (ValueError, OSError, RuntimeError, KeyError, NotImplementedError) as e:
        _fail(args.command, e)
    except KeyboardInterrupt:
        sys.stderr.write(f"scaffe {args.command}: interrupted\n")
        return 130
    return 1


def _fail(command, err):
    text = " ".join(str(err).split()) or type(err).__name__
    if isinstance(err, KeyError):
        text = f"missing {text}"
    sys.stderr.flush()
    sys.stderr.write(f"scaffe {command}: error: {text}\n")
    sys.stderr.flush()


if __name__ == "__main__":
    sys.exit(main())
