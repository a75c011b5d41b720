/* norm.c - CPU group norm (x NHWC, G groups of channels) and layer norm (x (M,D) over D),
 * forward and backward. PyTorch semantics: biased variance, rstd = 1/sqrt(var + eps); the forward saves
 * mean and rstd in fp32. Sums run in double, each in one thread in a fixed order.
 * gamma / beta may be NULL (no affine: 1 / 0); dx, dgamma, dbeta may be NULL (skipped).
 * The group norm's task bodies are in norm_gn.h (also compiled for AVX-512: norm512.c).
 */
#include <math.h>
#include <omp.h>

#include "cpu.h"
#include "norm_gn.h"
#include "typed.h"
#include "vmath.h"

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

/* dt need not be a constant: the parallel region dispatches each task to its dtype's copy
 * (TY_DISPATCH_IN) */
static int gn_fwd(void *y, float *mean, float *rstd, void *xo, const void *x, const void *xb,
                  const void *yb, const void *yr, const float *gamma, const float *beta, int n,
                  int c, int hw, int groups, float eps, int silu, bk_ctx *ctx, int dt)
{
    if (!y || !mean || !rstd || !x || !ctx || n < 1 || c < 1 || hw < 1 || groups < 1 ||
        c % groups != 0 || !(eps >= 0.0f) || (xb && !xo) || !ty_valid(dt))
        return BK_ERR_INVALID;
    const int blk = gn_block_wide(c, c / groups), nblk = (c + blk - 1) / blk;
    if (blk > GN_MAX_BLOCK) return BK_ERR_INVALID;
    /* AVX-512 where the fused SiLU's math dominates, the x + xb form too: 1.5 vs 1.8 ns an
     * element alone (bf16 8x128x32x32 .. 8x256x8x8, 1 thread), and the seed-64 b8 step's
     * group norms 8.3-8.5 -> 7.9-8.4 ms (a 2x slowdown once measured there did not recur) */
    const int isa512 = silu && cpu_isa() >= CPU_ISA_AVX512;
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
    for (int t = 0; t < n * nblk; t++) {
        if (isa512)
            gn_fwd_task_avx512(t, y, mean, rstd, xo, x, xb, yb, yr, gamma, beta, c, hw, groups,
                               eps, silu, blk, nblk, dt);
        else
            TY_DISPATCH_IN(dt, gn_fwd_task, t, y, mean, rstd, xo, x, xb, yb, yr, gamma, beta, c,
                           hw, groups, eps, silu, blk, nblk);
    }
    return BK_OK;
}

int cpu_groupnorm_fwd(float *y, float *mean, float *rstd, const float *x, const float *gamma,
                      const float *beta, int n, int c, int hw, int groups, float eps,
                      bk_ctx *ctx)
{
    return gn_fwd(y, mean, rstd, NULL, x, NULL, NULL, NULL, gamma, beta, n, c, hw, groups, eps, 0,
                  ctx, BK_DTYPE_F32);
}

int cpu_groupnorm_silu_fwd(float *y, float *mean, float *rstd, const float *x,
                           const float *gamma, const float *beta, int n, int c, int hw,
                           int groups, float eps, bk_ctx *ctx)
{
    return gn_fwd(y, mean, rstd, NULL, x, NULL, NULL, NULL, gamma, beta, n, c, hw, groups, eps, 1,
                  ctx, BK_DTYPE_F32);
}

static int gn_bwd_check(const void *dy, const void *x, const float *mean, const float *rstd,
                        bk_ctx *ctx, int n, int c, int hw, int groups)
{
    if (!dy || !x || !mean || !rstd || !ctx || n < 1 || c < 1 || hw < 1 || groups < 1 ||
        c % groups != 0 || gn_block(c, c / groups) > GN_MAX_BLOCK)
        return BK_ERR_INVALID;
    return BK_OK;
}

/* Without a workspace: a thread owns a channel block across all images, so the parameter
 * gradients add images in order. */
