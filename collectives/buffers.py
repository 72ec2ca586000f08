"""One view of any buffer argument: numpy arrays, buffer-protocol objects and mpi4py buffer specs.

`parse(arg)` turns what a user may pass to an mpi4py collective into a `Buffer`: a flat numpy view
of exactly the elements MPI would touch, plus what is needed to fall back to the wrapped
communicator when we cannot handle it (derived datatypes, unknown type codes).
"""
import numpy
from mpi4py import MPI

from collectives.errors import CollectiveError


class Buffer:
    """A flat, contiguous numpy view of a message (`array`), or `array is None` when only MPI can handle it."""

    __slots__ = ("array", "spec")

    def __init__(self, array, spec):
        self.array = array
        self.spec = spec  # the argument exactly as the user gave it, for the native fallback

    @property
    def nbytes(self):
        return self.array.nbytes


def _dtype_of(datatype):
    """numpy dtype for a predefined MPI datatype, or None for derived/unknown ones."""
    try:
        return numpy.dtype(datatype.tocode())
    except (ValueError, TypeError, MPI.Exception):
        return None


def _flat_view(obj, what):
    """A 1-D numpy view of obj's memory without copying; non-contiguous data is an error."""
    if isinstance(obj, numpy.ndarray):
        arr = obj
    else:
        if hasattr(obj, "__cuda_array_interface__"):
            raise CollectiveError(
                f"{what}: device (GPU) buffers are not supported by this build's collectives yet; "
                "copy to host memory first")
        try:
            arr = numpy.asarray(memoryview(obj))
        except TypeError:
            arr = numpy.asarray(obj)
            if arr.dtype == object:
                raise CollectiveError(f"{what}: {type(obj).__name__} does not export the buffer protocol") from None
    if not (arr.flags.c_contiguous or arr.flags.f_contiguous):
        raise CollectiveError(
            f"{what}: buffer of shape {arr.shape} with strides {arr.strides} is not contiguous; "
            "pass numpy.ascontiguousarray(buf) (and copy the result back for a receive buffer)")
    return arr.reshape(-1, order="A")


def parse(arg, what="buffer"):
    """Buffer for an mpi4py buffer argument: obj, [obj, type], [obj, count, type], [obj, (count, displ), type]."""
    if isinstance(arg, numpy.ndarray):
        flat = _flat_view(arg, what)
        return Buffer(flat, arg)
    if isinstance(arg, (list, tuple)):
        if not 1 <= len(arg) <= 4:
            raise CollectiveError(f"{what}: a buffer spec has 1 to 4 items, got {len(arg)}")
        obj = arg[0]
        datatype = arg[-1] if len(arg) >= 2 and isinstance(arg[-1], MPI.Datatype) else None
        count = displ = None
        if len(arg) >= 3 or (len(arg) == 2 and datatype is None):
            cd = arg[1]
            if isinstance(cd, (list, tuple)):
                count, displ = cd
            else:
                count = cd
        flat = _flat_view(obj, what)
        if datatype is not None:
            dtype = _dtype_of(datatype)
            if dtype is None:
                return Buffer(None, arg)  # derived datatype: the wrapped MPI handles it
            raw = flat.view(numpy.uint8)
            if raw.nbytes % dtype.itemsize:
                raise CollectiveError(
                    f"{what}: {raw.nbytes} bytes is not a whole number of {datatype.Get_name()} elements")
            flat = raw.view(dtype)
        start = int(displ or 0)
        stop = flat.shape[0] if count is None else start + int(count)
        if start < 0 or stop > flat.shape[0] or (count is not None and int(count) < 0):
            raise CollectiveError(
                f"{what}: count {count} at displacement {start} exceeds the buffer's {flat.shape[0]} elements")
        return Buffer(flat[start:stop], arg)
    if arg is None:
        return None
    return Buffer(_flat_view(arg, what), arg)


def writable(buf, what):
    if not buf.array.flags.writeable:
        raise CollectiveError(f"{what} is read-only; the result must be written into it")
