"""The example nets written again in PyTorch, layer for layer, to time scaffe's GPU training against eager
PyTorch on the same architectures: LeNet (batch 64), cifar10_quick (batch 100), Caffe's AlexNet (batch 128).

Each net is a plain list of layer specs (SPECS), so its learnable shapes can be checked against scaffe's
own nets without torch (`param_shapes`); `build` turns a spec into a torch module. Caffe's pooling rounds
up (ceil mode) and its LRN divides alpha by the window like torch's. Timing (`ms_per_iter`) is a whole
SGD iteration (forward, backward, update with momentum and weight decay) on fixed random data, with the
device synchronised around the timed loop; TF32 is off, as scaffe leaves it off unless CUPY_TF32 says.

    python -m perf.torch_twins [--net lenet|cifar10_quick|alexnet|all] [--iterations 20] [--warmup 5]
"""
import argparse
import sys
import time

# name -> (batch, input (C, H, W), layers). conv: (out, kernel, stride, pad, group); pool: (MAX|AVE, kernel,
# stride); lrn: (size, alpha, beta); ip: (out,); dropout: (ratio,).
SPECS = {
    "lenet": (64, (1, 28, 28), [
        ("conv", 20, 5, 1, 0, 1), ("pool", "MAX", 2, 2), ("conv", 50, 5, 1, 0, 1), ("pool", "MAX", 2, 2),
        ("ip", 500), ("relu",), ("ip", 10)]),
    "cifar10_quick": (100, (3, 32, 32), [
        ("conv", 32, 5, 1, 2, 1), ("pool", "MAX", 3, 2), ("relu",),
        ("conv", 32, 5, 1, 2, 1), ("relu",), ("pool", "AVE", 3, 2),
        ("conv", 64, 5, 1, 2, 1), ("relu",), ("pool", "AVE", 3, 2),
        ("ip", 64), ("ip", 10)]),
    "alexnet": (128, (3, 227, 227), [
        ("conv", 96, 11, 4, 0, 1), ("relu",), ("lrn", 5, 1e-4, 0.75), ("pool", "MAX", 3, 2),
        ("conv", 256, 5, 1, 2, 2), ("relu",), ("lrn", 5, 1e-4, 0.75), ("pool", "MAX", 3, 2),
        ("conv", 384, 3, 1, 1, 1), ("relu",), ("conv", 384, 3, 1, 1, 2), ("relu",),
        ("conv", 256, 3, 1, 1, 2), ("relu",), ("pool", "MAX", 3, 2),
        ("ip", 4096), ("relu",), ("dropout", 0.5), ("ip", 4096), ("relu",), ("dropout", 0.5), ("ip", 1000)]),
}


def _pooled(size, kernel, stride):
    return -(-(size - kernel) // stride) + 1  # Caffe's ceil rounding (no padding in these nets)


def param_shapes(name):
    """The learnable shapes of net `name`, in order: (weight, bias) of each conv and ip layer, as Caffe's."""
    _, (channels, height, width), layers = SPECS[name]
    flat = None
    shapes = []
    for kind, *args in layers:
        if kind == "conv":
            out, kernel, stride, pad, group = args
            shapes += [(out, channels // group, kernel, kernel), (out,)]
            channels = out
            height = (height + 2 * pad - kernel) // stride + 1
            width = (width + 2 * pad - kernel) // stride + 1
        elif kind == "pool":
            height, width = _pooled(height, args[1], args[2]), _pooled(width, args[1], args[2])
        elif kind == "ip":
            inputs = flat if flat is not None else channels * height * width
            shapes += [(args[0], inputs), (args[0],)]
            flat = args[0]
    return shapes


def build(name):
    """Net `name` as a torch.nn.Sequential (imports torch)."""
    from torch import nn
    _, (channels, height, width), layers = SPECS[name]
    modules = []
    flat = None
    for kind, *args in layers:
        if kind == "conv":
            out, kernel, stride, pad, group = args
            modules.append(nn.Conv2d(channels, out, kernel, stride, pad, groups=group))
            channels = out
            height = (height + 2 * pad - kernel) // stride + 1
            width = (width + 2 * pad - kernel) // stride + 1
        elif kind == "pool":
            pool = nn.MaxPool2d if args[0] == "MAX" else nn.AvgPool2d
            modules.append(pool(args[1], args[2], ceil_mode=True))
            height, width = _pooled(height, args[1], args[2]), _pooled(width, args[1], args[2])
        elif kind == "relu":
            modules.append(nn.ReLU(inplace=True))
        elif kind == "lrn":
            modules.append(nn.LocalResponseNorm(args[0], alpha=args[1], beta=args[2], k=1.0))
        elif kind == "dropout":
            modules.append(nn.Dropout(args[0]))
        elif kind == "ip":
            if flat is None:
                modules.append(nn.Flatten())
                flat = channels * height * width
            modules.append(nn.Linear(flat, args[0]))
            flat = args[0]
    return nn.Sequential(*modules)


def ms_per_iter(name, iterations=20, warmup=5, batch=None):
    """Milliseconds per SGD iteration of net `name` in eager PyTorch on the current CUDA device."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    default_batch, image, layers = SPECS[name]
    batch = batch or default_batch
    model = build(name).cuda().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator(device="cuda").manual_seed(0)
    data = torch.rand((batch, *image), device="cuda", generator=generator)
    classes = next(args[0] for kind, *args in reversed(layers) if kind == "ip")
    label = torch.randint(0, classes, (batch,), device="cuda", generator=generator)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(data), label).backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iterations):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iterations * 1e3


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m perf.torch_twins", description=__doc__.splitlines()[0])
    p.add_argument("--net", default="all", choices=["all", *SPECS])
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args(argv)
    for name in SPECS if args.net == "all" else [args.net]:
        print(f"RESULT torch_ms_per_iter {name} {ms_per_iter(name, args.iterations, args.warmup):.3f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