int cpu_groupnorm_bwd(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                      const float *gamma, const float *mean, const float *rstd, int accum, int n,
                      int c, int hw, int groups, bk_ctx *ctx)
{
    if (gn_bwd_check(dy, x, mean, rstd, ctx, n, c, hw, groups)) return BK_ERR_INVALID;
    const int blk = gn_block(c, c / groups), nblk = (c + blk - 1) / blk;
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
    for (int bi = 0; bi < nblk; bi++) {
        const int c0 = bi * blk, nc = c - c0 < blk ? c - c0 : blk;
        double sg_all[GN_MAX_BLOCK], sb_all[GN_MAX_BLOCK], sg[GN_MAX_BLOCK], sb[GN_MAX_BLOCK];
        for (int k = 0; k < nc; k++) sg_all[k] = sb_all[k] = 0.0;
        for (int img = 0; img < n; img++) {
            gn_bwd_image(dx, sg, sb, NULL, dy, x, gamma, NULL, mean, rstd, accum, 0, 0, c, hw,
                         groups, img, c0, nc, NULL, BK_DTYPE_F32);
            for (int k = 0; k < nc; k++) {
                sg_all[k] += sg[k];
                sb_all[k] += sb[k];
            }
        }
        for (int k = 0; k < nc; k++) {
            if (dgamma) dgamma[c0 + k] += (float)sg_all[k];
            if (dbeta) dbeta[c0 + k] += (float)sb_all[k];
        }
    }
    return BK_OK;
}

/* the workspace: each image's per-channel sums, (N, 2, C) doubles, then for silu per thread
 * (cpu_threads: at most the machine's cores) one task's silu'-scaled gradient, hw x block
 * floats */
size_t cpu_groupnorm_bwd_ws_bytes(int n, int c, int hw, int groups, int silu)
{
    if (n < 1 || c < 1 || hw < 1 || groups < 1 || c % groups) return 0;
    size_t blk = (size_t)gn_block_wide(c, c / groups);
    return (size_t)n * 2 * c * sizeof(double) +
           (silu ? (size_t)cpu_threads(NULL) * hw * blk * sizeof(float) : 0);
}

/* With the workspace the (image, channel block) tasks run in parallel, each block at least
 * GN_WIDE channels, and the parameter gradients add the images' sums in order afterwards.
 * Operands of dtype dt, db as gn_bwd_image's. */
static int gn_bwd_ws(void *dx, float *dgamma, float *dbeta, void *db, const void *dy,
                        const void *x, const float *gamma, const float *beta, const float *mean,
                        const float *rstd, int accum, int db_accum, int db_of_dx, int n, int c,
                        int hw, int groups, int silu, void *ws, bk_ctx *ctx, int dt)
{
    if (gn_bwd_check(dy, x, mean, rstd, ctx, n, c, hw, groups) || !ws || (db_of_dx && db && !dx) ||
        !ty_valid(dt))
        return BK_ERR_INVALID;
    const int blk = gn_block_wide(c, c / groups);
    const int nblk = (c + blk - 1) / blk;
    double *part = ws; /* (N, 2, C) */
    const int isa512 = silu && cpu_isa() >= CPU_ISA_AVX512; /* where silu' dominates */
    float *gzs = (float *)(part + (size_t)n * 2 * c);
#pragma omp parallel num_threads(cpu_threads(ctx))
    {
        float *gz = silu ? gzs + (size_t)omp_get_thread_num() * hw * blk : NULL;
#pragma omp for schedule(static)
        for (int t = 0; t < n * nblk; t++) {
            const int img = t / nblk, c0 = (t % nblk) * blk, nc = c - c0 < blk ? c - c0 : blk;
            double *sg = part + (size_t)img * 2 * c + c0, *sb = sg + c;
            if (isa512)
                gn_bwd_image_avx512(dx, sg, sb, db, dy, x, gamma, beta, mean, rstd, accum,
                                    db_accum, db_of_dx, c, hw, groups, img, c0, nc, gz, dt);
            else
                TY_DISPATCH_IN(dt, gn_bwd_image, dx, sg, sb, db, dy, x, gamma, beta, mean, rstd,
                               accum, db_accum, db_of_dx, c, hw, groups, img, c0, nc, gz);
        }
    }
    if (dgamma || dbeta) {
#pragma omp parallel for num_threads(ctx->threads) schedule(static) if (c >= 256)
        for (int k = 0; k < c; k++) {
            double g = 0.0, b = 0.0;
            for (int img = 0; img < n; img++) {
                g += part[(size_t)img * 2 * c + k];
                b += part[(size_t)img * 2 * c + c + k];
            }
            if (dgamma) dgamma[k] += (float)g;
            if (dbeta) dbeta[k] += (float)b;
        }
    }
    return BK_OK;
}

