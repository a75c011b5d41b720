/* eltwise.c - the CPU backend's element-wise kernels: SiLU, exact GELU, add, gradient copy,
 * per-channel broadcast add (the time-embedding term) and scalar scale. OpenMP over elements;
 * every output element is written by one thread, so results do not depend on the thread count.
 */
#include <math.h>

#include "cpu.h"

/* below this many elements a parallel region costs more than it saves */
#define ELTWISE_PAR_MIN 16384

int cpu_silu_fwd(float *y, const float *x, size_t count, bk_ctx *ctx) // (count)
{
#pragma omp parallel for num_threads(ctx->threads) if (count >= ELTWISE_PAR_MIN) schedule(static)
    for (size_t i = 0; i < count; i++) {
        float v = x[i];
        /* x * sigmoid(x); for very negative x expf overflows to inf and the result is -0 */
        y[i] = v / (1.0f + expf(-v));
    }
    return BK_OK;
}

int cpu_silu_bwd(float *dx, const float *dy, const float *x, int accum, size_t count,
                 bk_ctx *ctx) // (count)
{
#pragma omp parallel for num_threads(ctx->threads) if (count >= ELTWISE_PAR_MIN) schedule(static)
    for (size_t i = 0; i < count; i++) {
        float v = x[i];
        float s = 1.0f / (1.0f + expf(-v));
        /* d/dx x*s(x) = s + x*s*(1-s) = s*(1 + x*(1-s)) */
        float g = dy[i] * (s * (1.0f + v * (1.0f - s)));
        dx[i] = accum ? dx[i] + g : g;
    }
    return BK_OK;
}

#define GELU_RSQRT2 0.70710678118654752440f   /* 1/sqrt(2) */
#define GELU_RSQRT2PI 0.39894228040143267794f /* 1/sqrt(2*pi) */

int cpu_gelu_fwd(float *y, const float *x, size_t count, bk_ctx *ctx) // (count)
{
#pragma omp parallel for num_threads(ctx->threads) if (count >= ELTWISE_PAR_MIN) schedule(static)
    for (size_t i = 0; i < count; i++) {
        float v = x[i];
        y[i] = 0.5f * v * (1.0f + erff(v * GELU_RSQRT2));
    }
    return BK_OK;
}

int cpu_gelu_bwd(float *dx, const float *dy, const float *x, int accum, size_t count,
                 bk_ctx *ctx) // (count)
{
#pragma omp parallel for num_threads(ctx->threads) if (count >= ELTWISE_PAR_MIN) schedule(static)
    for (size_t i = 0; i < count; i++) {
        float v = x[i];
        /* Phi(x) + x * phi(x), the exact (erf) GELU's derivative */
        float cdf = 0.5f * (1.0f + erff(v * GELU_RSQRT2));
        float pdf = expf(-0.5f * v * v) * GELU_RSQRT2PI;
        float g = dy[i] * (cdf + v * pdf);
        dx[i] = accum ? dx[i] + g : g;
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

/* y (N,C,HW) = x (N,C,HW) + b (N,C) */
int cpu_add_bcast_fwd(float *y, const float *x, const float *b, int n, int c, int hw,
                      bk_ctx *ctx)
{
    long rows = (long)n * c;
    int par = (size_t)rows * (size_t)hw >= ELTWISE_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * hw;
        float *yr = y + (size_t)r * hw;
        float br = b[r];
        for (int p = 0; p < hw; p++) yr[p] = xr[p] + br;
    }
    return BK_OK;
}

/* db (N,C) (=/+=) sum over HW of dy (N,C,HW). Each row is summed serially by one thread, in
 * double with eight fixed lanes combined in a fixed order: thread-count independent. */
int cpu_add_bcast_bwd(float *db, const float *dy, int accum, int n, int c, int hw, bk_ctx *ctx)
{
    long rows = (long)n * c;
    int par = (size_t)rows * (size_t)hw >= ELTWISE_PAR_MIN;
#pragma omp parallel for num_threads(ctx->threads) if (par) schedule(static)
    for (long r = 0; r < rows; r++) {
        const float *g = dy + (size_t)r * hw;
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        int p = 0;
        for (; p + 8 <= hw; p += 8)
            for (int l = 0; l < 8; l++) acc[l] += (double)g[p + l];
        for (; p < hw; p++) acc[p & 7] += (double)g[p];
        double s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
                   ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        db[r] = accum ? (float)((double)db[r] + s) : (float)s;
    }
    return BK_OK;
}

int cpu_scale_fwd(float *y, const float *x, float s, size_t count, bk_ctx *ctx) // (count)
{
#pragma omp parallel for num_threads(ctx->threads) if (count >= ELTWISE_PAR_MIN) schedule(static)
    for (size_t i = 0; i < count; i++) y[i] = x[i] * s;
    return BK_OK;
}
