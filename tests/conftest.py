"""Test-wide set-up: `gpu`-marked tests run only where a CUDA device is usable, and skip cleanly elsewhere.

Without a device, numba.cuda kernels run in numba's CUDA simulator, so their tests still check the kernel
source. numba reads the switch when it is first imported, so it is set here, before any test module
imports it; child processes (the mpiexec workers) inherit it.
"""
import os

import pytest


def _has_cuda_device():
    from kernels.backend import cupy_or_none
    return cupy_or_none() is not None


if "NUMBA_ENABLE_CUDASIM" not in os.environ and not _has_cuda_device():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if gpu_items and not _has_cuda_device():
        skip = pytest.mark.skip(reason="needs a CUDA device (cupy with a GPU); none here")
        for item in gpu_items:
            item.add_marker(skip)
