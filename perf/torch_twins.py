"""The example nets written again in PyTorch, layer for layer, to time scaffe's GPU training against eager
PyTorch on the same architectures: LeNet (batch 64), cifar10_quick (batch 100), Caffe's AlexNet (batch 128),
GoogLeNet (batch 32).

Each chain net is a plain list of layer specs (SPECS); GoogLeNet, whose Inception modules branch and
concatenate, is read from its deploy prototxt (examples/googlenet), layer by layer, into a module that
runs them in the prototxt's order over named blobs. Either way the learnable shapes can be checked
against scaffe's own nets without torch (`param_shapes`); `build` turns a spec into a torch module. Caffe's pooling rounds
up (ceil mode) and its LRN divides alpha by the window like torch's. Timing (`ms_per_iter`) is a whole
SGD iteration (forward, backward, update with momentum and weight decay) on fixed random data, with the
device synchronised around the timed loop; TF32 is off, as scaffe leaves it off unless CUPY_TF32 says.

    python -m perf.torch_twins [--net lenet|cifar10_quick|alexnet|googlenet|all] [--iterations 20] [--warmup 5]
"""
import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> (batch, input (C, H, W), layers). conv: (out, kernel, stride, pad, group); pool: (MAX|AVE, kernel,
# stride); lrn: (size, alpha, beta); ip: (out,); dropout: (ratio,). A Path instead of layers: a deploy
# prototxt of Input, Convolution, ReLU, Pooling, LRN, Concat, Dropout, InnerProduct and Softmax layers.
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
    "googlenet": (32, (3, 224, 224), ROOT / "examples" / "googlenet" / "deploy.prototxt"),
}


def _pooled(size, kernel, stride):
    return -(-(size - kernel) // stride) + 1  # Caffe's ceil rounding (no padding in these nets)


def param_shapes(name):
    """The learnable shapes of net `name`, in order: (weight, bias) of each conv and ip layer, as Caffe's."""
    _, (channels, height, width), layers = SPECS[name]
    if isinstance(layers, Path):
        _, steps = _graph_steps(layers, (channels, height, width))
        return [shape for _, _, shapes in steps for shape in shapes]
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


def _caffe_pooled(size, kernel, stride, pad):
    """Caffe's pooled extent: rounded up, less a last window that would start in the padding."""
    pooled = -(-(size + 2 * pad - kernel) // stride) + 1
    return pooled - 1 if pad and (pooled - 1) * stride >= size + pad else pooled


def _graph_steps(path, image):
    """(the Input's blob, [(layer, (C, H, W) of its first bottom, its learnable shapes) of each later layer])
    of prototxt `path`, whose Input takes `image`."""
    from scaffe import io as sio
    net = sio.read_net_prototxt(str(path))
    shapes, steps, data = {}, [], None
    for layer in net.layer:
        if layer.type == "Input":
            data = layer.top[0]
            shapes[data] = image
            continue
        channels, height, width = shapes[layer.bottom[0]]
        learnable = []
        if layer.type == "Convolution":
            p = layer.convolution_param
            kernel, stride, pad = p.kernel_size[0], (list(p.stride) or [1])[0], (list(p.pad) or [0])[0]
            learnable = [(p.num_output, channels // p.group, kernel, kernel), (p.num_output,)]
            out = (p.num_output, (height + 2 * pad - kernel) // stride + 1, (width + 2 * pad - kernel) // stride + 1)
        elif layer.type == "Pooling":
            p = layer.pooling_param
            out = (channels, _caffe_pooled(height, p.kernel_size, p.stride, p.pad),
                   _caffe_pooled(width, p.kernel_size, p.stride, p.pad))
        elif layer.type == "InnerProduct":
            learnable = [(layer.inner_product_param.num_output, channels * height * width),
                         (layer.inner_product_param.num_output,)]
            out = (layer.inner_product_param.num_output, 1, 1)
        elif layer.type == "Concat":
            out = (sum(shapes[b][0] for b in layer.bottom), height, width)
        elif layer.type in ("ReLU", "LRN", "Dropout", "Softmax"):
            out = (channels, height, width)
        else:
            raise ValueError(f"{path}: no torch twin for layer type {layer.type} ({layer.name})")
        shapes[layer.top[0]] = out
        steps.append((layer, (channels, height, width), learnable))
    return data, steps


def _torch_layer(layer, channels, learnable):
    """The torch module of a prototxt layer (None for a Concat, which the graph does itself)."""
    from torch import nn
    from scaffe.proto import caffe_pb2
    kind = layer.type
    if kind == "Convolution":
        p = layer.convolution_param
        return nn.Conv2d(channels, p.num_output, p.kernel_size[0], (list(p.stride) or [1])[0],
                         (list(p.pad) or [0])[0], groups=p.group)
    if kind == "Pooling":
        p = layer.pooling_param
        pool = nn.AvgPool2d if p.pool == caffe_pb2.PoolingParameter.AVE else nn.MaxPool2d
        return pool(p.kernel_size, p.stride, p.pad, ceil_mode=True)
    if kind == "InnerProduct":
        return nn.Sequential(nn.Flatten(), nn.Linear(learnable[0][1], learnable[0][0]))
    if kind == "ReLU":
        return nn.ReLU(inplace=True)
    if kind == "LRN":
        p = layer.lrn_param
        return nn.LocalResponseNorm(p.local_size, alpha=p.alpha, beta=p.beta, k=1.0)
    if kind == "Dropout":
        return nn.Dropout(layer.dropout_param.dropout_ratio)
    return None


def _build_graph(path, image):
    """The prototxt net at `path` as a torch module running its layers in order over named blobs; its
    output is the classifier's (the Softmax's bottom: the loss takes logits)."""
    import torch
    from torch import nn

    class Graph(nn.Module):
        def __init__(self):
            super().__init__()
            self.steps, modules, self.output = [], [], None
            self.input, steps = _graph_steps(path, image)
            for layer, (channels, _, _), learnable in steps:
                if layer.type == "Softmax":
                    self.output = layer.bottom[0]
                    continue
                module = _torch_layer(layer, channels, learnable)
                if module is not None:
                    modules.append(module)
                self.steps.append((module, list(layer.bottom), layer.top[0]))
            self.layers = nn.ModuleList(modules)  # in the prototxt's order: Caffe's order of learnables
            self.output = self.output or self.steps[-1][2]

        def forward(self, data):
            blobs = {self.input: data}
            for module, bottoms, top in self.steps:
                inputs = [blobs[b] for b in bottoms]
                blobs[top] = torch.cat(inputs, 1) if module is None else module(inputs[0])
            return blobs[self.output]

    return Graph()


def build(name):
    """Net `name` as a torch module (imports torch)."""
    from torch import nn
    _, (channels, height, width), layers = SPECS[name]
    if isinstance(layers, Path):
        return _build_graph(layers, (channels, height, width))
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
    default_batch, image, _ = SPECS[name]
    batch = batch or default_batch
    model = build(name).cuda().train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    generator = torch.Generator(device="cuda").manual_seed(0)
    data = torch.rand((batch, *image), device="cuda", generator=generator)
    classes = param_shapes(name)[-1][0]  # the last layer's bias: one per class
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
