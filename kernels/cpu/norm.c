/* norm.c - CPU group norm (x (N,C,HW), G groups) and layer norm (x (M,D) over D), forward and
 * backward. PyTorch semantics: biased variance, rstd = 1/sqrt(var + eps); the forward saves
 * mean and rstd in fp32. Sums run in double, each in one thread in a fixed order.
 * gamma / beta may be NULL (no affine: 1 / 0); dx, dgamma, dbeta may be NULL (skipped).
 */
#include <math.h>

#include "cpu.h"

/* column block of the layer-norm parameter-gradient reduction */
#define NORM_COL_BLOCK 64

/* mean and rstd of cnt contiguous values, two-pass in double */
static void norm_stats(float *mean, float *rstd, const float *x, size_t cnt, float eps)
{
    double sum = 0.0;
    for (size_t i = 0; i < cnt; i++) sum += x[i];
    double mu = sum / (double)cnt, ss = 0.0;
    for (size_t i = 0; i < cnt; i++) {
        double d = (double)x[i] - mu;
        ss += d * d;
    }
    *mean = (float)mu;
    *rstd = (float)(1.0 / sqrt(ss / (double)cnt + (double)eps));
}

int cpu_groupnorm_fwd(float *y, float *mean, float *rstd, const float *x, const float *gamma,
                      const float *beta, int n, int c, int hw, int groups, float eps,
                      bk_ctx *ctx)
{
    if (!y || !mean || !rstd || !x || !ctx || n < 1 || c < 1 || hw < 1 || groups < 1 ||
        c % groups != 0 || !(eps >= 0.0f))
        return BK_ERR_INVALID;
    const int cpg = c / groups, ng = n * groups;
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
    for (int t = 0; t < ng; t++) {
        int g = t % groups;
        size_t base = (size_t)t * cpg * hw; /* == ((t / groups) * c + g * cpg) * hw */
        norm_stats(&mean[t], &rstd[t], x + base, (size_t)cpg * hw, eps);
        const float mu = mean[t], rs = rstd[t];
        for (int ch = 0; ch < cpg; ch++) {
            int cc = g * cpg + ch;
            const float gm = gamma ? gamma[cc] : 1.0f, bt = beta ? beta[cc] : 0.0f;
            const float *xr = x + base + (size_t)ch * hw;
            float *yr = y + base + (size_t)ch * hw;
            for (int p = 0; p < hw; p++) yr[p] = (xr[p] - mu) * rs * gm + bt;
        }
    }
    return BK_OK;
}

int cpu_groupnorm_bwd(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                      const float *gamma, const float *mean, const float *rstd, int accum, int n,
                      int c, int hw, int groups, bk_ctx *ctx)
{
    if (!dy || !x || !mean || !rstd || !ctx || n < 1 || c < 1 || hw < 1 || groups < 1 ||
        c % groups != 0)
        return BK_ERR_INVALID;
    const int cpg = c / groups, ng = n * groups;
    if (dx) {
        /* dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy gamma, over the group */
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
        for (int t = 0; t < ng; t++) {
            int g = t % groups;
            size_t base = (size_t)t * cpg * hw;
            const double mu = mean[t], rs = rstd[t];
            double s1 = 0.0, s2 = 0.0;
            for (int ch = 0; ch < cpg; ch++) {
                const double gm = gamma ? gamma[g * cpg + ch] : 1.0;
                const float *xr = x + base + (size_t)ch * hw, *dr = dy + base + (size_t)ch * hw;
                for (int p = 0; p < hw; p++) {
                    double gd = dr[p] * gm;
                    s1 += gd;
                    s2 += gd * ((xr[p] - mu) * rs);
                }
            }
            const double cnt = (double)cpg * hw, a = s1 / cnt, b = s2 / cnt;
            for (int ch = 0; ch < cpg; ch++) {
                const double gm = gamma ? gamma[g * cpg + ch] : 1.0;
                const float *xr = x + base + (size_t)ch * hw, *dr = dy + base + (size_t)ch * hw;
                float *o = dx + base + (size_t)ch * hw;
                for (int p = 0; p < hw; p++) {
                    float v = (float)(rs * (dr[p] * gm - a - (xr[p] - mu) * rs * b));
                    o[p] = accum ? o[p] + v : v;
                }
            }
        }
    }
    if (dgamma || dbeta) {
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
        for (int cc = 0; cc < c; cc++) {
            int g = cc / cpg;
            double sg = 0.0, sb = 0.0;
            for (int ni = 0; ni < n; ni++) {
                const double mu = mean[ni * groups + g], rs = rstd[ni * groups + g];
                size_t off = ((size_t)ni * c + cc) * hw;
                const float *xr = x + off, *dr = dy + off;
                for (int p = 0; p < hw; p++) {
                    sg += dr[p] * ((xr[p] - mu) * rs);
                    sb += dr[p];
                }
            }
            if (dgamma) dgamma[cc] += (float)sg;
            if (dbeta) dbeta[cc] += (float)sb;
        }
    }
    return BK_OK;
}

