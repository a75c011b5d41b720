/* resample.c - the CPU backend's resampling kernels over NHWC images: nearest and bilinear 2x
 * upsampling (PyTorch F.interpolate(scale_factor=2) semantics, both align_corners) and
 * 2x2/stride-2 max pooling. Backwards are gathers, or scatters done serially per (image,
 * channel block) by one thread: deterministic, no atomics.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"

#define RESAMPLE_PAR_MIN 16384

/* x (N,H,W,C) -> y (N,2H,2W,C), y[2i+a][2j+b] = x[i][j] */
int cpu_upsample_nearest2x_fwd(float *y, const float *x, int n, int c, int h, int w,
                               bk_ctx *ctx)
{
    long rows = (long)n * h; /* input rows; each writes two output rows */
    size_t px = (size_t)c * sizeof(float), orow = (size_t)2 * w * c;
    int par = (size_t)rows * (size_t)w * c >= RESAMPLE_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * w * c;
        float *y0 = y + (size_t)r * 2 * orow, *y1 = y0 + orow;
        for (int j = 0; j < w; j++) {
            memcpy(y0 + (size_t)2 * j * c, xr + (size_t)j * c, px);
            memcpy(y0 + (size_t)(2 * j + 1) * c, xr + (size_t)j * c, px);
        }
        memcpy(y1, y0, orow * sizeof(float));
    }
    return BK_OK;
}

/* dx (N,H,W,C) (=/+=) sum of the 2x2 block of dy (N,2H,2W,C) over it (a gather) */
int cpu_upsample_nearest2x_bwd(float *dx, const float *dy, int accum, int n, int c, int h,
                               int w, bk_ctx *ctx)
{
    long rows = (long)n * h;
    size_t orow = (size_t)2 * w * c;
    int par = (size_t)rows * (size_t)w * c >= RESAMPLE_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++) {
        const float *g0 = dy + (size_t)r * 2 * orow, *g1 = g0 + orow;
        float *dr = dx + (size_t)r * w * c;
        for (int j = 0; j < w; j++) {
            const float *a = g0 + (size_t)2 * j * c, *b = a + c, *e = g1 + (size_t)2 * j * c,
                        *f = e + c;
            float *d = dr + (size_t)j * c;
            for (int k = 0; k < c; k++) {
                float v = (a[k] + b[k]) + (e[k] + f[k]);
                d[k] = accum ? d[k] + v : v;
            }
        }
    }
    return BK_OK;
}

/* PyTorch's area_pixel_compute_scale for scale_factor=2 (float, as its float kernels) */
static float bilinear_scale(int in, int out, int align_corners)
{
    if (align_corners) return out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f;
    return 0.5f; /* 1 / scale_factor, equal to in/out here */
}

/* Source taps and weights of output index dst, as PyTorch's area_pixel_compute_source_index
 * plus its linear-weight computation: src clamped at 0 (align_corners=False), i0 = floor(src),
 * i1 = i0 + 1 unless at the last input index, l1 = src - i0 clamped to [0,1], l0 = 1 - l1. */
static inline void bilinear_tap(int dst, int in, float scale, int align_corners, int *i0, int *i1,
                                float *l0, float *l1)
{
    float src = align_corners ? scale * (float)dst : scale * ((float)dst + 0.5f) - 0.5f;
    if (src < 0.0f) src = 0.0f;
    int i = (int)src; /* src >= 0: truncation is floor */
    if (i > in - 1) i = in - 1;
    float lam = src - (float)i;
    if (lam < 0.0f) lam = 0.0f;
    if (lam > 1.0f) lam = 1.0f;
    *i0 = i;
    *i1 = i < in - 1 ? i + 1 : i;
    *l1 = lam;
    *l0 = 1.0f - lam;
}

