"""How device buffers are recognised and viewed (in-process: no MPI job needed to parse a buffer).

numba device arrays stand in for every device buffer here; in CI they are the CUDA simulator's.
"""
import numpy
import pytest
from mpi4py import MPI

from collectives.buffers import Buffer, parse, writable
from collectives.device import PinnedPool, Staging, is_read_only, is_device_buffer
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
