/* layout.c - the CPU backend's layout kernels: channel concat of NHWC images (forward and
 * backward) and the (N,C,HW) <-> (N,HW,C) transpose (the host-side layout change and a reshape
 * that flattens an image), cache-blocked, on fp32 and (typed.h) 16-bit elements. Pure data
 * movement: every output element is written by exactly one thread.
 */
#include <string.h>

#include "cpu.h"
#include "typed.h"

#define LAYOUT_PAR_MIN 16384
#define LAYOUT_TILE 32 /* 32x32 floats = 4 KiB per side: both tiles stay in L1 */

/* channel concat of NHWC images of dtype dt: each pixel of y is [a's C1 channels, b's C2
 * channels] */
TY_INLINE int concat_fwd(void *y, const void *a, const void *b, int n, int c1, int c2, int hw,
                         bk_ctx *ctx, int dt)
{
    int ct = c1 + c2;
    long rows = (long)n * hw;
    int par = (size_t)rows * (size_t)ct >= LAYOUT_PAR_MIN;
    const size_t es = bk_dtype_size(dt);
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++) {
        memcpy(ty_at(y, (size_t)r * ct, dt), ty_at(a, (size_t)r * c1, dt), (size_t)c1 * es);
        memcpy(ty_at(y, (size_t)r * ct + c1, dt), ty_at(b, (size_t)r * c2, dt), (size_t)c2 * es);
    }
    return BK_OK;
}

int cpu_concat_fwd(float *y, const float *a, const float *b, int n, int c1, int c2, int hw,
                   bk_ctx *ctx)
{
    return concat_fwd(y, a, b, n, c1, c2, hw, ctx, BK_DTYPE_F32);
}

int cpu_t_concat_fwd(void *y, const void *a, const void *b, int n, int c1, int c2, int hw,
                     int dtype, bk_ctx *ctx)
{
    return TY_DISPATCH(dtype, concat_fwd, y, a, b, n, c1, c2, hw, ctx);
}

/* dst (=/+= accum) cnt elements of g from element i, both of dtype dt */
TY_INLINE void part_grad(void *dst, size_t di, const void *g, size_t gi, int accum, int cnt,
                         int dt)
{
    if (!accum) {
        memcpy(ty_at(dst, di, dt), ty_at(g, gi, dt), (size_t)cnt * bk_dtype_size(dt));
        return;
    }
    float gbuf[TY_ROW], obuf[TY_ROW];
    for (int k0 = 0; k0 < cnt; k0 += TY_ROW) {
        const size_t m = cnt - k0 < TY_ROW ? (size_t)(cnt - k0) : TY_ROW;
        const float *gr = ty_row(g, gi + k0, m, dt, gbuf);
        float *o = ty_out(dst, di + k0, dt, obuf);
        if (dt != BK_DTYPE_F32) cpu_convert_run(obuf, BK_DTYPE_F32, ty_at(dst, di + k0, dt), dt, m);
        for (size_t k = 0; k < m; k++) o[k] += gr[k];
        ty_put(dst, di + k0, m, dt, obuf);
    }
}

/* da (N,H,W,C1), db (N,H,W,C2) from dy (N,H,W,C1+C2) of dtype dt; each (=/+=) per its own
 * accum flag; a NULL da or db is skipped. */
TY_INLINE int concat_bwd_row(long r, void *da, void *db, const void *dy, int accum_a, int accum_b,
                             int c1, int c2, int dt)
{
    const int ct = c1 + c2;
    if (da) part_grad(da, (size_t)r * c1, dy, (size_t)r * ct, accum_a, c1, dt);
    if (db) part_grad(db, (size_t)r * c2, dy, (size_t)r * ct + c1, accum_b, c2, dt);
    return BK_OK;
}

static int concat_bwd(void *da, void *db, const void *dy, int accum_a, int accum_b, int n, int c1,
                      int c2, int hw, bk_ctx *ctx, int dt)
{
    if (!ty_valid(dt)) return BK_ERR_INVALID;
    int ct = c1 + c2;
    long rows = (long)n * hw;
    int par = (size_t)rows * (size_t)ct >= LAYOUT_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++)
        TY_DISPATCH_IN(dt, concat_bwd_row, r, da, db, dy, accum_a, accum_b, c1, c2);
    return BK_OK;
}