/* x (N,H,W,C) -> y (N,2H,2W,C) bilinear */
int cpu_upsample_bilinear2x_fwd(float *y, const float *x, int align_corners, int n, int c,
                                int h, int w, bk_ctx *ctx)
{
    int ho = 2 * h, wo = 2 * w;
    float sh = bilinear_scale(h, ho, align_corners), sw = bilinear_scale(w, wo, align_corners);
    long rows = (long)n * ho; /* output rows */
    int par = (size_t)rows * (size_t)wo * c >= RESAMPLE_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++) {
        long img = r / ho;
        int oy = (int)(r % ho);
        int y0, y1;
        float ly0, ly1;
        bilinear_tap(oy, h, sh, align_corners, &y0, &y1, &ly0, &ly1);
        const float *xr0 = x + ((size_t)img * h + y0) * w * c;
        const float *xr1 = x + ((size_t)img * h + y1) * w * c;
        float *yr = y + (size_t)r * wo * c;
        for (int ox = 0; ox < wo; ox++) {
            int x0, x1;
            float lx0, lx1;
            bilinear_tap(ox, w, sw, align_corners, &x0, &x1, &lx0, &lx1);
            const float *a = xr0 + (size_t)x0 * c, *b = xr0 + (size_t)x1 * c;
            const float *e = xr1 + (size_t)x0 * c, *f = xr1 + (size_t)x1 * c;
            float *o = yr + (size_t)ox * c;
            for (int k = 0; k < c; k++)
                o[k] = ly0 * (lx0 * a[k] + lx1 * b[k]) + ly1 * (lx0 * e[k] + lx1 * f[k]);
        }
    }
    return BK_OK;
}

#define RESAMPLE_CBLK 64

/* dx (N,H,W,C) (=/+=) from dy (N,2H,2W,C): each (image, 64-channel block) is scattered serially
 * by one thread in output row-major order, so the summation order is fixed. */
int cpu_upsample_bilinear2x_bwd(float *dx, const float *dy, int align_corners, int accum,
                                int n, int c, int h, int w, bk_ctx *ctx)
{
    int ho = 2 * h, wo = 2 * w;
    float sh = bilinear_scale(h, ho, align_corners), sw = bilinear_scale(w, wo, align_corners);
    int cblocks = (c + RESAMPLE_CBLK - 1) / RESAMPLE_CBLK;
    long tasks = (long)n * cblocks;
    int par = (size_t)n * c * (size_t)ho * (size_t)wo >= RESAMPLE_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long t = 0; t < tasks; t++) {
        long img = t / cblocks;
        int c0 = (int)(t % cblocks) * RESAMPLE_CBLK;
        int nc = c - c0 < RESAMPLE_CBLK ? c - c0 : RESAMPLE_CBLK;
        float *d = dx + (size_t)img * h * w * c + c0;
        const float *g = dy + (size_t)img * ho * wo * c + c0;
        if (!accum)
            for (size_t p = 0; p < (size_t)h * w; p++) memset(d + p * c, 0, (size_t)nc * sizeof(float));
        for (int oy = 0; oy < ho; oy++) {
            int y0, y1;
            float ly0, ly1;
            bilinear_tap(oy, h, sh, align_corners, &y0, &y1, &ly0, &ly1);
            float *d0 = d + (size_t)y0 * w * c, *d1 = d + (size_t)y1 * w * c;
            const float *gr = g + (size_t)oy * wo * c;
            for (int ox = 0; ox < wo; ox++) {
                int x0, x1;
                float lx0, lx1;
                bilinear_tap(ox, w, sw, align_corners, &x0, &x1, &lx0, &lx1);
                const float *v = gr + (size_t)ox * c;
                float *a = d0 + (size_t)x0 * c, *b = d0 + (size_t)x1 * c;
                float *e = d1 + (size_t)x0 * c, *f = d1 + (size_t)x1 * c;
                for (int k = 0; k < nc; k++) {
                    a[k] += ly0 * lx0 * v[k];
                    b[k] += ly0 * lx1 * v[k];
                    e[k] += ly1 * lx0 * v[k];
                    f[k] += ly1 * lx1 * v[k];
                }
            }
        }
    }
    return BK_OK;
}

