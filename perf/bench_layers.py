"""Times forward + backward of LeNet- and cifar10_quick-shaped layer stacks, per layer, without a Net.

Each stack is wired by hand from scaffe layers the way Caffe's example prototxts wire them (ReLUs in
place, no gradient into the data), with random inputs; the loss top's diff is set to 1 as the net
would. Prints Caffe-`time`-like lines: per-layer forward and backward means, then the total per
iteration. Usage: python -m perf.bench_layers [--iterations N] [--warmup N] [--net lenet|cifar10_quick|all]
"""
import argparse
import time

import numpy
from google.protobuf import text_format

from scaffe.blob import Blob
from scaffe.layer_impls import create_layer
from scaffe.proto import caffe_pb2

XAVIER = 'weight_filler { type: "xavier" } bias_filler { type: "constant" }'
GAUSS = 'weight_filler { type: "gaussian" std: 0.01 } bias_filler { type: "constant" }'

# (name, prototxt body, bottoms, tops); blobs named "data"/"label" are inputs.
LENET = [
    ("conv1", f'type: "Convolution" convolution_param {{ num_output: 20 kernel_size: 5 stride: 1 {XAVIER} }}',
     ["data"], ["conv1"]),
    ("pool1", 'type: "Pooling" pooling_param { pool: MAX kernel_size: 2 stride: 2 }', ["conv1"], ["pool1"]),
    ("conv2", f'type: "Convolution" convolution_param {{ num_output: 50 kernel_size: 5 stride: 1 {XAVIER} }}',
     ["pool1"], ["conv2"]),
    ("pool2", 'type: "Pooling" pooling_param { pool: MAX kernel_size: 2 stride: 2 }', ["conv2"], ["pool2"]),
    ("ip1", f'type: "InnerProduct" inner_product_param {{ num_output: 500 {XAVIER} }}', ["pool2"], ["ip1"]),
    ("relu1", 'type: "ReLU"', ["ip1"], ["ip1"]),
    ("ip2", f'type: "InnerProduct" inner_product_param {{ num_output: 10 {XAVIER} }}', ["ip1"], ["ip2"]),
    ("loss", 'type: "SoftmaxWithLoss"', ["ip2", "label"], ["loss"]),
]

CIFAR10_QUICK = [
    ("conv1", 'type: "Convolution" convolution_param { num_output: 32 pad: 2 kernel_size: 5 stride: 1 '
     'weight_filler { type: "gaussian" std: 0.0001 } bias_filler { type: "constant" } }', ["data"], ["conv1"]),
    ("pool1", 'type: "Pooling" pooling_param { pool: MAX kernel_size: 3 stride: 2 }', ["conv1"], ["pool1"]),
    ("relu1", 'type: "ReLU"', ["pool1"], ["pool1"]),
    ("conv2", f'type: "Convolution" convolution_param {{ num_output: 32 pad: 2 kernel_size: 5 stride: 1 {GAUSS} }}',
     ["pool1"], ["conv2"]),
    ("relu2", 'type: "ReLU"', ["conv2"], ["conv2"]),
    ("pool2", 'type: "Pooling" pooling_param { pool: AVE kernel_size: 3 stride: 2 }', ["conv2"], ["pool2"]),
    ("conv3", f'type: "Convolution" convolution_param {{ num_output: 64 pad: 2 kernel_size: 5 stride: 1 {GAUSS} }}',
     ["pool2"], ["conv3"]),
    ("relu3", 'type: "ReLU"', ["conv3"], ["conv3"]),
    ("pool3", 'type: "Pooling" pooling_param { pool: AVE kernel_size: 3 stride: 2 }', ["conv3"], ["pool3"]),
    ("ip1", 'type: "InnerProduct" inner_product_param { num_output: 64 weight_filler { type: "gaussian" std: 0.1 } '
     'bias_filler { type: "constant" } }', ["pool3"], ["ip1"]),
    ("ip2", 'type: "InnerProduct" inner_product_param { num_output: 10 weight_filler { type: "gaussian" std: 0.1 } '
     'bias_filler { type: "constant" } }', ["ip1"], ["ip2"]),
    ("loss", 'type: "SoftmaxWithLoss"', ["ip2", "label"], ["loss"]),
]