int cpu_layernorm_fwd(float *y, float *mean, float *rstd, const float *x, const float *gamma,
                      const float *beta, int m, int d, float eps, bk_ctx *ctx)
{
    if (!y || !mean || !rstd || !x || !ctx || m < 1 || d < 1 || !(eps >= 0.0f))
        return BK_ERR_INVALID;
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
    for (int i = 0; i < m; i++) {
        const float *xr = x + (size_t)i * d;
        float *yr = y + (size_t)i * d;
        norm_stats(&mean[i], &rstd[i], xr, (size_t)d, eps);
        const float mu = mean[i], rs = rstd[i];
        for (int j = 0; j < d; j++)
            yr[j] = (xr[j] - mu) * rs * (gamma ? gamma[j] : 1.0f) + (beta ? beta[j] : 0.0f);
    }
    return BK_OK;
}

int cpu_layernorm_bwd(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                      const float *gamma, const float *mean, const float *rstd, int accum, int m,
                      int d, bk_ctx *ctx)
{
    if (!dy || !x || !mean || !rstd || !ctx || m < 1 || d < 1) return BK_ERR_INVALID;
    if (dx) {
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
        for (int i = 0; i < m; i++) {
            const float *xr = x + (size_t)i * d, *dr = dy + (size_t)i * d;
            float *o = dx + (size_t)i * d;
            const double mu = mean[i], rs = rstd[i];
            double s1 = 0.0, s2 = 0.0;
            for (int j = 0; j < d; j++) {
                double gd = dr[j] * (gamma ? (double)gamma[j] : 1.0);
                s1 += gd;
                s2 += gd * ((xr[j] - mu) * rs);
            }
            const double a = s1 / d, b = s2 / d;
            for (int j = 0; j < d; j++) {
                double gd = dr[j] * (gamma ? (double)gamma[j] : 1.0);
                float v = (float)(rs * (gd - a - (xr[j] - mu) * rs * b));
                o[j] = accum ? o[j] + v : v;
            }
        }
    }
    if (dgamma || dbeta) {
        const int nblk = (d + NORM_COL_BLOCK - 1) / NORM_COL_BLOCK;
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
        for (int bi = 0; bi < nblk; bi++) {
            const int j0 = bi * NORM_COL_BLOCK;
            const int nb = d - j0 < NORM_COL_BLOCK ? d - j0 : NORM_COL_BLOCK;
            double sg[NORM_COL_BLOCK] = {0}, sb[NORM_COL_BLOCK] = {0};
            for (int i = 0; i < m; i++) {
                const float *xr = x + (size_t)i * d + j0, *dr = dy + (size_t)i * d + j0;
                const double mu = mean[i], rs = rstd[i];
                for (int j = 0; j < nb; j++) {
                    sg[j] += dr[j] * ((xr[j] - mu) * rs);
                    sb[j] += dr[j];
                }
            }
            for (int j = 0; j < nb; j++) {
                if (dgamma) dgamma[j0 + j] += (float)sg[j];
                if (dbeta) dbeta[j0 + j] += (float)sb[j];
            }
        }
    }
    return BK_OK;
}
