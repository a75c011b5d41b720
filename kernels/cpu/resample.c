/* resample.c - the CPU backend's resampling kernels over NHWC images: nearest and bilinear 2x
 * upsampling (PyTorch F.interpolate(scale_factor=2) semantics, both align_corners) and
 * 2x2/stride-2 max pooling, on fp32 and (typed.h) 16-bit elements. Backwards are gathers, or
 * scatters done serially per (image, channel block) by one thread: deterministic, no atomics.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "typed.h"
#include "vmath.h"

#define RESAMPLE_PAR_MIN 16384

/* input row r of nearest_fwd */
TY_INLINE int nearest_fwd_row(long r, void *y, const void *x, int c, int w, int dt)
{
    const size_t px = (size_t)c * bk_dtype_size(dt), orow = (size_t)2 * w * c;
    const size_t xr = (size_t)r * w * c, y0 = (size_t)r * 2 * orow;
    for (int j = 0; j < w; j++) {
        memcpy(ty_at(y, y0 + (size_t)2 * j * c, dt), ty_at(x, xr + (size_t)j * c, dt), px);
        memcpy(ty_at(y, y0 + (size_t)(2 * j + 1) * c, dt), ty_at(x, xr + (size_t)j * c, dt),
               px);
    }
    memcpy(ty_at(y, y0 + orow, dt), ty_at(y, y0, dt), orow * bk_dtype_size(dt));
    return BK_OK;
}

/* x (N,H,W,C) -> y (N,2H,2W,C), y[2i+a][2j+b] = x[i][j]; of dtype dt */
static int nearest_fwd(void *y, const void *x, int n, int c, int h, int w, bk_ctx *ctx, int dt)
{
    if (!ty_valid(dt)) return BK_ERR_INVALID;
    long rows = (long)n * h; /* input rows; each writes two output rows */
    int par = (size_t)rows * (size_t)w * c >= RESAMPLE_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++)
        TY_DISPATCH_IN(dt, nearest_fwd_row, r, y, x, c, w);
    return BK_OK;
}

int cpu_upsample_nearest2x_fwd(float *y, const float *x, int n, int c, int h, int w,
                               bk_ctx *ctx)
{
    return nearest_fwd(y, x, n, c, h, w, ctx, BK_DTYPE_F32);
}

int cpu_t_upsample_nearest2x_fwd(void *y, const void *x, int n, int c, int h, int w, int dtype,
                                 bk_ctx *ctx)
{
    return nearest_fwd(y, x, n, c, h, w, ctx, dtype);
}

/* input row r of nearest_bwd */
TY_INLINE int nearest_bwd_row(long r, void *dx, const void *dy, int accum, int c, int w, int dt)
{
    const size_t orow = (size_t)2 * w * c;
    const size_t g0 = (size_t)r * 2 * orow, g1 = g0 + orow, dr = (size_t)r * w * c;
    for (int j = 0; j < w; j++) {
        const size_t a = g0 + (size_t)2 * j * c, b = a + c, e = g1 + (size_t)2 * j * c,
                     f = e + c, d = dr + (size_t)j * c;
        for (int k = 0; k < c; k++) {
            float v = (ty_ld(dy, a + k, dt) + ty_ld(dy, b + k, dt)) +
                      (ty_ld(dy, e + k, dt) + ty_ld(dy, f + k, dt));
            ty_st(dx, d + k, accum ? ty_ld(dx, d + k, dt) + v : v, dt);
        }
    }
    return BK_OK;
}

/* dx (N,H,W,C) (=/+=) sum of the 2x2 block of dy (N,2H,2W,C) over it (a gather); of dtype dt */
static int nearest_bwd(void *dx, const void *dy, int accum, int n, int c, int h, int w,
                       bk_ctx *ctx, int dt)
{
    if (!ty_valid(dt)) return BK_ERR_INVALID;
    long rows = (long)n * h;
    int par = (size_t)rows * (size_t)w * c >= RESAMPLE_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++)
        TY_DISPATCH_IN(dt, nearest_bwd_row, r, dx, dy, accum, c, w);
    return BK_OK;
}

int cpu_upsample_nearest2x_bwd(float *dx, const float *dy, int accum, int n, int c, int h,
                               int w, bk_ctx *ctx)
{
    return nearest_bwd(dx, dy, accum, n, c, h, w, ctx, BK_DTYPE_F32);
}

