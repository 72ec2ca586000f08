"""The Python parts of jobs/gpu_acceptance.sh: device bounds, scaffe's GPU ms/iter, and the verdict table.

    python -m perf.gpu_acceptance bounds                  # fused 4-input kernels and device copies
    python -m perf.gpu_acceptance scaffe-time [--net N]   # ms per SGD iteration of scaffe on the GPU,
                                                          # replayed from CUDA graphs and eager
    python -m perf.gpu_acceptance train-net NET B PATH    # AlexNet's or GoogLeNet's train net at batch B,
                                                          # for `scaffe time` (the h100 model's check)
    python -m perf.gpu_acceptance cifar-digits DIR        # cifar10_quick's solver on the bundled digits
    python -m perf.gpu_acceptance verdict LOGDIR          # the acceptance lines against the logs

Measurements print `RESULT key [arg] value` lines, which the verdict reads back from LOGDIR's logs (the
OSU tables, the training logs' last test accuracy, the gpu tests' summary, and these lines), with the
script's record of how each step ended (LOGDIR/steps.tsv): a line whose numbers are absent reads FAIL
when a step it needs failed or timed out and MISSING when that step did not run. Device times come from
CUDA events around repeated calls after warm-up; scaffe's ms/iter synchronises the device around its loop.
"""
import argparse
import re
import sys
import time
from pathlib import Path

import numpy

MIB = 1 << 20
RANKS = 4
DEVICES = ("cupy", "cuda")  # OSU's -d: cupy arrays and numba device arrays
LARGEST = 256 * MIB
KERNEL_SIZES = (64 * MIB, 256 * MIB)  # the Reduce lines' sizes
ALLREDUCE_SIZES = (16 * MIB, 32 * MIB, 64 * MIB, 128 * MIB, 256 * MIB)  # "from 16 MiB up"
BCAST_SIZE = 64 * MIB
# (ranks, schedule); "eager": one rank with SCAFFE_CAPTURE=0, every iteration launched from Python.
TRAIN_RUNS = {"lenet": [(1, "scaffe"), (1, "eager")] + [(ranks, schedule) for ranks in (2, 4)
                                                        for schedule in ("scaffe", "allreduce")],
              "cifar10_quick": [(1, "scaffe"), (2, "scaffe"), (4, "scaffe")]}
TIMED_NETS = ("lenet", "cifar10_quick", "alexnet", "googlenet")  # issue 25: b64, b100, b128, b32
# Issue 22's acceptance lines.
MAX_SMALL_US = 50.0  # Reduce and Allreduce of 4 B
MAX_REDUCE_VS_KERNEL = {64 * MIB: 1.3, 256 * MIB: 1.15}  # against one fused kernel summing the P buffers
MIN_COPY_FRACTION = 0.75  # Allreduce's traffic (P buffers read, P written) against the device copy rate
MAX_BCAST_VS_COPIES = 1.3  # against P - 1 device copies of the message
# Issue 18's and 25's training lines.
ACCURACY_TOLERANCE = 0.01
MIN_ACCURACY = {"lenet": 0.95, "cifar10_quick": 0.0}  # cifar10_quick's short run: only ranks against one rank
MAX_SLOWDOWN_VS_TORCH = 1.0


# ---------------------------------------------------------------- measurements (need a GPU)

def _device_ms(call, reps=20, warmup=3):
    import cupy
    for _ in range(warmup):
        call()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    start.record()
    for _ in range(reps):
        call()
    stop.record()
    stop.synchronize()
    return cupy.cuda.get_elapsed_time(start, stop) / reps


def bounds():
    """One fused pass over RANKS float32 buffers: the Reduce bound (sum into one output) and the Allreduce
    bound (the sum written to all RANKS), in us; device-to-device copy rates (GB/s, read + written)."""
    for size in sorted(set(KERNEL_SIZES) | set(ALLREDUCE_SIZES)):
        _bound_kernels(size)
        _copy_rate(size)


def _bound_kernels(size):
    import cupy

    from kernels.cuda_sources import launch
    from kernels.grid import THREADS, blocks
    count = size // 4
    inputs = [cupy.full(count, k + 1, dtype=cupy.float32) for k in range(RANKS)]
    outputs = [cupy.empty(count, dtype=cupy.float32) for _ in range(RANKS)]
    grid = blocks(count)
    ms = _device_ms(lambda: launch("scaffe_bound_sum4_float32", grid, THREADS, *inputs, outputs[0], count))
    print(f"RESULT fused_sum4_us {size} {ms * 1e3:.2f}", flush=True)
    ms = _device_ms(lambda: launch("scaffe_bound_allreduce4_float32", grid, THREADS, *inputs, *outputs, count))
    print(f"RESULT fused_allreduce4_us {size} {ms * 1e3:.2f}", flush=True)
    if not all(bool((out == sum(range(1, RANKS + 1))).all()) for out in outputs):
        raise AssertionError("a fused bound kernel summed wrongly")


