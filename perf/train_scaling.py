"""Data-parallel training throughput and scaling: images/s, scaling efficiency and the fraction of
communication hidden behind compute, for each rank count and schedule, against the no-overlap baseline.

    python -m perf.train_scaling [--net lenet|cifar10_quick|alexnet|googlenet] [--ranks 1,2,4] [--iterations 20] [--warmup 3]
                                 [--repeats 3] [--batch B] [--launcher 'mpiexec -n {ranks}'] [--hosts H]
                                 [--traces DIR] [--link-rate MB/s]

For each rank count P > 1, one job is launched (the launcher template, then this module as the worker);
in it the schedules `scaffe` and `allreduce` and the baseline `native` (MPI's own Allreduce of every
gradient after the whole backward: no overlap) train in turn, in rounds ordered ABC CBA ABC..., each
on a freshly built solver: `warmup` untimed iterations, then `iterations` timed ones between two
Barriers, with the timeline recording (scaffe.timeline) for the hidden fraction. One rank runs
without the launcher and without communication: the reference of the scaling efficiency,
images/s(P) / (P x images/s(1)). Every column is the median over the repeats.

Nets: `lenet` (default) reads the bundled MNIST LMDB, each rank its shard, batch 64 per rank;
`cifar10_quick` is examples/cifar10's net on random images (an Input layer filled once, as
perf.bench_train does), batch 100 per rank, with cifar10_quick_solver's settings; `alexnet` is
Caffe's bvlc_alexnet (examples/alexnet/deploy.prototxt, its fillers) trained with a SoftmaxWithLoss
on synthetic data (a DummyData layer of constant images and labels), batch 8 per rank.

Launcher: `{ranks}` is the number of ranks, `{per_host}` that divided by --hosts. On the multi-host
bed: --hosts 2 --launcher 'jobs/cluster.sh run -n {per_host}'.

`--traces DIR` keeps each run's timeline (`python -m scaffe.timeline FILE` prints what overlapped what).

Columns: compute ms is each rank's forward, backward and update time per iteration less its waits,
comm ms its collectives' time per iteration (both averaged over ranks); hidden is the part of the
collectives' time that overlapped compute (scaffe.timeline); vs native is images/s over the baseline's.
With `--link-rate` (MB/s one way, 10^6 bytes, as perf.link_rate measures it): wire ms is the time the
gradients (every learnable blob once) take on that link, bound ms is max(compute ms, wire ms), what a
schedule that hides all communication reaches, and x bound is iter ms over it.
"""
import argparse
import json
import logging
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCHEDULES = ("scaffe", "allreduce", "native")
NETS = {"lenet": 64, "cifar10_quick": 100, "alexnet": 8, "googlenet": 8}  # name -> default batch per rank
RESULT = "RESULT "  # the worker root's lines the driver reads


# ---------------------------------------------------------------- the nets

def lenet_solver_param(batch):
    from scaffe import io as sio
    from scaffe.solvers import read_solver_file
    param = read_solver_file(str(ROOT / "examples" / "mnist" / "lenet_solver.prototxt"))
    net = sio.read_net_prototxt(str(ROOT / "examples" / "mnist" / "lenet_train_test.prototxt"))
    for layer in net.layer:
        if layer.type == "Data":
            layer.data_param.batch_size = batch
            layer.data_param.source = str(ROOT / "examples" / "mnist" / Path(layer.data_param.source).name)
    param.ClearField("net")
    param.net_param.CopyFrom(net)
    return param


def deploy_train_net(name, batch):
    """examples/<name>/deploy.prototxt (Caffe's bvlc_alexnet, GoogLeNet) as a train net: the deploy net's
    Input becomes a DummyData layer of constant images and labels (filled once, so the data costs
    nothing per iteration), its Softmax a SoftmaxWithLoss."""
    from scaffe import io as sio
    from scaffe.proto import caffe_pb2
    deploy = sio.read_net_prototxt(str(ROOT / "examples" / name / "deploy.prototxt"))
    net = caffe_pb2.NetParameter(name=deploy.name)
    for layer in deploy.layer:
        if layer.type == "Input":
            data = net.layer.add(name="data", type="DummyData", top=["data", "label"])
            image = list(layer.input_param.shape[0].dim)[1:]
            data.dummy_data_param.shape.add().dim.extend([batch] + image)
            data.dummy_data_param.shape.add().dim.extend([batch])
            data.dummy_data_param.data_filler.add(type="constant", value=0.5)
            data.dummy_data_param.data_filler.add(type="constant", value=1)
        elif layer.type == "Softmax":
            net.layer.add(name="loss", type="SoftmaxWithLoss", bottom=[layer.bottom[0], "label"], top=["loss"])
        else:
            net.layer.add().CopyFrom(layer)
    return net


def alexnet_solver_param(batch):
    from scaffe.proto import caffe_pb2
    param = caffe_pb2.SolverParameter(type="SGD", base_lr=0.01, momentum=0.9, weight_decay=0.0005,
                                      lr_policy="step", gamma=0.1, stepsize=100000)
    param.net_param.CopyFrom(deploy_train_net("alexnet", batch))
    return param