int cpu_concat_bwd(float *da, float *db, const float *dy, int accum_a, int accum_b, int n,
                   int c1, int c2, int hw, bk_ctx *ctx)
{
    return concat_bwd(da, db, dy, accum_a, accum_b, n, c1, c2, hw, ctx, BK_DTYPE_F32);
}

int cpu_t_concat_bwd(void *da, void *db, const void *dy, int accum_a, int accum_b, int n, int c1,
                     int c2, int hw, int dtype, bk_ctx *ctx)
{
    return concat_bwd(da, db, dy, accum_a, accum_b, n, c1, c2, hw, ctx, dtype);
}

/* y (N,HW,C) (=/+= per accum) = transpose of x (N,C,HW), of dtype dt. Called with (c, hw)
 * swapped it maps (N,HW,C) back to (N,C,HW), which is also this op's backward (with accum). y
 * must not overlap x. Tiles of LAYOUT_TILE x LAYOUT_TILE are distributed over threads. This is
 * tile (ic, ip) of image s. */
TY_INLINE int transpose_tile(int s, int ic, int ip, void *y, const void *x, int accum, int c,
                             int hw, int dt)
{
    const size_t so = (size_t)s * c * hw;
    int c0 = ic * LAYOUT_TILE, c1 = c0 + LAYOUT_TILE < c ? c0 + LAYOUT_TILE : c;
    int p0 = ip * LAYOUT_TILE, p1 = p0 + LAYOUT_TILE < hw ? p0 + LAYOUT_TILE : hw;
    /* inner loop writes y contiguously along C; the x tile is L1-resident */
    if (dt != BK_DTYPE_F32 && !accum) { /* a 16-bit copy: the bits move */
        const uint16_t *xs = (const uint16_t *)x + so;
        uint16_t *ys = (uint16_t *)y + so;
        for (int p = p0; p < p1; p++)
            for (int ch = c0; ch < c1; ch++)
                ys[(size_t)p * c + ch] = xs[(size_t)ch * hw + p];
    } else if (accum) {
        for (int p = p0; p < p1; p++)
            for (int ch = c0; ch < c1; ch++) {
                const size_t yi = so + (size_t)p * c + ch;
                ty_st(y, yi, ty_ld(y, yi, dt) + ty_ld(x, so + (size_t)ch * hw + p, dt),
                      dt);
            }
    } else {
        const float *xs = (const float *)x + so;
        float *ys = (float *)y + so;
        for (int p = p0; p < p1; p++)
            for (int ch = c0; ch < c1; ch++)
                ys[(size_t)p * c + ch] = xs[(size_t)ch * hw + p];
    }
    return BK_OK;
}

static int transpose_fwd(void *y, const void *x, int accum, int n, int c, int hw, bk_ctx *ctx,
                         int dt)
{
    if (!ty_valid(dt)) return BK_ERR_INVALID;
    int tc = (c + LAYOUT_TILE - 1) / LAYOUT_TILE;
    int tp = (hw + LAYOUT_TILE - 1) / LAYOUT_TILE;
    int par = (size_t)n * c * hw >= LAYOUT_PAR_MIN;
#pragma omp parallel for collapse(3) num_threads(ctx->threads) if (par) schedule(static)
    for (int s = 0; s < n; s++)
        for (int ic = 0; ic < tc; ic++)
            for (int ip = 0; ip < tp; ip++)
                TY_DISPATCH_IN(dt, transpose_tile, s, ic, ip, y, x, accum, c, hw);
    return BK_OK;
}

int cpu_transpose_fwd(float *y, const float *x, int accum, int n, int c, int hw, bk_ctx *ctx)
{
    return transpose_fwd(y, x, accum, n, c, hw, ctx, BK_DTYPE_F32);
}

int cpu_t_transpose_fwd(void *y, const void *x, int accum, int n, int c, int hw, int dtype,
                        bk_ctx *ctx)
{
    return transpose_fwd(y, x, accum, n, c, hw, ctx, dtype);
}
