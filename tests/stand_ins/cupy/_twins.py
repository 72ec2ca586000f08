"""numpy twins of scaffe's GPU kernels, keyed by kernel name, for the stand-in's ElementwiseKernel and RawKernel.

Each twin is a line-by-line translation of its kernel's CUDA body, vectorised over the thread index `i`:
same index arithmetic, same summation order, arithmetic kept in the kernel's type T (a C `T / int` is a
T division); the index arithmetic of im2col and col2im is kept per geometry, as a training loop repeats it.
Raw arrays are read flat in C order, as cupy's raw indexing reads them; outputs are written
at their C-order flat index `i` (the kernel runs in blocks of `i`). The CUDA sources themselves are checked by
the NVRTC compile tests, not here.
"""
import functools

import numpy

TWINS = {}


def twin(name):
    def register(function):
        TWINS[name] = function
        return function
    return register


def _store(out, i, values):
    out.flat[i] = values


def _gather(raw, index, valid):
    return numpy.where(valid, raw.reshape(-1)[numpy.where(valid, index, 0)], raw.dtype.type(0))


@twin("scaffe_im2col")
def _im2col(i, x, n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, col):
    index, inside = _im2col_taps(i.size, n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow)
    _store(col, i, _gather(x, index, inside))


@functools.lru_cache(maxsize=8)
def _im2col_taps(threads, n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow):
    """(index, inside) of the kernel's gather for threads [0, threads), kept per geometry."""
    i = numpy.arange(threads, dtype=numpy.int64)
    positions = oh * ow
    p = i % positions
    n = (i // positions) % n_img
    row = i // (positions * n_img)
    kj = row % kw
    ki = (row // kw) % kh
    c = row // (kw * kh)
    y = (p // ow) * sh - ph + ki * dh
    xx = (p % ow) * sw - pw + kj * dw
    inside = (y >= 0) & (y < height) & (xx >= 0) & (xx < width)
    return ((n * channels + c) * height + y) * width + xx, inside


@twin("scaffe_col2im")
def _col2im(i, col, n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, dx):
    acc = numpy.zeros(i.shape, dtype=col.dtype)
    for index, ok in _col2im_taps(i.size, n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow):
        acc += _gather(col, index, ok)
    _store(dx, i, acc)


@functools.lru_cache(maxsize=8)
def _col2im_taps(threads, n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow):
    """(index, ok) of every tap in the kernel's order, for threads [0, threads), kept per geometry."""
    i = numpy.arange(threads, dtype=numpy.int64)
    xx = i % width
    y = (i // width) % height
    c = (i // (width * height)) % channels
    n = i // (width * height * channels)
    positions = oh * ow
    taps = []
    for ki in range(kh):
        ys = y + ph - ki * dh
        oy = ys // sh
        row_ok = (ys >= 0) & (ys % sh == 0) & (oy < oh)
        for kj in range(kw):
            xs = xx + pw - kj * dw
            ox = xs // sw
            ok = row_ok & (xs >= 0) & (xs % sw == 0) & (ox < ow)
            row = (c * kh + ki) * kw + kj
            taps.append(((row * n_img + n) * positions + oy * ow + ox, ok))
    return taps


@twin("scaffe_max_pool_forward")
def _max_pool_forward(i, x, channels, height, width, kh, kw, ph, pw, sh, sw, oh, ow, top, mask):
    px = i % ow
    py = (i // ow) % oh
    plane = i // (ow * oh)
    hs = py * sh - ph
    ws = px * sw - pw
    he = numpy.minimum(hs + kh, height)
    we = numpy.minimum(ws + kw, width)
    hs = numpy.maximum(hs, 0)
    ws = numpy.maximum(ws, 0)
    best = numpy.full(i.shape, -3.402823466e+38, dtype=x.dtype)
    arg = numpy.full(i.shape, -1, dtype=numpy.int32)
    base = plane * height * width
    # The window is at most kh x kw after clipping; walk it in the kernel's row-major order.
    for a in range(kh):
        h = hs + a
        for b in range(kw):
            w = ws + b
            inside = (h < he) & (w < we)
            value = _gather(x, base + h * width + w, inside)
            better = inside & (value > best)
            best = numpy.where(better, value, best)
            arg = numpy.where(better, h * width + w, arg).astype(numpy.int32)
    _store(top, i, best)
    _store(mask, i, arg)


@twin("scaffe_max_pool_backward")
def _max_pool_backward(i, dtop, mask, height, width, kh, kw, ph, pw, sh, sw, oh, ow, dx):
    w = i % width
    h = (i // width) % height
    plane = i // (width * height)
    phs = numpy.where(h + ph < kh, 0, (h + ph - kh) // sh + 1)
    phe = numpy.minimum((h + ph) // sh + 1, oh)
    pws = numpy.where(w + pw < kw, 0, (w + pw - kw) // sw + 1)
    pwe = numpy.minimum((w + pw) // sw + 1, ow)
    base = plane * oh * ow
    own = h * width + w
    acc = numpy.zeros(i.shape, dtype=dx.dtype)
    for a in range(_windows_covering(kh, sh)):
        py = phs + a
        for b in range(_windows_covering(kw, sw)):
            px = pws + b
            inside = (py < phe) & (px < pwe)
            at = base + py * ow + px
            hit = inside & (_gather(mask, at, inside) == own)
            acc += _gather(dtop, at, hit)
    _store(dx, i, acc)


@twin("scaffe_ave_pool_forward")
def _ave_pool_forward(i, x, height, width, kh, kw, ph, pw, sh, sw, oh, ow, top):
    px = i % ow
    py = (i // ow) % oh
    plane = i // (ow * oh)
    hs = py * sh - ph
    ws = px * sw - pw
    he = numpy.minimum(hs + kh, height + ph)
    we = numpy.minimum(ws + kw, width + pw)
    pool_size = (he - hs) * (we - ws)
    hs = numpy.maximum(hs, 0)
    ws = numpy.maximum(ws, 0)
    he = numpy.minimum(he, height)
    we = numpy.minimum(we, width)
    base = plane * height * width
    acc = numpy.zeros(i.shape, dtype=x.dtype)
    for a in range(kh):
        h = hs + a
        for b in range(kw):
            w = ws + b
            acc += _gather(x, base + h * width + w, (h < he) & (w < we))
    _store(top, i, acc / pool_size.astype(x.dtype))


@twin("scaffe_ave_pool_backward")
def _ave_pool_backward(i, dtop, height, width, kh, kw, ph, pw, sh, sw, oh, ow, dx):
    w = i % width + pw
    h = (i // width) % height + ph
    plane = i // (width * height)
    phs = numpy.where(h < kh, 0, (h - kh) // sh + 1)
    phe = numpy.minimum(h // sh + 1, oh)
    pws = numpy.where(w < kw, 0, (w - kw) // sw + 1)
    pwe = numpy.minimum(w // sw + 1, ow)
    base = plane * oh * ow
    acc = numpy.zeros(i.shape, dtype=dx.dtype)
    for a in range(_windows_covering(kh, sh)):
        py = phs + a
        for b in range(_windows_covering(kw, sw)):
            px = pws + b
            inside = (py < phe) & (px < pwe)
            hs = py * sh - ph
            ws = px * sw - pw
            he = numpy.minimum(hs + kh, height + ph)
            we = numpy.minimum(ws + kw, width + pw)
            divisor = numpy.where(inside, (he - hs) * (we - ws), 1).astype(dx.dtype)
            acc += numpy.where(inside, _gather(dtop, base + py * ow + px, inside) / divisor, dx.dtype.type(0))
    _store(dx, i, acc)


def _windows_covering(kernel, stride):
    """An upper bound on how many pooling windows along one axis contain a given cell."""
    return (kernel + stride - 1) // stride


from cupy import _solver_twins  # noqa: E402,F401 - registers the solvers' update twins


@twin("scaffe_softmax_loss_rows")
def _softmax_loss_rows(i, x, label, channels, inner, positions, chunk, has_ignore, ignore, row_max, row_sum,
                       part_loss, part_count, part_bad):
    # Vectorised over positions; each chunk's parts summed in its thread's order.
    t = x.dtype.type
    xs = x.reshape(-1)
    p = numpy.arange(positions)
    base = (p // inner) * channels * inner + p % inner
    top = xs[base]
    for c in range(1, channels):
        v = xs[base + c * inner]
        top = numpy.where((v > top) | (v != v), v, top)
    total = numpy.zeros(positions, dtype=x.dtype)
    for c in range(channels):
        total += numpy.exp(xs[base + c * inner] - top)
    row_max[:positions], row_sum[:positions] = top, total
    labels = label.reshape(-1)[:positions].astype(numpy.int64)
    valid = ~((has_ignore != 0) & (labels == ignore))
    bad = valid & ((labels < 0) | (labels >= channels))
    counted = valid & ~bad
    picked = numpy.exp(xs[base + numpy.where(counted, labels, 0) * inner] - top) / total
    floor = t(1.17549435082228751e-38)
    logs = numpy.where(counted, numpy.log(numpy.where(picked > floor, picked, floor)).astype(numpy.float64), 0.0)
    parts = i.size
    padded = parts * chunk - positions

    def by_chunk(values, fill):
        return numpy.concatenate([values, numpy.full(padded, fill, dtype=values.dtype)]).reshape(parts, chunk)

    loss, count, chunk_bad, chunk_labels = (by_chunk(logs, 0.0), by_chunk(valid.astype(numpy.float64), 0.0),
                                            by_chunk(bad, False), by_chunk(labels, 0))
    loss_sum, count_sum = numpy.zeros(parts), numpy.zeros(parts)
    for k in range(chunk):
        loss_sum += loss[:, k]
        count_sum += count[:, k]
    part_loss[:parts], part_count[:parts] = loss_sum, count_sum
    first = chunk_bad.argmax(axis=1)
    seen = chunk_bad.any(axis=1)
    part_bad[0:2 * parts:2] = numpy.where(seen, i * chunk + first, -1)
    part_bad[1:2 * parts:2] = numpy.where(seen, chunk_labels[i, first], 0)


@twin("scaffe_softmax_loss_prob")
def _softmax_loss_prob(i, x, channels, inner, row_max, row_sum, prob):
    p = (i // (inner * channels)) * inner + i % inner
    _store(prob, i, numpy.exp(x.reshape(-1)[i] - row_max[p]) / row_sum[p])


@twin("scaffe_softmax_loss_finish")
def _softmax_loss_finish(i, part_loss, part_count, part_bad, parts, count_valid, fixed_norm, top, norm, check):
    loss = counted = numpy.float64(0.0)
    for k in range(parts):
        loss += part_loss[k]
        counted += part_count[k]
    n = counted if count_valid else numpy.float64(fixed_norm)
    n = numpy.float64(1.0) if n < 1.0 else n
    norm[0] = n
    top.reshape(-1)[0] = top.dtype.type(-loss / n)
    for k in range(parts):
        if check[0] != 0:
            break
        if part_bad[2 * k] >= 0:
            check[0], check[1] = 1, part_bad[2 * k + 1]


@twin("scaffe_softmax_loss_backward")
def _softmax_loss_backward(i, prob, label, channels, inner, has_ignore, ignore, top_diff, norm, dx):
    c = (i // inner) % channels
    labels = label.reshape(-1)[(i // (inner * channels)) * inner + i % inner].astype(numpy.int64)
    valid = ~((has_ignore != 0) & (labels == ignore)) & (labels >= 0) & (labels < channels)
    t = dx.dtype.type
    scale = t(numpy.float64(top_diff.reshape(-1)[0]) / norm[0])
    one_hot = numpy.where(c == labels, t(1), t(0))
    _store(dx, i, numpy.where(valid, (prob.reshape(-1)[i] - one_hot) * scale, t(0)))


@twin("scaffe_relu_backward")
def _relu_backward(i, y, dy, dx):
    _store(dx, i, dy.reshape(-1)[i] * (y.reshape(-1)[i] > 0).astype(dx.dtype))


def _lrn_windows(i, channels, inner, size, dtype, term):
    """(at, window) for each channel in turn: the kernels' sums of term(at) over a channel's `size` neighbours."""
    base, pre = (i // inner) * channels * inner + i % inner, (size - 1) // 2
    for c in range(channels):
        window = numpy.zeros(i.size, dtype=dtype)
        for j in range(size):
            if 0 <= c - pre + j < channels:
                window += term(base + (c - pre + j) * inner)
        yield base + c * inner, window


@twin("scaffe_lrn_forward")
def _lrn_forward(i, x, channels, inner, size, alpha_over, k, beta, scale, y):
    t, xs = x.dtype.type, x.reshape(-1)
    for at, window in _lrn_windows(i, channels, inner, size, x.dtype, lambda at: xs[at] * xs[at]):
        s = window * t(alpha_over) + t(k)
        scale.flat[at] = s
        y.flat[at] = numpy.power(s, t(-beta)) * xs[at]


@twin("scaffe_lrn_backward")
def _lrn_backward(i, x, y, scale, dy, channels, inner, size, ratio_coef, beta, dx):
    t = x.dtype.type
    xs, ys, ss, ds = x.reshape(-1), y.reshape(-1), scale.reshape(-1), dy.reshape(-1)
    for at, window in _lrn_windows(i, channels, inner, size, x.dtype, lambda at: ds[at] * ys[at] / ss[at]):
        dx.flat[at] = numpy.power(ss[at], t(-beta)) * ds[at] - window * xs[at] * t(ratio_coef)