int cpu_t_upsample_nearest2x_bwd(void *dx, const void *dy, int accum, int n, int c, int h, int w,
                                 int dtype, bk_ctx *ctx)
{
    return nearest_bwd(dx, dy, accum, n, c, h, w, ctx, dtype);
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

/* one output pixel's gradient v (nc channels) scattered onto its four input taps a (y0,x0),
 * b (y0,x1), e (y1,x0), f (y1,x1) with the bilinear weights; the fp32 and 16-bit backward share
 * it so they sum in the same order */
static inline void bilinear_scatter(float *a, float *b, float *e, float *f, const float *v,
                                    int nc, float ly0, float ly1, float lx0, float lx1)
{
    for (int k = 0; k < nc; k++) {
        a[k] += ly0 * lx0 * v[k];
        b[k] += ly0 * lx1 * v[k];
        e[k] += ly1 * lx0 * v[k];
        f[k] += ly1 * lx1 * v[k];
    }
}

/* output row r of bilinear_fwd */
TY_INLINE int bilinear_fwd_row(long r, void *y, const void *x, int align_corners, int c, int h,
                              int w, float sh, float sw, int dt)
{
    const int ho = 2 * h, wo = 2 * w;
    long img = r / ho;
    int oy = (int)(r % ho);
    int y0, y1;
    float ly0, ly1;
    bilinear_tap(oy, h, sh, align_corners, &y0, &y1, &ly0, &ly1);
    const size_t xr0 = ((size_t)img * h + y0) * w * c, xr1 = ((size_t)img * h + y1) * w * c;
    const size_t yr = (size_t)r * wo * c;
    for (int ox = 0; ox < wo; ox++) {
        int x0, x1;
        float lx0, lx1;
        bilinear_tap(ox, w, sw, align_corners, &x0, &x1, &lx0, &lx1);
        const size_t a = xr0 + (size_t)x0 * c, b = xr0 + (size_t)x1 * c;
        const size_t e = xr1 + (size_t)x0 * c, f = xr1 + (size_t)x1 * c;
        const size_t o = yr + (size_t)ox * c;
#pragma omp simd
        for (int k = 0; k < c; k++)
            ty_st(y, o + k,
                  ly0 * (lx0 * ty_ld(x, a + k, dt) + lx1 * ty_ld(x, b + k, dt)) +
                      ly1 * (lx0 * ty_ld(x, e + k, dt) + lx1 * ty_ld(x, f + k, dt)),
                  dt);
    }
    return BK_OK;
}

/* x (N,H,W,C) -> y (N,2H,2W,C) bilinear, of dtype dt */
static int bilinear_fwd(void *y, const void *x, int align_corners, int n, int c, int h, int w,
                        bk_ctx *ctx, int dt)
{
    if (!ty_valid(dt)) return BK_ERR_INVALID;
    int ho = 2 * h, wo = 2 * w;
    float sh = bilinear_scale(h, ho, align_corners), sw = bilinear_scale(w, wo, align_corners);
    long rows = (long)n * ho; /* output rows */
    int par = (size_t)rows * (size_t)wo * c >= RESAMPLE_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++)
        TY_DISPATCH_IN(dt, bilinear_fwd_row, r, y, x, align_corners, c, h, w, sh, sw);
    return BK_OK;
}

int cpu_upsample_bilinear2x_fwd(float *y, const float *x, int align_corners, int n, int c,
                                int h, int w, bk_ctx *ctx)
{
    return bilinear_fwd(y, x, align_corners, n, c, h, w, ctx, BK_DTYPE_F32);
}

int cpu_t_upsample_bilinear2x_fwd(void *y, const void *x, int align_corners, int n, int c, int h,
                                  int w, int dtype, bk_ctx *ctx)
{
    return bilinear_fwd(y, x, align_corners, n, c, h, w, ctx, dtype);
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
                bilinear_scatter(d0 + (size_t)x0 * c, d0 + (size_t)x1 * c, d1 + (size_t)x0 * c,
                                 d1 + (size_t)x1 * c, v, nc, ly0, ly1, lx0, lx1);
            }
        }
    }
    return BK_OK;
}

/* floats of the 16-bit backward's rows of one (image, channel block) task (typed: the row
 * window below); its channel block shrinks to fit wide images */
#define RESAMPLE_ROW_FLOATS 8192

