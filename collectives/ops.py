"""Which reductions the collectives compute themselves, and where: the one table every layer asks.

A reduction is ours when its op is predefined (`op_name`) and its elements are numbers in native byte
order (`computes`); MPI's rules then say whether the op is defined for them at all (`supports`). The
compiled node loop runs those of `compiled`; the interpreted one the rest. The wrapped MPI is asked to
reduce only element types it can (`native_reduces`).
"""
import numpy
from mpi4py import MPI

# op name -> (the MPI op, the dtype kinds MPI defines it for: MPI 4.1, section 6.9.2).
_OPS = {
    "sum": (MPI.SUM, "iufc"),
    "prod": (MPI.PROD, "iufc"),
    "min": (MPI.MIN, "iuf"),
    "max": (MPI.MAX, "iuf"),
    "land": (MPI.LAND, "iu"),
    "lor": (MPI.LOR, "iu"),
    "lxor": (MPI.LXOR, "iu"),
    "band": (MPI.BAND, "iu"),
    "bor": (MPI.BOR, "iu"),
    "bxor": (MPI.BXOR, "iu"),
}
# MPI.Op objects are unhashable; their Fortran handles are stable integers for predefined ops.
_NAMES = {mpi_op.py2f(): name for name, (mpi_op, _) in _OPS.items()}
NAMES = tuple(_OPS)  # an op's index here is its code where a number must stand for it (a node's shared record)
# The ops the compiled node loop computes, in the order of its op codes (intranode/_steps.binop): those
# defined for every numeric dtype. Bitwise and logical ops stay on the interpreted loop.
COMPILED_OPS = ("sum", "prod", "min", "max")
# Bytes per element numba computes on, by kind: not float16, nor the long double types.
_NUMBA_ITEMSIZES = {"i": (1, 2, 4, 8), "u": (1, 2, 4, 8), "f": (4, 8), "c": (8, 16)}
COMPILED_DTYPES = tuple(numpy.dtype(f"{kind}{size}") for kind, sizes in _NUMBA_ITEMSIZES.items() for size in sizes)
# Native MPI has no portable half-precision type (Open MPI lacks one), so float16 never goes native.
_NEVER_NATIVE = {numpy.dtype(numpy.float16)}


def op_name(op):
    """Kernel name for a predefined op we compute ("sum", ...), or None (user-defined, MINLOC, REPLACE ...)."""
    return _NAMES.get(op.py2f())


def computes(dtype):
    """Whether we reduce elements of `dtype` ourselves: integers, floats and complex in native byte order
    (bool and structured dtypes go to the wrapped MPI)."""
    dtype = numpy.dtype(dtype)
    return dtype.kind in "iufc" and dtype.byteorder in "=|"


def supports(name, dtype):
    """Whether op `name` is defined for elements of `dtype` (MPI's rules: no MIN/MAX on complex, bit and
    logical ops on integers only)."""
    return name in _OPS and numpy.dtype(dtype).kind in _OPS[name][1]


def compiled(name, dtype):
    """Whether the compiled node loop computes op `name` on elements of `dtype`."""
    dtype = numpy.dtype(dtype)
    return (name in COMPILED_OPS and supports(name, dtype)
            and dtype.itemsize in _NUMBA_ITEMSIZES[dtype.kind])


def native_reduces(dtype):
    """Whether the wrapped MPI can reduce elements of `dtype` (one of those we compute) itself."""
    return numpy.dtype(dtype) not in _NEVER_NATIVE
