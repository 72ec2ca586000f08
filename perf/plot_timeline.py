"""Draws a training timeline (`scaffe train --timeline FILE.json`) as a picture: one row per rank and
track (compute, collectives, data), time on x, forward / backward / update / waits / collectives in
their own colours.

    python -m perf.plot_timeline FILE.json out.png [--start MS] [--end MS]

Needs matplotlib (`pip install -e '.[plot]'`).
"""
import argparse
import sys

from scaffe import timeline

COLOURS = {"forward": "#4c72b0", "backward": "#dd8452", "update": "#55a868", "wait": "#c44e52",
           "collective": "#8172b3", "data": "#937860"}
ROWS = ("compute", "collectives", "data")


def _row(event):
    if event["tid"] == timeline.DATA:
        return "data"
    if timeline.COLLECTIVES <= event["tid"] < timeline.DATA:
        return "collectives"
    return "compute" if event["tid"] == timeline.COMPUTE_TRACK else None


def _colour(event, row):
    return COLOURS["data"] if row == "data" else COLOURS[event["cat"]]


def plot(trace, out, start_ms=None, end_ms=None):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise SystemExit("perf.plot_timeline needs matplotlib: pip install -e '.[plot]' (or pip install matplotlib)")
    bars = {}  # (rank, row) -> [(start ms, length ms)], [colours]
    for event in trace["traceEvents"]:
        if event.get("ph") != "X":
            continue
        row = _row(event)
        if row is None:
            continue
        start, length = event["ts"] / 1e3, event["dur"] / 1e3
        if (start_ms is not None and start + length < start_ms) or (end_ms is not None and start > end_ms):
            continue
        spans, colours = bars.setdefault((event["pid"], row), ([], []))
        spans.append((start, length))
        colours.append(_colour(event, row))
    if not bars:
        raise SystemExit("perf.plot_timeline: the trace has no forward, backward, update, wait or collective "
                         "events in that range")
    ranks = sorted({rank for rank, _ in bars})
    rows = [(rank, row) for rank in ranks for row in ROWS]
    fig, ax = plt.subplots(figsize=(14, 0.45 * len(rows) + 1.5))
    for y, key in enumerate(reversed(rows)):
        if key in bars:
            spans, colours = bars[key]
            ax.broken_barh(spans, (y - 0.4, 0.8), facecolors=colours, linewidth=0)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"rank {rank} {row}" for rank, row in reversed(rows)])
    ax.set_xlabel("time (ms)")
    if start_ms is not None or end_ms is not None:
        ax.set_xlim(start_ms, end_ms)
    summary = timeline.summarize(trace)
    ax.set_title(f"scaffe timeline: {timeline.describe(summary)}", fontsize=9)
    fig.legend(handles=[Patch(color=c, label=name) for name, c in COLOURS.items()], loc="lower center",
               fontsize=8, ncol=len(COLOURS), frameon=False)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m perf.plot_timeline", description=__doc__.splitlines()[0])
    p.add_argument("trace", help="a trace written by scaffe train --timeline")
    p.add_argument("out", help="the picture to write (.png, .svg, .pdf)")
    p.add_argument("--start", type=float, default=None, help="first millisecond to show")
    p.add_argument("--end", type=float, default=None, help="last millisecond to show")
    args = p.parse_args(argv)
    plot(timeline.load(args.trace), args.out, args.start, args.end)
    return 0


if __name__ == "__main__":
    sys.exit(main())
