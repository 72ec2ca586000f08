"""One view of any buffer argument: numpy arrays, buffer-protocol objects and mpi4py buffer specs.

`parse(arg)` turns what a user may pass to an mpi4py collective into a `Buffer`: a flat numpy view
of exactly the elements MPI would touch, plus what is needed to fall back to the wrapped
communicator when we cannot handle it (derived datatypes, unknown type codes). Device buffers
(collectives.device) become a flat device view instead, which the caller stages through host memory.
"""
import numpy
from mpi4py import MPI

from collectives import device
from collectives.errors import CollectiveError


class Buffer:
    """A flat, contiguous numpy view of a message (`array`), or `array is None` when only MPI can handle it.

    For a device buffer, `device` is its flat device view and `array` is None until a host stand-in
    is assigned.
    """

    __slots__ = ("array", "spec", "device", "read_only")

    def __init__(self, array, spec, device_view=None, read_only=False):
        self.array = array
        self.spec = spec  # the argument exactly as the user gave it, for the native fallback
        self.device = device_view
        self.read_only = read_only

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


def _element_range(length, count, displ, what):
    """[start, stop) of the elements a spec's (count, displacement) selects from `length` of them."""
    start = int(displ or 0)
    stop = length if count is None else start + int(count)
    if start < 0 or stop > length or (count is not None and int(count) < 0):
        raise CollectiveError(f"{what}: count {count} at displacement {start} exceeds the buffer's {length} elements")
    return start, stop


def _device_buffer(arg, obj, datatype, count, displ, what):
    flat = device.flat_device_view(obj, what)
    if datatype is not None and _dtype_of(datatype) != numpy.dtype(flat.dtype):
        raise CollectiveError(f"{what}: a device buffer of {numpy.dtype(flat.dtype)} cannot be read as "
                              f"{datatype.Get_name()}; pass a device array of the matching dtype")
    start, stop = _element_range(flat.size, count, displ, what)
    return Buffer(None, arg, flat[start:stop], device.is_read_only(obj))


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
        if device.looks_like_device(obj):
            return _device_buffer(arg, obj, datatype, count, displ, what)
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
        start, stop = _element_range(flat.shape[0], count, displ, what)
        return Buffer(flat[start:stop], arg)
    if arg is None:
        return None
    if device.looks_like_device(arg):
        return _device_buffer(arg, arg, None, None, None, what)
    return Buffer(_flat_view(arg, what), arg)


def writable(buf, what):
    if buf.read_only or (buf.array is not None and not buf.array.flags.writeable):
        raise CollectiveError(f"{what} is read-only; the result must be written into it")
