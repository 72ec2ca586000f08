"""Compute kernels with CPU (numpy) and GPU (cupy / numba.cuda) twins behind one signature."""
from kernels.backend import get_array_module, cupy_or_none

__all__ = ["get_array_module", "cupy_or_none"]
