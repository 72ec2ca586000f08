"""Which MPI reduction ops the collectives compute themselves, by name of the kernel that does it."""
from mpi4py import MPI

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
