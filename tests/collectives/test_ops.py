"""collectives.ops: the one place that decides which reductions we compute, and on which node loop."""
import numpy
from mpi4py import MPI

from collectives import ops


def test_predefined_ops_have_names_and_others_none():
    assert ops.op_name(MPI.SUM) == "sum" and ops.op_name(MPI.BXOR) == "bxor"
    assert ops.op_name(MPI.MAXLOC) is None and ops.op_name(MPI.REPLACE) is None


def test_we_compute_numbers_in_native_byte_order_only():
    assert ops.computes(numpy.int8) and ops.computes(numpy.float16) and ops.computes(numpy.complex128)
    assert not ops.computes(numpy.bool_) and not ops.computes(numpy.dtype([("a", "f8")]))
    swapped = numpy.dtype(numpy.float64).newbyteorder()
    assert not ops.computes(swapped)


def test_mpi_rules_for_ops_on_dtypes():
    assert ops.supports("prod", numpy.complex64) and not ops.supports("min", numpy.complex64)
    assert ops.supports("band", numpy.uint16) and not ops.supports("band", numpy.float32)
    assert not ops.supports("sum", numpy.bool_) and not ops.supports("minloc", numpy.int32)


def test_float16_never_goes_to_native_mpi():
    assert not ops.native_reduces(numpy.float16) and ops.native_reduces(numpy.float32)
