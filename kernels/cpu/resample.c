/* resample.c - the CPU backend's resampling kernels: nearest and bilinear 2x upsampling (PyTorch
 * F.interpolate(scale_factor=2) semantics, both align_corners) and 2x2/stride-2 max pooling.
 * Backwards are gathers or serial per-(n,c)-plane scatters: deterministic, no atomics.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"

#define RESAMPLE_PAR_MIN 16384

/* x (N,C,H,W) -> y (N,C,2H,2W), y[2i+a][2j+b] = x[i][j] */
int cpu_upsample_nearest2x_fwd(float *y, const float *x, int n, int c, int h, int w,
                               bk_ctx *ctx)
{
    long rows = (long)n * c * h; /* input rows; each writes two output rows */
    int wo = 2 * w;
    int par = (size_t)rows * (size_t)w >= RESAMPLE_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * w;
        float *y0 = y + (size_t)r * 2 * wo, *y1 = y0 + wo;
        for (int j = 0; j < w; j++) {
            y0[2 * j] = xr[j];
            y0[2 * j + 1] = xr[j];
        }
        memcpy(y1, y0, (size_t)wo * sizeof(float));
    }
    return BK_OK;
}

/* dx (N,C,H,W) (=/+=) sum of the 2x2 block of dy (N,C,2H,2W) over it (a gather) */
int cpu_upsample_nearest2x_bwd(float *dx, const float *dy, int accum, int n, int c, int h,
                               int w, bk_ctx *ctx)
{
    long rows = (long)n * c * h;
    int wo = 2 * w;
    int par = (size_t)rows * (size_t)w >= RESAMPLE_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++) {
        const float *g0 = dy + (size_t)r * 2 * wo, *g1 = g0 + wo;
        float *dr = dx + (size_t)r * w;
        for (int j = 0; j < w; j++) {
            float s = (g0[2 * j] + g0[2 * j + 1]) + (g1[2 * j] + g1[2 * j + 1]);
            dr[j] = accum ? dr[j] + s : s;
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

/* x (N,C,H,W) -> y (N,C,2H,2W) bilinear */
int cpu_upsample_bilinear2x_fwd(float *y, const float *x, int align_corners, int n, int c,
                                int h, int w, bk_ctx *ctx)
{
    int ho = 2 * h, wo = 2 * w;
    float sh = bilinear_scale(h, ho, align_corners), sw = bilinear_scale(w, wo, align_corners);
    long rows = (long)n * c * ho; /* output rows */
    int par = (size_t)rows * (size_t)wo >= RESAMPLE_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++) {
        long plane = r / ho;
        int oy = (int)(r % ho);
        int y0, y1;
        float ly0, ly1;
        bilinear_tap(oy, h, sh, align_corners, &y0, &y1, &ly0, &ly1);
        const float *xr0 = x + ((size_t)plane * h + y0) * w;
        const float *xr1 = x + ((size_t)plane * h + y1) * w;
        float *yr = y + (size_t)r * wo;
        for (int ox = 0; ox < wo; ox++) {
            int x0, x1;
            float lx0, lx1;
            bilinear_tap(ox, w, sw, align_corners, &x0, &x1, &lx0, &lx1);
            yr[ox] = ly0 * (lx0 * xr0[x0] + lx1 * xr0[x1]) +
                     ly1 * (lx0 * xr1[x0] + lx1 * xr1[x1]);
        }
    }
    return BK_OK;
}

/* dx (N,C,H,W) (=/+=) from dy (N,C,2H,2W): each (n,c) plane is scattered serially by one
 * thread in output row-major order, so the summation order is fixed. */
int cpu_upsample_bilinear2x_bwd(float *dx, const float *dy, int align_corners, int accum,
                                int n, int c, int h, int w, bk_ctx *ctx)
{
    int ho = 2 * h, wo = 2 * w;
    float sh = bilinear_scale(h, ho, align_corners), sw = bilinear_scale(w, wo, align_corners);
    long planes = (long)n * c;
    int par = (size_t)planes * (size_t)ho * (size_t)wo >= RESAMPLE_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long pl = 0; pl < planes; pl++) {
        float *d = dx + (size_t)pl * h * w;
        const float *g = dy + (size_t)pl * ho * wo;
        if (!accum) memset(d, 0, (size_t)h * w * sizeof(float));
        for (int oy = 0; oy < ho; oy++) {
            int y0, y1;
            float ly0, ly1;
            bilinear_tap(oy, h, sh, align_corners, &y0, &y1, &ly0, &ly1);
            float *d0 = d + (size_t)y0 * w, *d1 = d + (size_t)y1 * w;
            const float *gr = g + (size_t)oy * wo;
            for (int ox = 0; ox < wo; ox++) {
                int x0, x1;
                float lx0, lx1;
                bilinear_tap(ox, w, sw, align_corners, &x0, &x1, &lx0, &lx1);
                float v = gr[ox];
                d0[x0] += ly0 * lx0 * v;
                d0[x1] += ly0 * lx1 * v;
                d1[x0] += ly1 * lx0 * v;
                d1[x1] += ly1 * lx1 * v;
            }
        }
    }
    return BK_OK;
}

