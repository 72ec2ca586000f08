"""The training timeline: what each rank did when, as a Chrome trace, and how much communication hid.

`scaffe train --timeline FILE.json` records, on every rank, each layer's forward and backward, the
update, every collective from its start to its completion (reported by `collectives.events`, from
whichever thread ran it), and the waits of the training thread: for data (the Data layer's prefetch
queue), for parameters and for gradients (the schedule's Waits). The root gathers all ranks into one
trace in Chrome's Trace Event Format (load it in https://ui.perfetto.dev or chrome://tracing): one
process per rank (pid = rank), with the tracks `iterations`, `compute` (forward, backward, update and
the waits for parameters and gradients), `data` (waits for data) and `collectives` (more lanes when
collectives overlap). Times are microseconds from a Barrier that all ranks left together.

Hidden communication: each collective's [start, end] is intersected with the rank's compute time,
the union of its forward, backward and update intervals minus every wait; the sum of those overlaps
over the sum of the collectives' durations is the fraction of communication hidden behind compute.
On a CPU the collectives' helper thread shares the cores with compute, so "hidden" means overlapped
in time, not free. On a GPU a layer's slice is when its kernels ran on the compute stream: CUDA events
recorded around its launches (Net.stamp), placed on the host's clock at the end through an event the
start synchronised; recording waits for nothing, so host and device still overlap as they do untimed.

Collectives are named with what they carry, as the schedules label them when they start them
(`collectives.events.labelled`): the gradients or parameters of which layers, and, where a layer
travels in pieces (scaffe.parallel.pieces), which piece of how many ("Ireduce fc6 [3/36]"). The
schedules' small messages of stop/snapshot flags carry no label.

`python -m scaffe.timeline FILE.json` prints the summary, where each rank's iterations spend their
time, and, for each gradient collective, the layers whose backward ran while it was in flight.

Off (no --timeline), nothing is recorded and no clock is read per layer: the hooks stay empty and
the waits check one module attribute.
"""
import bisect
import json
import socket
import sys
import time

import numpy

from collectives import events
from scaffe.log import get_logger
from scaffe.solvers.callbacks import SolverCallback

log = get_logger(__name__)

recording = None  # the Timeline recording in this process, else None

REDUCING = ("Reduce", "Ireduce", "Allreduce", "Iallreduce")
BROADCASTING = ("Bcast", "Ibcast")
COMPUTE = ("forward", "backward", "update")
# Track ids (tid) and their order on screen; collectives that overlap get lanes COLLECTIVES + 1, ...
ITERATIONS, COMPUTE_TRACK, COLLECTIVES, DATA = 0, 1, 2, 9
TRACK_NAMES = {ITERATIONS: "iterations", COMPUTE_TRACK: "compute", COLLECTIVES: "collectives", DATA: "data"}
_MAX_LANES = DATA - COLLECTIVES


class _Block:
    """A `with` block that the recording timeline, if any, keeps as an interval (`record`)."""
    __slots__ = ("began",)

    def __enter__(self):
        self.began = time.perf_counter() if recording is not None else None

    def __exit__(self, *exc):
        timeline = recording
        if self.began is not None and timeline is not None:
            self.record(timeline, self.began, time.perf_counter())


class waiting(_Block):
    """`with waiting("gradients"):` records the block as a wait of training for "data",
    "parameters" or "gradients" (`layer`: a layer index or a name) while a timeline records."""
    __slots__ = ("what", "layer")

    def __init__(self, what, layer=None):
        self.what, self.layer = what, layer

    def record(self, timeline, start, end):
        timeline.add_wait(self.what, self.layer, start, end)


class updating(_Block):
    """`with updating():` records the block as part of the update, for an update made outside the
    solver's (the S-Caffe root updates each layer during backward, as its sum arrives)."""
    __slots__ = ()

    def record(self, timeline, start, end):
        timeline.add_update(start, end)


