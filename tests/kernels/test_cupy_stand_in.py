"""The cupy stand-in itself: it refuses what cupy refuses, counts host syncs, and its kernel twins agree
with the CPU kernels."""
import subprocess
import sys

import numpy
import pytest

IMPLICIT = "Implicit conversion to a NumPy array is not allowed"


def test_implicit_host_conversions_are_refused(cupy_stand_in):
    cp = cupy_stand_in
    x = cp.arange(6, dtype=cp.float32).reshape(2, 3)
    with pytest.raises(TypeError, match=IMPLICIT):
        numpy.asarray(x)
    with pytest.raises(TypeError, match=IMPLICIT):
        numpy.array(x, dtype=numpy.float64)
    with pytest.raises(TypeError):
        memoryview(x)
    for mixed in (lambda: x + numpy.ones(3, numpy.float32), lambda: numpy.ones(3, numpy.float32) * x,
                  lambda: cp.add(x, numpy.ones(3)), lambda: numpy.maximum(x, numpy.zeros(3)),
                  lambda: cp.where(numpy.ones(3, bool), x, 0), lambda: cp.concatenate([x, numpy.ones((1, 3))]),
                  lambda: cp.multiply(x, 2, out=numpy.empty((2, 3), numpy.float32)), lambda: cp.add(x, [1, 2, 3])):
        with pytest.raises(TypeError, match="Unsupported type|must be cupy.ndarray"):
            mixed()
    with pytest.raises(ValueError, match="non-scalar numpy.ndarray cannot be used for fill"):
        x[...] = numpy.ones((2, 3), numpy.float32)


def test_what_cupy_allows_and_counts_as_host_syncs(cupy_stand_in):
    cp = cupy_stand_in
    host = numpy.arange(6, dtype=numpy.float32).reshape(2, 3)
    x = cp.asarray(host)
    assert cp._stand_in.counters["host_to_device"] == 1
    total = x.sum()
    assert isinstance(total, cp.ndarray) and total.shape == ()  # reductions stay on the device
    assert isinstance(x[1, 2], cp.ndarray)
    assert cp._stand_in.host_syncs() == 0
    assert float(total) == 15.0 and int(x[1, 2]) == 5 and bool(x[0, 1]) and x.max().item() == 5.0
    assert f"{total:.1f}" == "15.0"
    numpy.testing.assert_array_equal(x.get(), host)
    numpy.testing.assert_array_equal(cp.asnumpy(x), host)
    assert cp._stand_in.counters["device_to_host"] == 7
    with pytest.raises(ValueError, match="ambiguous"):
        bool(x)
    x[...] = numpy.float32(2)  # host scalars (numpy's too) are fine
    x[0] = 1.0
    x[numpy.array([1]), 0] = cp.asarray(numpy.float32(7))  # host index arrays are copied up by cupy itself
    numpy.testing.assert_array_equal(x.get(), [[1, 1, 1], [7, 2, 2]])
    y = numpy.exp(x)  # numpy ufuncs on device arrays dispatch to cupy's
    assert isinstance(y, cp.ndarray)
    x.set(host)
    numpy.testing.assert_array_equal((x * 2 + 1).get(), host * 2 + 1)


def test_array_module_and_one_device(cupy_stand_in):
    from kernels.backend import cupy_or_none, get_array_module
    cp = cupy_stand_in
    assert cupy_or_none() is cp
    assert get_array_module(cp.zeros(2)) is cp and get_array_module(numpy.zeros(2)) is numpy
    assert cp.get_array_module(numpy.zeros(2)) is numpy
    assert cp.cuda.runtime.getDeviceCount() == 1
    cp.cuda.Device(0).use()
    with pytest.raises(cp.cuda.runtime.CUDARuntimeError):
        cp.cuda.Device(1).use()
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        assert cp.cuda.get_current_stream() is stream
    assert cp.cuda.get_current_stream() is cp.cuda.Stream.null
    stream.synchronize()
    assert cp._stand_in.counters["synchronize"] == 1


def test_cublas_is_a_submodule_that_import_cupy_does_not_load(cupy_stand_in):
    # As in cupy: code that calls cupy.cublas must import it (a GPU found kernels.blas assuming otherwise).
    probe = "import cupy; assert not hasattr(cupy, 'cublas'); import cupy.cublas; print(cupy.cublas.gemm.__name__)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "gemm", done.stderr