NETS = {
    "lenet": (LENET, (64, 1, 28, 28), 10, "LeNet, batch 64, 1x28x28"),
    "cifar10_quick": (CIFAR10_QUICK, (100, 3, 32, 32), 10, "cifar10_quick, batch 100, 3x32x32"),
}


class Stack:
    """Layers wired to named blobs in order; backward runs where Caffe's net would run it."""

    def __init__(self, spec, data_shape, classes, seed=0):
        rng = numpy.random.default_rng(seed)
        numpy.random.seed(seed)
        self.blobs = {"data": Blob(data_shape), "label": Blob((data_shape[0],))}
        self.blobs["data"].data[...] = rng.uniform(0, 1, data_shape)
        self.blobs["label"].data[...] = rng.integers(0, classes, data_shape[0])
        self.layers = []
        for name, body, bottom_names, top_names in spec:
            lp = caffe_pb2.LayerParameter()
            text_format.Parse(body, lp)
            lp.name = name
            layer = create_layer(lp, caffe_pb2.TRAIN)
            for t in top_names:
                self.blobs.setdefault(t, Blob(()))
            bottom = [self.blobs[b] for b in bottom_names]
            top = [self.blobs[t] for t in top_names]
            layer.setup(bottom, top)
            layer.reshape(bottom, top)
            # Gradients flow into every bottom except the inputs (data, label), as in Caffe's nets.
            propagate = [b not in ("data", "label") for b in bottom_names]
            self.layers.append((name, layer, bottom, top, propagate))

    def forward_backward(self, timings):
        for name, layer, bottom, top, _ in self.layers:
            start = time.perf_counter()
            layer.reshape(bottom, top)
            layer.forward(bottom, top)
            timings[name][0] += time.perf_counter() - start
        for name, layer, bottom, top, propagate in reversed(self.layers):
            start = time.perf_counter()
            for blob in layer.blobs:
                blob.diff[...] = 0
            if layer.is_loss():
                top[0].diff[...] = 1.0
            layer.backward(top, propagate, bottom)
            timings[name][1] += time.perf_counter() - start


def bench(net, iterations, warmup):
    spec, shape, classes, title = NETS[net]
    stack = Stack(spec, shape, classes)
    scratch = {name: [0.0, 0.0] for name, *_ in spec}
    for _ in range(warmup):
        stack.forward_backward(scratch)
    timings = {name: [0.0, 0.0] for name, *_ in spec}
    totals = []
    cpu_start = time.process_time()
    for _ in range(iterations):
        start = time.perf_counter()
        stack.forward_backward(timings)
        totals.append(time.perf_counter() - start)
    cpu_ms = (time.process_time() - cpu_start) / iterations * 1e3
    print(f"# {title}: {iterations} iterations after {warmup} warm-up")
    print(f"{'layer':>10} {'forward ms':>11} {'backward ms':>12}")
    for name, (fwd, bwd) in timings.items():
        print(f"{name:>10} {fwd / iterations * 1e3:11.3f} {bwd / iterations * 1e3:12.3f}")
    fwd_total = sum(t[0] for t in timings.values()) / iterations * 1e3
    bwd_total = sum(t[1] for t in timings.values()) / iterations * 1e3
    totals_ms = numpy.array(totals) * 1e3
    print(f"{'total':>10} {fwd_total:11.3f} {bwd_total:12.3f}")
    print(f"forward+backward: mean {totals_ms.mean():.2f} ms/iter, median {numpy.median(totals_ms):.2f}, "
          f"min {totals_ms.min():.2f}; process CPU time {cpu_ms:.2f} ms/iter (all threads)")
    print()
    return float(totals_ms.mean())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--net", choices=sorted(NETS) + ["all"], default="all")
    args = parser.parse_args(argv)
    for net in (sorted(NETS) if args.net == "all" else [args.net]):
        bench(net, args.iterations, args.warmup)


if __name__ == "__main__":
    main()