/* task t of bilinear_bwd16: image t / cblocks, channel block t % cblocks */
TY_INLINE int bilinear_bwd16_task(long t, void *dx, const void *dy, int align_corners, int accum,
                                  int c, int h, int w, float sh, float sw, int cb, int cblocks,
                                  int dt)
{
    const int ho = 2 * h, wo = 2 * w;
    long img = t / cblocks;
    int c0 = (int)(t % cblocks) * cb;
    int nc = c - c0 < cb ? c - c0 : cb;
    const size_t d = (size_t)img * h * w * c + c0, g = (size_t)img * ho * wo * c + c0;
    float win[RESAMPLE_ROW_FLOATS]; /* rows iy % 3, each w x nc */
    int made = 0, done = 0;         /* rows [done, made) are in the window */
#define BB_ROW(iy) (win + (size_t)((iy) % 3) * w * nc)
#define BB_MAKE(iy)                                                                                \
    do {                                                                                           \
        float *rw_ = BB_ROW(iy);                                                                   \
        for (int j_ = 0; j_ < w; j_++)                                                             \
            for (int k_ = 0; k_ < nc; k_++)                                                        \
                rw_[(size_t)j_ * nc + k_] =                                                        \
                    accum ? ty_ld(dx, d + ((size_t)(iy) * w + j_) * c + k_, dt) : 0.0f;            \
    } while (0)
#define BB_DONE(iy)                                                                                \
    do {                                                                                           \
        const float *rw_ = BB_ROW(iy);                                                             \
        for (int j_ = 0; j_ < w; j_++)                                                             \
            for (int k_ = 0; k_ < nc; k_++)                                                        \
                ty_st(dx, d + ((size_t)(iy) * w + j_) * c + k_, rw_[(size_t)j_ * nc + k_], dt);    \
    } while (0)
    for (int oy = 0; oy < ho; oy++) {
        int y0, y1;
        float ly0, ly1;
        bilinear_tap(oy, h, sh, align_corners, &y0, &y1, &ly0, &ly1);
        for (; done < y0; done++) {
            if (done >= made) {
                BB_MAKE(made);
                made++;
            }
            BB_DONE(done);
        }
        for (; made <= y1; made++) BB_MAKE(made);
        float *d0 = BB_ROW(y0), *d1 = BB_ROW(y1);
        const size_t gr = g + (size_t)oy * wo * c;
        for (int ox = 0; ox < wo; ox++) {
            int x0, x1;
            float lx0, lx1;
            bilinear_tap(ox, w, sw, align_corners, &x0, &x1, &lx0, &lx1);
            float v[RESAMPLE_CBLK];
            cpu_convert_run(v, BK_DTYPE_F32, ty_at(dy, gr + (size_t)ox * c, dt), dt,
                            (size_t)nc);
            bilinear_scatter(d0 + (size_t)x0 * nc, d0 + (size_t)x1 * nc, d1 + (size_t)x0 * nc,
                             d1 + (size_t)x1 * nc, v, nc, ly0, ly1, lx0, lx1);
        }
    }
    for (; done < h; done++) {
        if (done >= made) {
            BB_MAKE(made);
            made++;
        }
        BB_DONE(done);
    }
#undef BB_ROW
#undef BB_MAKE
#undef BB_DONE
    return BK_OK;
}

/* The same on 16-bit dx, dy of dtype dt: dx's rows are summed in fp32 in a window of three
 * rows on the stack, in the fp32 kernel's order (output row-major), from dx's stored values
 * (accum) or 0, and each is rounded once when no later output row reaches it (a 2x upsample's
 * taps y0 <= y1 <= y0 + 1 rise by at most one per output row): the fp32 kernel's bits on
 * converted operands. */
static int bilinear_bwd16(void *dx, const void *dy, int align_corners, int accum, int n, int c,
                          int h, int w, bk_ctx *ctx, int dt)
{
    if (!ty_valid(dt)) return BK_ERR_INVALID;
    int ho = 2 * h, wo = 2 * w;
    float sh = bilinear_scale(h, ho, align_corners), sw = bilinear_scale(w, wo, align_corners);
    int cb = RESAMPLE_ROW_FLOATS / 3 / w;
    cb = cb > RESAMPLE_CBLK ? RESAMPLE_CBLK : cb;
    if (cb < 1) return BK_ERR_INVALID;
    int cblocks = (c + cb - 1) / cb;
    long tasks = (long)n * cblocks;
    int par = (size_t)n * c * (size_t)ho * (size_t)wo >= RESAMPLE_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long t = 0; t < tasks; t++)
        TY_DISPATCH_IN(dt, bilinear_bwd16_task, t, dx, dy, align_corners, accum, c, h, w, sh, sw,
                       cb, cblocks);
    return BK_OK;
}

