/* norm.cu - group norm (x (N,C,HW), G groups) and layer norm (x (M,D) over D), forward and
 * backward, as kernels/cpu/norm.c: biased variance, two-pass statistics in double saved as fp32
 * mean and rstd, backward sums in double. One block per group / row / channel; every sum has a
 * fixed order (no atomics), so results do not change from run to run.
 */
#include "cuda_backend.h"

#define NORM_THREADS 256

/* mean and rstd of cnt values at x (contiguous), two passes in double; every thread gets them */
__device__ void norm_stats(double *mu_out, double *rs_out, const float *x, size_t cnt, float eps,
                           double *sh)
{
    double s = 0.0;
    for (size_t i = threadIdx.x; i < cnt; i += blockDim.x) s += (double)x[i];
    const double mu = cu_block_sum(s, sh) / (double)cnt;
    double ss = 0.0;
    for (size_t i = threadIdx.x; i < cnt; i += blockDim.x) {
        double d = (double)x[i] - mu;
        ss += d * d;
    }
    ss = cu_block_sum(ss, sh);
    *mu_out = mu;
    *rs_out = 1.0 / sqrt(ss / (double)cnt + (double)eps);
}

/* one block per (n, g) */
__global__ void k_groupnorm_fwd(float *y, float *mean, float *rstd, const float *x,
                                const float *gamma, const float *beta, int groups, int cpg,
                                int hw, float eps)
{
    __shared__ double sh[33];
    const int t = blockIdx.x, g = t % groups;
    const size_t cnt = (size_t)cpg * hw, base = (size_t)t * cnt;
    double mu, rs;
    norm_stats(&mu, &rs, x + base, cnt, eps, sh);
    const float muf = (float)mu, rsf = (float)rs;
    if (threadIdx.x == 0) {
        mean[t] = muf;
        rstd[t] = rsf;
    }
    for (size_t i = threadIdx.x; i < cnt; i += blockDim.x) {
        const int cc = g * cpg + (int)(i / hw);
        const float gm = gamma ? gamma[cc] : 1.0f, bt = beta ? beta[cc] : 0.0f;
        y[base + i] = (x[base + i] - muf) * rsf * gm + bt;
    }
}

/* dx of one (n, g) per block: rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma */
__global__ void k_groupnorm_bwd_dx(float *dx, const float *dy, const float *x, const float *gamma,
                                   const float *mean, const float *rstd, int accum, int groups,
                                   int cpg, int hw)
{
    __shared__ double sh[33];
    const int t = blockIdx.x, g = t % groups;
    const size_t cnt = (size_t)cpg * hw, base = (size_t)t * cnt;
    const double mu = mean[t], rs = rstd[t];
    double s1 = 0.0, s2 = 0.0;
    for (size_t i = threadIdx.x; i < cnt; i += blockDim.x) {
        const double gm = gamma ? (double)gamma[g * cpg + (int)(i / hw)] : 1.0;
        const double gd = (double)dy[base + i] * gm;
        s1 += gd;
        s2 += gd * (((double)x[base + i] - mu) * rs);
    }
    s1 = cu_block_sum(s1, sh);
    s2 = cu_block_sum(s2, sh);
    const double a = s1 / (double)cnt, b = s2 / (double)cnt;
    for (size_t i = threadIdx.x; i < cnt; i += blockDim.x) {
        const double gm = gamma ? (double)gamma[g * cpg + (int)(i / hw)] : 1.0;
        const float v = (float)(rs * ((double)dy[base + i] * gm - a -
                                      ((double)x[base + i] - mu) * rs * b));
        dx[base + i] = accum ? dx[base + i] + v : v;
    }
}

/* dgamma, dbeta of one channel per block, over n and hw */
__global__ void k_groupnorm_bwd_param(float *dgamma, float *dbeta, const float *dy,
                                      const float *x, const float *mean, const float *rstd, int n,
                                      int c, int hw, int groups, int cpg)
{
    __shared__ double sh[33];
    const int cc = blockIdx.x, g = cc / cpg;
    double sg = 0.0, sb = 0.0;
    for (int ni = 0; ni < n; ni++) {
        const double mu = mean[ni * groups + g], rs = rstd[ni * groups + g];
        const size_t off = ((size_t)ni * c + cc) * hw;
        for (int p = threadIdx.x; p < hw; p += blockDim.x) {
            const double d = (double)dy[off + p];
            sg += d * (((double)x[off + p] - mu) * rs);
            sb += d;
        }
    }
    sg = cu_block_sum(sg, sh);
    sb = cu_block_sum(sb, sh);
    if (threadIdx.x == 0) {
        if (dgamma) dgamma[cc] += (float)sg;
        if (dbeta) dbeta[cc] += (float)sb;
    }
}

int cu_groupnorm_fwd(float *y, float *mean, float *rstd, const float *x, const float *gamma,
                     const float *beta, int n, int c, int hw, int groups, float eps,
                     bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!y || !mean || !rstd || !x || n < 1 || c < 1 || hw < 1 || groups < 1 ||
        c % groups != 0 || !(eps >= 0.0f))
        return BK_ERR_INVALID;
    const int cpg = c / groups;
    CU_LAUNCH(k_groupnorm_fwd, n * groups, NORM_THREADS, 0, ctx->stream)(
        y, mean, rstd, x, gamma, beta, groups, cpg, hw, eps);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