int cpu_groupnorm_bwd_ws(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                         const float *gamma, const float *beta, const float *mean,
                         const float *rstd, int accum, int n, int c, int hw, int groups, int silu,
                         void *ws, bk_ctx *ctx)
{
    return gn_bwd_ws(dx, dgamma, dbeta, NULL, dy, x, gamma, beta, mean, rstd, accum, 0, 0, n, c,
                     hw, groups, silu, ws, ctx, BK_DTYPE_F32);
}

/* the typed group norm (ops.def): the bodies above on s->dtype */
size_t cpu_t_groupnorm_ws_bytes(const struct bk_groupnorm *s, int backward)
{
    return backward ? cpu_groupnorm_bwd_ws_bytes(s->n, s->c, s->hw, s->groups, s->silu) : 0;
}

int cpu_t_groupnorm_fwd(void *y, float *mean, float *rstd, void *xo, const void *x,
                        const void *xb, const void *yb, const void *yr, const float *gamma,
                        const float *beta, void *ws, const struct bk_groupnorm *s, bk_ctx *ctx)
{
    return gn_fwd(y, mean, rstd, xo, x, xb, yb, yr, gamma, beta, s->n, s->c, s->hw, s->groups,
                  s->eps, s->silu, ctx, s->dtype);
}

int cpu_t_groupnorm_bwd(void *dx, float *dgamma, float *dbeta, void *db, const void *dy,
                        const void *x, const float *gamma, const float *beta, const float *mean,
                        const float *rstd, int accum, int db_accum, int db_of_dx, void *ws,
                        const struct bk_groupnorm *s, bk_ctx *ctx)
{
    return gn_bwd_ws(dx, dgamma, dbeta, db, dy, x, gamma, s->silu ? beta : NULL, mean, rstd,
                     accum, db_accum, db_of_dx, s->n, s->c, s->hw, s->groups, s->silu, ws, ctx,
                     s->dtype);
}

/* column block of the layer-norm parameter-gradient reduction */
#define NORM_COL_BLOCK 64

/* the longest row the typed layer norm takes in 16 bits (its rows convert on the stack) */
#define LN_MAX_ROW 4096

/* Rows per layer-norm forward task: the row statistics are double sums in element order
 * (norm_stats), one chain of dependent adds per row, so a task runs LN_ROWS rows' chains side by
 * side (each row's sum in its own order: the bits of one row at a time) when LN_ROWS rows fit
 * the row buffers; longer rows go one at a time. (The backward's two sums a row stay one row at
 * a time: side by side measured slower there.) */
#define LN_ROWS 8

/* rows a task takes: LN_ROWS where they fit the row buffers (d <= LN_MAX_ROW / LN_ROWS), else 1 */
static int ln_rows(int d) { return d <= LN_MAX_ROW / LN_ROWS ? LN_ROWS : 1; }

