"""Which MPI reduction ops the collectives compute themselves, by name of the kernel that does it, and
which element types the wrapped MPI can reduce itself."""
import numpy
from mpi4py import MPI

# Native MPI has no portable half-precision type (Open MPI lacks one), so float16 never goes native.
_NEVER_NATIVE = {numpy.dtype(numpy.float16)}

# MPI.Op objects are unhashable; their Fortran handles are stable integers for predefined ops.
_OP_NAMES = {
    MPI.SUM.py2f(): "sum",
    MPI.PROD.py2f(): "prod",
    MPI.MIN.py2f(): "min",
    MPI.MAX.py2f(): "max",
    MPI.LAND.py2f(): "land",
    MPI.LOR.py2f(): "lor",
    MPI.LXOR.py2f(): "lxor",
    MPI.BAND.py2f(): "band",
    MPI.BOR.py2f(): "bor",
    MPI.BXOR.py2f(): "bxor",
}


def op_name(op):
    """Kernel name for a predefined op we compute ("sum", ...), or None (user-defined, MINLOC, REPLACE ...)."""
    return _OP_NAMES.get(op.py2f())


def native_reduces(dtype):
    """Whether the wrapped MPI can reduce elements of `dtype` (one of those we compute) itself."""
    return numpy.dtype(dtype) not in _NEVER_NATIVE