int cu_groupnorm_bwd(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                     const float *gamma, const float *mean, const float *rstd, int accum, int n,
                     int c, int hw, int groups, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!dy || !x || !mean || !rstd || n < 1 || c < 1 || hw < 1 || groups < 1 ||
        c % groups != 0)
        return BK_ERR_INVALID;
    const int cpg = c / groups;
    if (dx) {
        CU_LAUNCH(k_groupnorm_bwd_dx, n * groups, NORM_THREADS, 0, ctx->stream)(
            dx, dy, x, gamma, mean, rstd, accum, groups, cpg, hw);
        CU_LAUNCHED(ctx);
    }
    if (dgamma || dbeta) {
        CU_LAUNCH(k_groupnorm_bwd_param, c, NORM_THREADS, 0, ctx->stream)(
            dgamma, dbeta, dy, x, mean, rstd, n, c, hw, groups, cpg);
        CU_LAUNCHED(ctx);
    }
    return BK_OK;
}

/* one block per row */
__global__ void k_layernorm_fwd(float *y, float *mean, float *rstd, const float *x,
                                const float *gamma, const float *beta, int d, float eps)
{
    __shared__ double sh[33];
    const int i = blockIdx.x;
    const float *xr = x + (size_t)i * d;
    float *yr = y + (size_t)i * d;
    double mu, rs;
    norm_stats(&mu, &rs, xr, (size_t)d, eps, sh);
    const float muf = (float)mu, rsf = (float)rs;
    if (threadIdx.x == 0) {
        mean[i] = muf;
        rstd[i] = rsf;
    }
    for (int j = threadIdx.x; j < d; j += blockDim.x)
        yr[j] = (xr[j] - muf) * rsf * (gamma ? gamma[j] : 1.0f) + (beta ? beta[j] : 0.0f);
}

__global__ void k_layernorm_bwd_dx(float *dx, const float *dy, const float *x, const float *gamma,
                                   const float *mean, const float *rstd, int accum, int d)
{
    __shared__ double sh[33];
    const int i = blockIdx.x;
    const float *xr = x + (size_t)i * d, *dr = dy + (size_t)i * d;
    float *o = dx + (size_t)i * d;
    const double mu = mean[i], rs = rstd[i];
    double s1 = 0.0, s2 = 0.0;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const double gd = (double)dr[j] * (gamma ? (double)gamma[j] : 1.0);
        s1 += gd;
        s2 += gd * (((double)xr[j] - mu) * rs);
    }
    s1 = cu_block_sum(s1, sh);
    s2 = cu_block_sum(s2, sh);
    const double a = s1 / d, b = s2 / d;
    for (int j = threadIdx.x; j < d; j += blockDim.x) {
        const double gd = (double)dr[j] * (gamma ? (double)gamma[j] : 1.0);
        const float v = (float)(rs * (gd - a - ((double)xr[j] - mu) * rs * b));
        o[j] = accum ? o[j] + v : v;
    }
}

#define LN_COLS 32
#define LN_ROWS 32

/* dgamma, dbeta (D) over the M rows: a block owns 32 columns, 32 row lanes, fixed-order combine */
__global__ void k_layernorm_bwd_param(float *dgamma, float *dbeta, const float *dy,
                                      const float *x, const float *mean, const float *rstd, int m,
                                      int d)
{
    __shared__ double pg[LN_ROWS][LN_COLS + 1], pb[LN_ROWS][LN_COLS + 1];
    const int tx = threadIdx.x, ty = threadIdx.y, j = blockIdx.x * LN_COLS + tx;
    double sg = 0.0, sb = 0.0;
    if (j < d)
        for (int i = ty; i < m; i += LN_ROWS) {
            const double dd = (double)dy[(size_t)i * d + j];
            sg += dd * (((double)x[(size_t)i * d + j] - (double)mean[i]) * (double)rstd[i]);
            sb += dd;
        }
    pg[ty][tx] = sg;
    pb[ty][tx] = sb;
    __syncthreads();
    if (ty == 0 && j < d) {
        double g = 0.0, b = 0.0;
        for (int r = 0; r < LN_ROWS; r++) {
            g += pg[r][tx];
            b += pb[r][tx];
        }
        if (dgamma) dgamma[j] += (float)g;
        if (dbeta) dbeta[j] += (float)b;
    }
}

int cu_layernorm_fwd(float *y, float *mean, float *rstd, const float *x, const float *gamma,
                     const float *beta, int m, int d, float eps, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!y || !mean || !rstd || !x || m < 1 || d < 1 || !(eps >= 0.0f)) return BK_ERR_INVALID;
    CU_LAUNCH(k_layernorm_fwd, m, 128, 0, ctx->stream)(y, mean, rstd, x, gamma, beta, d, eps);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

int cu_layernorm_bwd(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                     const float *gamma, const float *mean, const float *rstd, int accum, int m,
                     int d, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!dy || !x || !mean || !rstd || m < 1 || d < 1) return BK_ERR_INVALID;
    if (dx) {
        CU_LAUNCH(k_layernorm_bwd_dx, m, 128, 0, ctx->stream)(
            dx, dy, x, gamma, mean, rstd, accum, d);
        CU_LAUNCHED(ctx);
    }
    if (dgamma || dbeta) {
        dim3 block(LN_COLS, LN_ROWS);
        CU_LAUNCH(k_layernorm_bwd_param, (d + LN_COLS - 1) / LN_COLS, block, 0, ctx->stream)(
            dgamma, dbeta, dy, x, mean, rstd, m, d);
        CU_LAUNCHED(ctx);
    }
    return BK_OK;
}