class Timeline(SolverCallback):
    """Records one rank's training; `start()` before solving, `finish(path)` after (collective)."""

    def __init__(self, solver, comm):
        self.solver = solver
        self.net = solver.net
        self.comm = comm  # the job's mpi4py communicator: a Barrier at start, a gather at the end
        self.rank = comm.Get_rank()
        self.origin = None
        self._anchor = None  # on a GPU: the event at time `origin`, which the layers' events are read against
        self._layers = []        # (layer index, "forward" | "backward", start, end)
        self._waits = []         # (what, layer, start, end)
        self._updates = []       # (start, end)
        self._iterations = []    # (iteration, start, end)
        self._ops = {}           # op id -> (name, nbytes, start) while in flight
        self._collectives = []   # (name, nbytes, start, end)
        self._iteration_start = self._update_start = None

    # ------------------------------------------------------------ recording

    def start(self):
        global recording
        if recording is not None:
            raise RuntimeError("a timeline is already recording in this process")
        self.comm.Barrier()  # every rank's time 0 is the same instant, give or take the Barrier's exit
        if self.net.xp is not numpy:  # the device's time 0: an event done at the host's
            self._anchor = self.net.stamp()
            self._anchor.synchronize()
        self.origin = time.perf_counter()
        self.net.add_hooks(on_layer_timed=self._layer_timed)
        self.solver.callbacks.append(self)
        events.add_listener(self)
        recording = self

    def stop(self):
        """Stops recording (idempotent); what was recorded stays."""
        global recording
        if recording is self:
            recording = None
        events.remove_listener(self)
        for hooks, hook in ((self.net.layer_timed_hooks, self._layer_timed),
                            (self.solver.callbacks, self)):
            if hook in hooks:
                hooks.remove(hook)

    def _layer_timed(self, layer_id, phase, start, end):
        self._layers.append((layer_id, phase, start, end))

    def add_wait(self, what, layer, start, end):
        self._waits.append((what, layer, start, end))

    def add_update(self, start, end):
        self._updates.append((start, end))

    # solver callbacks: the schedule's run first, so the update starts here
    def on_start(self):
        self._iteration_start = time.perf_counter()

    def on_gradients_ready(self):
        self._update_start = time.perf_counter()

    def on_iteration(self, record):
        now = time.perf_counter()
        if self._update_start is not None:
            self._updates.append((self._update_start, now))
        if self._iteration_start is not None:
            self._iterations.append((record["iteration"], self._iteration_start, now))
        self._iteration_start = self._update_start = None

    # collectives.events listener: may run on the collectives' helper thread
    def started(self, op_id, name, nbytes, t):
        self._ops[op_id] = (name, nbytes, t)

    def finished(self, op_id, t):
        op = self._ops.pop(op_id, None)
        if op is not None:
            self._collectives.append(op + (t,))

    # ------------------------------------------------------------ the trace

    def trace_events(self):
        """This rank's Chrome trace events: pid = rank, microseconds since `start()`."""
        names = [layer.name for layer in self.net.layers]
        collectives, lane_count = self._collective_events(names)
        return self._process_events() + self._compute_events(names) + collectives + self._track_events(lane_count)

    def _seconds(self, stamp):
        """A layer's stamp (Net.stamp) as perf_counter seconds: a CUDA event by its time after the anchor's."""
        if self._anchor is None:
            return stamp
        stamp.synchronize()
        return self.origin + self.net.xp.cuda.get_elapsed_time(self._anchor, stamp) / 1e3

    def _event(self, name, cat, tid, start, end, **args):
        """One complete ("X") event from perf_counter times."""
        # Both ends rounded alike, so slices that follow each other never overlap by a rounding.
        ts, te = round((start - self.origin) * 1e6, 3), round((end - self.origin) * 1e6, 3)
        event = {"name": name, "cat": cat, "ph": "X", "pid": self.rank, "tid": tid, "ts": ts, "dur": round(te - ts, 3)}
        if args:
            event["args"] = args
        return event

    def _process_events(self):
        pid = self.rank
        title = f"rank {pid} ({socket.gethostname()})"
        return [{"name": "process_name", "ph": "M", "pid": pid, "args": {"name": title}},
                {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": pid}}]

    def _compute_events(self, names):
        """Iterations, layers, updates and waits."""
        out = [self._event(f"iteration {iteration}", "iteration", ITERATIONS, start, end)
               for iteration, start, end in self._iterations]
        out += [self._event(names[layer_id], phase, COMPUTE_TRACK, self._seconds(start), self._seconds(end),
                            layer=layer_id)
                for layer_id, phase, start, end in self._layers]
        out += [self._event("update", "update", COMPUTE_TRACK, start, end) for start, end in self._updates]
        for what, layer, start, end in self._waits:
            name = names[layer] if isinstance(layer, int) else layer
            label = f"wait {what}" + (f" ({name})" if name else "")
            out.append(self._event(label, "wait", DATA if what == "data" else COMPUTE_TRACK, start, end,
                                   waits_for=what))
        return out

    def _collective_events(self, names):
        """(events, number of lanes): overlapping collectives go to separate lanes (tracks)."""
        out = []
        lanes = []  # end time of the last collective in each lane
        for name, nbytes, start, end in sorted(self._collectives, key=lambda op: op[2]):
            carries, layers, piece = _label_parts(getattr(name, "label", None))
            lane = next((k for k, busy_until in enumerate(lanes) if busy_until <= start), len(lanes))
            if lane == len(lanes):
                lanes.append(end)
            lanes[lane] = end
            # str(): the communicator's names carry attributes that would not survive the gather.
            title = f"{name} {', '.join(names[i] for i in layers)}" if layers else str(name)
            args = {"bytes": nbytes}
            if carries:
                args.update(carries=carries, layers=[names[i] for i in layers])
            if piece:
                title += f" [{piece[0] + 1}/{piece[1]}]"
                args.update(piece=piece[0], pieces=piece[1])
            out.append(self._event(title, "collective", COLLECTIVES + min(lane, _MAX_LANES - 1), start, end, **args))
        return out, len(lanes)

    def _track_events(self, lane_count):
        """Names and order of the tracks (threads in the trace viewer)."""
        pid = self.rank
        tracks = dict(TRACK_NAMES)
        for lane in range(1, min(lane_count, _MAX_LANES)):
            tracks[COLLECTIVES + lane] = f"collectives {lane + 1}"
        out = []
        for tid, name in tracks.items():
            out.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": name}})
            out.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
        return out

    def gather(self):
        """Stops recording and gathers every rank's events into one trace at the root (None on the
        others). Collective: every rank calls it."""
        self.stop()
        gathered = self.comm.gather(self.trace_events(), root=0)
        if self.rank != 0:
            return None
        return {"traceEvents": [e for rank_events in gathered for e in rank_events], "displayTimeUnit": "ms"}

    def finish(self, path):
        """`gather()`, then the root writes the trace to `path` and logs the hidden fraction."""
        trace = self.gather()
        if trace is None:
            return
        save(trace, path)
        log.info("Timeline written to %s; %s", path, describe(summarize(trace)))


def _label_parts(label):
    """(carries, layer indices, (piece, pieces) or None) of a collective's label (see the module docstring)."""
    if not label:
        return None, (), None
    carries, layers, *piece = label
    return carries, layers, piece[0] if piece else None


# ---------------------------------------------------------------- analysis of a trace

def _union(intervals):
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def _subtract(intervals, holes):
    """`intervals` minus `holes`, both merged (sorted, disjoint)."""
    out, k = [], 0
    for start, end in intervals:
        while k < len(holes) and holes[k][1] <= start:
            k += 1
        j = k
        while j < len(holes) and holes[j][0] < end:
            if holes[j][0] > start:
                out.append([start, holes[j][0]])
            start = max(start, holes[j][1])
            j += 1
        if start < end:
            out.append([start, end])
    return out


def _overlap(start, end, merged, starts):
    """Length of [start, end] inside the merged intervals (whose start times are `starts`)."""
    total = 0.0
    k = max(bisect.bisect_right(starts, start) - 1, 0)
    while k < len(merged) and merged[k][0] < end:
        total += max(0.0, min(end, merged[k][1]) - max(start, merged[k][0]))
        k += 1
    return total


def _spans(events, cats):
    return [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("ph") == "X" and e["cat"] in cats]


def _by_rank(trace):
    ranks = {}
    for e in trace["traceEvents"]:
        if e.get("ph") == "X":
            ranks.setdefault(e["pid"], []).append(e)
    return dict(sorted(ranks.items()))


def _compute_time(events):
    """Merged intervals of the rank's own compute: forward, backward and update minus every wait."""
    return _subtract(_union(_spans(events, COMPUTE)), _union(_spans(events, ("wait",))))


def summarize(trace):
    """Per rank and over all ranks: communication time, the part hidden behind compute, and compute
    time (microseconds); see the module docstring for the definition."""
    ranks = {}
    for rank, rank_events in _by_rank(trace).items():
        busy = _compute_time(rank_events)
        starts = [s for s, _ in busy]
        collectives = _spans(rank_events, ("collective",))
        ranks[rank] = {"communication_us": sum(e - s for s, e in collectives),
                       "hidden_us": sum(_overlap(s, e, busy, starts) for s, e in collectives),
                       "compute_us": sum(e - s for s, e in busy)}
    total = sum(r["communication_us"] for r in ranks.values())
    hidden = sum(r["hidden_us"] for r in ranks.values())
    return {"ranks": ranks, "communication_us": total, "hidden_us": hidden,
            "hidden_fraction": hidden / total if total > 0 else None}


def describe(summary):
    """One line: communication time and the fraction hidden behind compute, per rank."""
    if summary["hidden_fraction"] is None:
        return "no communication recorded"
    per_rank = ", ".join(f"rank {rank} {_percent(r['hidden_us'], r['communication_us'])}"
                         for rank, r in summary["ranks"].items())
    return (f"communication {summary['communication_us'] / 1e3:.1f} ms over all ranks, "
            f"{summary['hidden_fraction']:.1%} hidden behind compute ({per_rank})")


def _percent(part, whole):
    return f"{part / whole:.1%}" if whole > 0 else "-"


WAITS = ("data", "parameters", "gradients")


def _inside(merged, within):
    """Length of the merged intervals `merged` that lies inside the merged intervals `within`."""
    starts = [s for s, _ in within]
    return sum(_overlap(s, e, within, starts) for s, e in merged)


def iteration_breakdown(trace):
    """Per rank, where an iteration's time goes (ms per iteration, inside the iteration slices):
    compute, each kind of wait, and the rest, the training thread outside layers and waits (the
    solver's and schedule's own work, and whatever kept the thread from running)."""
    rows = []
    for rank, rank_events in _by_rank(trace).items():
        count = sum(1 for e in rank_events if e["cat"] == "iteration")
        if not count:
            continue
        iterations = _union(_spans(rank_events, ("iteration",)))
        total = sum(e - s for s, e in iterations)
        compute = _inside(_compute_time(rank_events), iterations)
        waits = {what: _inside(_union([(e["ts"], e["ts"] + e["dur"]) for e in rank_events
                                       if e["cat"] == "wait" and e["args"]["waits_for"] == what]), iterations)
                 for what in WAITS}
        waited = _inside(_union(_spans(rank_events, ("wait",))), iterations)
        rows.append({"rank": rank, "iterations": count, "iteration_ms": total / count / 1e3,
                     "compute_ms": compute / count / 1e3,
                     "wait_ms": {what: t / count / 1e3 for what, t in waits.items()},
                     "other_ms": (total - compute - waited) / count / 1e3})
    return rows


def gradient_overlap(trace):
    """For each rank and each gradient collective (same op, same layers): how many ran, their mean
    time in flight and hidden (microseconds), and the mean overlap with each layer's backward."""
    rows = []
    for rank, rank_events in _by_rank(trace).items():
        busy = _compute_time(rank_events)
        starts = [s for s, _ in busy]
        backward = {}  # (layer index, name) -> its backward intervals, listed in backward order
        for e in rank_events:
            if e["cat"] == "backward":
                backward.setdefault((e["args"]["layer"], e["name"]), []).append((e["ts"], e["ts"] + e["dur"]))
        backward = {name: _union(spans) for (_, name), spans in sorted(backward.items(), reverse=True)}
        groups = {}
        for e in rank_events:
            if e["cat"] != "collective" or e.get("args", {}).get("carries") != "gradients":
                continue
            start, end = e["ts"], e["ts"] + e["dur"]
            key = (e["name"], e["args"]["bytes"])
            group = groups.setdefault(key, {"count": 0, "flight": 0.0, "hidden": 0.0, "backward": {}})
            group["count"] += 1
            group["flight"] += end - start
            group["hidden"] += _overlap(start, end, busy, starts)
            for name, spans in backward.items():
                part = _overlap(start, end, spans, [s for s, _ in spans])
                if part > 0:
                    group["backward"][name] = group["backward"].get(name, 0.0) + part
        for (name, nbytes), g in groups.items():
            n = g["count"]
            rows.append({"rank": rank, "collective": name, "bytes": nbytes, "count": n,
                         "flight_us": g["flight"] / n, "hidden_us": g["hidden"] / n,
                         "backward_us": {layer: t / n for layer, t in g["backward"].items()}})
    return rows


def report(trace):
    """The summary line, where each rank's iterations spend their time, and per gradient collective
    the backward it overlapped: printable lines."""
    lines = [describe(summarize(trace)), "",
             "# rank  iterations  iteration ms  compute ms" + "".join(f"  wait {what} ms" for what in WAITS)
             + "  other ms"]
    for row in iteration_breakdown(trace):
        lines.append(f"{row['rank']:>6}{row['iterations']:>12}{row['iteration_ms']:>14.3f}{row['compute_ms']:>12.3f}"
                     + "".join(f"{row['wait_ms'][what]:>{len(what) + 10}.3f}" for what in WAITS)
                     + f"{row['other_ms']:>10.3f}")
    lines += ["",
              "# rank  calls  in flight ms  hidden      bytes  gradient collective: backward it overlapped (ms per call)"]
    for row in gradient_overlap(trace):
        overlapped = ", ".join(f"{layer} {t / 1e3:.3f}" for layer, t in row["backward_us"].items()) or "-"
        lines.append(f"{row['rank']:>6}{row['count']:>7}{row['flight_us'] / 1e3:>14.3f}"
                     f"{_percent(row['hidden_us'], row['flight_us']):>8}{row['bytes']:>11}  {row['collective']}: {overlapped}")
    return lines


def save(trace, path):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f, separators=(",", ":"))


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        sys.stderr.write("usage: python -m scaffe.timeline FILE.json   (a trace from scaffe train --timeline)\n")
        return 2
    for line in report(load(argv[0])):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
