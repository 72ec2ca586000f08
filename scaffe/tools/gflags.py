"""Caffe's gflags spellings for the data tools' argparse parsers, the one backend scaffe has, and the
tools' one way of reporting a failure.

argparse already takes `-backend=lmdb`, `--backend=lmdb`, `-backend lmdb` and `--backend lmdb` once
both `-backend` and `--backend` are declared; gflags booleans (`-gray`, `--gray=false`,
`--nogray`) need rewriting to plain switches first.
"""
import sys

from scaffe.gflags import gflags_bool, take_flags

__all__ = ["switches", "require_lmdb", "run_tool"]


def switches(argv, names, tool):
    """argv with each gflags boolean in `names` turned into `--name` (on) or dropped (off)."""
    try:
        rest, flags = take_flags(argv, (), names)
    except ValueError as e:
        raise SystemExit(f"{tool}: {e}") from None
    for name, value in flags.items():
        if gflags_bool(value) is None:
            raise SystemExit(f"{tool}: --{name} takes true or false, got {value!r}")
    return rest + [f"--{name}" for name, value in flags.items() if gflags_bool(value)]


def require_lmdb(backend):
    """Caffe's tools also write LevelDB; scaffe reads and writes LMDB only."""
    if backend.lower() != "lmdb":
        raise ValueError(f"backend {backend!r} is not supported: scaffe reads and writes LMDB only; give lmdb")


def run_tool(tool, backend, work):
    """Exit status of a data tool: 0 once work() has run; 1, with one line on stderr naming the tool, when
    the backend is not LMDB or work() fails on its input or files."""
    try:
        require_lmdb(backend)
        work()
    except (OSError, ValueError, RuntimeError) as e:
        print(f"{tool}: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    return 0