/* norm_stats of LN_ROWS rows x[r] at once, in each row's order */
static void norm_stats_rows(float *mean, float *rstd, const float *const *x, size_t cnt, float eps)
{
    double sum[LN_ROWS] = {0}, mu[LN_ROWS], ss[LN_ROWS] = {0};
    for (size_t i = 0; i < cnt; i++)
        for (int r = 0; r < LN_ROWS; r++) sum[r] += x[r][i];
    for (int r = 0; r < LN_ROWS; r++) mu[r] = sum[r] / (double)cnt;
    for (size_t i = 0; i < cnt; i++)
        for (int r = 0; r < LN_ROWS; r++) {
            double dd = (double)x[r][i] - mu[r];
            ss[r] += dd * dd;
        }
    for (int r = 0; r < LN_ROWS; r++) {
        mean[r] = (float)mu[r];
        rstd[r] = (float)(1.0 / sqrt(ss[r] / (double)cnt + (double)eps));
    }
}

/* task t of ln_fwd: rows [i0, i0 + nr) (nr = ln_rows(d), clamped to m; a short last task
 * repeats its last row in the unused chains and stores nothing of them) */
TY_INLINE int ln_fwd_task(int t, void *y, float *mean, float *rstd, const void *x,
                          const float *gamma, const float *beta, int m, int d, float eps, int dt)
{
    const int rows = ln_rows(d), i0 = t * rows, nr = m - i0 < rows ? m - i0 : rows;
    float buf[dt == BK_DTYPE_F32 ? 1 : LN_MAX_ROW];
    const float *xr[LN_ROWS];
    float mu[LN_ROWS], rs[LN_ROWS];
    for (int r = 0; r < rows; r++) {
        const int i = i0 + (r < nr ? r : nr - 1);
        xr[r] = ty_row(x, (size_t)i * d, (size_t)d, dt, buf + (dt == BK_DTYPE_F32 ? 0 : r * d));
    }
    if (rows == LN_ROWS) norm_stats_rows(mu, rs, xr, (size_t)d, eps);
    else norm_stats(&mu[0], &rs[0], xr[0], (size_t)d, eps);
    for (int r = 0; r < nr; r++) {
        const int i = i0 + r;
        mean[i] = mu[r];
        rstd[i] = rs[r];
        /* buf's row r is read before written */
        float *yr = ty_out(y, (size_t)i * d, dt, buf + (dt == BK_DTYPE_F32 ? 0 : r * d));
        const float mr = mu[r], sr = rs[r];
        if (gamma && beta) {
#pragma omp simd
            for (int j = 0; j < d; j++) yr[j] = (xr[r][j] - mr) * sr * gamma[j] + beta[j];
        } else {
            for (int j = 0; j < d; j++)
                yr[j] = (xr[r][j] - mr) * sr * (gamma ? gamma[j] : 1.0f) + (beta ? beta[j] : 0.0f);
        }
        ty_put(y, (size_t)i * d, (size_t)d, dt, yr);
    }
    return BK_OK;
}

/* x, y (M,D) of dtype dt (typed.h), which the parallel region dispatches per task
 * (TY_DISPATCH_IN) */
static int ln_fwd(void *y, float *mean, float *rstd, const void *x, const float *gamma,
                  const float *beta, int m, int d, float eps, bk_ctx *ctx, int dt)
{
    if (!y || !mean || !rstd || !x || !ctx || m < 1 || d < 1 || !(eps >= 0.0f) || !ty_valid(dt) ||
        (dt != BK_DTYPE_F32 && d > LN_MAX_ROW))
        return BK_ERR_INVALID;
    const int tasks = (m + ln_rows(d) - 1) / ln_rows(d);
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
    for (int t = 0; t < tasks; t++)
        TY_DISPATCH_IN(dt, ln_fwd_task, t, y, mean, rstd, x, gamma, beta, m, d, eps);
    return BK_OK;
}

int cpu_layernorm_fwd(float *y, float *mean, float *rstd, const float *x, const float *gamma,
                      const float *beta, int m, int d, float eps, bk_ctx *ctx)
{
    return ln_fwd(y, mean, rstd, x, gamma, beta, m, d, eps, ctx, BK_DTYPE_F32);
}

