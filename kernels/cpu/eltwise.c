/* eltwise.c - the CPU backend's element-wise kernels: SiLU, exact GELU, add, gradient copy,
 * per-channel broadcast add (the time-embedding term, over NHWC images) and scalar scale.
 * OpenMP over elements; every output element is written by one thread, so results do not
 * depend on the thread count.
 */
#include <math.h>

#include "cpu.h"
#include "typed.h"
#include "vmath.h"

/* below this many elements a parallel region costs more than it saves */
#define ELTWISE_PAR_MIN 16384

/* SiLU and GELU below run over fixed blocks of ELTWISE_BLK elements (the blocks, not the
 * threads, decide where a vector loop ends and its scalar remainder starts, so results do not
 * depend on the thread count) with vectorized inner loops; the math is vmath.h's. */
#define ELTWISE_BLK 4096

/* one block of each (at most ELTWISE_BLK elements, on the calling thread), in the instruction
 * set cpu_isa() picks (eltwise_blocks.h; the same bits either way): the fp32 entries below run
 * them over the blocks in parallel, typed.c on blocks converted from 16 bits */
#define ELT_SUFFIX _avx2
#include "eltwise_blocks.h"

void cpu_silu_block(float *y, const float *x, size_t n)
{
    if (cpu_isa() >= CPU_ISA_AVX512) cpu_silu_block_avx512(y, x, n);
    else cpu_silu_block_avx2(y, x, n);
}

void cpu_silu_bwd_block(float *dx, const float *dy, const float *x, int accum, size_t n)
{
    if (cpu_isa() >= CPU_ISA_AVX512) cpu_silu_bwd_block_avx512(dx, dy, x, accum, n);
    else cpu_silu_bwd_block_avx2(dx, dy, x, accum, n);
}

void cpu_gelu_block(float *y, const float *x, size_t n)
{
    if (cpu_isa() >= CPU_ISA_AVX512) cpu_gelu_block_avx512(y, x, n);
    else cpu_gelu_block_avx2(y, x, n);
}

void cpu_gelu_bwd_block(float *dx, const float *dy, const float *x, int accum, size_t n)
{
    if (cpu_isa() >= CPU_ISA_AVX512) cpu_gelu_bwd_block_avx512(dx, dy, x, accum, n);
    else cpu_gelu_bwd_block_avx2(dx, dy, x, accum, n);
}

/* block b of count elements: [i0, i1) */
#define ELT_BLOCKS(count) ((long)(((count) + ELTWISE_BLK - 1) / ELTWISE_BLK))
#define ELT_RANGE(b, count, i0, n)                                                                 \
    const size_t i0 = (size_t)(b) * ELTWISE_BLK;                                                  \
    const size_t n = (count) - i0 > ELTWISE_BLK ? ELTWISE_BLK : (count) - i0

int cpu_silu_fwd(float *y, const float *x, size_t count, bk_ctx *ctx) // (count)
{
#pragma omp parallel for num_threads(ctx->threads) if (count >= ELTWISE_PAR_MIN) schedule(static)
    for (long b = 0; b < ELT_BLOCKS(count); b++) {
        ELT_RANGE(b, count, i0, n);
        cpu_silu_block(y + i0, x + i0, n);
    }
    return BK_OK;
}

int cpu_silu_bwd(float *dx, const float *dy, const float *x, int accum, size_t count,
                 bk_ctx *ctx) // (count)
{
#pragma omp parallel for num_threads(ctx->threads) if (count >= ELTWISE_PAR_MIN) schedule(static)
    for (long b = 0; b < ELT_BLOCKS(count); b++) {
        ELT_RANGE(b, count, i0, n);
        cpu_silu_bwd_block(dx + i0, dy + i0, x + i0, accum, n);
    }
    return BK_OK;
}

int cpu_gelu_fwd(float *y, const float *x, size_t count, bk_ctx *ctx) // (count)
{
#pragma omp parallel for num_threads(ctx->threads) if (count >= ELTWISE_PAR_MIN) schedule(static)
    for (long b = 0; b < ELT_BLOCKS(count); b++) {
        ELT_RANGE(b, count, i0, n);
        cpu_gelu_block(y + i0, x + i0, n);
    }
    return BK_OK;
}

int cpu_gelu_bwd(float *dx, const float *dy, const float *x, int accum, size_t count,
                 bk_ctx *ctx) // (count)
{
#pragma omp parallel for num_threads(ctx->threads) if (count >= ELTWISE_PAR_MIN) schedule(static)
    for (long b = 0; b < ELT_BLOCKS(count); b++) {
        ELT_RANGE(b, count, i0, n);
        cpu_gelu_bwd_block(dx + i0, dy + i0, x + i0, accum, n);
    }
    return BK_OK;
}

int cpu_add_fwd(float *y, const float *a, const float *b, size_t count, bk_ctx *ctx) // (count)
{
#pragma omp parallel for num_threads(ctx->threads) if (count >= ELTWISE_PAR_MIN) schedule(static)
    for (size_t i = 0; i < count; i++) y[i] = a[i] + b[i];
    return BK_OK;
}

