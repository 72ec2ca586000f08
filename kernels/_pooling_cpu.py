"""Pooling's CPU kernels, compiled by numba once per host and loaded without it (kernels.native);
kernels/pooling.py calls them. Each entry takes the arrays as (int64 address, element count); masks are int32."""
import numpy
from numba import njit, types, uint64

from kernels._views import view

_MASK = numpy.empty(0, numpy.int32)


# Windows that the image edge cuts: their bounds are clipped at run time. These helpers are inlined into
# the kernels at numba's IR level; the windows inside the image (the hot path, unrolled when the size is
# compiled in) are written out in the kernels themselves.
@njit(inline="always")
def _max_clipped(x, src, height, width, hs, ws, kh, kw):
    """(largest value, its flat index in the plane) of a clipped window; ties go to the first, as in Caffe."""
    best = -numpy.inf
    arg = -1
    for h in range(max(hs, 0), min(hs + kh, height)):
        for w in range(max(ws, 0), min(ws + kw, width)):
            v = x[uint64(src + h * width + w)]
            if v > best:
                best = v
                arg = h * width + w
    return best, arg


@njit(inline="always")
def _sum_clipped(x, src, height, width, hs, ws, he, we):
    acc = 0.0
    for h in range(max(hs, 0), min(he, height)):
        for w in range(max(ws, 0), min(we, width)):
            acc += x[uint64(src + h * width + w)]
    return acc


@njit(inline="always")
def _spread_clipped(dx, dst, height, width, hs, ws, he, we, g):
    for h in range(max(hs, 0), min(he, height)):
        for w in range(max(ws, 0), min(we, width)):
            dx[uint64(dst + h * width + w)] += g


# Each factory makes its kernel for one window size: fixed_kh/kw > 0 compile the size in (numba treats
# closure variables as constants), 0 reads it from the arguments.
def _max_forward_kernel(fixed_kh, fixed_kw):
    @njit(nogil=True)
    def max_forward(x, height, width, kh, kw, ph, pw, sh, sw, oh, ow, top, mask, first, last):
        if fixed_kh > 0:
            kh = fixed_kh
            kw = fixed_kw
        plane_in = height * width
        plane_out = oh * ow
        for pl in range(first, last):
            src = pl * plane_in
            dst = pl * plane_out
            for py in range(oh):
                hs = py * sh - ph
                for px in range(ow):
                    ws = px * sw - pw
                    if hs >= 0 and ws >= 0 and hs + kh <= height and ws + kw <= width:
                        arg = hs * width + ws
                        best = x[uint64(src + arg)]
                        for i in range(kh):
                            row = (hs + i) * width + ws
                            at = uint64(src + row)
                            for j in range(kw):
                                v = x[at + uint64(j)]
                                if v > best:
                                    best = v
                                    arg = row + j
                    else:
                        best, arg = _max_clipped(x, src, height, width, hs, ws, kh, kw)
                    out = uint64(dst + py * ow + px)
                    top[out] = best
                    mask[out] = arg

    return max_forward


def _ave_forward_kernel(fixed_kh, fixed_kw):
    @njit(nogil=True)
    def ave_forward(x, height, width, kh, kw, ph, pw, sh, sw, oh, ow, top, first, last):
        if fixed_kh > 0:
            kh = fixed_kh
            kw = fixed_kw
        plane_in = height * width
        plane_out = oh * ow
        for pl in range(first, last):
            src = pl * plane_in
            dst = pl * plane_out
            for py in range(oh):
                hs = py * sh - ph
                he = min(hs + kh, height + ph)
                for px in range(ow):
                    ws = px * sw - pw
                    if hs >= 0 and ws >= 0 and hs + kh <= height and ws + kw <= width:
                        acc = 0.0
                        for i in range(kh):
                            at = uint64(src + (hs + i) * width + ws)
                            for j in range(kw):
                                acc += x[at + uint64(j)]
                        top[uint64(dst + py * ow + px)] = acc / (kh * kw)
                    else:
                        we = min(ws + kw, width + pw)
                        acc = _sum_clipped(x, src, height, width, hs, ws, he, we)
                        top[uint64(dst + py * ow + px)] = acc / ((he - hs) * (we - ws))

    return ave_forward