def googlenet_solver_param(batch):
    """bvlc_googlenet's quick solver's settings (poly policy, power 0.5) on the deploy net's layers."""
    from scaffe.proto import caffe_pb2
    param = caffe_pb2.SolverParameter(type="SGD", base_lr=0.01, momentum=0.9, weight_decay=0.0002,
                                      lr_policy="poly", power=0.5, max_iter=2400000)
    param.net_param.CopyFrom(deploy_train_net("googlenet", batch))
    return param


def cifar10_quick_solver_param(batch):
    from perf.bench_train import MODELS, synthetic_train_net
    from scaffe.proto import caffe_pb2
    path, _, image_shape = MODELS["cifar10_quick"]
    param = caffe_pb2.SolverParameter(type="SGD", base_lr=0.001, momentum=0.9, weight_decay=0.004, lr_policy="fixed")
    param.net_param.CopyFrom(synthetic_train_net(path, batch, image_shape))
    return param


SOLVER_PARAMS = {"lenet": lenet_solver_param, "cifar10_quick": cifar10_quick_solver_param,
                 "alexnet": alexnet_solver_param, "googlenet": googlenet_solver_param}


def make_solver(net, batch, rank):
    from perf.bench_train import fill_synthetic_inputs
    from scaffe.solvers import create_solver
    param = SOLVER_PARAMS[net](batch)
    param.max_iter = 10 ** 9
    del param.test_iter[:]
    param.test_interval = 0
    param.display = 0
    param.snapshot = 0
    param.snapshot_after_train = False
    param.random_seed = 1
    param.solver_mode = param.CPU
    solver = create_solver(param, root_solver=rank == 0)
    if net == "cifar10_quick":
        fill_synthetic_inputs(solver.net)
    return solver


# ---------------------------------------------------------------- the worker (one job)

def worker(args):
    from mpi4py import MPI

    import collectives
    from scaffe import timeline
    from scaffe.parallel import attach
    from scaffe.parallel.launch import shard_training_data
    logging.getLogger("scaffe").setLevel(logging.WARNING)
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    collectives.install_abort_hook(world)
    variants = list(SCHEDULES) if size > 1 else ["single"]
    for repeat in range(args.repeats):
        for schedule in (variants if repeat % 2 == 0 else variants[::-1]):
            solver = make_solver(args.net, args.batch, rank)
            # Each run gets a communicator of its own, as a job would, and frees it (with the
            # shared memory its buckets took) at the end.
            fast = collectives.Comm(world.Dup()) if size > 1 else None
            try:
                if fast is not None:
                    shard_training_data(solver, rank, size)
                    attach(solver, fast, schedule)
                solver.step(args.warmup)
                recorder = timeline.Timeline(solver, world)
                recorder.start()  # a Barrier: every rank starts the clock together
                solver.step(args.iterations)
                world.Barrier()
                seconds = time.perf_counter() - recorder.origin
                trace = recorder.gather()
            finally:
                solver.close()
                if fast is not None:
                    fast.Free()
            if rank == 0:
                if args.traces:
                    timeline.save(trace, Path(args.traces) / f"{args.net}-{size}ranks-{schedule}-{repeat}.json")
                summary = timeline.summarize(trace)
                per_rank = list(summary["ranks"].values())
                print(RESULT + json.dumps({
                    "ranks": size, "schedule": schedule, "repeat": repeat,
                    "images_per_s": args.batch * size * args.iterations / seconds,
                    "iter_ms": seconds / args.iterations * 1e3,
                    "compute_ms": statistics.mean(r["compute_us"] for r in per_rank) / args.iterations / 1e3,
                    "comm_ms": statistics.mean(r["communication_us"] for r in per_rank) / args.iterations / 1e3,
                    "hidden": summary["hidden_fraction"],
                    "gradient_bytes": sum(blob.diff.nbytes for blob in solver.net.learnable_params)}), flush=True)
    return 0


# ---------------------------------------------------------------- the driver

