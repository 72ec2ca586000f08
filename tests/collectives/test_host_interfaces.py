"""Host memory behind `__cuda_array_interface__` or DLPack is a host buffer, and buffer specs read as mpi4py
reads them: in-process checks of `parse`, then every overridden collective on such buffers in MPI jobs.

mpi4py's own tests pass "fake GPU arrays" (host memory behind the CUDA array interface); so does any
program on a machine without a CUDA driver, and pinned memory does everywhere. This machine has no
driver, so every interface pointer here is host memory; `gpu`-marked tests ask a real driver.
"""
import shlex

import numpy
import pytest
from mpi4py import MPI

from collectives.devices import driver
from collectives.buffers import parse, writable
from collectives.devices.memory import is_device_buffer
from collectives.errors import CollectiveError
from mpi_harness import run_ok, settings_of
from workers.worker_util import DLPackArray, HostInterfaceArray


def test_host_pointer_behind_the_cuda_interface_is_a_host_view():
    data = numpy.arange(10, dtype=numpy.float32)
    fake = HostInterfaceArray(data)
    assert not driver.available() or not driver.is_device_memory(data.ctypes.data)
    assert not is_device_buffer(fake)
    view = parse(fake, "recvbuf")
    assert view.device is None and view.array.dtype == numpy.float32
    view.array[3] = -1  # the same memory, not a copy
    assert data[3] == -1


def test_host_interface_honours_shape_strides_typestr_and_read_only():
    matrix = numpy.asfortranarray(numpy.arange(12, dtype=numpy.int16).reshape(3, 4))
    numpy.testing.assert_array_equal(parse(HostInterfaceArray(matrix)).array, matrix.ravel(order="F"))
    with pytest.raises(CollectiveError, match="not contiguous"):
        parse(HostInterfaceArray(numpy.zeros((4, 4))[:, 1]))
    frozen = parse(HostInterfaceArray(numpy.zeros(4), read_only=True), "recvbuf")
    with pytest.raises(CollectiveError, match="read-only"):
        writable(frozen, "recvbuf")
    old = parse(HostInterfaceArray(numpy.arange(3, dtype=numpy.int64), version=0))  # no strides key at all
    numpy.testing.assert_array_equal(old.array, [0, 1, 2])


def test_host_interface_specs_and_null_pointers():
    data = numpy.arange(8, dtype=numpy.float64)
    numpy.testing.assert_array_equal(parse([HostInterfaceArray(data), (3, 2), MPI.DOUBLE]).array, [2, 3, 4])
    empty = {"shape": (0,), "typestr": "<f8", "data": (0, False), "version": 3}
    assert parse(type("Empty", (), {"__cuda_array_interface__": empty})()).array.size == 0
    null = dict(empty, shape=(4,))
    with pytest.raises(CollectiveError, match="null pointer"):
        parse(type("Null", (), {"__cuda_array_interface__": null})())


def test_dlpack_host_exporter_is_viewed_with_a_datatype_and_left_to_mpi_without():
    data = numpy.arange(6, dtype=numpy.int32)
    typed = parse([DLPackArray(data), MPI.INT], "recvbuf")
    numpy.testing.assert_array_equal(typed.array, data)
    typed.array[0] = 9
    assert data[0] == 9
    assert parse(DLPackArray(data)).array is None  # mpi4py asks the exporter for its element type


def test_specs_read_as_mpi4py_reads_them():
    data = numpy.arange(10, dtype=numpy.float64)
    numpy.testing.assert_array_equal(parse([data, 3, 2, MPI.DOUBLE]).array, [2, 3, 4])
    numpy.testing.assert_array_equal(parse([data, [3, 2], MPI.DOUBLE]).array, [2, 3, 4])
    numpy.testing.assert_array_equal(parse([data, (2, 5)]).array, [5, 6])
    assert parse([data, "d"]).array.size == 10 and parse([data, "i"]).array.dtype == numpy.int32
    assert parse([data, 0, MPI.DOUBLE]).array.size == 0
    for absolute in ([None, 0, MPI.DOUBLE], [MPI.BOTTOM, 1, MPI.DOUBLE], MPI.BOTTOM):
        assert parse(absolute).array is None  # addresses inside the datatype: MPI's business
    with pytest.raises(CollectiveError, match="2 to 4 items"):
        parse([data])


def test_objects_without_a_buffer_are_refused_not_copied():
    class Sequence:
        def __len__(self):
            return 3

        def __getitem__(self, i):
            if i >= 3:
                raise IndexError(i)
            return i

    with pytest.raises(CollectiveError, match="neither the buffer protocol"):
        parse([Sequence(), MPI.INT])


@pytest.mark.gpu
def test_driver_tells_device_managed_and_pinned_memory_apart():
    import cupy
    device = cupy.arange(4, dtype=cupy.float32)
    assert is_device_buffer(device)
    managed = cupy.ndarray((4,), cupy.float32, cupy.cuda.malloc_managed(16))
    assert is_device_buffer(managed)  # staged through the driver's copies, by decision
    pinned_memory = cupy.cuda.alloc_pinned_memory(16)
    pinned = numpy.frombuffer(pinned_memory, numpy.float32, 4)
    pinned[:] = [1, 2, 3, 4]
    fake = HostInterfaceArray(pinned)
    assert not is_device_buffer(fake)
    numpy.testing.assert_array_equal(parse(fake).array, [1, 2, 3, 4])
    assert not is_device_buffer(HostInterfaceArray(numpy.zeros(4)))  # pageable memory


# (ranks, SCAFFE_RANKS_PER_NODE, SCAFFE_REDUCE_ALGO, memory); small chunks, so 5003 elements are many. The
# passes of one rank count run in one launch (workers/space.py --pass).
PASSES = [(2, None, None, "interface"), (3, 2, "hierarchical", "interface"), (4, None, "tree", "interface"),
          (3, 2, "hierarchical", "dlpack")]


@pytest.mark.parametrize("ranks", sorted({ranks for ranks, *_ in PASSES}), ids=lambda ranks: f"n{ranks}")
def test_collectives_on_host_interfaces(ranks):
    """Reduce, Allreduce, Bcast and their I* forms on such buffers (native below the selection thresholds,
    ours above them or when forced), in place or not, checked against numpy on every rank."""
    passes = [case for case in PASSES if case[0] == ranks]
    dtypes = "int8,int32,uint16,int64,float32,float64,complex128"
    words = []
    for _, per_node, algo, memory in passes:
        words += ["--pass", shlex.join([
            "--rotate", "--memory", memory, "--ops", "all", "--dtypes", dtypes, "--sizes", "0,1,7,1001,5003",
            "--name", f"{memory}-n{ranks}",
            "--settings", settings_of(per_node, algo)])]
    run_ok(ranks, "space.py", *words, timeout=120 * len(passes), passes=len(passes),
           # numba's real CUDA target, as a program has it: without a driver, reading these pointers as device
           # memory raised CudaSupportError.
           env={"NUMBA_ENABLE_CUDASIM": 0, "SCAFFE_CHUNK_BYTES": 4096, "SCAFFE_SHM_CHUNK_BYTES": 2048})
