"""Training throughput on this machine: ms per iteration and images/s for LeNet (batch 64) and
cifar10_quick (batch 100), forward, backward, forward+backward and a full SGD iteration.

The example nets' Data layers are replaced by an Input layer holding fixed random images and
labels, so the numbers measure the layers and the solver, not the disk or the decoder.

With --gpu the nets run on that CUDA device (cupy). A GPU runs the launched work asynchronously, so the
device is synchronised before every reading of the clock: a time is the work's, not its launches'.

    python -m perf.bench_train [--iterations 20] [--warmup 3] [--model lenet|cifar10_quick|all] [--gpu ID]
"""
import argparse
import os
import sys
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


def device_module(gpu):
    """numpy, or cupy with CUDA device `gpu` current."""
    if gpu is None:
        return numpy
    from kernels.backend import cupy_or_none
    cupy = cupy_or_none()
    if cupy is None:
        raise SystemExit(f"--gpu {gpu}: no CUDA GPU is usable here (cupy missing or no device)")
    cupy.cuda.Device(gpu).use()
    return cupy


def make_solver(name, xp=numpy):
    from scaffe.proto import caffe_pb2
    from scaffe.solvers import create_solver
    path, batch, shape = MODELS[name]
    solver_param = caffe_pb2.SolverParameter(type="SGD", base_lr=0.01, momentum=0.9, weight_decay=0.0005,
                                             lr_policy="fixed", max_iter=10 ** 9, display=0, random_seed=1,
                                             snapshot_after_train=False)
    solver_param.net_param.CopyFrom(synthetic_train_net(path, batch, shape))
    solver = create_solver(solver_param, net_kwargs={"xp": xp})
    fill_synthetic_inputs(solver.net, xp)
    return solver, batch


def fill_synthetic_inputs(net, xp=numpy):
    """Random images in [0, 1) and labels of 10 classes, once, in the Input layer of a `synthetic_train_net`."""
    rng = numpy.random.RandomState(0)
    data, label = net.input_blobs
    data.data[...] = xp.asarray(rng.uniform(0, 1, data.shape).astype(data.dtype))
    label.data[...] = xp.asarray(rng.randint(0, 10, label.shape).astype(label.dtype))


def bench(name, iterations, warmup, xp=numpy):
    solver, batch = make_solver(name, xp)
    net = solver.net
    clock = net.clock  # after the device has run what was queued
    for _ in range(warmup):
        solver.step(1)
    fwd = bwd = 0.0
    for _ in range(iterations):
        t0 = clock()
        net.forward()
        t1 = clock()
        net.backward()
        t2 = clock()
        fwd += t1 - t0
        bwd += t2 - t1
    t0 = clock()
    solver.step(iterations)
    full = (clock() - t0) / iterations
    fwd, bwd = fwd / iterations, bwd / iterations
    return {"model": name, "batch": batch, "fwd_ms": fwd * 1e3, "bwd_ms": bwd * 1e3,
            "fwd_bwd_ms": (fwd + bwd) * 1e3, "iter_ms": full * 1e3, "images_per_s": batch / full}


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m perf.bench_train", description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3,
                   help="untimed iterations first (kernels load, or compile on a new host, then)")
    p.add_argument("--model", default="all", choices=["all"] + sorted(MODELS))
    p.add_argument("--gpu", type=int, default=None, help="run on this CUDA device (default: the CPU)")
    args = p.parse_args(argv)
    xp = device_module(args.gpu)
    import logging
    logging.getLogger("scaffe").setLevel(logging.WARNING)
    names = sorted(MODELS) if args.model == "all" else [args.model]
    from kernels._threads import num_threads
    threads = num_threads()
    where = (f"GPU {args.gpu}: {xp.cuda.runtime.getDeviceProperties(args.gpu)['name'].decode()}"
             if xp is not numpy else
             f"CPU: {os.cpu_count()} cores, kernel threads {threads}, numpy {numpy.__version__}")
    print(f"# scaffe training throughput, {where}, {args.iterations} iterations after {args.warmup} warm-up")
    print(f"{'# model':<16}{'batch':>6}{'fwd ms':>10}{'bwd ms':>10}{'fwd+bwd ms':>12}{'iter ms':>10}{'images/s':>10}")
    for name in names:
        r = bench(name, args.iterations, args.warmup, xp)
        print(f"{r['model']:<16}{r['batch']:>6}{r['fwd_ms']:>10.2f}{r['bwd_ms']:>10.2f}{r['fwd_bwd_ms']:>12.2f}"
              f"{r['iter_ms']:>10.2f}{r['images_per_s']:>10.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