def _ave_backward_kernel(fixed_kh, fixed_kw):
    @njit(nogil=True)
    def ave_backward(dtop, height, width, kh, kw, ph, pw, sh, sw, oh, ow, dx, first, last):
        if fixed_kh > 0:
            kh = fixed_kh
            kw = fixed_kw
        plane_in = height * width
        plane_out = oh * ow
        for pl in range(first, last):
            src = pl * plane_out
            dst = pl * plane_in
            for q in range(dst, dst + plane_in):
                dx[uint64(q)] = 0
            for py in range(oh):
                hs = py * sh - ph
                he = min(hs + kh, height + ph)
                for px in range(ow):
                    ws = px * sw - pw
                    if hs >= 0 and ws >= 0 and hs + kh <= height and ws + kw <= width:
                        g = dtop[uint64(src + py * ow + px)] / (kh * kw)
                        for i in range(kh):
                            at = uint64(dst + (hs + i) * width + ws)
                            for j in range(kw):
                                dx[at + uint64(j)] += g
                    else:
                        we = min(ws + kw, width + pw)
                        g = dtop[uint64(src + py * ow + px)] / ((he - hs) * (we - ws))
                        _spread_clipped(dx, dst, height, width, hs, ws, he, we, g)

    return ave_backward


@njit(nogil=True)
def _max_backward_cpu(dtop, mask, plane_in, plane_out, dx, first, last):
    for pl in range(first, last):
        src = pl * plane_out
        dst = pl * plane_in
        for q in range(dst, dst + plane_in):
            dx[uint64(q)] = 0
        for q in range(src, src + plane_out):
            arg = mask[uint64(q)]
            if arg >= 0:
                dx[uint64(dst + arg)] += dtop[uint64(q)]


def max_forward(dtype, fixed_kh, fixed_kw):
    like, kernel = numpy.empty(0, dtype), _max_forward_kernel(fixed_kh, fixed_kw)

    def entry(x, x_count, height, width, kh, kw, ph, pw, sh, sw, oh, ow, top, mask, top_count, first, last):
        kernel(view(x, like, x_count), height, width, kh, kw, ph, pw, sh, sw, oh, ow, view(top, like, top_count),
               view(mask, _MASK, top_count), first, last)
    return entry, (types.int64,) * 17


def ave_forward(dtype, fixed_kh, fixed_kw):
    like, kernel = numpy.empty(0, dtype), _ave_forward_kernel(fixed_kh, fixed_kw)

    def entry(x, x_count, height, width, kh, kw, ph, pw, sh, sw, oh, ow, top, top_count, first, last):
        kernel(view(x, like, x_count), height, width, kh, kw, ph, pw, sh, sw, oh, ow, view(top, like, top_count),
               first, last)
    return entry, (types.int64,) * 16


def ave_backward(dtype, fixed_kh, fixed_kw):
    like, kernel = numpy.empty(0, dtype), _ave_backward_kernel(fixed_kh, fixed_kw)

    def entry(dtop, dtop_count, height, width, kh, kw, ph, pw, sh, sw, oh, ow, dx, dx_count, first, last):
        kernel(view(dtop, like, dtop_count), height, width, kh, kw, ph, pw, sh, sw, oh, ow, view(dx, like, dx_count),
               first, last)
    return entry, (types.int64,) * 16


def max_backward(dtype):
    like = numpy.empty(0, dtype)

    def entry(dtop, mask, dtop_count, plane_in, plane_out, dx, dx_count, first, last):
        _max_backward_cpu(view(dtop, like, dtop_count), view(mask, _MASK, dtop_count), plane_in, plane_out,
                          view(dx, like, dx_count), first, last)
    return entry, (types.int64,) * 9