def _copy_rate(size):
    import cupy
    src, dst = cupy.ones(size, dtype=cupy.uint8), cupy.empty(size, dtype=cupy.uint8)
    ms = _device_ms(lambda: dst.data.copy_from_device_async(src.data, size))
    print(f"RESULT d2d_copy_GBps {size} {2 * size / (ms * 1e-3) / 1e9:.1f}", flush=True)


def _gpu_solver(net, batch):
    import cupy

    from perf import bench_train, train_scaling
    from scaffe.proto import caffe_pb2
    from scaffe.solvers import create_solver
    if net in ("alexnet", "googlenet"):
        param = train_scaling.SOLVER_PARAMS[net](batch)
    else:
        path, _, shape = bench_train.MODELS[net]
        param = caffe_pb2.SolverParameter(type="SGD", base_lr=0.01, momentum=0.9, weight_decay=0.0005,
                                          lr_policy="fixed")
        param.net_param.CopyFrom(bench_train.synthetic_train_net(path, batch, shape))
    param.max_iter, param.display, param.random_seed, param.snapshot_after_train = 10 ** 9, 0, 1, False
    solver = create_solver(param, net_kwargs={"xp": cupy})
    rng = numpy.random.RandomState(0)
    for blob in solver.net.input_blobs:  # the Input layers of lenet and cifar10_quick: images, labels
        values = rng.randint(0, 10, blob.shape) if blob.data.ndim == 1 else rng.uniform(0, 1, blob.shape)
        blob.data[...] = cupy.asarray(values, dtype=blob.data.dtype)
    return solver


def scaffe_ms_per_iter(net, batch, iterations, warmup, capture=True):
    """ms per iteration after `warmup` (replayed from CUDA graphs from the fourth on, unless not `capture`)."""
    import os

    import cupy
    os.environ["SCAFFE_CAPTURE"] = "1" if capture else "0"
    solver = _gpu_solver(net, batch)
    solver.step(warmup)
    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    solver.step(iterations)
    cupy.cuda.Device().synchronize()
    return (time.perf_counter() - start) / iterations * 1e3


# ---------------------------------------------------------------- cifar10_quick's data where CIFAR-10 is absent

CIFAR_DIR = Path(__file__).resolve().parents[1] / "examples" / "cifar10"


