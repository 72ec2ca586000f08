"""The Python parts of jobs/gpu_acceptance.sh: device bounds, scaffe's GPU ms/iter, and the verdict table.

    python -m perf.gpu_acceptance bounds                  # one fused 4-input kernel and device copies
    python -m perf.gpu_acceptance scaffe-time [--net N]   # ms per SGD iteration of scaffe on the GPU
    python -m perf.gpu_acceptance verdict LOGDIR          # issue 18's acceptance lines against the logs

Measurements print `RESULT key [net] value` lines, which the verdict reads back from LOGDIR's logs
(the OSU tables, the training logs' last test accuracy, and these lines). Device times come from CUDA
events around repeated calls after warm-up; scaffe's ms/iter synchronises the device around its loop.
"""
import argparse
import re
import sys
import time
from pathlib import Path

import numpy

MIB = 1 << 20
BOUND_BYTES = 64 * MIB  # the acceptance's message: 64 MiB of float32 over 4 ranks
COPY_SIZES = (64 * MIB, 128 * MIB, 256 * MIB)
RANKS = 4
TRAIN_RUNS = [(1, "scaffe")] + [(ranks, schedule) for ranks in (2, 4) for schedule in ("scaffe", "allreduce")]
NETS = ("lenet", "cifar10_quick", "alexnet")
# Acceptance lines (issue 18): how many times faster than staged, how near one fused kernel, what part of
# the device copy bandwidth, how close to one rank's accuracy, how near PyTorch eager.
MIN_SPEEDUP_VS_STAGED = 100.0
MAX_SLOWDOWN_VS_KERNEL = 2.0
MIN_COPY_FRACTION = 0.85
ACCURACY_TOLERANCE = 0.01
MIN_ACCURACY = 0.95
MAX_SLOWDOWN_VS_TORCH = 1.5


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
    """The fused 4-input sum of 64 MiB buffers (us) and device-to-device copy rates (GB/s, read + written)."""
    import cupy

    from kernels.cuda_sources import launch
    count = BOUND_BYTES // 4
    inputs = [cupy.full(count, k + 1, dtype=cupy.float32) for k in range(RANKS)]
    out = cupy.empty(count, dtype=cupy.float32)
    blocks = min(1 << 16, -(-count // 256))
    ms = _device_ms(lambda: launch("scaffe_bound_sum4_float32", blocks, 256, *inputs, out, count))
    if not bool((out == sum(range(1, RANKS + 1))).all()):
        raise AssertionError("the fused bound kernel summed wrongly")
    print(f"RESULT fused_sum4_us {BOUND_BYTES} {ms * 1e3:.2f}", flush=True)
    for size in COPY_SIZES:
        src, dst = cupy.ones(size, dtype=cupy.uint8), cupy.empty(size, dtype=cupy.uint8)
        ms = _device_ms(lambda: dst.data.copy_from_device_async(src.data, size))
        print(f"RESULT d2d_copy_GBps {size} {2 * size / (ms * 1e-3) / 1e9:.1f}", flush=True)


def _gpu_solver(net, batch):
    import cupy

    from perf import bench_train, train_scaling
    from scaffe.proto import caffe_pb2
    from scaffe.solvers import create_solver
    if net == "alexnet":
        param = train_scaling.alexnet_solver_param(batch)
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


def scaffe_ms_per_iter(net, batch, iterations, warmup):
    import cupy
    solver = _gpu_solver(net, batch)
    solver.step(warmup)
    cupy.cuda.Device().synchronize()
    start = time.perf_counter()
    solver.step(iterations)
    cupy.cuda.Device().synchronize()
    return (time.perf_counter() - start) / iterations * 1e3


# ---------------------------------------------------------------- the verdict (reads logs; no GPU)

def results(logs):
    """{(key, size-or-net): value} from every `RESULT key arg value` line of the logs."""
    found = {}
    for log in sorted(Path(logs).glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 4 and parts[0] == "RESULT":
                arg = int(parts[2]) if parts[2].isdigit() else parts[2]
                found[(parts[1], arg)] = float(parts[3])
    return found


def osu_table(path):
    """{size: {column title: value}} of an OSU output (perf/osu.py's format), {} when the file is missing."""
    path = Path(path)
    if not path.exists():
        return {}
    titles, rows = None, {}
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("# Size"):
            titles = [t.strip() for t in re.split(r"\s{2,}", line[len("# Size"):].strip())]
        elif titles and line and not line.startswith("#"):
            values = line.split()
            if len(values) == len(titles) + 1:
                rows[int(values[0])] = dict(zip(titles, map(float, values[1:])))
    return rows


def last_accuracy(path):
    """The last `Test net output #k: accuracy = X` of a training log; None when there is none."""
    path = Path(path)
    if not path.exists():
        return None
    found = re.findall(r"Test net output #\d+: accuracy = ([0-9.eE+-]+)", path.read_text(errors="replace"))
    return float(found[-1]) if found else None


def verdict_rows(logs):
    """(check, measured, needed, verdict) rows; verdict is PASS, FAIL or MISSING (not measured)."""
    logs = Path(logs)
    measured = results(logs)
    rows = []

    def row(check, value, needed, passed):
        rows.append((check, value if value is not None else "-", needed,
                     "MISSING" if value is None else ("PASS" if passed else "FAIL")))

    kernel_us = measured.get(("fused_sum4_us", BOUND_BYTES))
    for device in ("cuda", "cupy"):
        reduce_row = osu_table(logs / f"osu_reduce_{device}.log").get(BOUND_BYTES, {})
        ratio = reduce_row.get("Ratio(staged/scaffe)")
        row(f"Reduce 64 MiB, {RANKS} ranks, -d {device}: staged / scaffe", ratio and f"{ratio:.1f}x",
            f">= {MIN_SPEEDUP_VS_STAGED:.0f}x", ratio is not None and ratio >= MIN_SPEEDUP_VS_STAGED)
        ours = reduce_row.get("Avg Latency(us) scaffe")
        slowdown = ours / kernel_us if ours is not None and kernel_us else None
        row(f"Reduce 64 MiB, -d {device}: scaffe / one fused kernel", slowdown and f"{slowdown:.2f}x",
            f"<= {MAX_SLOWDOWN_VS_KERNEL:.0f}x", slowdown is not None and slowdown <= MAX_SLOWDOWN_VS_KERNEL)
        allreduce = osu_table(logs / f"osu_allreduce_{device}.log")
        for size in COPY_SIZES:
            ours = allreduce.get(size, {}).get("Avg Latency(us) scaffe")
            copy = measured.get(("d2d_copy_GBps", size))
            # An allreduce on one GPU reads every rank's input and writes every rank's output at least once.
            fraction = (2 * RANKS * size / (ours * 1e-6) / 1e9) / copy if ours and copy else None
            row(f"Allreduce {size // MIB} MiB, -d {device}: memory rate / device copy rate",
                fraction and f"{fraction:.0%}", f">= {MIN_COPY_FRACTION:.0%}",
                fraction is not None and fraction >= MIN_COPY_FRACTION)
    one_rank = last_accuracy(logs / "train_lenet_np1_scaffe.log")
    for ranks, schedule in TRAIN_RUNS:
        accuracy = last_accuracy(logs / f"train_lenet_np{ranks}_{schedule}.log")
        passed = accuracy is not None and accuracy >= MIN_ACCURACY and (
            ranks == 1 or (one_rank is not None and abs(accuracy - one_rank) <= ACCURACY_TOLERANCE))
        row(f"LeNet accuracy, {ranks} rank(s), {schedule}", accuracy and f"{accuracy:.4f}",
            f">= {MIN_ACCURACY}" + ("" if ranks == 1 else f", within {ACCURACY_TOLERANCE} of 1 rank"), passed)
    for net in NETS:
        ours, torch = measured.get(("scaffe_ms_per_iter", net)), measured.get(("torch_ms_per_iter", net))
        slowdown = ours / torch if ours and torch else None
        row(f"{net} ms/iter: scaffe {ours or '-'} / PyTorch eager {torch or '-'}", slowdown and f"{slowdown:.2f}x",
            f"<= {MAX_SLOWDOWN_VS_TORCH}x", slowdown is not None and slowdown <= MAX_SLOWDOWN_VS_TORCH)
    return rows


def print_verdict(logs):
    rows = verdict_rows(logs)
    widths = [max(len(str(r[i])) for r in rows + [("check", "measured", "needed", "verdict")]) for i in range(4)]
    print("| " + " | ".join(t.ljust(w) for t, w in zip(("check", "measured", "needed", "verdict"), widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print("| " + " | ".join(str(v).ljust(w) for v, w in zip(r, widths)) + " |")
    passed = sum(r[3] == "PASS" for r in rows)
    print(f"{passed} of {len(rows)} acceptance checks pass")
    return 0 if passed == len(rows) else 1


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m perf.gpu_acceptance", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("bounds", help="one fused 4-input kernel over 64 MiB and device-to-device copy rates")
    timing = sub.add_parser("scaffe-time", help="ms per SGD iteration of scaffe on the GPU")
    timing.add_argument("--net", default="all", choices=["all", *NETS])
    timing.add_argument("--iterations", type=int, default=20)
    timing.add_argument("--warmup", type=int, default=5)
    verdict = sub.add_parser("verdict", help="the acceptance table from a folder of logs")
    verdict.add_argument("logs")
    args = p.parse_args(argv)
    if args.command == "bounds":
        bounds()
    elif args.command == "scaffe-time":
        from perf.torch_twins import SPECS
        for net in NETS if args.net == "all" else [args.net]:
            ms = scaffe_ms_per_iter(net, SPECS[net][0], args.iterations, args.warmup)
            print(f"RESULT scaffe_ms_per_iter {net} {ms:.3f}", flush=True)
    else:
        return print_verdict(args.logs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
