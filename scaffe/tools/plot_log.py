"""The training curves of a parsed log (scaffe.tools.parse_log) in one PNG: every train and test output
against iterations on the left and against seconds on the right, the way Caffe's
tools/extra/plot_training_log.py charts them one pair at a time. Needs matplotlib (scaffe[plot]).
"""

__all__ = ["plot_training_curves"]

_FIXED_COLUMNS = ("NumIters", "Seconds", "LearningRate")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("drawing training curves needs matplotlib, which is not installed: "
                           "pip install matplotlib (or scaffe[plot])") from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as pyplot
    return pyplot


def plot_training_curves(train_rows, test_rows, png_path):
    """Draws the outputs of `train_rows` and `test_rows` (parse_log's rows) into `png_path`."""
    if not train_rows and not test_rows:
        raise ValueError(f"no training or test outputs to plot into {png_path}")
    pyplot = _pyplot()
    figure, axes = pyplot.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for kind, rows in (("train", train_rows), ("test", test_rows)):
        names = [name for name in (rows[0] if rows else ()) if name not in _FIXED_COLUMNS]
        for name in names:
            values = [row.get(name, float("nan")) for row in rows]
            for axis, x_column in zip(axes, ("NumIters", "Seconds")):
                axis.plot([row[x_column] for row in rows], values, marker="." if kind == "test" else None,
                          linestyle="--" if kind == "test" else "-", label=f"{kind} {name}")
    for axis, label in zip(axes, ("iterations", "seconds")):
        axis.set_xlabel(label)
        axis.grid(True, alpha=0.3)
    axes[0].set_ylabel("output")
    axes[1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize="small")
    figure.tight_layout()
    figure.savefig(png_path, dpi=100)
    pyplot.close(figure)
