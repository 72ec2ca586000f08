"""Reading and writing Caffe's files: prototxt nets and solvers, .caffemodel, .solverstate, mean
files (BlobProto) and HDF5 snapshots, plus conversions between BlobProto and numpy arrays.

It is also pycaffe's `caffe.io`: Datum and BlobProtoVector conversions with pycaffe's signatures
(end of this file), and the deploy-time image helpers of scaffe.preprocess (Transformer, load_image,
resize_image, oversample).

Every reader raises `CaffeFormatError` (a ValueError) with one line that names the file and says
what is wrong; every writer replaces its target atomically (temporary file in the same folder,
then `os.replace`), so a crash mid-write never leaves a truncated snapshot behind.
"""
import contextlib
import os
import tempfile

import numpy
from google.protobuf import message as _pb_message
from google.protobuf import text_format

from scaffe.log import get_logger
from scaffe.messages import CaffeFormatError, copy_message, parse_datum
from scaffe.preprocess import Transformer, load_image, oversample, resize_image
from scaffe.proto import caffe_pb2
from scaffe.upgrade import upgrade_net, upgrade_solver

__all__ = [
    "CaffeFormatError", "copy_message", "to_host",
    "atomic_write_bytes", "atomic_path",
    "read_text_proto", "parse_net_text", "read_net_prototxt", "parse_solver_text", "read_solver_prototxt",
    "write_prototxt", "read_binary_proto", "write_binary_proto",
    "read_net_binary", "write_net_binary", "read_blobproto", "write_blobproto", "read_blob_array", "read_mean_file",
    "read_solverstate", "write_solverstate",
    "blobproto_to_array", "array_to_blobproto", "blobproto_shape", "blobproto_matches_shape", "warn_non_finite",
    "model_layers", "net_weights", "set_layer_blobs", "read_weights", "write_hdf5_weights", "read_hdf5_weights",
    "write_hdf5_solverstate", "read_hdf5_solverstate", "is_hdf5_file", "check_hdf5_numbers", "hdf5_errors",
    # pycaffe's caffe.io
    "array_to_datum", "datum_to_array", "arraylist_to_blobprotovector_str", "blobprotovector_str_to_arraylist",
    "Transformer", "load_image", "resize_image", "oversample",
]


log = get_logger(__name__)


def to_host(array):
    """`array` as a numpy array: a device (cupy) array is copied to the host, a numpy one passes as is."""
    return array if isinstance(array, numpy.ndarray) else array.get()


# ---------------------------------------------------------------- atomic writes

