"""im2col's and col2im's CPU kernels, compiled by numba once per host and loaded without it (kernels.native);
kernels/im2col.py calls them. Each entry takes the arrays as (int64 address, element count)."""
import numpy
from numba import njit, types, uint64

from kernels._views import view


@njit(inline="always")
def _valid_range(tap_offset, stride, in_size, out_size):
    """Output positions o with 0 <= o*stride + tap_offset < in_size, as [lo, hi)."""
    lo = 0 if tap_offset >= 0 else (-tap_offset + stride - 1) // stride
    hi = (in_size - tap_offset + stride - 1) // stride if in_size - tap_offset > 0 else 0
    if hi > out_size:
        hi = out_size
    if lo > hi:
        lo = hi
    return lo, hi


# Both kernels work on flat (raveled) arrays with explicit offsets, and index them with unsigned
# integers: numba wraps negative signed indices around, and that check in the innermost loop kept
# LLVM from vectorizing the copies (unsigned indices made im2col 2.5-3x faster). Offsets are cast to
# uint64 only once they are known to be non-negative; uint64 must not meet int64 in arithmetic (numba
# would promote the pair to float64).
@njit(inline="always")
def _zero_padding(col, dst, positions, ow, ylo, yhi, xlo, xhi, side_bands):
    """Zeros only where the tap reads padding: whole output rows above/below, bands left/right."""
    for q in range(dst, dst + ylo * ow):
        col[uint64(q)] = 0
    for q in range(dst + yhi * ow, dst + positions):
        col[uint64(q)] = 0
    if side_bands:
        for oy in range(ylo, yhi):
            d = dst + oy * ow
            for q in range(d, d + xlo):
                col[uint64(q)] = 0
            for q in range(d + xhi, d + ow):
                col[uint64(q)] = 0


@njit(inline="always")
def _copy_window(x, col, s0, d0, ylo, yhi, nx, sh, sw, ustride, width, ow):
    """Copies the pixels a tap sees into its output rows (inlined into the kernel at numba's IR level)."""
    # The unit-stride case gets its own loop so LLVM sees a plain contiguous copy.
    if sw == 1:
        for oy in range(ylo, yhi):
            d = uint64(d0 + oy * ow)
            s = uint64(s0 + oy * sh * width)
            for q in range(nx):
                col[d + q] = x[s + q]
    else:
        for oy in range(ylo, yhi):
            d = uint64(d0 + oy * ow)
            s = uint64(s0 + oy * sh * width)
            for q in range(nx):
                col[d + q] = x[s + q * ustride]


@njit(nogil=True)
def _im2col_rows(x, n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, col, first, last):
    taps = kh * kw
    positions = oh * ow
    plane = height * width
    ustride = uint64(sw)
    for row in range(first, last):
        c = row // taps
        ti = (row // kw) % kh * dh - ph
        tj = row % kw * dw - pw
        ylo, yhi = _valid_range(ti, sh, height, oh)
        xlo, xhi = _valid_range(tj, sw, width, ow)
        nx = uint64(xhi - xlo)
        side_bands = xlo > 0 or xhi < ow
        for n in range(n_img):
            dst = (row * n_img + n) * positions
            _zero_padding(col, dst, positions, ow, ylo, yhi, xlo, xhi, side_bands)
            s0 = (n * channels + c) * plane + ti * width + tj + xlo * sw
            _copy_window(x, col, s0, dst + xlo, ylo, yhi, nx, sh, sw, ustride, width, ow)


@njit(nogil=True)
def _col2im_planes(col, n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, dx, first, last):
    positions = oh * ow
    plane = height * width
    ustride = uint64(sw)
    for pl in range(first, last):
        n = pl // channels
        c = pl % channels
        base = pl * plane
        for q in range(base, base + plane):
            dx[uint64(q)] = 0
        for i in range(kh):
            ti = i * dh - ph
            ylo, yhi = _valid_range(ti, sh, height, oh)
            for j in range(kw):
                tj = j * dw - pw
                xlo, xhi = _valid_range(tj, sw, width, ow)
                nx = uint64(xhi - xlo)
                s0 = (((c * kh + i) * kw + j) * n_img + n) * positions + xlo
                d0 = base + ti * width + tj + xlo * sw
                if sw == 1:
                    for oy in range(ylo, yhi):
                        d = uint64(d0 + oy * sh * width)
                        s = uint64(s0 + oy * ow)
                        for q in range(nx):
                            dx[d + q] += col[s + q]
                else:
                    for oy in range(ylo, yhi):
                        d = uint64(d0 + oy * sh * width)
                        s = uint64(s0 + oy * ow)
                        for q in range(nx):
                            dx[d + q * ustride] += col[s + q]


def im2col_rows(dtype):
    """Rows [first, last) of the columns of image x, for `dtype` elements."""
    like = numpy.empty(0, dtype)

    def entry(x, x_count, n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, col, col_count,
              first, last):
        _im2col_rows(view(x, like, x_count), n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow,
                     view(col, like, col_count), first, last)
    return entry, (types.int64,) * 20


def col2im_planes(dtype):
    """(image, channel) planes [first, last) of dx from the columns, for `dtype` elements."""
    like = numpy.empty(0, dtype)

    def entry(col, col_count, n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, dx, dx_count,
              first, last):
        _col2im_planes(view(col, like, col_count), n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw,
                       oh, ow, view(dx, like, dx_count), first, last)
    return entry, (types.int64,) * 20
