"""What each layer's forward and backward, and the solver's update, take in a modelled run: from a `caffe
time` log or a GPU model (scaffe.modelled.gpus).

SPEC (`scaffe train --compute-profile=SPEC`, or SCAFFE_COMPUTE_PROFILE) is `k80`, `v100`, `h100`, or the
path of a log of BVLC Caffe's `caffe time` or of `scaffe time` (any device): its per-layer lines
`<layer>\tforward: X ms.` and `<layer>\tbackward: Y ms.` give the times at the batch of the log's first
`Top shape:` line, scaled linearly to the net's batch. Layers the log does not name take no time (the
root logs which). A log has no update time: the update is then modelled as on an h100, as a log says.
Every modelled time is multiplied by SCAFFE_COMPUTE_SCALE (default 1) and by the time dilation
SCAFFE_TIME_DILATION (default 1; perf/cluster_sim.py sets it with the links shaped to rate / D).
"""
import re

from collectives.settings import positive_number
from scaffe.modelled import gpus

LOG_LINE = re.compile(r"(\S+)\s+(forward|backward): ([0-9.eE+-]+) ms")
TOP_SHAPE = re.compile(r"Top shape: (\d+)")


def compute_scale():
    """SCAFFE_COMPUTE_SCALE: a factor on every modelled time (default 1)."""
    return positive_number("SCAFFE_COMPUTE_SCALE", 1.0)


def time_dilation():
    """SCAFFE_TIME_DILATION: D, every modelled time D times longer (default 1)."""
    return positive_number("SCAFFE_TIME_DILATION", 1.0)


class ComputeProfile:
    """`forward[name]`, `backward[name]`: a layer's seconds at the net's batch, scale and dilation included;
    `update(elements)`: the solver's update of that many values; `source`: what it came from."""

    def __init__(self, spec, layers, batch, history_sets=1, scale=None, dilation=None):
        self.scale = (compute_scale() if scale is None else scale) * (time_dilation() if dilation is None else dilation)
        self.history_sets = history_sets
        self.unnamed = []
        if spec in gpus.GPUS:
            self.gpu, self.source = spec, f"the {spec} model"
            self.forward = {layer.name: gpus.layer_seconds(spec, layer.flops[0], layer.bytes[0], layer.kernels[0])
                            for layer in layers}
            self.backward = {layer.name: gpus.layer_seconds(spec, layer.flops[1], layer.bytes[1], layer.kernels[1])
                             for layer in layers}
        else:
            self.gpu, self.source = "h100", f"the log {spec} (updates as on an h100)"
            self.forward, self.backward = read_time_log(spec, batch)
            self.unnamed = [layer.name for layer in layers
                            if layer.name not in self.forward and layer.name not in self.backward]
        for times in (self.forward, self.backward):
            for name in times:
                times[name] *= self.scale

    def update(self, elements):
        return gpus.update_seconds(self.gpu, elements, self.history_sets) * self.scale

    def iteration_seconds(self, layers, elements):
        """One rank's modelled iteration: every forward and backward and the update of every value."""
        return sum(self.forward.get(layer.name, 0.0) + self.backward.get(layer.name, 0.0) for layer in layers) \
            + self.update(elements)


def read_time_log(path, batch):
    """({layer: forward s}, {layer: backward s}) of a `caffe time` log, scaled from its batch to `batch`."""
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"--compute-profile: {path}: {e.strerror}; give a `caffe time` log or one of "
                         f"{', '.join(gpus.GPUS)}") from None
    times = {"forward": {}, "backward": {}}
    for name, direction, ms in LOG_LINE.findall(text):
        times[direction][name] = float(ms) / 1000
    shape = TOP_SHAPE.search(text)
    if not times["forward"] or shape is None:
        raise ValueError(f"--compute-profile: {path} holds no `caffe time` per-layer lines (`<layer>\tforward: "
                         f"X ms.`) or no `Top shape:` line")
    factor = batch / int(shape.group(1))
    return ({k: v * factor for k, v in times["forward"].items()},
            {k: v * factor for k, v in times["backward"].items()})
