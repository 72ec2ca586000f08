"""GPU twins of kernels.im2col for cupy arrays: one thread per output element, compiled once by cupy.

Imported only when a cupy array reaches kernels.im2col, so CPU-only machines never import cupy.
Same layout as the CPU kernels: columns are (C*kh*kw, N, oh*ow).
"""
import cupy

# One thread per column element; reading x is a gather, writing col is fully coalesced.
_im2col_kernel = cupy.ElementwiseKernel(
    "raw T x, int32 n_img, int32 channels, int32 height, int32 width, int32 kh, int32 kw, "
    "int32 ph, int32 pw, int32 sh, int32 sw, int32 dh, int32 dw, int32 oh, int32 ow",
    "T col",
    """
    const int positions = oh * ow;
    const int p = i % positions;
    const int n = (i / positions) % n_img;
    const int row = i / (positions * n_img);
    const int kj = row % kw;
    const int ki = (row / kw) % kh;
    const int c = row / (kw * kh);
    const int y = (p / ow) * sh - ph + ki * dh;
    const int xx = (p % ow) * sw - pw + kj * dw;
    col = (y >= 0 && y < height && xx >= 0 && xx < width)
        ? x[((n * channels + c) * height + y) * width + xx] : (T)0;
    """,
    "scaffe_im2col",
)

# One thread per image element gathering every column entry that reads it: no atomics, deterministic.
_col2im_kernel = cupy.ElementwiseKernel(
    "raw T col, int32 n_img, int32 channels, int32 height, int32 width, int32 kh, int32 kw, "
    "int32 ph, int32 pw, int32 sh, int32 sw, int32 dh, int32 dw, int32 oh, int32 ow",
    "T dx",
    """
    const int xx = i % width;
    const int y = (i / width) % height;
    const int c = (i / (width * height)) % channels;
    const int n = i / (width * height * channels);
    const int positions = oh * ow;
    T acc = 0;
    for (int ki = 0; ki < kh; ++ki) {
        const int ys = y + ph - ki * dh;
        if (ys < 0 || ys % sh != 0) continue;
        const int oy = ys / sh;
        if (oy >= oh) continue;
        for (int kj = 0; kj < kw; ++kj) {
            const int xs = xx + pw - kj * dw;
            if (xs < 0 || xs % sw != 0) continue;
            const int ox = xs / sw;
            if (ox >= ow) continue;
            const int row = (c * kh + ki) * kw + kj;
            acc += col[(row * n_img + n) * positions + oy * ow + ox];
        }
    }
    dx = acc;
    """,
    "scaffe_col2im",
)


def im2col(x, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, col):
    n_img, channels, height, width = x.shape
    _im2col_kernel(x, n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, col)


def col2im(col, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, dx):
    n_img, channels, height, width = dx.shape
    _col2im_kernel(col, n_img, channels, height, width, kh, kw, ph, pw, sh, sw, dh, dw, oh, ow, dx)
