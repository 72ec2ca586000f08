"""How device buffers are recognised and viewed (in-process: no MPI job needed to parse a buffer).

numba device arrays stand in for every device buffer here; in CI they are the CUDA simulator's.
"""
import numpy
import pytest
from mpi4py import MPI

from collectives.buffers import Buffer, parse, writable
from collectives.devices.memory import PinnedPool, Staging, is_read_only, is_device_buffer
from collectives.errors import CollectiveError
from kernels.numba_cuda import cuda

from async_arrays import LateStream, StreamedArray


def test_host_buffers_are_not_device_buffers():
    for host in (numpy.zeros(3), bytearray(8), memoryview(b"abcd")):
        assert not is_device_buffer(host)
        assert parse(host).device is None


def test_specs_around_device_arrays():
    data = cuda.to_device(numpy.arange(10, dtype=numpy.float32))
    whole = parse(data)
    assert whole.array is None and whole.device.size == 10
    typed = parse([data, MPI.FLOAT])
    assert typed.device.size == 10
    counted = parse([data, 4, MPI.FLOAT])
    numpy.testing.assert_array_equal(counted.device.copy_to_host(), [0, 1, 2, 3])
    shifted = parse([data, (3, 5), MPI.FLOAT])
    numpy.testing.assert_array_equal(shifted.device.copy_to_host(), [5, 6, 7])


def test_two_dimensional_device_array_is_flattened():
    data = cuda.to_device(numpy.arange(12, dtype=numpy.int32).reshape(3, 4))
    numpy.testing.assert_array_equal(parse(data).device.copy_to_host(), numpy.arange(12))


@pytest.mark.parametrize("spec,message", [
    (lambda d: [d, MPI.DOUBLE], "cannot be read as"),
    (lambda d: [d, 11, MPI.FLOAT], "exceeds the buffer"),
    (lambda d: [d, (2, 9), MPI.FLOAT], "exceeds the buffer"),
])
def test_bad_device_specs_raise(spec, message):
    data = cuda.to_device(numpy.arange(10, dtype=numpy.float32))
    with pytest.raises(CollectiveError, match=message):
        parse(spec(data))


def test_read_only_interface_is_refused_as_receive_buffer():
    class ReadOnly:
        """A producer that marks its device memory read-only (CUDA array interface data=(ptr, True))."""
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (0, True), "version": 3}

    assert is_read_only(ReadOnly())
    buf = Buffer(None, ReadOnly(), device_view=cuda.device_array(4, dtype=numpy.float32),
                 read_only=is_read_only(ReadOnly()))
    with pytest.raises(CollectiveError, match="read-only"):
        writable(buf, "recvbuf")


def test_staging_copies_in_and_out_and_reuses_pinned_memory():
    pool = PinnedPool()
    source = cuda.to_device(numpy.arange(6, dtype=numpy.float64))
    target = cuda.device_array(6, dtype=numpy.float64)
    staging = Staging(pool)
    host_in = staging.host(source, copy_in=True, copy_out=False)
    host_out = staging.host(target, copy_in=False, copy_out=True)

    def work():
        host_out[:] = host_in * 2

    staging.wrap(work)()
    numpy.testing.assert_array_equal(target.copy_to_host(), numpy.arange(6) * 2.0)
    again = Staging(pool)
    reused = again.host(source, copy_in=True, copy_out=False)
    assert reused.base is not None and len(pool._free) == 1  # one of the two buffers came back out


def test_staged_copies_land_before_the_host_and_the_stream_read_them():
    """A cupy array's view copies asynchronously on the producer's stream (tests/collectives/async_arrays.py):
    the host work must see this call's data, not a stale pinned buffer, and the result must be on the device
    before the caller's next work on that stream, even when the next call takes the same pinned buffers."""
    stream = LateStream(seed=18)
    size = 1000
    source = StreamedArray(numpy.zeros(size), stream=stream)
    target = StreamedArray(numpy.zeros(size), stream=stream)
    pool = PinnedPool()
    for round_ in range(1, 4):
        source.copy_to_device(numpy.arange(size) + round_)  # the producer's work, queued on its stream
        staging = Staging(pool)
        host_in = staging.host(source, copy_in=True, copy_out=False)
        host_out = staging.host(target, copy_in=False, copy_out=True)
        seen = []

        def work():
            seen.append(host_in.copy())
            host_out[:] = host_in * 2

        staging.wrap(work)()
        # The next call takes the same pinned buffers and fills them at once.
        reuse = Staging(pool)
        reuse.host(source, copy_in=False, copy_out=False)[:] = -1
        reuse.host(target, copy_in=False, copy_out=False)[:] = -1
        numpy.testing.assert_array_equal(seen[0], numpy.arange(size) + round_)
        numpy.testing.assert_array_equal(target.read(), (numpy.arange(size) + round_) * 2)
        reuse.release()