int cpu_t_upsample_bilinear2x_bwd(void *dx, const void *dy, int align_corners, int accum, int n,
                                  int c, int h, int w, int dtype, bk_ctx *ctx)
{
    if (dtype == BK_DTYPE_F32)
        return cpu_upsample_bilinear2x_bwd(dx, dy, align_corners, accum, n, c, h, w, ctx);
    if (dtype == BK_DTYPE_BF16)
        return bilinear_bwd16(dx, dy, align_corners, accum, n, c, h, w, ctx, BK_DTYPE_BF16);
    if (dtype == BK_DTYPE_F16)
        return bilinear_bwd16(dx, dy, align_corners, accum, n, c, h, w, ctx, BK_DTYPE_F16);
    return BK_ERR_INVALID;
}

/* Index (0..3, row-major in the window) of the window's maximum, as PyTorch's CPU max_pool2d:
 * a later value wins only if strictly greater, or if it is NaN (NaN propagates). Selects by
 * integer masks, no branch, so that the channel loops calling it vectorize (vmath.h). */
/* one step of maxpool_argmax's scan: v at index q replaces the maximum m so far (and its index
 * k) if greater, or NaN */
static inline void maxpool_take(float *m, uint32_t *k, float v, uint32_t q)
{
    const uint32_t t = (uint32_t)0 - (uint32_t)(isgreater(v, *m) | isnan(v));
    *m = vm_bits_to_f((vm_f_to_bits(v) & t) | (vm_f_to_bits(*m) & ~t));
    *k = (q & t) | (*k & ~t);
}

static inline int maxpool_argmax(float v0, float v1, float v2, float v3, float *out)
{
    float m = v0; /* what the scan from -inf keeps after v0, v0 = -inf included */
    uint32_t k = 0;
    maxpool_take(&m, &k, v1, 1);
    maxpool_take(&m, &k, v2, 2);
    maxpool_take(&m, &k, v3, 3);
    *out = m;
    return (int)k;
}

/* output row r of maxpool_fwd */
TY_INLINE int maxpool_fwd_row(long r, void *y, const void *x, int c, int h, int w, int dt)
{
    const int ho = h / 2, wo = w / 2;
    long img = r / ho;
    int oy = (int)(r % ho);
    const size_t r0 = ((size_t)img * h + 2 * oy) * w * c, r1 = r0 + (size_t)w * c;
    const size_t yr = (size_t)r * wo * c;
    for (int j = 0; j < wo; j++) {
        const size_t a = r0 + (size_t)2 * j * c, b = a + c, e = r1 + (size_t)2 * j * c,
                     f = e + c;
#pragma omp simd
        for (int k = 0; k < c; k++) {
            float m;
            maxpool_argmax(ty_ld(x, a + k, dt), ty_ld(x, b + k, dt), ty_ld(x, e + k, dt),
                           ty_ld(x, f + k, dt), &m);
            ty_st(y, yr + (size_t)j * c + k, m, dt);
        }
    }
    return BK_OK;
}

/* x (N,H,W,C) -> y (N,H/2,W/2,C) (floor: an odd last row/column is dropped); of dtype dt */
static int maxpool_fwd(void *y, const void *x, int n, int c, int h, int w, bk_ctx *ctx, int dt)
{
    if (!ty_valid(dt)) return BK_ERR_INVALID;
    int ho = h / 2, wo = w / 2;
    long rows = (long)n * ho;
    int par = (size_t)rows * (size_t)wo * c >= RESAMPLE_PAR_MIN / 4;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++)
        TY_DISPATCH_IN(dt, maxpool_fwd_row, r, y, x, c, h, w);
    return BK_OK;
}

int cpu_maxpool2x2_fwd(float *y, const float *x, int n, int c, int h, int w, bk_ctx *ctx)
{
    return maxpool_fwd(y, x, n, c, h, w, ctx, BK_DTYPE_F32);
}

int cpu_t_maxpool2x2_fwd(void *y, const void *x, int n, int c, int h, int w, int dtype,
                         bk_ctx *ctx)
{
    return maxpool_fwd(y, x, n, c, h, w, ctx, dtype);
}