@contextlib.contextmanager
def atomic_path(path):
    """Yields a temporary path next to `path`; on success it replaces `path`, on error it is removed.

    The temporary file lives in the same folder so `os.replace` is a rename on one file system,
    which POSIX makes atomic: readers see either the old file or the complete new one.
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=folder)
    os.close(fd)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            # mkstemp makes the file private (0600); give it the mode open() would have (0644 under umask 022).
            os.fchmod(f.fileno(), 0o666 & ~_umask())
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask():
    # The only portable way to read the umask is to set it; it is put back at once.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_bytes(path, data):
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


# ---------------------------------------------------------------- text formats

def _read_text(path):
    try:
        with open(path, "r", encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise CaffeFormatError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CaffeFormatError(f"{path}: cannot read: {e}") from None


def _one_line(err):
    return " ".join(str(err).split())


def _parse_text(text, message_class, source, what):
    msg = message_class()
    try:
        text_format.Parse(text, msg)
    except text_format.ParseError as e:
        raise CaffeFormatError(f"{source}: cannot parse as a {what}: {_one_line(e)}") from None
    return msg


def read_text_proto(path, message_class, what=None):
    """An instance of `message_class` parsed from the text protobuf file `path`, not upgraded."""
    path = os.fspath(path)
    return _parse_text(_read_text(path), message_class, path, what or message_class.DESCRIPTOR.name)


def parse_net_text(text, source="<string>"):
    """A NetParameter from prototxt text, upgraded to today's format as Caffe does on load (V0 and
    V1 `layers`, net inputs, data transformation fields, old BatchNorm params: see scaffe.upgrade)."""
    net = _parse_text(text, caffe_pb2.NetParameter, source, "Caffe net (NetParameter)")
    upgrade_net(net, source)
    return net


def read_net_prototxt(path):
    """The NetParameter in the prototxt file `path` (see `parse_net_text` for the upgrades applied)."""
    path = os.fspath(path)
    return parse_net_text(_read_text(path), source=path)


def parse_solver_text(text, source="<string>"):
    """A SolverParameter from prototxt text; the deprecated `solver_type` enum is turned into `type`
    and inline nets are upgraded (see scaffe.upgrade)."""
    solver = _parse_text(text, caffe_pb2.SolverParameter, source, "Caffe solver (SolverParameter)")
    upgrade_solver(solver, source)
    return solver


def read_solver_prototxt(path):
    path = os.fspath(path)
    return parse_solver_text(_read_text(path), source=path)


def write_prototxt(msg, path):
    atomic_write_bytes(path, text_format.MessageToString(msg).encode("utf-8"))


# ---------------------------------------------------------------- binary formats

def read_binary_proto(path, message_class, what=None):
    """An instance of `message_class` parsed from the binary protobuf file `path`."""
    path = os.fspath(path)
    what = what or message_class.DESCRIPTOR.name
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise CaffeFormatError(f"{path}: no such file") from None
    except OSError as e:
        raise CaffeFormatError(f"{path}: cannot read: {e}") from None
    msg = message_class()
    try:
        msg.ParseFromString(data)
    except _pb_message.DecodeError as e:
        raise CaffeFormatError(f"{path}: not a binary {what}: {_one_line(e)}") from None
    return msg


def write_binary_proto(msg, path):
    atomic_write_bytes(path, msg.SerializeToString())


def read_net_binary(path):
    """The NetParameter of a .caffemodel. Files in the old V0/V1 `layers` formats are upgraded as
    Caffe does on load (scaffe.upgrade); others are returned as stored, so they round-trip byte
    for byte (Caffe's other upgrades, e.g. of BatchNorm's param specs, do not touch weights)."""
    path = os.fspath(path)
    net = read_binary_proto(path, caffe_pb2.NetParameter, "Caffe model (NetParameter)")
    if len(net.layers):
        upgrade_net(net, path)
    return net


def write_net_binary(net, path):
    write_binary_proto(net, path)


def read_blobproto(path):
    return read_binary_proto(path, caffe_pb2.BlobProto, "BlobProto")


def write_blobproto(blob, path):
    write_binary_proto(blob, path)


@contextlib.contextmanager
def _naming(path):
    """Makes a ValueError raised inside (a blob whose values do not fill its shape) a CaffeFormatError
    that names the file `path`; a CaffeFormatError, which names it already, passes unchanged."""
    try:
        yield
    except CaffeFormatError:
        raise
    except ValueError as e:
        raise CaffeFormatError(f"{os.fspath(path)}: {_one_line(e)}") from None


def read_blob_array(path):
    """The values of the binary BlobProto file `path` as an array of its stored shape."""
    with _naming(path):
        return blobproto_to_array(read_blobproto(path))


def read_mean_file(path):
    """A Caffe mean file (binary BlobProto, usually 1 x C x H x W) as a float32 array of shape (C, H, W).

    A leading axis of 1 is dropped because the mean applies to every sample of a batch.
    """
    arr = read_blob_array(path)
    if arr.ndim == 4 and arr.shape[0] == 1:
        arr = arr[0]
    return arr


def read_solverstate(path):
    """A SolverState from a binary .solverstate or an HDF5 .solverstate.h5 file."""
    path = os.fspath(path)
    if is_hdf5_file(path):
        return read_hdf5_solverstate(path)
    state = read_binary_proto(path, caffe_pb2.SolverState, "solver state (SolverState)")
    # protobuf hands back a string field that is not UTF-8 as bytes rather than failing.
    if isinstance(state.learned_net, bytes):
        raise CaffeFormatError(f"{path}: learned_net {state.learned_net!r} is not UTF-8 text; the file is damaged")
    return state


def write_solverstate(state, path, hdf5=False):
    if hdf5:
        write_hdf5_solverstate(path, state.iter, state.learned_net, state.current_step,
                               [blobproto_to_array(b) for b in state.history])
    else:
        write_binary_proto(state, path)


# ---------------------------------------------------------------- BlobProto <-> numpy

def blobproto_shape(blob):
    """The blob's shape: `shape.dim` if given, else the legacy 4-d (num, channels, height, width).

    Like Caffe's Blob::FromProto, any legacy dimension field being present selects the 4-d form.
    """
    if any(blob.HasField(f) for f in ("num", "channels", "height", "width")):
        return (blob.num, blob.channels, blob.height, blob.width)
    return tuple(int(d) for d in blob.shape.dim)


def blobproto_matches_shape(blob, shape):
    """Whether the stored blob may be loaded into a blob of `shape` (Caffe's ShapeEquals).

    A legacy 4-d proto also matches a blob of at most 4 axes whose shape, padded with leading 1s
    to 4 axes, is equal: that is how old InnerProduct weights (1 x 1 x out x in) load into (out, in).
    """
    shape = tuple(int(d) for d in shape)
    stored = blobproto_shape(blob)
    if any(blob.HasField(f) for f in ("num", "channels", "height", "width")):
        return len(shape) <= 4 and (1,) * (4 - len(shape)) + shape == stored
    return stored == shape


def blobproto_to_array(blob, return_diff=False, shape=None):
    """The blob's values (or gradient when `return_diff`) as a new numpy array.

    float32 unless the proto stores doubles (double_data/double_diff), then float64. With `shape`,
    the result takes that shape after checking `blobproto_matches_shape`.
    """
    stored = blobproto_shape(blob)
    if shape is not None:
        if not blobproto_matches_shape(blob, shape):
            raise ValueError(f"stored blob has shape {stored}, expected {tuple(shape)}")
        stored = tuple(int(d) for d in shape)
    doubles = blob.double_diff if return_diff else blob.double_data
    floats = blob.diff if return_diff else blob.data
    values = numpy.array(doubles, dtype=numpy.float64) if len(doubles) else numpy.array(floats, dtype=numpy.float32)
    count = int(numpy.prod(stored, dtype=numpy.int64))
    if values.size != count:
        what = "diff" if return_diff else "data"
        raise ValueError(f"blob of shape {stored} needs {count} {what} values, the file holds {values.size}")
    return values.reshape(stored)


def warn_non_finite(values, what):
    """Says in the log how many of the host array `values` (`what`: the file and the blob) are NaN or infinite:
    a sound model or solver state holds none, but a diverged snapshot may still be loaded to be looked at."""
    bad = values.size - int(numpy.count_nonzero(numpy.isfinite(values)))
    if bad:
        log.warning("%s holds %s NaN or infinite value(s) of %s; the file may be damaged", what, f"{bad:,}",
                    f"{values.size:,}")


def _varint(n):
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _packed_field(number, values, dtype):
    return b"".join(field_chunks(number, [numpy.ascontiguousarray(values, dtype=dtype).tobytes()]))


def field_chunks(number, chunks):
    """`chunks` (buffers that together encode one message) as length-delimited field `number` of the message
    around it: the field's key and length, then the chunks themselves, not copied."""
    size = sum(memoryview(chunk).nbytes for chunk in chunks)
    return [_varint(number << 3 | 2) + _varint(size), *chunks]


def blob_chunks(data):
    """The BlobProto array_to_blobproto makes of host array `data` (shape and float or double data), as
    buffers whose concatenation is its serialization; the data's buffer is the array's own memory where it is
    little-endian and contiguous. Writing these is a commit's one copy; protobuf's parse and serialization
    would add two more of every byte."""
    data = numpy.asarray(data)
    double = data.dtype == numpy.float64
    raw = numpy.ascontiguousarray(data, dtype="<f8" if double else "<f4").reshape(-1)
    head = caffe_pb2.BlobProto(shape=caffe_pb2.BlobShape(dim=[int(d) for d in data.shape])).SerializeToString()
    return [head, *field_chunks(8 if double else 5, [memoryview(raw).cast("B")])]


def array_to_blobproto(data, diff=None, blob=None, legacy_4d=False):
    """A BlobProto (filled in place when `blob` is given) holding `data` and optionally `diff`.

    float64 arrays go to double_data/double_diff, everything else to float data, as Caffe's
    Blob<double>/Blob<float>::ToProto do. `legacy_4d` writes num/channels/height/width (at most
    4 axes, padded with leading 1s) instead of `shape`, for tools that only read old files.
    """
    data = numpy.asarray(data)
    if hasattr(data, "get") and not isinstance(data, numpy.ndarray):  # cupy array
        data = data.get()
    blob = caffe_pb2.BlobProto() if blob is None else blob
    blob.Clear()
    if legacy_4d:
        if data.ndim > 4:
            raise ValueError(f"a legacy 4-d BlobProto cannot hold shape {data.shape}")
        blob.num, blob.channels, blob.height, blob.width = (1,) * (4 - data.ndim) + tuple(data.shape)
    else:
        blob.shape.dim.extend(int(d) for d in data.shape)
    double = data.dtype == numpy.float64
    # Filling a repeated float field element by element costs seconds for AlexNet-sized
    # blobs; merging the packed wire encoding is a memcpy parsed in C.
    parts = [_packed_field(8 if double else 5, data.ravel(), "<f8" if double else "<f4")]
    if diff is not None:
        diff = numpy.asarray(diff.get() if hasattr(diff, "get") and not isinstance(diff, numpy.ndarray) else diff)
        if diff.shape != data.shape:
            raise ValueError(f"diff shape {diff.shape} differs from data shape {data.shape}")
        parts.append(_packed_field(9 if double else 6, diff.ravel(), "<f8" if double else "<f4"))
    blob.MergeFromString(b"".join(parts))
    return blob


# ---------------------------------------------------------------- weights <-> NetParameter

def model_layers(net):
    """The layers of a NetParameter that carry weights: `layer`, or `layers` in old V1 files (e.g.
    the original CaffeNet/AlexNet releases), whose weights are still usable by name."""
    return list(net.layer) if len(net.layer) else list(net.layers)


def net_weights(net):
    """{layer name: [numpy arrays]} for every layer with blobs, in file order.

    Arrays keep the stored shape (legacy 4-d for old files; `blobproto_to_array(..., shape=)`
    adapts them). When a name appears twice the later layer wins, as in Caffe's CopyTrainedLayers.
    """
    weights = {}
    for layer in model_layers(net):
        try:
            arrays = [blobproto_to_array(b) for b in layer.blobs]
        except ValueError as e:
            raise ValueError(f"layer '{layer.name}': {e}") from None
        if arrays:
            weights[layer.name] = arrays
    return weights


def set_layer_blobs(layer, arrays, diffs=None):
    """Replaces the blobs of a LayerParameter with host `arrays` (and gradients `diffs` if given)."""
    del layer.blobs[:]
    for i, a in enumerate(arrays):
        array_to_blobproto(a, None if diffs is None else diffs[i], blob=layer.blobs.add())
    return layer


def read_weights(path):
    """{layer name: [arrays]} of every layer with blobs in a binary .caffemodel or an HDF5
    .caffemodel.h5 (where None stands for a blob the layer shares with an earlier one)."""
    path = os.fspath(path)
    if is_hdf5_file(path):
        return {name: [blobs.get(i) for i in range(max(blobs) + 1)]
                for name, blobs in read_hdf5_weights(path).items() if blobs}
    with _naming(path):
        return net_weights(read_net_binary(path))


# ---------------------------------------------------------------- HDF5 snapshots

def is_hdf5_file(path):
    """True for HDF5 files (by signature, so a renamed file is still recognised)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return os.fspath(path).endswith(".h5")
    return head == b"\x89HDF\r\n\x1a\n"


def _h5py():
    try:
        import h5py
    except ImportError:
        raise RuntimeError("HDF5 snapshots need the h5py package: pip install h5py") from None
    return h5py


@contextlib.contextmanager
def hdf5_errors(what):
    """Makes what h5py raises on a damaged or wrong file (OSError, KeyError, RuntimeError, ValueError) a
    CaffeFormatError that begins with `what` (the file, and what it is read as); a CaffeFormatError, which
    names the file already, passes unchanged."""
    try:
        yield
    except CaffeFormatError:
        raise
    except (OSError, KeyError, RuntimeError, ValueError) as e:
        # A KeyError's str() quotes its message.
        problem = e.args[0] if isinstance(e, KeyError) and e.args else e
        raise CaffeFormatError(f"{what}: {_one_line(problem)}") from None


def check_hdf5_numbers(dataset, path):
    """Refuses an h5py dataset of strings, complex numbers (HDF5 compounds), booleans (enums) or any type
    but floats and integers, which are all that Caffe's hdf5_load_nd_dataset reads."""
    if dataset.dtype.kind not in "fiu":
        raise CaffeFormatError(f"{path}: dataset {dataset.name!r} holds {dataset.dtype} values: unsupported "
                               "datatype class (Caffe reads float and integer data only)")


def _numbered(group, path):
    """{i: array} for the datasets of `group` named by a number ("0", "1", ..., "10")."""
    numbered = {int(k): group[k] for k in group if k.isdigit()}
    for dataset in numbered.values():
        if not hasattr(dataset, "dtype"):
            raise CaffeFormatError(f"{path}: {dataset.name!r} is a group where a blob's dataset should be")
        check_hdf5_numbers(dataset, path)
    return {i: dataset[()] for i, dataset in numbered.items()}


def write_hdf5_weights(path, weights, diffs=None):
    """Caffe's HDF5 model layout (Net::ToHDF5): data/<layer>/<i> and, when `diffs` is given,
    diff/<layer>/<i>. Both are (layer name, [host arrays]) pairs in net order; a None array is
    not written (a blob the layer shares with another one)."""
    h5py = _h5py()
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as f:
            for top, source in (("data", weights), ("diff", diffs)):
                if source is None:
                    continue
                root = f.create_group(top, track_order=True)
                for layer_name, arrays in source:
                    g = root.create_group(layer_name)
                    for i, a in enumerate(arrays):
                        if a is not None:
                            g.create_dataset(str(i), data=numpy.asarray(a))


def read_hdf5_weights(path):
    """{layer name: {blob index: array}} from data/<layer>/<i> of a Caffe .caffemodel.h5, in the
    file's order; a layer lacks the indices of the blobs it shares with another layer."""
    h5py = _h5py()
    path = os.fspath(path)
    with hdf5_errors(f"{path}: cannot read as a Caffe HDF5 model"):
        with h5py.File(path, "r") as f:
            # Not f.get("data"): it answers None for a name it cannot look up in a damaged file.
            if "data" not in f or not isinstance(f["data"], h5py.Group):
                raise CaffeFormatError(f"{path}: HDF5 file has no 'data' group (not a Caffe .caffemodel.h5)")
            return {name: _numbered(g, path) for name, g in f["data"].items() if isinstance(g, h5py.Group)}


def write_hdf5_solverstate(path, iteration, learned_net, current_step, history):
    """Caffe's HDF5 solver state: iter, learned_net, current_step and history/<i>."""
    h5py = _h5py()
    with atomic_path(path) as tmp:
        with h5py.File(tmp, "w") as f:
            # Caffe stores the integers as 1-element int32 datasets and the file name as a
            # fixed-length string; same here so Caffe's hdf5_load_int/string accept the file.
            f.create_dataset("iter", data=numpy.array([iteration], dtype=numpy.int32))
            f.create_dataset("learned_net", data=numpy.bytes_(learned_net.encode("utf-8")))
            f.create_dataset("current_step", data=numpy.array([current_step], dtype=numpy.int32))
            g = f.create_group("history", track_order=True)
            for i, h in enumerate(history):
                g.create_dataset(str(i), data=numpy.asarray(h))


def read_hdf5_solverstate(path):
    """A SolverState message filled from an HDF5 .solverstate.h5 file."""
    h5py = _h5py()
    path = os.fspath(path)
    with hdf5_errors(f"{path}: cannot read as a Caffe HDF5 solver state"):
        with h5py.File(path, "r") as f:
            state = caffe_pb2.SolverState()
            state.iter = int(numpy.asarray(f["iter"][()]).reshape(-1)[0])
            name = f["learned_net"][()]
            state.learned_net = name.decode("utf-8") if isinstance(name, bytes) else str(name)
            if "current_step" in f:
                state.current_step = int(numpy.asarray(f["current_step"][()]).reshape(-1)[0])
            history = _numbered(f["history"], path)
            for i in sorted(history):
                array_to_blobproto(history[i], blob=state.history.add())
            return state


# ---------------------------------------------------------------- pycaffe's Datum / BlobProtoVector conversions

def arraylist_to_blobprotovector_str(arraylist):
    """A serialized BlobProtoVector holding each array of `arraylist` (see array_to_blobproto)."""
    vec = caffe_pb2.BlobProtoVector()
    for array in arraylist:
        array_to_blobproto(array, blob=vec.blobs.add())
    return vec.SerializeToString()


def blobprotovector_str_to_arraylist(serialized):
    """The arrays of a serialized BlobProtoVector."""
    vec = caffe_pb2.BlobProtoVector()
    vec.ParseFromString(serialized)
    return [blobproto_to_array(blob) for blob in vec.blobs]


def array_to_datum(arr, label=None):
    """A Datum for a C x H x W array: uint8 pixels go to `data` as bytes, other dtypes to `float_data`;
    the label is set only when given (pycaffe's signature; scaffe.data.datum has the database-side one)."""
    arr = numpy.asarray(arr)
    if arr.ndim != 3:
        raise ValueError(f"array_to_datum: expected a C x H x W array, got shape {arr.shape}")
    datum = caffe_pb2.Datum(channels=arr.shape[0], height=arr.shape[1], width=arr.shape[2])
    if arr.dtype == numpy.uint8:
        datum.data = arr.tobytes()
    else:
        datum.MergeFromString(_packed_field(6, arr.ravel(), "<f4"))  # float_data, in one C-side parse
    if label is not None:
        datum.label = int(label)
    return datum


def datum_to_array(datum):
    """A Datum's pixels as a C x H x W array (uint8 from `data`, float64 from `float_data`, as pycaffe);
    the label is `datum.label`. An encoded (JPEG/PNG) Datum is decoded by scaffe.data.datum instead.
    `datum` may also be the bytes of a database record; bytes that are no Datum, or a Datum whose values
    do not fill its shape, raise CaffeFormatError."""
    datum = parse_datum(datum)
    shape = (datum.channels, datum.height, datum.width)
    if datum.encoded:
        raise ValueError("datum_to_array: the Datum holds an encoded image; decode it with "
                         "scaffe.data.datum.datum_to_array (or PIL)")
    values = (numpy.frombuffer(datum.data, dtype=numpy.uint8).copy() if len(datum.data)
              else numpy.array(datum.float_data, dtype=numpy.float64))
    if values.size != datum.channels * datum.height * datum.width:
        raise CaffeFormatError(f"Datum of shape {shape} holds {values.size} values")
    return values.reshape(shape)