class Exported:
    """A producer's device buffer as `__cuda_array_interface__` v3 describes it, naming the stream its work is on."""

    def __init__(self, host, stream):
        self.host = host
        self.__cuda_array_interface__ = {"shape": host.shape, "typestr": host.dtype.str, "version": 3,
                                         "data": (host.ctypes.data, False), "stream": stream}


def test_a_named_stream_is_not_waited_for_but_becomes_the_callers(monkeypatch):
    """numba's as_cuda_array would block the host on the named stream (sync=True, its default); the view is
    made without that wait (on a GPU numba keeps the stream as the view's, and staged copies go there), and
    the Buffer carries the handle for the call."""
    import collectives.devices.memory
    import kernels.numba_cuda as numba_cuda
    late = LateStream(seed=3)
    asked = []

    def as_cuda_array(obj, sync=True):  # numba's conversion on a GPU: a view on the named stream
        asked.append(sync)
        return StreamedArray(obj.host, stream=late)

    monkeypatch.setattr(collectives.devices.memory.driver, "is_device_memory", lambda pointer: True)
    monkeypatch.setattr(numba_cuda, "SIMULATED", False)
    monkeypatch.setattr(numba_cuda.cuda, "as_cuda_array", as_cuda_array, raising=False)
    exported = Exported(numpy.arange(8, dtype=numpy.float32), stream=0x5150)
    buf = parse([exported, (2, 4), MPI.FLOAT])
    assert asked == [False]
    assert buf.stream == 0x5150
    numpy.testing.assert_array_equal(buf.device.copy_to_host(), [4, 5])


def test_the_callers_stream_is_the_one_the_buffers_name():
    from collectives.buffers import named_stream

    def named(stream):
        return Buffer(None, None, stream=stream)

    assert named_stream(named(None), None) is None
    assert named_stream(named(7), named(None)) == 7 and named_stream(named(None), named(7)) == 7
    assert named_stream(named(7), named(7)) == 7
    with pytest.raises(CollectiveError, match=r"different CUDA streams \(0x7, 0x9\).*pass stream="):
        named_stream(named(9), named(7))


def test_a_remembered_device_call_repeats_only_while_its_arrays_name_the_same_stream():
    """A repeated call given no stream takes the stream its arrays name as the caller's: once they name
    another (cupy names its current stream), the remembered call no longer matches and the full path runs."""
    from collectives.plans import DevicePlan

    class Local:  # a LocalCall that exported its buffers
        failure = None

    send = Exported(numpy.arange(8, dtype=numpy.float32), stream=0x5150)
    plan = DevicePlan(None, send, None, MPI.SUM, 0, send.host.nbytes, Local(), named=0x5150)
    assert plan.holds(send, None, None)
    send.__cuda_array_interface__["stream"] = 0x7
    assert not plan.holds(send, None, None)
    assert plan.holds(send, None, 0x7)  # a stream given by the caller is the call's


@pytest.mark.gpu
def test_cupy_buffers_on_a_busy_stream_are_viewed_without_waiting_and_the_call_follows_it():
    import cupy

    import collectives
    comm = collectives.Comm(MPI.COMM_WORLD)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        big = cupy.ones((8192, 8192), dtype=cupy.float32)
        (big @ big)[0, :1024] / 8192  # cuBLAS's handle and the division's kernel made before the timed work
        stream.synchronize()
        send = (big @ big)[0, :1024] / 8192  # tens of milliseconds of work ahead of the data, all ones
        assert parse(send).stream == stream.ptr
        assert not stream.done, "viewing the buffer waited for its stream"
        recv = cupy.zeros_like(send)
        comm.Allreduce(send, recv)  # no stream= given: the call follows the one the buffers name
        numpy.testing.assert_array_equal(cupy.asnumpy(recv), numpy.full(1024, comm.Get_size(), numpy.float32))