/* Index (0..3, row-major in the window) of the window's maximum, as PyTorch's CPU max_pool2d:
 * a later value wins only if strictly greater, or if it is NaN (NaN propagates). */
static inline int maxpool_argmax(const float *r0, const float *r1, int j, float *out)
{
    float v[4] = {r0[2 * j], r0[2 * j + 1], r1[2 * j], r1[2 * j + 1]};
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

/* x (N,C,H,W) -> y (N,C,H/2,W/2) (floor: an odd last row/column is dropped) */
int cpu_maxpool2x2_fwd(float *y, const float *x, int n, int c, int h, int w, bk_ctx *ctx)
{
    int ho = h / 2, wo = w / 2;
    long rows = (long)n * c * ho;
    int par = (size_t)rows * (size_t)wo >= RESAMPLE_PAR_MIN / 4;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++) {
        long plane = r / ho;
        int oy = (int)(r % ho);
        const float *r0 = x + ((size_t)plane * h + 2 * oy) * w, *r1 = r0 + w;
        float *yr = y + (size_t)r * wo;
        for (int j = 0; j < wo; j++) maxpool_argmax(r0, r1, j, &yr[j]);
    }
    return BK_OK;
}

/* dx (N,C,H,W) (=/+=): dy goes to each window's argmax (recomputed from x), zero elsewhere,
 * including a dropped odd last row/column. A gather: each dx element is written once. */
int cpu_maxpool2x2_bwd(float *dx, const float *dy, const float *x, int accum, int n, int c,
                       int h, int w, bk_ctx *ctx)
{
    int ho = h / 2, wo = w / 2;
    long planes = (long)n * c;
    int par = (size_t)planes * (size_t)h * (size_t)w >= RESAMPLE_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long pl = 0; pl < planes; pl++) {
        const float *xp = x + (size_t)pl * h * w;
        const float *gp = dy + (size_t)pl * ho * wo;
        float *dp = dx + (size_t)pl * h * w;
        for (int oy = 0; oy < ho; oy++) {
            const float *r0 = xp + (size_t)2 * oy * w, *r1 = r0 + w;
            float *d0 = dp + (size_t)2 * oy * w, *d1 = d0 + w;
            const float *gr = gp + (size_t)oy * wo;
            for (int j = 0; j < wo; j++) {
                float m;
                int k = maxpool_argmax(r0, r1, j, &m);
                float g = gr[j];
                float v0 = k == 0 ? g : 0.0f, v1 = k == 1 ? g : 0.0f;
                float v2 = k == 2 ? g : 0.0f, v3 = k == 3 ? g : 0.0f;
                if (accum) {
                    d0[2 * j] += v0;
                    d0[2 * j + 1] += v1;
                    d1[2 * j] += v2;
                    d1[2 * j + 1] += v3;
                } else {
                    d0[2 * j] = v0;
                    d0[2 * j + 1] = v1;
                    d1[2 * j] = v2;
                    d1[2 * j + 1] = v3;
                }
            }
            if (!accum && (w & 1)) {
                d0[w - 1] = 0.0f;
                d1[w - 1] = 0.0f;
            }
        }
        if (!accum && (h & 1)) memset(dp + (size_t)(h - 1) * w, 0, (size_t)w * sizeof(float));
    }
    return BK_OK;
}