def test_random_draws_stay_on_the_device(cupy_stand_in):
    cp = cupy_stand_in
    rng = cp.random.default_rng(3)
    draws = [rng.random((4, 5), dtype=cp.float32), cp.random.RandomState(3).uniform(size=(2, 2), dtype=cp.float32),
             cp.random.rand(3), cp.random.randn(2, dtype=cp.float32)]
    for d in draws:
        assert isinstance(d, cp.ndarray)
    assert draws[0].dtype == numpy.float32 and draws[3].dtype == numpy.float32
    numpy.testing.assert_array_equal(cp.random.default_rng(5).random(4).get(), cp.random.default_rng(5).random(4).get())
    with pytest.raises(TypeError):
        rng.random(3, dtype=cp.int32)
    assert cp._stand_in.counters["host_to_device"] == 0


def _pool_cases():
    # (kernel, pad, stride) with windows clipped by the border and overlapping windows
    return [((2, 2), (0, 0), (2, 2)), ((3, 3), (1, 1), (2, 2)), ((3, 2), (0, 1), (1, 2))]


def test_kernel_twins_match_the_cpu_kernels(cupy_stand_in):
    from kernels import geometry, im2col, pooling
    cp = cupy_stand_in
    rng = numpy.random.default_rng(0)
    x = rng.standard_normal((2, 3, 7, 6)).astype(numpy.float32)
    x[0, 0, :2, :2] = 1.0  # ties: the first maximum wins on both sides
    dev = cp.asarray(x)
    for kernel, pad, stride in _pool_cases():
        col = im2col.im2col(x, kernel, pad, stride, dilation=(1, 2))
        dev_col = im2col.im2col(dev, kernel, pad, stride, dilation=(1, 2))
        numpy.testing.assert_array_equal(dev_col.get(), col)
        numpy.testing.assert_allclose(im2col.col2im(dev_col, x.shape, kernel, pad, stride, (1, 2)).get(),
                                      im2col.col2im(col, x.shape, kernel, pad, stride, (1, 2)), rtol=1e-6, atol=1e-6)
        out = tuple(geometry.pooled_size(s, k, p, st) for s, k, p, st in zip(x.shape[2:], kernel, pad, stride))
        top, mask = pooling.max_pool_forward(x, kernel, pad, stride, out)
        dev_top, dev_mask = pooling.max_pool_forward(dev, kernel, pad, stride, out)
        numpy.testing.assert_array_equal(dev_top.get(), top)
        numpy.testing.assert_array_equal(dev_mask.get(), mask)
        dtop = rng.standard_normal(top.shape).astype(numpy.float32)
        numpy.testing.assert_allclose(
            pooling.max_pool_backward(cp.asarray(dtop), dev_mask, kernel, pad, stride, x.shape).get(),
            pooling.max_pool_backward(dtop, mask, kernel, pad, stride, x.shape), rtol=1e-6, atol=1e-6)
        numpy.testing.assert_allclose(pooling.ave_pool_forward(dev, kernel, pad, stride, out).get(),
                                      pooling.ave_pool_forward(x, kernel, pad, stride, out), rtol=1e-6, atol=1e-6)
        numpy.testing.assert_allclose(
            pooling.ave_pool_backward(cp.asarray(dtop), kernel, pad, stride, x.shape).get(),
            pooling.ave_pool_backward(dtop, kernel, pad, stride, x.shape), rtol=1e-6, atol=1e-6)


def test_raw_kernel_binds_arguments_as_the_signature_says(cupy_stand_in):
    from kernels.cuda_sources import raw_kernel
    cp = cupy_stand_in
    x = cp.arange(9, dtype=cp.float32).reshape(1, 1, 3, 3)
    col = cp.empty((1, 1, 9), dtype=cp.float32)
    kernel = raw_kernel("scaffe_im2col_float32")
    geometry = [numpy.int32(v) for v in (1, 1, 3, 3, 1, 1, 0, 0, 1, 1, 1, 1, 3, 3)]
    kernel((1,), (32,), (x, *geometry, col, numpy.int64(9)))
    numpy.testing.assert_array_equal(col.get().reshape(-1), numpy.arange(9))
    with pytest.raises(TypeError, match="expected 17 arguments, got 16"):
        kernel((1,), (32,), (x, *geometry, col))
    with pytest.raises(TypeError, match="n_img is int, got <class 'int'>"):
        kernel((1,), (32,), (x, 1, *geometry[1:], col, numpy.int64(9)))
    with pytest.raises(TypeError, match="must be a cupy.ndarray"):
        kernel((1,), (32,), (x.get(), *geometry, col, numpy.int64(9)))
    with pytest.raises(NotImplementedError, match="no numpy twin"):
        cp.RawKernel('extern "C" __global__ void other_float32(long long total) {}', "other_float32")(
            (1,), (1,), (numpy.int64(1),))


