"""GPU twins of kernels.pooling for cupy arrays, compiled once by cupy; imported only for cupy inputs.

Forward runs one thread per output; backward one thread per input element that gathers from every
window covering it, so there are no atomics and the result does not depend on scheduling.
"""
import cupy

_max_forward_kernel = cupy.ElementwiseKernel(
    "raw T x, int32 channels, int32 height, int32 width, int32 kh, int32 kw, int32 ph, int32 pw, "
    "int32 sh, int32 sw, int32 oh, int32 ow",
    "T top, int32 mask",
    """
    const int px = i % ow;
    const int py = (i / ow) % oh;
    const int plane = i / (ow * oh);
    int hs = py * sh - ph;
    int ws = px * sw - pw;
    const int he = min(hs + kh, height);
    const int we = min(ws + kw, width);
    hs = max(hs, 0);
    ws = max(ws, 0);
    T best = (T)-3.402823466e+38;  // -FLT_MAX, as Caffe starts; NVRTC has no <cfloat>
    int arg = -1;
    const T* src = &x[0] + (long long)plane * height * width;
    for (int h = hs; h < he; ++h) {
        for (int w = ws; w < we; ++w) {
            if (src[h * width + w] > best) {
                best = src[h * width + w];
                arg = h * width + w;
            }
        }
    }
    top = best;
    mask = arg;
    """,
    "scaffe_max_pool_forward",
)

_max_backward_kernel = cupy.ElementwiseKernel(
    "raw T dtop, raw int32 mask, int32 height, int32 width, int32 kh, int32 kw, int32 ph, int32 pw, "
    "int32 sh, int32 sw, int32 oh, int32 ow",
    "T dx",
    """
    const int w = i % width;
    const int h = (i / width) % height;
    const int plane = i / (width * height);
    const int phs = (h + ph < kh) ? 0 : (h + ph - kh) / sh + 1;
    const int phe = min((h + ph) / sh + 1, oh);
    const int pws = (w + pw < kw) ? 0 : (w + pw - kw) / sw + 1;
    const int pwe = min((w + pw) / sw + 1, ow);
    const long long base = (long long)plane * oh * ow;
    const int self = h * width + w;
    T acc = 0;
    for (int py = phs; py < phe; ++py)
        for (int px = pws; px < pwe; ++px)
            if (mask[base + py * ow + px] == self) acc += dtop[base + py * ow + px];
    dx = acc;
    """,
    "scaffe_max_pool_backward",
)

_ave_forward_kernel = cupy.ElementwiseKernel(
    "raw T x, int32 height, int32 width, int32 kh, int32 kw, int32 ph, int32 pw, "
    "int32 sh, int32 sw, int32 oh, int32 ow",
    "T top",
    """
    const int px = i % ow;
    const int py = (i / ow) % oh;
    const int plane = i / (ow * oh);
    int hs = py * sh - ph;
    int ws = px * sw - pw;
    int he = min(hs + kh, height + ph);
    int we = min(ws + kw, width + pw);
    const int pool_size = (he - hs) * (we - ws);
    hs = max(hs, 0);
    ws = max(ws, 0);
    he = min(he, height);
    we = min(we, width);
    const T* src = &x[0] + (long long)plane * height * width;
    T acc = 0;
    for (int h = hs; h < he; ++h)
        for (int w = ws; w < we; ++w)
            acc += src[h * width + w];
    top = acc / pool_size;
    """,
    "scaffe_ave_pool_forward",
)

_ave_backward_kernel = cupy.ElementwiseKernel(
    "raw T dtop, int32 height, int32 width, int32 kh, int32 kw, int32 ph, int32 pw, "
    "int32 sh, int32 sw, int32 oh, int32 ow",
    "T dx",
    """
    const int w = i % width + pw;
    const int h = (i / width) % height + ph;
    const int plane = i / (width * height);
    const int phs = (h < kh) ? 0 : (h - kh) / sh + 1;
    const int phe = min(h / sh + 1, oh);
    const int pws = (w < kw) ? 0 : (w - kw) / sw + 1;
    const int pwe = min(w / sw + 1, ow);
    const long long base = (long long)plane * oh * ow;
    T acc = 0;
    for (int py = phs; py < phe; ++py) {
        for (int px = pws; px < pwe; ++px) {
            const int hs = py * sh - ph;
            const int ws = px * sw - pw;
            const int he = min(hs + kh, height + ph);
            const int we = min(ws + kw, width + pw);
            acc += dtop[base + py * ow + px] / ((he - hs) * (we - ws));
        }
    }
    dx = acc;
    """,
    "scaffe_ave_pool_backward",
)


def max_forward(x, kh, kw, ph, pw, sh, sw, oh, ow, top, mask):
    _max_forward_kernel(x, x.shape[1], x.shape[2], x.shape[3], kh, kw, ph, pw, sh, sw, oh, ow, top, mask)


def max_backward(dtop, mask, kh, kw, ph, pw, sh, sw, dx):
    oh, ow = dtop.shape[2], dtop.shape[3]
    _max_backward_kernel(dtop, mask, dx.shape[2], dx.shape[3], kh, kw, ph, pw, sh, sw, oh, ow, dx)


def ave_forward(x, kh, kw, ph, pw, sh, sw, oh, ow, top):
    _ave_forward_kernel(x, x.shape[2], x.shape[3], kh, kw, ph, pw, sh, sw, oh, ow, top)


def ave_backward(dtop, kh, kw, ph, pw, sh, sw, dx):
    oh, ow = dtop.shape[2], dtop.shape[3]
    _ave_backward_kernel(dtop, dx.shape[2], dx.shape[3], kh, kw, ph, pw, sh, sw, oh, ow, dx)
