"""kernels.blas: the layers' products on the host, on the GPU path (cupy stand-in) and on a capturing stream, where
they go to cuBLAS through nvmath-python's bindings (here their stand-in, column-major on the stand-in's memory)."""
import numpy
import pytest

from kernels import blas


def _operands(rng, m, n, k, trans_a, trans_b, views):
    """a, b such that op(a) is m x k and op(b) is k x n; with `views`, transposed views of C-ordered arrays."""
    def make(rows, cols, trans):
        shape = (cols, rows) if trans else (rows, cols)
        if views:  # the same values, held by a transposed view of a C-ordered array
            return numpy.ascontiguousarray(rng.standard_normal(shape[::-1]).astype(numpy.float32)).T
        return rng.standard_normal(shape).astype(numpy.float32)
    return make(m, k, trans_a), make(k, n, trans_b)


CASES = [(views, trans_a, trans_b) for views in (False, True) for trans_a in (False, True) for trans_b in (False, True)]


@pytest.mark.parametrize("views, trans_a, trans_b", CASES)
def test_captured_products_equal_numpys(nvmath_stand_in, views, trans_a, trans_b):
    check_captured_products(__import__("cupy"), views, trans_a, trans_b)


@pytest.mark.gpu
def test_captured_products_on_a_gpu_equal_numpys():
    import cupy
    if not blas.capture_ready():
        pytest.skip("nvmath-python's cuBLAS bindings are not installed")
    for case in CASES:
        check_captured_products(cupy, *case)


def check_captured_products(cp, views, trans_a, trans_b):
    rng = numpy.random.default_rng(0)
    m, n, k = 5, 3, 7
    a, b = _operands(rng, m, n, k, trans_a, trans_b, views)
    start = rng.standard_normal((m, n)).astype(numpy.float32)
    expected = (a.T if trans_a else a) @ (b.T if trans_b else b)
    device = [cp.asarray(numpy.ascontiguousarray(x)) for x in (a, b)]
    if views:
        device = [x.T.copy().T for x in device]  # transposed views of C-ordered device arrays
    set_out, add_out = cp.asarray(start), cp.asarray(start)
    stream = cp.cuda.Stream(non_blocking=True)
    blas.prepare_capture(cp)
    with stream, cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc):
        stream.begin_capture()
        blas.product(set_out, *device, trans_a, trans_b)
        blas.add_product(add_out, *device, trans_a, trans_b)
        graph = stream.end_capture()
    numpy.testing.assert_array_equal(set_out.get(), start)  # a capture computes nothing
    graph.launch(stream)
    numpy.testing.assert_allclose(set_out.get(), expected, rtol=1e-5, atol=1e-5)
    numpy.testing.assert_allclose(add_out.get(), start + expected, rtol=1e-5, atol=1e-5)
    host = numpy.zeros((m, n), numpy.float32)
    blas.product(host, a, b, trans_a, trans_b)
    numpy.testing.assert_allclose(host, expected, rtol=1e-6)


def test_captured_column_sums_and_group_slices(nvmath_stand_in):
    cp = __import__("cupy")
    rng = numpy.random.default_rng(1)
    a = rng.standard_normal((6, 4)).astype(numpy.float32)
    groups = rng.standard_normal((2, 3, 5)).astype(numpy.float32)  # (group, r, c), as Convolution's GEMMs
    weights = rng.standard_normal((2, 4, 3)).astype(numpy.float32)
    sums, out = cp.ones(4, dtype=cp.float32), cp.zeros((2, 4, 5), dtype=cp.float32)
    ones, da, dg, dw = cp.ones(6, dtype=cp.float32), cp.asarray(a), cp.asarray(groups), cp.asarray(weights)
    stream = cp.cuda.Stream(non_blocking=True)
    blas.prepare_capture(cp)
    with stream, cp.cuda.using_allocator(cp.cuda.MemoryPool().malloc):
        stream.begin_capture()
        blas.add_column_sums(sums, da, ones)
        for g in range(2):
            blas.product(out[g], dw[g], dg[g])
        graph = stream.end_capture()
    graph.launch(stream)
    numpy.testing.assert_allclose(sums.get(), 1 + a.sum(axis=0), rtol=1e-5)
    numpy.testing.assert_allclose(out.get(), weights @ groups, rtol=1e-5, atol=1e-6)


def test_without_nvmath_a_capture_refuses_gemms(cupy_stand_in):
    cp = cupy_stand_in
    assert not blas.capture_ready()
    out, a = cp.zeros((2, 2), dtype=cp.float32), cp.ones((2, 2), dtype=cp.float32)
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        with pytest.raises(NotImplementedError, match="nvmath-python's are missing .ModuleNotFoundError"):
            blas.product(out, a, a)
        stream.end_capture()
