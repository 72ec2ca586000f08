"""What fused multiply-add does to the solvers' fused update kernels, on the CPU (issue 22, item 4).

    python -m perf.update_rounding

LeNet (batch 4, Caffe's fillers, lr_mult 1/2, biases without decay) takes 3 steps of each adaptive solver
from the numpy net's gradients, twice in float32: every product and sum rounded, as the per-blob pipeline
and the kernels compiled with --fmad=false compute, and with each `a * b + c` of the history updates
contracted into fma(a, b, c), as NVRTC compiles by default (emulated exactly: a float32 product is exact in
float64, and the one rounding to float32 is the fma's). Both take the same gradients each step.
"""
import numpy

from perf.bench_train import MODELS, synthetic_train_net

f32 = numpy.float32
SOLVERS = {"AdaGrad": {}, "RMSProp": {"rms_decay": 0.9}, "AdaDelta": {"momentum": 0.95, "delta": 1e-6, "base_lr": 1.0},
           "Adam": {"momentum": 0.9, "momentum2": 0.999, "base_lr": 0.001}}


def fused(a, b, c):
    return (numpy.float64(a) * numpy.float64(b) + numpy.float64(c)).astype(f32)


def rounded(a, b, c):
    return f32(a) * b + c


def step(kind, g, h, rate, p, t, mad):
    """The solver's step from gradient `g`, updating its histories `h` in place."""
    if kind == "AdaGrad":
        h[0] = mad(g, g, h[0])
        return rate * (g / (numpy.sqrt(h[0]) + f32(p.delta)))
    if kind == "RMSProp":
        h[0] = mad(f32(p.rms_decay), h[0], (f32(1) - f32(p.rms_decay)) * (g * g))
        return rate * (g / (numpy.sqrt(h[0]) + f32(p.delta)))
    if kind == "AdaDelta":
        m = f32(p.momentum)
        h[0] = mad(m, h[0], (f32(1) - m) * (g * g))
        scaled = g * numpy.sqrt((h[1] + f32(p.delta)) / (h[0] + f32(p.delta)))
        h[1] = mad(m, h[1], (f32(1) - m) * (scaled * scaled))
        return rate * scaled
    b1, b2 = f32(p.momentum), f32(p.momentum2)
    correction = f32(numpy.sqrt(1.0 - float(b2) ** t) / (1.0 - float(b1) ** t))
    h[0] = mad(b1, h[0], (f32(1) - b1) * g)
    h[1] = mad(b2, h[1], (f32(1) - b2) * (g * g))
    return (rate * correction) * (h[0] / (numpy.sqrt(h[1]) + f32(p.delta)))


def lenet_solver(kind):
    from scaffe.proto import caffe_pb2
    from scaffe.solvers import create_solver
    path, _, shape = MODELS["lenet"]
    settings = dict({"base_lr": 0.01, "weight_decay": 0.005, "lr_policy": "fixed", "max_iter": 100, "display": 0,
                     "random_seed": 3, "snapshot_after_train": False}, **SOLVERS[kind])
    param = caffe_pb2.SolverParameter(type=kind, **settings)
    param.net_param.CopyFrom(synthetic_train_net(path, 4, shape))
    solver = create_solver(param)
    rng = numpy.random.default_rng(0)
    solver.net.blobs["data"].data[...] = rng.uniform(0, 1, (4, *shape))
    solver.net.blobs["label"].data[...] = rng.integers(0, 10, 4)
    return solver


def compare(kind, steps=3):
    """(elements that differ, largest relative difference, largest absolute difference) of the parameters."""
    solver = lenet_solver(kind)
    blobs = solver.net.learnable_params
    states = {mad: ([b.data.copy() for b in blobs], [[numpy.zeros_like(b.data) for _ in range(2)] for b in blobs])
              for mad in (rounded, fused)}
    p = solver.param
    for t in range(1, steps + 1):
        solver.net.clear_param_diffs()
        solver.net.forward_backward()
        for mad, (xs, hs) in states.items():
            for i, blob in enumerate(blobs):
                weights = i % 2 == 0  # LeNet's blobs alternate weights (decay 1, lr_mult 1) and biases (0, 2)
                g = blob.diff + f32(p.weight_decay) * xs[i] if weights else blob.diff
                xs[i] = xs[i] - step(kind, g, hs[i], f32(p.base_lr) * f32(1 if weights else 2), p, t, mad)
        for blob, x in zip(blobs, states[rounded][0]):
            blob.data[...] = x
    a, b = (numpy.concatenate([x.ravel() for x in states[mad][0]]) for mad in (rounded, fused))
    differ = a != b
    relative = numpy.abs(a - b)[differ] / numpy.abs(a)[differ]
    return int(differ.sum()), a.size, float(relative.max(initial=0)), float(numpy.abs(a - b).max())


def main():
    print("| solver | elements differing | largest relative difference | largest absolute difference |")
    print("|---|---|---|---|")
    for kind in SOLVERS:
        differ, total, relative, absolute = compare(kind)
        print(f"| {kind} | {differ} of {total} | {relative:.2e} | {absolute:.2e} |")


if __name__ == "__main__":
    main()