def launch_command(template, ranks, hosts):
    if ranks == 1:
        return []
    if ranks % hosts:
        raise SystemExit(f"perf.train_scaling: {ranks} ranks do not divide over {hosts} hosts")
    return shlex.split(template.format(ranks=ranks, per_host=ranks // hosts))


def run_job(args, ranks):
    command = launch_command(args.launcher, ranks, args.hosts) + [
        sys.executable, "-m", "perf.train_scaling", "--worker", "--net", args.net, "--batch", str(args.batch),
        "--iterations", str(args.iterations), "--warmup", str(args.warmup), "--repeats", str(args.repeats),
        "--traces", args.traces]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"perf.train_scaling: {' '.join(command)} ran past --timeout {args.timeout} s") from None
    results = [json.loads(line[len(RESULT):]) for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not results:
        raise SystemExit(f"perf.train_scaling: {' '.join(command)} failed (exit {done.returncode}):\n"
                         f"{done.stdout[-2000:]}{done.stderr[-4000:]}")
    return results


def medians(results):
    """(ranks, schedule) -> the median of every measured column over the repeats."""
    groups = {}
    for r in results:
        groups.setdefault((r["ranks"], r["schedule"]), []).append(r)
    columns = ("images_per_s", "iter_ms", "compute_ms", "comm_ms", "hidden", "gradient_bytes")
    return {key: {c: (statistics.median(r[c] for r in rows) if all(r[c] is not None for r in rows) else None)
                  for c in columns}
            for key, rows in groups.items()}


def print_table(args, table):
    print(f"# scaffe training scaling: {args.net}, batch {args.batch} per rank, {args.iterations} iterations "
          f"after {args.warmup} warm-up, medians of {args.repeats} repeats, {os.cpu_count()} cores here")
    print(f"# launcher: {args.launcher} (--hosts {args.hosts}); 1 rank runs without it")
    if args.link_rate:
        print(f"# link: {args.link_rate:g} MB/s one way (--link-rate); wire ms: the gradients' bytes on it")
    print(f"{'# ranks':>7}  {'schedule':<10}{'images/s':>10}{'iter ms':>10}{'compute ms':>12}{'comm ms':>10}"
          f"{'hidden':>8}{'efficiency':>12}{'vs native':>11}{'wire ms':>9}{'bound ms':>10}{'x bound':>9}")
    single = table.get((1, "single"))
    order = ("single",) + SCHEDULES
    for (ranks, schedule), m in sorted(table.items(), key=lambda item: (item[0][0], order.index(item[0][1]))):
        efficiency = f"{m['images_per_s'] / (ranks * single['images_per_s']):.2f}" if single else "-"
        native = table.get((ranks, "native"))
        versus = f"{m['images_per_s'] / native['images_per_s']:.2f}" if native else "-"
        hidden = f"{m['hidden']:.0%}" if m["hidden"] is not None else "-"
        print(f"{ranks:>7}  {schedule:<10}{m['images_per_s']:>10.1f}{m['iter_ms']:>10.2f}{m['compute_ms']:>12.2f}"
              f"{m['comm_ms']:>10.2f}{hidden:>8}{efficiency:>12}{versus:>11}{_bound_columns(args, ranks, m)}",
              flush=True)


def _bound_columns(args, ranks, m):
    """wire ms, bound ms (max of compute and wire) and iter ms over the bound; '-' where they do not apply."""
    if ranks == 1 or not args.link_rate:
        return f"{'-':>9}{'-':>10}{'-':>9}"
    wire_ms = m["gradient_bytes"] / (args.link_rate * 1e6) * 1e3
    bound_ms = max(m["compute_ms"], wire_ms)
    return f"{wire_ms:>9.1f}{bound_ms:>10.1f}{m['iter_ms'] / bound_ms:>9.2f}"


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m perf.train_scaling", description=__doc__.splitlines()[0])
    p.add_argument("--net", choices=sorted(NETS), default="lenet")
    p.add_argument("--batch", type=int, default=None, help="images per rank per iteration (lenet 64, cifar10_quick 100, alexnet 8)")
    p.add_argument("--ranks", default="1,2,4", help="comma-separated rank counts")
    p.add_argument("--iterations", type=int, default=20, help="timed iterations per run")
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations first (numba compiles then)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each schedule; columns are medians")
    p.add_argument("--launcher", default=f"{Path(sys.executable).with_name('mpiexec')} -n {{ranks}}",
                   help="command prefix launching P ranks: {ranks}, {per_host} are filled in")
    p.add_argument("--hosts", type=int, default=1, help="hosts the launcher spreads ranks over ({per_host})")
    p.add_argument("--traces", default="", help="save each run's timeline in this folder "
                                                "(NET-Pranks-SCHEDULE-REPEAT.json, see scaffe.timeline)")
    p.add_argument("--link-rate", type=float, default=None,
                   help="MB/s (10^6 bytes) the link carries one way, from perf.link_rate: adds wire ms, bound ms "
                        "(max of compute and wire) and x bound")
    p.add_argument("--timeout", type=float, default=3600, help="seconds one job may take")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.batch = args.batch or NETS[args.net]
    if args.iterations < 1 or args.repeats < 1 or args.warmup < 0:
        p.error("--iterations and --repeats must be at least 1, --warmup at least 0")
    if args.worker:
        return worker(args)
    try:
        ranks = sorted({int(r) for r in args.ranks.split(",") if r})
    except ValueError:
        p.error(f"--ranks={args.ranks}: give rank counts like 1,2,4")
    if not ranks or ranks[0] < 1:
        p.error(f"--ranks={args.ranks}: give rank counts like 1,2,4")
    if args.traces:
        args.traces = os.path.abspath(args.traces)
        os.makedirs(args.traces, exist_ok=True)
    if args.net == "lenet":
        from scaffe.tools.convert_mnist import ensure_mnist_lmdb
        ensure_mnist_lmdb(str(ROOT / "examples" / "mnist"))
    results = []
    for count in ranks:
        results += run_job(args, count)
    print_table(args, medians(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