def test_pinned_uploads_on_a_side_stream_land_only_once_waited_for(cupy_stand_in):
    cp = cupy_stand_in
    memory = cp.cuda.alloc_pinned_memory(4 * 4)
    pinned = numpy.frombuffer(memory, numpy.float32, 4)
    pinned[...] = 1
    device = cp.zeros(4, dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    device.set(pinned, stream=stream)
    uploaded = stream.record()
    pinned[...] = 2  # refilled before the copy ran: the copy reads the new values, as a DMA would
    numpy.testing.assert_array_equal(device.get(), 0)  # nobody waited: not there yet
    cp.cuda.get_current_stream().wait_event(uploaded)
    numpy.testing.assert_array_equal(device.get(), 2)
    assert cp._stand_in.counters["pinned_upload"] == 1 and cp._stand_in.counters["pageable_upload"] == 0
    device.set(numpy.full(4, 3, numpy.float32), stream=stream)  # pageable: copied before set() returns
    numpy.testing.assert_array_equal(device.get(), 3)
    assert cp._stand_in.counters["pageable_upload"] == 1


def test_out_of_range_gather_indices_wrap_around_as_in_cupy(cupy_stand_in):
    cp = cupy_stand_in
    a = cp.arange(6, dtype=cp.float32).reshape(2, 3)
    picked = cp.take_along_axis(a, cp.asarray(numpy.array([[4], [-1]])), axis=1)
    numpy.testing.assert_array_equal(picked.get(), [[1], [5]])


def test_a_capture_computes_nothing_and_its_graph_replays_on_new_inputs(cupy_stand_in):
    cp = cupy_stand_in
    x = cp.arange(4, dtype=cp.float32)
    y = cp.zeros(4, dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    pool = cp.cuda.MemoryPool()
    with stream, cp.cuda.using_allocator(pool.malloc):
        stream.begin_capture()
        assert stream.is_capturing()
        doubled = x * 2  # allocated during the capture: holds garbage until the graph runs
        cp.add(doubled, 1, out=y)
        total = y.sum()
        graph = stream.end_capture()
    assert not y.get().any() and numpy.isnan(doubled.get()).all()  # nothing ran
    x[...] = 10
    launches = cp._stand_in.counters["launches"]
    graph.launch(stream)
    assert cp._stand_in.counters["launches"] == launches + 1 and cp._stand_in.counters["graph_launches"] == 1
    numpy.testing.assert_array_equal(y.get(), numpy.full(4, 21, numpy.float32))
    assert float(total) == 84.0
    with pytest.raises(RuntimeError, match="cannot capture on the default"):
        cp.cuda.Stream.null.begin_capture()


def test_a_capture_refuses_what_cuda_and_cupy_refuse(cupy_stand_in):
    import cupy.cublas
    cp = cupy_stand_in
    a = cp.ones((2, 2), dtype=cp.float32)
    out = cp.zeros((2, 2), dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    event = cp.cuda.Event()
    event.record(stream)
    refused = {
        "host sync": (lambda: a.get(), "cudaErrorStreamCaptureUnsupported"),
        "stream sync": (lambda: stream.synchronize(), "cudaErrorStreamCaptureUnsupported"),
        "pageable upload": (lambda: cp.asarray(numpy.ones(2)), "cudaErrorStreamCaptureUnsupported"),
        "cuBLAS": (lambda: cupy.cublas.gemm("N", "N", a, a, out=out), "cuBLAS API during stream capture"),
        "matmul": (lambda: a @ a, "cuBLAS API during stream capture"),
        "shared pool": (lambda: a + 1, "shared pool"),
        "outside event": (lambda: stream.wait_event(event), "cudaErrorStreamCaptureIsolation"),
    }
    for name, (work, message) in refused.items():
        with stream:
            stream.begin_capture()
            with pytest.raises(Exception, match=message):
                work()
            stream.end_capture()
