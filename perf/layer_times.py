"""Each layer's forward and backward time on the device, by CUDA events around back-to-back repeats.

    python -m perf.layer_times --model NET.prototxt [--repeats 20] [--warmup 3]

`scaffe time` (like BVLC Caffe's) times each layer from the host between device synchronisations, so a small
layer's time there is mostly the host's launches, which a training iteration replayed from CUDA graphs does
not pay. Here each pass runs `--repeats` times in a row between two events on the stream: where the device is
the bottleneck that is its time, where the host is, the launches' (an upper bound). The lines have `scaffe
time`'s form (`<layer>\tforward: X ms.`, a `Top shape:` line for the batch), so perf/model_check.py and
`--compute-profile` read them.
"""
import argparse
import sys


def layer_times(net, repeats, warmup):
    """[(name, forward ms, backward ms)] of `net` (a cupy Net), each pass's mean over `repeats` runs."""
    import cupy
    stream = cupy.cuda.get_current_stream()
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()

    def device_ms(work):
        for _ in range(warmup):
            work()
        start.record(stream)
        for _ in range(repeats):
            work()
        stop.record(stream)
        stop.synchronize()
        return cupy.cuda.get_elapsed_time(start, stop) / repeats

    net.forward()
    net.backward()
    rows = []
    for i, layer in enumerate(net.layers):
        forward = device_ms(lambda: net.forward_from_to(i, i))
        backward = device_ms(lambda: layer.backward(net.top_vecs[i], net.bottom_need_backward[i],
                                                    net.bottom_vecs[i]))
        rows.append((layer.name, forward, backward))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m perf.layer_times", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="a train net prototxt (perf.gpu_acceptance train-net writes one)")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    args = p.parse_args(argv)
    import cupy

    from scaffe.net import Net
    net = Net.from_file(args.model, "TRAIN", xp=cupy)
    print(f"Top shape: {' '.join(map(str, net.blobs[net.blob_names[0]].shape))}")
    for name, forward, backward in layer_times(net, args.repeats, args.warmup):
        print(f"{name}\tforward: {forward:.4f} ms.")
        print(f"{name}\tbackward: {backward:.4f} ms.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