/* row i of ln_bwd's dx */
TY_INLINE int ln_bwd_row(int i, void *dx, const void *dy, const void *x, const float *gamma,
                         const float *mean, const float *rstd, int accum, int d, int dt)
{
    float xbuf[dt == BK_DTYPE_F32 ? 1 : LN_MAX_ROW];
    float dbuf[dt == BK_DTYPE_F32 ? 1 : LN_MAX_ROW];
    float obuf[dt == BK_DTYPE_F32 ? 1 : LN_MAX_ROW];
    const size_t ro = (size_t)i * d;
    const float *xr = ty_row(x, ro, (size_t)d, dt, xbuf);
    const float *dr = ty_row(dy, ro, (size_t)d, dt, dbuf);
    float *o = ty_out(dx, ro, dt, obuf);
    if (accum && dt != BK_DTYPE_F32)
        cpu_convert_run(obuf, BK_DTYPE_F32, ty_at(dx, ro, dt), dt, (size_t)d);
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
    ty_put(dx, ro, (size_t)d, dt, obuf);
    return BK_OK;
}

/* column block bi of ln_bwd's parameter gradients */
TY_INLINE int ln_bwd_cols(int bi, float *dgamma, float *dbeta, const void *dy, const void *x,
                          const float *mean, const float *rstd, int m, int d, int dt)
{
    const int j0 = bi * NORM_COL_BLOCK;
    const int nb = d - j0 < NORM_COL_BLOCK ? d - j0 : NORM_COL_BLOCK;
    double sg[NORM_COL_BLOCK] = {0}, sb[NORM_COL_BLOCK] = {0};
    float xbuf[NORM_COL_BLOCK], dbuf[NORM_COL_BLOCK];
    for (int i = 0; i < m; i++) {
        const float *xr = ty_row(x, (size_t)i * d + j0, (size_t)nb, dt, xbuf);
        const float *dr = ty_row(dy, (size_t)i * d + j0, (size_t)nb, dt, dbuf);
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
    return BK_OK;
}

/* dx, dy, x (M,D) of dtype dt, which the parallel regions dispatch per task (TY_DISPATCH_IN) */
static int ln_bwd(void *dx, float *dgamma, float *dbeta, const void *dy, const void *x,
                  const float *gamma, const float *mean, const float *rstd, int accum, int m, int d,
                  bk_ctx *ctx, int dt)
{
    if (!dy || !x || !mean || !rstd || !ctx || m < 1 || d < 1 || !ty_valid(dt) ||
        (dt != BK_DTYPE_F32 && d > LN_MAX_ROW))
        return BK_ERR_INVALID;
    if (dx) {
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
        for (int i = 0; i < m; i++)
            TY_DISPATCH_IN(dt, ln_bwd_row, i, dx, dy, x, gamma, mean, rstd, accum, d);
    }
    if (dgamma || dbeta) {
        const int nblk = (d + NORM_COL_BLOCK - 1) / NORM_COL_BLOCK;
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
        for (int bi = 0; bi < nblk; bi++)
            TY_DISPATCH_IN(dt, ln_bwd_cols, bi, dgamma, dbeta, dy, x, mean, rstd, m, d);
    }
    return BK_OK;
}

int cpu_layernorm_bwd(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                      const float *gamma, const float *mean, const float *rstd, int accum, int m,
                      int d, bk_ctx *ctx)
{
    return ln_bwd(dx, dgamma, dbeta, dy, x, gamma, mean, rstd, accum, m, d, ctx, BK_DTYPE_F32);
}

int cpu_t_layernorm_fwd(void *y, float *mean, float *rstd, const void *x, const float *gamma,
                        const float *beta, int m, int d, float eps, int dtype, bk_ctx *ctx)
{
    return ln_fwd(y, mean, rstd, x, gamma, beta, m, d, eps, ctx, dtype);
}

int cpu_t_layernorm_bwd(void *dx, float *dgamma, float *dbeta, const void *dy, const void *x,
                        const float *gamma, const float *mean, const float *rstd, int accum, int m,
                        int d, int dtype, bk_ctx *ctx)
{
    return ln_bwd(dx, dgamma, dbeta, dy, x, gamma, mean, rstd, accum, m, d, ctx, dtype);
}