int cpu_copy_grad(float *dx, const float *dy, int accum, size_t count, bk_ctx *ctx) // (count)
{
    if (accum) {
#pragma omp parallel for num_threads(ctx->threads) if (count >= ELTWISE_PAR_MIN) schedule(static)
        for (size_t i = 0; i < count; i++) dx[i] += dy[i];
    } else {
#pragma omp parallel for num_threads(ctx->threads) if (count >= ELTWISE_PAR_MIN) schedule(static)
        for (size_t i = 0; i < count; i++) dx[i] = dy[i];
    }
    return BK_OK;
}

/* row r of add_bcast_fwd */
TY_INLINE int add_bcast_fwd_row(long r, void *y, const void *x, const void *b, int c, int hw,
                                int dt)
{
    const size_t xo = (size_t)r * c, bo = (size_t)(r / hw) * c;
    float xbuf[TY_ROW], bbuf[TY_ROW], obuf[TY_ROW];
    for (int k0 = 0; k0 < c; k0 += TY_ROW) {
        const size_t m = c - k0 < TY_ROW ? (size_t)(c - k0) : TY_ROW;
        const float *xr = ty_row(x, xo + k0, m, dt, xbuf);
        const float *br = ty_row(b, bo + k0, m, dt, bbuf);
        float *o = ty_out(y, xo + k0, dt, obuf);
        for (size_t k = 0; k < m; k++) o[k] = xr[k] + br[k];
        ty_put(y, xo + k0, m, dt, obuf);
    }
    return BK_OK;
}

/* y = x + b (N,C) broadcast over the pixels; x, y NHWC (the CPU backend's image layout), all
 * of dtype dt (typed.h), which the parallel region dispatches per row (TY_DISPATCH_IN) */
static int add_bcast_fwd(void *y, const void *x, const void *b, int n, int c, int hw,
                         bk_ctx *ctx, int dt)
{
    if (!ty_valid(dt)) return BK_ERR_INVALID;
    long rows = (long)n * hw;
    int par = (size_t)rows * (size_t)c >= ELTWISE_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++) TY_DISPATCH_IN(dt, add_bcast_fwd_row, r, y, x, b, c, hw);
    return BK_OK;
}

int cpu_add_bcast_fwd(float *y, const float *x, const float *b, int n, int c, int hw,
                      bk_ctx *ctx)
{
    return add_bcast_fwd(y, x, b, n, c, hw, ctx, BK_DTYPE_F32);
}

int cpu_t_add_bcast_fwd(void *y, const void *x, const void *b, int n, int c, int hw, int dtype,
                        bk_ctx *ctx)
{
    return add_bcast_fwd(y, x, b, n, c, hw, ctx, dtype);
}

/* db (N,C) (=/+=) sum over the pixels of dy (NHWC), of dtype dt. One thread owns a block of 64
 * channels of one image and adds its pixels in order, in double: thread-count independent. */
#define BCAST_CBLK 64
/* task t of add_bcast_bwd: image t / cblocks, channel block t % cblocks */
TY_INLINE int add_bcast_bwd_task(long t, void *db, const void *dy, int accum, int c, int hw,
                                 int cblocks, int dt)
{
    int img = (int)(t / cblocks), c0 = (int)(t % cblocks) * BCAST_CBLK;
    int nc = c - c0 < BCAST_CBLK ? c - c0 : BCAST_CBLK;
    double acc[BCAST_CBLK];
    float buf[BCAST_CBLK];
    for (int k = 0; k < nc; k++) acc[k] = 0.0;
    for (int p = 0; p < hw; p++) {
        const float *g = ty_row(dy, ((size_t)img * hw + p) * c + c0, (size_t)nc, dt, buf);
        for (int k = 0; k < nc; k++) acc[k] += (double)g[k];
    }
    const size_t d = (size_t)img * c + c0;
    for (int k = 0; k < nc; k++)
        ty_st(db, d + k, accum ? (float)((double)ty_ld(db, d + k, dt) + acc[k]) : (float)acc[k],
              dt);
    return BK_OK;
}

static int add_bcast_bwd(void *db, const void *dy, int accum, int n, int c, int hw, bk_ctx *ctx,
                         int dt)
{
    if (!ty_valid(dt)) return BK_ERR_INVALID;
    int cblocks = (c + BCAST_CBLK - 1) / BCAST_CBLK;
    long tasks = (long)n * cblocks;
    int par = (size_t)n * c * (size_t)hw >= ELTWISE_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long t = 0; t < tasks; t++)
        TY_DISPATCH_IN(dt, add_bcast_bwd_task, t, db, dy, accum, c, hw, cblocks);
    return BK_OK;
}

int cpu_add_bcast_bwd(float *db, const float *dy, int accum, int n, int c, int hw, bk_ctx *ctx)
{
    return add_bcast_bwd(db, dy, accum, n, c, hw, ctx, BK_DTYPE_F32);
}

int cpu_t_add_bcast_bwd(void *db, const void *dy, int accum, int n, int c, int hw, int dtype,
                        bk_ctx *ctx)
{
    return add_bcast_bwd(db, dy, accum, n, c, hw, ctx, dtype);
}

int cpu_scale_fwd(float *y, const float *x, float s, size_t count, bk_ctx *ctx) // (count)
{
#pragma omp parallel for num_threads(ctx->threads) if (count >= ELTWISE_PAR_MIN) schedule(static)
    for (size_t i = 0; i < count; i++) y[i] = x[i] * s;
    return BK_OK;
}
