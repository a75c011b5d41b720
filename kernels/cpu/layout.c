/* layout.c - the CPU backend's layout kernels: channel concat of NHWC images (forward and
 * backward) and the (N,C,HW) <-> (N,HW,C) transpose (the host-side layout change and a reshape
 * that flattens an image), cache-blocked. Pure data movement:
 * every output element is written by exactly one thread.
 */
#include <string.h>

#include "cpu.h"

#define LAYOUT_PAR_MIN 16384
#define LAYOUT_TILE 32 /* 32x32 floats = 4 KiB per side: both tiles stay in L1 */

/* channel concat of NHWC images: each pixel of y is [a's C1 channels, b's C2 channels] */
int cpu_concat_fwd(float *y, const float *a, const float *b, int n, int c1, int c2, int hw,
                   bk_ctx *ctx)
{
    int ct = c1 + c2;
    long rows = (long)n * hw;
    int par = (size_t)rows * (size_t)ct >= LAYOUT_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++) {
        memcpy(y + (size_t)r * ct, a + (size_t)r * c1, (size_t)c1 * sizeof(float));
        memcpy(y + (size_t)r * ct + c1, b + (size_t)r * c2, (size_t)c2 * sizeof(float));
    }
    return BK_OK;
}

static void part_grad(float *dst, const float *g, int accum, int cnt)
{
    if (accum)
        for (int k = 0; k < cnt; k++) dst[k] += g[k];
    else
        memcpy(dst, g, (size_t)cnt * sizeof(float));
}

/* da (N,H,W,C1), db (N,H,W,C2) from dy (N,H,W,C1+C2); each (=/+=) per its own accum flag; a
 * NULL da or db is skipped. */
int cpu_concat_bwd(float *da, float *db, const float *dy, int accum_a, int accum_b, int n,
                   int c1, int c2, int hw, bk_ctx *ctx)
{
    int ct = c1 + c2;
    long rows = (long)n * hw;
    int par = (size_t)rows * (size_t)ct >= LAYOUT_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++) {
        const float *g = dy + (size_t)r * ct;
        if (da) part_grad(da + (size_t)r * c1, g, accum_a, c1);
        if (db) part_grad(db + (size_t)r * c2, g + c1, accum_b, c2);
    }
    return BK_OK;
}

/* y (N,HW,C) (=/+= per accum) = transpose of x (N,C,HW). Called with (c, hw) swapped it maps
 * (N,HW,C) back to (N,C,HW), which is also this op's backward (with accum). y must not overlap
 * x. Tiles of LAYOUT_TILE x LAYOUT_TILE are distributed over threads. */
int cpu_transpose_fwd(float *y, const float *x, int accum, int n, int c, int hw, bk_ctx *ctx)
{
    int tc = (c + LAYOUT_TILE - 1) / LAYOUT_TILE;
    int tp = (hw + LAYOUT_TILE - 1) / LAYOUT_TILE;
    int par = (size_t)n * c * hw >= LAYOUT_PAR_MIN;
#pragma omp parallel for collapse(3) num_threads(ctx->threads) if (par) schedule(static)
    for (int s = 0; s < n; s++) {
        for (int ic = 0; ic < tc; ic++) {
            for (int ip = 0; ip < tp; ip++) {
                const float *xs = x + (size_t)s * c * hw;
                float *ys = y + (size_t)s * c * hw;
                int c0 = ic * LAYOUT_TILE, c1 = c0 + LAYOUT_TILE < c ? c0 + LAYOUT_TILE : c;
                int p0 = ip * LAYOUT_TILE, p1 = p0 + LAYOUT_TILE < hw ? p0 + LAYOUT_TILE : hw;
                /* inner loop writes y contiguously along C; the x tile is L1-resident */
                if (accum) {
                    for (int p = p0; p < p1; p++)
                        for (int ch = c0; ch < c1; ch++)
                            ys[(size_t)p * c + ch] += xs[(size_t)ch * hw + p];
                } else {
                    for (int p = p0; p < p1; p++)
                        for (int ch = c0; ch < c1; ch++)
                            ys[(size_t)p * c + ch] = xs[(size_t)ch * hw + p];
                }
            }
        }
    }
    return BK_OK;
}