/* the gradient dy[gi] of the window x[a], x[b], x[e], x[f] routed to the two inputs of one
 * row, window indices want_lo and want_lo + 1: v0, v1 (+0 where not the argmax), by integer
 * masks (vectorizes) */
TY_INLINE void maxpool_route(float *v0, float *v1, const void *x, const void *dy, size_t a,
                             size_t b, size_t e, size_t f, size_t gi, int want_lo, int dt)
{
    float m;
    const int q = maxpool_argmax(ty_ld(x, a, dt), ty_ld(x, b, dt), ty_ld(x, e, dt),
                                 ty_ld(x, f, dt), &m);
    const uint32_t g = vm_f_to_bits(ty_ld(dy, gi, dt));
    *v0 = vm_bits_to_f(g & ((uint32_t)0 - (uint32_t)(q == want_lo)));
    *v1 = vm_bits_to_f(g & ((uint32_t)0 - (uint32_t)(q == want_lo + 1)));
}

/* input row r of maxpool_bwd */
TY_INLINE int maxpool_bwd_row(long r, void *dx, const void *dy, const void *x, int accum, int c,
                          int h, int w, int dt)
{
    const int ho = h / 2, wo = w / 2;
    const size_t row = (size_t)w * c;
    long img = r / h;
    int iy = (int)(r % h), oy = iy / 2;
    const size_t d = (size_t)r * row;
    if (oy >= ho) { /* the dropped odd last row */
        if (!accum) memset(ty_at(dx, d, dt), 0, row * bk_dtype_size(dt));
        return BK_OK;
    }
    const size_t r0 = ((size_t)img * h + 2 * oy) * row, r1 = r0 + row;
    const size_t gr = ((size_t)img * ho + oy) * wo * c;
    int want_lo = (iy & 1) ? 2 : 0; /* window indices 0,1 are the top row, 2,3 the bottom */
    for (int j = 0; j < wo; j++) {
        const size_t a = r0 + (size_t)2 * j * c, b = a + c, e = r1 + (size_t)2 * j * c,
                     f = e + c;
        const size_t d0 = d + (size_t)2 * j * c, d1 = d0 + c;
        const size_t g0 = gr + (size_t)j * c;
        if (accum) {
#pragma omp simd
            for (int k = 0; k < c; k++) {
                float v0, v1;
                maxpool_route(&v0, &v1, x, dy, a + k, b + k, e + k, f + k, g0 + k, want_lo, dt);
                ty_st(dx, d0 + k, ty_ld(dx, d0 + k, dt) + v0, dt);
                ty_st(dx, d1 + k, ty_ld(dx, d1 + k, dt) + v1, dt);
            }
        } else {
#pragma omp simd
            for (int k = 0; k < c; k++) {
                float v0, v1;
                maxpool_route(&v0, &v1, x, dy, a + k, b + k, e + k, f + k, g0 + k, want_lo, dt);
                ty_st(dx, d0 + k, v0, dt);
                ty_st(dx, d1 + k, v1, dt);
            }
        }
    }
    if (!accum && (w & 1))
        memset(ty_at(dx, d + (size_t)(w - 1) * c, dt), 0, (size_t)c * bk_dtype_size(dt));
    return BK_OK;
}

/* dx (N,H,W,C) (=/+=): dy goes to each window's argmax (recomputed from x), zero elsewhere,
 * including a dropped odd last row/column. A gather: each dx element is written once. Of
 * dtype dt. */
static int maxpool_bwd(void *dx, const void *dy, const void *x, int accum, int n, int c, int h,
                       int w, bk_ctx *ctx, int dt)
{
    if (!ty_valid(dt)) return BK_ERR_INVALID;
    long rows = (long)n * h; /* input rows */
    size_t row = (size_t)w * c;
    int par = (size_t)rows * row >= RESAMPLE_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++)
        TY_DISPATCH_IN(dt, maxpool_bwd_row, r, dx, dy, x, accum, c, h, w);
    return BK_OK;
}

int cpu_maxpool2x2_bwd(float *dx, const float *dy, const float *x, int accum, int n, int c,
                       int h, int w, bk_ctx *ctx)
{
    return maxpool_bwd(dx, dy, x, accum, n, c, h, w, ctx, BK_DTYPE_F32);
}

int cpu_t_maxpool2x2_bwd(void *dx, const void *dy, const void *x, int accum, int n, int c, int h,
                         int w, int dtype, bk_ctx *ctx)
{
    return maxpool_bwd(dx, dy, x, accum, n, c, h, w, ctx, dtype);
}