/* Index (0..3, row-major in the window) of the window's maximum, as PyTorch's CPU max_pool2d:
 * a later value wins only if strictly greater, or if it is NaN (NaN propagates). */
static inline int maxpool_argmax(float v0, float v1, float v2, float v3, float *out)
{
    float v[4] = {v0, v1, v2, v3};
    float m = -INFINITY;
    int k = 0;
    for (int q = 0; q < 4; q++) {
        if (v[q] > m || isnan(v[q])) {
            m = v[q];
            k = q;
        }
    }
    *out = m;
    return k;
}

/* x (N,H,W,C) -> y (N,H/2,W/2,C) (floor: an odd last row/column is dropped) */
int cpu_maxpool2x2_fwd(float *y, const float *x, int n, int c, int h, int w, bk_ctx *ctx)
{
    int ho = h / 2, wo = w / 2;
    long rows = (long)n * ho;
    int par = (size_t)rows * (size_t)wo * c >= RESAMPLE_PAR_MIN / 4;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++) {
        long img = r / ho;
        int oy = (int)(r % ho);
        const float *r0 = x + ((size_t)img * h + 2 * oy) * w * c, *r1 = r0 + (size_t)w * c;
        float *yr = y + (size_t)r * wo * c;
        for (int j = 0; j < wo; j++) {
            const float *a = r0 + (size_t)2 * j * c, *b = a + c, *e = r1 + (size_t)2 * j * c,
                        *f = e + c;
            for (int k = 0; k < c; k++) maxpool_argmax(a[k], b[k], e[k], f[k], &yr[(size_t)j * c + k]);
        }
    }
    return BK_OK;
}

/* dx (N,H,W,C) (=/+=): dy goes to each window's argmax (recomputed from x), zero elsewhere,
 * including a dropped odd last row/column. A gather: each dx element is written once. */
int cpu_maxpool2x2_bwd(float *dx, const float *dy, const float *x, int accum, int n, int c,
                       int h, int w, bk_ctx *ctx)
{
    int ho = h / 2, wo = w / 2;
    long rows = (long)n * h; /* input rows */
    size_t row = (size_t)w * c;
    int par = (size_t)rows * row >= RESAMPLE_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++) {
        long img = r / h;
        int iy = (int)(r % h), oy = iy / 2;
        float *d = dx + (size_t)r * row;
        if (oy >= ho) { /* the dropped odd last row */
            if (!accum) memset(d, 0, row * sizeof(float));
            continue;
        }
        const float *r0 = x + ((size_t)img * h + 2 * oy) * row, *r1 = r0 + row;
        const float *gr = dy + ((size_t)img * ho + oy) * wo * c;
        int want_lo = (iy & 1) ? 2 : 0; /* window indices 0,1 are the top row, 2,3 the bottom */
        for (int j = 0; j < wo; j++) {
            const float *a = r0 + (size_t)2 * j * c, *b = a + c, *e = r1 + (size_t)2 * j * c,
                        *f = e + c;
            float *d0 = d + (size_t)2 * j * c, *d1 = d0 + c;
            for (int k = 0; k < c; k++) {
                float m;
                int q = maxpool_argmax(a[k], b[k], e[k], f[k], &m);
                float g = gr[(size_t)j * c + k];
                float v0 = q == want_lo ? g : 0.0f, v1 = q == want_lo + 1 ? g : 0.0f;
                if (accum) {
                    d0[k] += v0;
                    d1[k] += v1;
                } else {
                    d0[k] = v0;
                    d1[k] = v1;
                }
            }
        }
        if (!accum && (w & 1)) memset(d + (size_t)(w - 1) * c, 0, (size_t)c * sizeof(float));
    }
    return BK_OK;
}
