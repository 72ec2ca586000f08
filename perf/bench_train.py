"""Training throughput on this machine: ms per iteration and images/s for LeNet (batch 64) and
cifar10_quick (batch 100), forward, backward, forward+backward and a full SGD iteration.

The example nets' Data layers are replaced by an Input layer holding fixed random images and
labels, so the numbers measure the layers and the solver, not the disk or the decoder.

    python -m perf.bench_train [--iterations 20] [--warmup 3] [--model lenet|cifar10_quick|all]
"""
import argparse
import os
import sys
import time
from pathlib import Path

import numpy

ROOT = Path(__file__).resolve().parents[1]

MODELS = {
    # name: (train_test prototxt, batch, image shape)
    "lenet": (ROOT / "examples" / "mnist" / "lenet_train_test.prototxt", 64, (1, 28, 28)),
    "cifar10_quick": (ROOT / "examples" / "cifar10" / "cifar10_quick_train_test.prototxt", 100, (3, 32, 32)),
}


def synthetic_train_net(path, batch, image_shape):
    """The TRAIN net of `path` with its Data layers swapped for one Input layer of the same tops."""
    from scaffe import io as sio
    from scaffe.proto import caffe_pb2
    param = sio.read_net_prototxt(path)
    out = caffe_pb2.NetParameter()
    out.CopyFrom(param)
    del out.layer[:]
    inserted = False
    for layer in param.layer:
        if layer.type == "Data":
            if not inserted:
                data = out.layer.add(name="data", type="Input")
                data.top.extend(["data", "label"])
                data.input_param.shape.add().dim.extend((batch,) + tuple(image_shape))
                data.input_param.shape.add().dim.extend((batch,))
                inserted = True
            continue
        out.layer.add().CopyFrom(layer)
    return out


def make_solver(name):
    from scaffe.proto import caffe_pb2
    from scaffe.solvers import create_solver
    path, batch, shape = MODELS[name]
    solver_param = caffe_pb2.SolverParameter(type="SGD", base_lr=0.01, momentum=0.9, weight_decay=0.0005,
                                             lr_policy="fixed", max_iter=10 ** 9, display=0, random_seed=1,
                                             snapshot_after_train=False)
    solver_param.net_param.CopyFrom(synthetic_train_net(path, batch, shape))
    solver = create_solver(solver_param)
    rng = numpy.random.RandomState(0)
    data, label = solver.net.input_blobs
    data.data[...] = rng.uniform(0, 1, data.shape)
    label.data[...] = rng.randint(0, 10, label.shape)
    return solver, batch


def bench(name, iterations, warmup):
    solver, batch = make_solver(name)
    net = solver.net
    for _ in range(warmup):
        solver.step(1)
    fwd = bwd = 0.0
    for _ in range(iterations):
        t0 = time.perf_counter()
        net.forward()
        t1 = time.perf_counter()
        net.backward()
        t2 = time.perf_counter()
        fwd += t1 - t0
        bwd += t2 - t1
    t0 = time.perf_counter()
    solver.step(iterations)
    full = (time.perf_counter() - t0) / iterations
    fwd, bwd = fwd / iterations, bwd / iterations
    return {"model": name, "batch": batch, "fwd_ms": fwd * 1e3, "bwd_ms": bwd * 1e3,
            "fwd_bwd_ms": (fwd + bwd) * 1e3, "iter_ms": full * 1e3, "images_per_s": batch / full}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m perf.bench_train", description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3, help="untimed iterations first (numba compiles then)")
    p.add_argument("--model", default="all", choices=["all"] + sorted(MODELS))
    args = p.parse_args(argv)
    import logging
    logging.getLogger("scaffe").setLevel(logging.WARNING)
    names = sorted(MODELS) if args.model == "all" else [args.model]
    try:
        import numba
        threads = numba.config.NUMBA_NUM_THREADS
    except ImportError:
        threads = 1
    print(f"# scaffe training throughput, CPU: {os.cpu_count()} cores, numba threads {threads}, "
          f"numpy {numpy.__version__}, {args.iterations} iterations after {args.warmup} warm-up")
    print(f"{'# model':<16}{'batch':>6}{'fwd ms':>10}{'bwd ms':>10}{'fwd+bwd ms':>12}{'iter ms':>10}{'images/s':>10}")
    for name in names:
        r = bench(name, args.iterations, args.warmup)
        print(f"{r['model']:<16}{r['batch']:>6}{r['fwd_ms']:>10.2f}{r['bwd_ms']:>10.2f}{r['fwd_bwd_ms']:>12.2f}"
              f"{r['iter_ms']:>10.2f}{r['images_per_s']:>10.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