def cifar_digits(out, iterations):
    """cifar10_quick's solver (`iterations` of it, then one test) and net in `out`, reading LMDBs of the bundled MNIST digits drawn as CIFAR-sized
    images (each digit centred in 32 x 32, in all three channels) and their mean: CIFAR-10 itself (163 MB)
    is not bundled, and the GPU machine cannot download it. Returns the solver's path."""
    from google.protobuf import text_format

    from scaffe.io import array_to_blobproto, write_blobproto
    from scaffe.proto import caffe_pb2
    from scaffe.tools.compute_image_mean import compute_image_mean
    from scaffe.tools.convert_mnist import bundled_mnist_dir, read_idx_images, read_idx_labels
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    sources = {}
    for prefix, phase in (("train", caffe_pb2.TRAIN), ("t10k", caffe_pb2.TEST)):
        images = read_idx_images(bundled_mnist_dir() / f"{prefix}-images-idx3-ubyte.gz")
        labels = read_idx_labels(bundled_mnist_dir() / f"{prefix}-labels-idx1-ubyte.gz")
        sources[phase] = out / f"{prefix}_lmdb"
        _write_cifar_sized(sources[phase], images, labels)
    mean, _ = compute_image_mean(str(sources[caffe_pb2.TRAIN]))
    write_blobproto(array_to_blobproto(mean[None], legacy_4d=True), str(out / "mean.binaryproto"))
    net = caffe_pb2.NetParameter()
    text_format.Parse((CIFAR_DIR / "cifar10_quick_train_test.prototxt").read_text(), net)
    for layer in net.layer:
        if layer.type == "Data":
            layer.data_param.source = str(sources[layer.include[0].phase])
            layer.transform_param.mean_file = str(out / "mean.binaryproto")
    solver = caffe_pb2.SolverParameter()
    text_format.Parse((CIFAR_DIR / "cifar10_quick_solver.prototxt").read_text(), solver)
    solver.ClearField("net")
    solver.net_param.CopyFrom(net)
    solver.test_iter[:] = [len(read_idx_labels(bundled_mnist_dir() / "t10k-labels-idx1-ubyte.gz")) // 100]
    solver.max_iter = solver.test_interval = iterations  # Caffe tests at the end only on a test interval
    solver.snapshot, solver.snapshot_after_train = 0, False
    solver.snapshot_prefix = str(out / "cifar10_quick")
    path = out / "solver.prototxt"
    path.write_text(text_format.MessageToString(solver))
    return path


def _write_cifar_sized(db_path, images, labels):
    from scaffe.data.lmdb_writer import LMDBWriter
    from scaffe.proto import caffe_pb2
    canvas = numpy.zeros((3, 32, 32), dtype=numpy.uint8)
    datum = caffe_pb2.Datum(channels=3, height=32, width=32)
    with LMDBWriter(str(db_path)) as db:
        for i, (image, label) in enumerate(zip(images, labels)):
            canvas[:, 2:30, 2:30] = image
            datum.data, datum.label = canvas.tobytes(), int(label)
            db.put(b"%08d" % i, datum.SerializeToString())


# ---------------------------------------------------------------- the verdict (reads logs; no GPU)

def _number(text):
    try:
        return float(text)
    except ValueError:
        return None


def results(logs):
    """{(key, size-or-net): value} from every well-formed `RESULT key arg value` line of the logs."""
    found = {}
    for log in sorted(Path(logs).glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[0] == "RESULT" and _number(parts[3]) is not None:
                arg = int(parts[2]) if parts[2].isdigit() else parts[2]
                found[(parts[1], arg)] = _number(parts[3])
    return found


def osu_table(path):
    """{size: {column title: value}} of an OSU output (perf/osu.py's format), {} when the file is missing.
    Only rows of numbers count: a failed run's traceback or messages between the rows are not rows."""
    path = Path(path)
    if not path.exists():
        return {}
    titles, rows = None, {}
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("# Size"):
            titles = [t.strip() for t in re.split(r"\s{2,}", line[len("# Size"):].strip())]
            continue
        values = line.split()
        if not titles or len(values) != len(titles) + 1 or not values[0].isdigit():
            continue
        numbers = [_number(v) for v in values[1:]]
        if None not in numbers:
            rows[int(values[0])] = dict(zip(titles, numbers))
    return rows


def last_accuracy(path):
    """The last `Test net output #k: accuracy = X` of a training log; None when there is none."""
    path = Path(path)
    if not path.exists():
        return None
    found = re.findall(r"Test net output #\d+: accuracy = ([0-9.eE+-]+)", path.read_text(errors="replace"))
    return _number(found[-1]) if found else None


def step_outcomes(logs):
    """{step: exit status, or "skipped"} from the script's LOGDIR/steps.tsv."""
    path = Path(logs) / "steps.tsv"
    outcomes = {}
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            parts = line.split("\t")
            if len(parts) == 2:
                outcomes[parts[0]] = int(parts[1]) if parts[1].lstrip("-").isdigit() else parts[1]
    return outcomes


class Verdict:
    """The rows of the table: (check, measured, needed, PASS/FAIL/MISSING)."""

    def __init__(self, logs):
        self.logs = Path(logs)
        self.measured = results(logs)
        self.outcomes = step_outcomes(logs)
        self.rows = []

    def failed_step(self, steps):
        """The first of `steps` that ran and failed, as "name (exit N)", else None."""
        for name in steps:
            outcome = self.outcomes.get(name)
            if outcome not in (None, 0, "skipped"):
                return f"{name} (exit {outcome})"
        return None

    def row(self, check, value, needed, passed, steps):
        """A row; `value` None (not measured) reads FAIL when one of `steps` failed, else MISSING."""
        if value is not None:
            self.rows.append((check, value, needed, "PASS" if passed else "FAIL"))
            return
        failed = self.failed_step(steps)
        self.rows.append((check, f"- ({failed} failed)" if failed else "-", needed, "FAIL" if failed else "MISSING"))

    def osu(self, bench, device):
        return osu_table(self.logs / f"osu_{bench}_{device}.log")


def _scaffe_us(table, size):
    return table.get(size, {}).get("Avg Latency(us) scaffe")


def _device_rows(verdict, device):
    steps = {bench: [f"osu_{bench}_{device}"] for bench in ("reduce", "allreduce", "bcast")}
    tables = {bench: verdict.osu(bench, device) for bench in steps}
    for bench in ("reduce", "allreduce"):
        ours = _scaffe_us(tables[bench], 4)
        verdict.row(f"{bench.capitalize()} 4 B, -d {device}: scaffe us", ours and f"{ours:.1f}", f"<= {MAX_SMALL_US:.0f}",
                    ours is not None and ours <= MAX_SMALL_US, steps[bench])
    for size, limit in MAX_REDUCE_VS_KERNEL.items():
        ours, kernel = _scaffe_us(tables["reduce"], size), verdict.measured.get(("fused_sum4_us", size))
        ratio = ours / kernel if ours and kernel else None
        verdict.row(f"Reduce {size // MIB} MiB, -d {device}: scaffe / one fused kernel", ratio and f"{ratio:.2f}x",
                    f"<= {limit}x", ratio is not None and ratio <= limit, steps["reduce"] + ["bounds"])
    for size in ALLREDUCE_SIZES:
        ours, copy = _scaffe_us(tables["allreduce"], size), verdict.measured.get(("d2d_copy_GBps", size))
        kernel = verdict.measured.get(("fused_allreduce4_us", size))
        traffic = 2 * RANKS * size  # every rank's input read once, every rank's output written once
        fraction = traffic / (ours * 1e-6) / 1e9 / copy if ours and copy else None
        bound = f" (fused kernel: {traffic / (kernel * 1e-6) / 1e9 / copy:.0%})" if kernel and copy else ""
        verdict.row(f"Allreduce {size // MIB} MiB, -d {device}: memory rate / device copy rate",
                    fraction and f"{fraction:.0%}{bound}", f">= {MIN_COPY_FRACTION:.0%}",
                    fraction is not None and fraction >= MIN_COPY_FRACTION, steps["allreduce"] + ["bounds"])
    ours, copy = _scaffe_us(tables["bcast"], BCAST_SIZE), verdict.measured.get(("d2d_copy_GBps", BCAST_SIZE))
    copies_us = (RANKS - 1) * 2 * BCAST_SIZE / (copy * 1e9) * 1e6 if copy else None
    ratio = ours / copies_us if ours and copies_us else None
    verdict.row(f"Bcast {BCAST_SIZE // MIB} MiB, -d {device}: scaffe / {RANKS - 1} device copies",
                ratio and f"{ratio:.2f}x", f"<= {MAX_BCAST_VS_COPIES}x", ratio is not None and ratio <= MAX_BCAST_VS_COPIES,
                steps["bcast"] + ["bounds"])
    for bench, table in tables.items():
        slower = [size for size, columns in table.items()
                  if columns.get("Avg Latency(us) scaffe", 0) > columns.get("Avg Latency(us) staged", float("inf"))]
        largest = max(table, default=None)
        measured = table and f"{len(slower)} of {len(table)} sizes slower, up to {largest} B"
        verdict.row(f"{bench.capitalize()} -d {device}: every size 4 B to 256 MiB at least as fast as staged",
                    measured or None, "0 slower, up to 268435456 B", not slower and largest == LARGEST, steps[bench])


def _gpu_test_rows(verdict):
    log = verdict.logs / "gpu_tests.log"
    text = log.read_text(errors="replace") if log.exists() else ""
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?)\b", text)}
    summary = ", ".join(f"{n} {kind}" for kind, n in counts.items()) or None
    passed = counts.get("passed", 0) > 0 and not (set(counts) - {"passed", "skipped"}) and (
        verdict.outcomes.get("gpu_tests") == 0)
    verdict.row("every `gpu`-marked test passes", summary, "0 failed, 0 errors", passed, ["gpu_tests"])


def _training_rows(verdict):
    for net, runs in TRAIN_RUNS.items():
        one_rank = last_accuracy(verdict.logs / f"train_{net}_np1_scaffe.log")
        data = " (bundled digits)" if net == "cifar10_quick" and "cifar_digits" in verdict.outcomes else ""
        for ranks, schedule in runs:
            name = f"train_{net}_np{ranks}_{schedule}"
            accuracy = last_accuracy(verdict.logs / f"{name}.log")
            passed = accuracy is not None and accuracy >= MIN_ACCURACY[net] and (
                ranks == 1 or (one_rank is not None and abs(accuracy - one_rank) <= ACCURACY_TOLERANCE))
            needed = (f">= {MIN_ACCURACY[net]}" if MIN_ACCURACY[net] else "") + (
                "" if ranks == 1 else f"{', ' if MIN_ACCURACY[net] else ''}within {ACCURACY_TOLERANCE} of 1 rank")
            verdict.row(f"{net}{data} accuracy, {ranks} rank(s), {schedule}", accuracy and f"{accuracy:.4f}",
                        needed or "a test accuracy", passed, [name, f"train_{net}_np1_scaffe", "cifar_digits"])


def _timing_rows(verdict):
    from perf.torch_twins import SPECS  # the nets both timing steps know
    for net in TIMED_NETS:
        ours, torch = verdict.measured.get(("scaffe_ms_per_iter", net)), verdict.measured.get(("torch_ms_per_iter", net))
        slowdown = ours / torch if ours and torch else None
        verdict.row(f"{net} ms/iter: scaffe {ours or '-'} / PyTorch eager {torch or '-'}", slowdown and f"{slowdown:.2f}x",
                    f"<= {MAX_SLOWDOWN_VS_TORCH}x" if net != "googlenet" else "both timed",
                    slowdown is not None and (net == "googlenet" or slowdown <= MAX_SLOWDOWN_VS_TORCH),
                    ["time_scaffe", "time_torch"] if net in SPECS else [])
        eager = verdict.measured.get(("scaffe_eager_ms_per_iter", net))
        gain = eager / ours if ours and eager else None
        verdict.row(f"{net} ms/iter: CUDA graphs {ours or '-'} / eager {eager or '-'}", gain and f"{gain:.2f}x faster",
                    "not slower", gain is not None and gain >= 0.98, ["time_scaffe"] if net in SPECS else [])


def verdict_rows(logs):
    """(check, measured, needed, verdict) rows; verdict is PASS, FAIL or MISSING (not measured)."""
    verdict = Verdict(logs)
    for device in DEVICES:
        _device_rows(verdict, device)
    _gpu_test_rows(verdict)
    _training_rows(verdict)
    _timing_rows(verdict)
    return verdict.rows


def print_verdict(logs):
    rows = verdict_rows(logs)
    widths = [max(len(str(r[i])) for r in rows + [("check", "measured", "needed", "verdict")]) for i in range(4)]
    print("| " + " | ".join(t.ljust(w) for t, w in zip(("check", "measured", "needed", "verdict"), widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(str(v).ljust(w) for v, w in zip(r, widths)) + " |")
    counts = {v: sum(r[3] == v for r in rows) for v in ("PASS", "FAIL", "MISSING")}
    print(f"{counts['PASS']} of {len(rows)} acceptance checks pass ({counts['FAIL']} fail, {counts['MISSING']} missing)")
    return 0 if counts["PASS"] == len(rows) else 1


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m perf.gpu_acceptance", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("bounds", help="fused 4-input Reduce and Allreduce kernels and device-to-device copy rates")
    timing = sub.add_parser("scaffe-time", help="ms per SGD iteration of scaffe on the GPU")
    timing.add_argument("--net", default="all", choices=["all", *TIMED_NETS])
    timing.add_argument("--iterations", type=int, default=20)
    timing.add_argument("--warmup", type=int, default=5)
    train_net = sub.add_parser("train-net", help="a timed net's train prototxt at a batch, for `scaffe time`")
    train_net.add_argument("net", choices=("alexnet", "googlenet"))
    train_net.add_argument("batch", type=int)
    train_net.add_argument("path")
    digits = sub.add_parser("cifar-digits", help="cifar10_quick's solver on the bundled digits, for want of CIFAR-10")
    digits.add_argument("out")
    digits.add_argument("--iterations", type=int, default=500)
    verdict = sub.add_parser("verdict", help="the acceptance table from a folder of logs")
    verdict.add_argument("logs")
    args = p.parse_args(argv)
    if args.command == "bounds":
        bounds()
    elif args.command == "train-net":
        from google.protobuf import text_format

        from perf import train_scaling
        net = train_scaling.SOLVER_PARAMS[args.net](args.batch).net_param
        Path(args.path).write_text(text_format.MessageToString(net))
    elif args.command == "cifar-digits":
        print(cifar_digits(args.out, args.iterations))
    elif args.command == "scaffe-time":
        from perf.torch_twins import SPECS
        for net in [n for n in TIMED_NETS if n in SPECS] if args.net == "all" else [args.net]:
            for capture, key in ((True, "scaffe_ms_per_iter"), (False, "scaffe_eager_ms_per_iter")):
                ms = scaffe_ms_per_iter(net, SPECS[net][0], args.iterations, args.warmup, capture)
                print(f"RESULT {key} {net} {ms:.3f}", flush=True)
    else:
        return print_verdict(args.logs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
