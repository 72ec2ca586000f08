"""mpi4py's own collective tests (test_cco_buf, test_cco_nb_buf) pass on `collectives.Comm`, as they do on the
communicator it wraps.

The tests come from mpi4py's source distribution on PyPI, for the installed version, downloaded once into
a cache directory (never copied into this repository); without a download the tests are skipped.
workers/mpi4py_suite.py runs them on every rank. 2 ranks run the default selection table (mpi4py's
small messages go to MPI after our validation); 3 and 4 ranks force our hierarchical algorithm, on nodes
of [2, 1] and [2, 2].
"""
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import mpi4py
import pytest

from mpi_harness import run_ok

MODULES = ("test_cco_buf", "test_cco_nb_buf")


def _cache_dir():
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "scaffe" / f"mpi4py-{mpi4py.__version__}-test"


def _download_tests(target):
    """mpi4py's test/ directory from its sdist into `target` (made whole or not at all)."""
    version = mpi4py.__version__
    with tempfile.TemporaryDirectory() as scratch:
        download = subprocess.run(
            # --no-binary for mpi4py alone: ":all:" would also build its build backend's Cython from
            # source (minutes), where wheels of those serve to read the sdist's metadata.
            [sys.executable, "-m", "pip", "download", "--no-binary", "mpi4py", "--no-deps", "-q",
             f"mpi4py=={version}", "-d", scratch], capture_output=True, text=True, timeout=300)
        sdists = list(Path(scratch).glob("mpi4py-*.tar.gz"))
        if download.returncode != 0 or not sdists:
            last = (download.stderr.strip().splitlines() or ["no sdist"])[-1]
            pytest.skip(f"could not download mpi4py {version}'s source distribution: {last}")
        partial = Path(scratch) / "test"
        partial.mkdir()
        with tarfile.open(sdists[0]) as sdist:
            for member in sdist.getmembers():
                parts = Path(member.name).parts
                if member.isfile() and len(parts) == 3 and parts[1] == "test":  # mpi4py-X/test/<file>
                    (partial / parts[2]).write_bytes(sdist.extractfile(member).read())
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(partial, target)
        except OSError:
            if not target.is_dir():  # else another process put it there first
                raise


@pytest.fixture(scope="module")
def mpi4py_test_dir():
    target = _cache_dir()
    if not all((target / f"{name}.py").exists() for name in MODULES):
        _download_tests(target)
    return target


# (ranks, SCAFFE_REDUCE_ALGO); 2 ranks per simulated node.
LAUNCHES = [(2, None), (3, "hierarchical"), (4, "hierarchical")]


@pytest.mark.parametrize("case", LAUNCHES, ids=lambda c: f"n{c[0]}-rpn2-{c[1] or 'default'}")
def test_mpi4py_collective_suites(mpi4py_test_dir, case):
    ranks, algo = case
    run_ok(ranks, "mpi4py_suite.py", mpi4py_test_dir, *MODULES, timeout=240,
           env={"SCAFFE_RANKS_PER_NODE": 2, "SCAFFE_REDUCE_ALGO": algo})
