"""One view of any buffer argument: numpy arrays, buffer-protocol objects and mpi4py buffer specs.

`parse(arg)` turns what a user may pass to an mpi4py collective into a `Buffer`: a flat numpy view
of exactly the elements MPI would touch, plus what is needed to fall back to the wrapped
communicator when we cannot handle it (derived datatypes, unknown type codes). Device buffers
(collectives.devices.memory) become a flat device view instead, which the caller stages through host memory.

A device buffer's `__cuda_array_interface__` may name the stream its producer's work was queued on. numba
would synchronise that stream on the host when it makes the view (`as_cuda_array`'s default); the view is
made without that wait instead, and the named stream becomes the caller's stream of the call (`named_stream`),
which the call is then ordered after on the device.
"""
import numpy
from mpi4py import MPI

from collectives.devices import memory
from collectives.errors import CollectiveError


class Buffer:
    """A flat, contiguous numpy view of a message (`array`), or `array is None` when only MPI can handle it.

    For a device buffer, `device` is its flat device view and `array` is None until a host stand-in
    is assigned; `stream` is the stream its `__cuda_array_interface__` names (a CUDA stream handle), else None.
    """

    __slots__ = ("array", "spec", "device", "read_only", "stream")

    def __init__(self, array, spec, device_view=None, read_only=False, stream=None):
        self.array = array
        self.spec = spec  # the argument exactly as the user gave it, for the native fallback
        self.device = device_view
        self.read_only = read_only
        self.stream = stream

    @property
    def nbytes(self):
        return self.array.nbytes


def _dtype_of(datatype):
    """numpy dtype for a predefined MPI datatype (or mpi4py's type code for one, "d"), or None for
    derived or unknown ones and those without a fixed-size numpy twin."""
    try:
        if isinstance(datatype, str):
            datatype = MPI.Datatype.fromcode(datatype)
        dtype = numpy.dtype(datatype.tocode())
    except (ValueError, TypeError, KeyError, MPI.Exception):
        return None
    return dtype if dtype.itemsize else None


def _is_datatype(item):
    return isinstance(item, (MPI.Datatype, str))


def _datatype_name(datatype):
    return datatype if isinstance(datatype, str) else datatype.Get_name()


def _host_array(obj, what, typed):
    """A numpy view (never a copy) of a host buffer's memory, or None when only MPI can read it: a DLPack
    exporter without a datatype in the spec (mpi4py asks the exporter for its element type)."""
    if isinstance(obj, numpy.ndarray):
        return obj
    if hasattr(obj, "__cuda_array_interface__"):
        return memory.host_view(obj, what)
    try:
        return numpy.asarray(memoryview(obj))
    except TypeError:
        pass
    if hasattr(obj, "__dlpack__"):
        return numpy.frombuffer(MPI.buffer(obj), numpy.uint8) if typed else None
    raise CollectiveError(f"{what}: {type(obj).__name__} exports neither the buffer protocol, DLPack nor "
                          "__cuda_array_interface__")


def _flat_view(arr, what):
    """`arr` as 1-D without copying; non-contiguous data is an error."""
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
    flat = memory.flat_device_view(obj, what)
    if datatype is not None and _dtype_of(datatype) != numpy.dtype(flat.dtype):
        raise CollectiveError(f"{what}: a device buffer of {numpy.dtype(flat.dtype)} cannot be read as "
                              f"{_datatype_name(datatype)}; pass a device array of the matching dtype")
    start, stop = _element_range(flat.size, count, displ, what)
    interface = getattr(obj, "__cuda_array_interface__", None)
    stream = None if interface is None else interface.get("stream")
    return Buffer(None, arg, flat[start:stop], memory.is_read_only(obj), stream)


def named_stream(send, recv):
    """The stream the exporters of a call's device buffers (`Buffer`s, or None) name, or None where none
    names one: the caller's stream, when the call was not given one. Two different streams are an error:
    the call would be ordered after only one of them."""
    streams = {buf.stream for buf in (send, recv) if buf is not None and buf.stream is not None}
    if len(streams) > 1:
        raise CollectiveError(f"sendbuf and recvbuf name different CUDA streams ({', '.join(map(hex, sorted(streams)))}) "
                              "in their __cuda_array_interface__; pass stream= to say which one the call follows")
    return streams.pop() if streams else None


def _split_spec(arg, what):
    """(buffer, count, displacement, datatype) of a list/tuple spec, read as mpi4py reads it:
    [buf, type], [buf, count], [buf, (count, displ)], [buf, count, type], [buf, (count, displ), type],
    [buf, count, displ, type]; a type is an MPI.Datatype or a type code string."""
    count = displ = datatype = None
    if len(arg) == 2:
        obj, second = arg
        if _is_datatype(second):
            datatype = second
        elif isinstance(second, (list, tuple)):
            count, displ = second
        else:
            count = second
    elif len(arg) == 3:
        obj, count, datatype = arg
        if isinstance(count, (list, tuple)):
            count, displ = count
    elif len(arg) == 4:
        obj, count, displ, datatype = arg
    else:
        raise CollectiveError(f"{what}: a buffer spec has 2 to 4 items, got {len(arg)}")
    return obj, count, displ, datatype


def parse(arg, what="buffer"):
    """Buffer for an mpi4py buffer argument: a buffer, or a list/tuple spec (see `_split_spec`)."""
    if isinstance(arg, numpy.ndarray):
        return Buffer(_flat_view(arg, what), arg)
    if isinstance(arg, (list, tuple)):
        return _parse_spec(arg, what)
    if arg is None:
        return None
    if arg is MPI.BOTTOM:
        return Buffer(None, arg)  # needs a datatype: the wrapped MPI says so
    if memory.is_device_buffer(arg):
        return _device_buffer(arg, arg, None, None, None, what)
    host = _host_array(arg, what, typed=False)
    return Buffer(None, arg) if host is None else Buffer(_flat_view(host, what), arg)


def _parse_spec(arg, what):
    """Buffer for a list/tuple spec; Buffer(None, arg) where only the wrapped MPI can read it."""
    obj, count, displ, datatype = _split_spec(arg, what)
    if obj is None or obj is MPI.BOTTOM:
        return Buffer(None, arg)  # absolute addresses in the datatype: the wrapped MPI handles them
    if memory.is_device_buffer(obj):
        return _device_buffer(arg, obj, datatype, count, displ, what)
    host = _host_array(obj, what, typed=datatype is not None)
    if host is None:
        return Buffer(None, arg)
    flat = _flat_view(host, what)
    if datatype is not None:
        flat = _typed_view(flat, datatype, what)
        if flat is None:
            return Buffer(None, arg)  # derived datatype: the wrapped MPI handles it
    start, stop = _element_range(flat.shape[0], count, displ, what)
    return Buffer(flat[start:stop], arg)


def _typed_view(flat, datatype, what):
    """`flat`'s bytes viewed as `datatype`'s elements; None for a derived datatype."""
    dtype = _dtype_of(datatype)
    if dtype is None:
        return None
    raw = flat.view(numpy.uint8)
    if raw.nbytes % dtype.itemsize:
        raise CollectiveError(
            f"{what}: {raw.nbytes} bytes is not a whole number of {_datatype_name(datatype)} elements")
    return raw.view(dtype)


def writable(buf, what):
    if buf.read_only or (buf.array is not None and not buf.array.flags.writeable):
        raise CollectiveError(f"{what} is read-only; the result must be written into it")
