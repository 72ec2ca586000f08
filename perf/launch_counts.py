"""Kernel launches and host time per training iteration, counted on the cupy stand-in (no GPU needed).

The small nets are bound on a GPU by host work per launch, so launches per iteration is the number that
capture and fused kernels bring down. The stand-in (tests/stand_ins/cupy) counts every launch (a GEMM as
one) and every host synchronisation; its host time includes its numpy computing, so read it only beside
another count taken the same way on the same machine. Nets as perf.bench_train builds them (Input
layers with fixed random batches), SGD with momentum; counts are per iteration of one solver step
after warm-up, with iterations replayed from CUDA graphs (scaffe.capture; a graph launch counts one) and
without (SCAFFE_CAPTURE=0).

    python -m perf.launch_counts [--iterations 4] [--warmup 3] [--model lenet|cifar10_quick|all] [--nvmath]

--nvmath puts the stand-in of nvmath-python's cuBLAS bindings (tests/stand_ins/nvmath_stand_in) on the path, so
that the GEMM layers are captured as they are where nvmath-python is installed.
"""
import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def stand_in_cupy(nvmath=False):
    """The numpy-backed cupy of tests/stand_ins (never a real one: a GPU's counts come from its profiler)."""
    sys.path.insert(0, str(ROOT / "tests" / "stand_ins"))
    if nvmath:
        sys.path.insert(0, str(ROOT / "tests" / "stand_ins" / "nvmath_stand_in"))
    import cupy
    if not hasattr(cupy, "_stand_in"):
        raise SystemExit("a real cupy was imported; run this where tests/stand_ins/cupy is the cupy found")
    return cupy


def count(name, iterations, warmup, cupy, capture):
    from perf.bench_train import make_solver
    os.environ["SCAFFE_CAPTURE"] = "1" if capture else "0"
    solver, batch = make_solver(name, cupy)
    for _ in range(warmup):
        solver.step(1)
    counters = cupy._stand_in.counters
    counters.clear()
    start = time.perf_counter()
    solver.step(iterations)  # one step of several iterations: a step's last one fetches the loss
    host_ms = (time.perf_counter() - start) * 1e3 / iterations
    return {"model": name, "batch": batch, "capture": "on" if capture else "off",
            "graphs": counters["graph_launches"] / iterations, "launches": counters["launches"] / iterations,
            "host_syncs": cupy._stand_in.host_syncs() / iterations,
            "uploads": counters["host_to_device"] / iterations, "host_ms": host_ms}


def main(argv=None):
    from perf.bench_train import MODELS
    p = argparse.ArgumentParser(prog="python -m perf.launch_counts", description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=4)
    p.add_argument("--warmup", type=int, default=3, help="iterations before counting (capture needs 3)")
    p.add_argument("--model", default="all", choices=["all"] + sorted(MODELS))
    p.add_argument("--nvmath", action="store_true", help="GEMMs captured too (nvmath-python's stand-in)")
    args = p.parse_args(argv)
    cupy = stand_in_cupy(args.nvmath)
    import logging
    logging.getLogger("scaffe").setLevel(logging.WARNING)
    names = sorted(MODELS) if args.model == "all" else [args.model]
    print(f"# per SGD iteration on the cupy stand-in, mean of one step of {args.iterations} iterations after "
          f"{args.warmup} warm-up (host ms: numpy compute included)")
    print(f"{'# model':<16}{'batch':>6}{'capture':>8}{'launches':>10}{'graphs':>8}{'host syncs':>12}{'uploads':>9}"
          f"{'host ms':>10}")
    for name in names:
        for capture in (False, True):
            r = count(name, args.iterations, args.warmup, cupy, capture)
            print(f"{r['model']:<16}{r['batch']:>6}{r['capture']:>8}{r['launches']:>10.1f}{r['graphs']:>8.1f}"
                  f"{r['host_syncs']:>12.2f}{r['uploads']:>9.2f}{r['host_ms']:>10.1f}")


if __name__ == "__main__":
    main()
