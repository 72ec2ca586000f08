"""Test-wide set-up: `gpu`-marked tests run only where a CUDA device is usable, and skip cleanly elsewhere.

Without a device, numba.cuda kernels run in numba's CUDA simulator, so their tests still check the kernel
source. numba reads the switch when it is first imported, so it is set here, before any test module
imports it; child processes (the mpiexec workers) inherit it.

The `cupy_stand_in` fixture puts the numpy-backed cupy of tests/stand_ins/cupy in place for one test.
"""
import compileall
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


def _has_cuda_device():
    from kernels.backend import cupy_or_none
    return cupy_or_none() is not None


# Training tests compare weights between runs and rank counts: the table's picks, not the measured ones
# (collectives.plans.Trial), which tests/collectives/test_plans.py checks.
os.environ.setdefault("SCAFFE_CHOICE", "table")

if "NUMBA_ENABLE_CUDASIM" not in os.environ and not _has_cuda_device():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"


_ahead = []  # the process compiling the CPU kernels ahead, while the suite runs
_started = []  # when the session started (time.time())


def pytest_sessionstart(session):
    """The repository's Python files are byte-compiled once: the suite starts hundreds of Python processes,
    and where PYTHONDONTWRITEBYTECODE is set (or a fresh clone) each would compile every module it imports
    again (a tenth of a second each). On a host that has not compiled the CPU kernels yet (a fresh clone's
    CI), a process at the lowest priority compiles them on whatever core the tests leave idle
    (kernels.native's `python -m`); a test that needs one before it is there compiles it itself."""
    _started.append(time.time())
    repository = Path(__file__).resolve().parents[1]
    for folder in repository.iterdir():
        if folder.is_dir() and not folder.name.startswith("."):
            compileall.compile_dir(folder, quiet=2)
    _ahead.append(subprocess.Popen([sys.executable, "-m", "kernels.native"], stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL, preexec_fn=lambda: os.nice(19)))


def pytest_sessionfinish(session, exitstatus):
    for process in _ahead:
        process.kill()
        process.wait()
    _remove_mpi_segments_left(_started[0])


def _remove_mpi_segments_left(since):
    """The MPI library's node segments in /dev/shm made during the session that no process maps any more:
    what the jobs the tests killed on purpose left (a rank's own abort removes them: collectives.errors)."""
    from collectives.errors import MPI_SEGMENTS, shm_files_mapped
    left = [path for path in Path("/dev/shm").glob("*") if str(path).startswith(MPI_SEGMENTS) and
            _mtime(path) >= since]
    if not left:
        return
    mapped = set().union(*(shm_files_mapped(maps) for maps in Path("/proc").glob("[0-9]*/maps")))
    for path in left:
        if str(path) not in mapped:
            path.unlink(missing_ok=True)


def _mtime(path):
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and not _has_cuda_device():
        skip = pytest.mark.skip(reason="needs a CUDA device (cupy with a GPU); none here")
        for item in gpu_items:
            item.add_marker(skip)


STAND_INS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stand_ins")


def _forget_cupy():
    """Drops every imported cupy module and the modules that imported one at their top (the GPU kernel
    twins), so the next `import cupy` finds whatever sys.path now says."""
    for name in [n for n in sys.modules if n == "cupy" or n.startswith("cupy.")]:
        del sys.modules[name]
    import kernels
    import kernels.cuda_sources
    kernels.cuda_sources._raw_kernels.clear()  # RawKernels of the cupy module being forgotten
    for name in ("_im2col_gpu", "_pooling_gpu"):
        sys.modules.pop(f"kernels.{name}", None)
        kernels.__dict__.pop(name, None)  # `from kernels import _im2col_gpu` reads the attribute first


@pytest.fixture
def cupy_stand_in(monkeypatch):
    """The numpy-backed cupy of tests/stand_ins as `cupy`, for this test and (through PYTHONPATH) the
    processes it starts; kernels.backend sees its one device. Everything is put back afterwards."""
    import kernels.backend
    monkeypatch.syspath_prepend(STAND_INS)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (STAND_INS, os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setattr(kernels.backend, "_cupy", None)
    monkeypatch.setattr(kernels.backend, "_cupy_checked", False)
    _forget_cupy()
    import cupy
    cupy._stand_in.reset()
    yield cupy
    monkeypatch.undo()
    _forget_cupy()


@pytest.fixture
def nvmath_stand_in(cupy_stand_in, monkeypatch):
    """cuBLAS bindings of nvmath-python (tests/stand_ins/nvmath_stand_in) on the cupy stand-in, so that GEMMs
    can be captured (kernels.blas); gone afterwards."""
    import kernels.blas

    def forget():
        for name in [n for n in sys.modules if n == "nvmath" or n.startswith("nvmath.")]:
            del sys.modules[name]
        kernels.blas._bindings.cache_clear()
        kernels.blas._handles.clear()
    monkeypatch.syspath_prepend(os.path.join(STAND_INS, "nvmath_stand_in"))
    forget()
    from nvmath.bindings import cublas
    yield cublas
    monkeypatch.undo()
    forget()
