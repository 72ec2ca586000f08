"""parse_log: a training log (Caffe's or scaffe's) -> Caffe's `<log>.train` and `<log>.test` CSV files,
as Caffe's tools/extra/parse_log.py writes them, and optionally a PNG of the training curves.

A row holds NumIters, Seconds (since the "Solving" line), LearningRate and every "Train net output"
(or "Test net output") of one iteration, numbers written as Python writes floats (NumIters 20.0).
As in Caffe's script, LearningRate is the last "lr = " printed before the row's first output (the
previous iteration's, since Caffe prints the rate after the outputs); the first row takes the second's.
Unlike it, both glog date prefixes are read: `I1128 22:00:53.123456` (the year is the log file's,
moved on when the month goes back) and glog 0.7's `I20261128 22:00:53.123456`; outputs of nan or
inf are kept; and a log's only row, or a last row holding every output, is kept.

CLI (Caffe's arguments): parse_log [--verbose] [--delimiter=,] [--plot=PNG] LOGFILE OUTPUT_DIR
"""
import argparse
import csv
import datetime
import math
import os
import re
import sys

__all__ = ["main", "parse_log", "save_csv_files"]

_ITERATION = re.compile(r"Iteration (\d+)")
_LEARNING_RATE = re.compile(r"lr = ([-+]?[0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)")
_NUMBER = r"([-+]?(?:[\d.]+(?:[eE][-+]?\d+)?|nan|inf))"
_OUTPUTS = {kind: re.compile(rf"{kind} net output #\d+: (\S+) = {_NUMBER}") for kind in ("Train", "Test")}
# glog's prefix: severity, [year,] month, day, time with microseconds.
_GLOG_TIME = re.compile(r"[IWEF](\d{4})?(\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) ")


class _Clock:
    """Times of glog lines; a prefix without a year takes `year`, advanced when the month goes back."""

    def __init__(self, year):
        self.year = year
        self.last_month = 0

    def time_of(self, line):
        """The datetime of a glog line, or None for a line without glog's prefix."""
        match = _GLOG_TIME.match(line)
        if match is None:
            return None
        year, month, day, hour, minute, second, micro = match.groups()
        month = int(month)
        if year is None:
            if month < self.last_month:
                self.year += 1
            year = self.year
        self.last_month = month
        return datetime.datetime(int(year), month, int(day), int(hour), int(minute), int(second), int(micro))


class _Rows:
    """The rows of one kind of output (train or test), grouped by iteration as Caffe's script does."""

    def __init__(self):
        self.rows = []
        self.open_row = None

    def add(self, name, value, iteration, seconds, learning_rate):
        if self.open_row is None or self.open_row["NumIters"] != iteration:
            if self.open_row is not None:
                self.rows.append(self.open_row)
            self.open_row = {"NumIters": iteration, "Seconds": seconds, "LearningRate": learning_rate}
        self.open_row[name] = value
        if self.rows and len(self.open_row) == len(self.rows[0]):
            self.rows.append(self.open_row)
            self.open_row = None

    def finish(self):
        """All rows, the last one too when it is the only one or holds every output."""
        if self.open_row is not None and (not self.rows or len(self.open_row) == len(self.rows[0])):
            self.rows.append(self.open_row)
        if len(self.rows) > 1 and math.isnan(self.rows[0]["LearningRate"]):
            self.rows[0]["LearningRate"] = self.rows[1]["LearningRate"]
        return self.rows


def parse_log(path):
    """(train rows, test rows) of a training log: lists of {column: float} in column order."""
    clock = _Clock(datetime.datetime.fromtimestamp(os.path.getctime(path)).year)
    tables = {kind: _Rows() for kind in _OUTPUTS}
    iteration, learning_rate, start = None, math.nan, None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            time = clock.time_of(line)
            if start is None:
                start = time if time is not None and "Solving" in line else None
                continue
            found = _ITERATION.search(line)
            if found:
                iteration = float(found.group(1))
            if iteration is None or time is None:
                continue
            found = _LEARNING_RATE.search(line)
            if found:
                learning_rate = float(found.group(1))
            for kind, pattern in _OUTPUTS.items():
                found = pattern.search(line)
                if found:
                    tables[kind].add(found.group(1), float(found.group(2)), iteration,
                                     (time - start).total_seconds(), learning_rate)
    if start is None:
        raise ValueError(f"{path}: no 'Solving' line: not the log of a training run")
    return tables["Train"].finish(), tables["Test"].finish()


def save_csv_files(log_path, output_dir, train_rows, test_rows, delimiter=",", verbose=False):
    """Writes OUTPUT_DIR/<log name>.train and .test (a kind without rows gets no file); returns the paths written."""
    written = []
    for suffix, rows in (("train", train_rows), ("test", test_rows)):
        path = os.path.join(output_dir, f"{os.path.basename(log_path)}.{suffix}")
        if not rows:
            if verbose:
                print(f"Not writing {path}; no lines to write")
            continue
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]), delimiter=delimiter, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
        if verbose:
            print(f"Wrote {path}")
        written.append(path)
    return written


def _parser():
    p = argparse.ArgumentParser(prog="parse_log", description="Parse a Caffe training log into two CSV files "
                                                              "of training and test outputs.")
    p.add_argument("logfile_path", help="the training log")
    p.add_argument("output_dir", help="where to write <log>.train and <log>.test")
    p.add_argument("--verbose", "-verbose", action="store_true", help="name the files written")
    p.add_argument("--delimiter", "-delimiter", default=",", help="column delimiter (default ',')")
    p.add_argument("--plot", "-plot", default="", help="also draw the training curves into this PNG")
    return p


def main(argv=None):
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        train_rows, test_rows = parse_log(args.logfile_path)
        save_csv_files(args.logfile_path, args.output_dir, train_rows, test_rows, args.delimiter, args.verbose)
        if args.plot:
            from scaffe.tools.plot_log import plot_training_curves
            plot_training_curves(train_rows, test_rows, args.plot)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"parse_log: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    from scaffe.cli import tool_script  # glog's settings and lines, as for every command
    sys.exit(tool_script("parse_log"))
