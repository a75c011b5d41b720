/* norm.c - CPU group norm (x NHWC, G groups of channels) and layer norm (x (M,D) over D),
 * forward and backward. PyTorch semantics: biased variance, rstd = 1/sqrt(var + eps); the forward saves
 * mean and rstd in fp32. Sums run in double, each in one thread in a fixed order.
 * gamma / beta may be NULL (no affine: 1 / 0); dx, dgamma, dbeta may be NULL (skipped).
 */
#include <math.h>
#include <omp.h>

#include "cpu.h"
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

/* Group norm over NHWC images: group g of image i is the cpg channels [g*cpg, (g+1)*cpg) of
 * every pixel. Work is split into channel blocks of whole groups (GN_WIDE channels at least,
 * GN_BLOCK in the workspace-free backward), so a pixel's block is one contiguous run that
 * vectorizes. Every sum is a per-channel sum over the pixels in order (in double; the backward
 * adds float partial sums of GN_CHUNK pixels), then over the group's channels in order: fixed
 * whatever the thread count. */
#define GN_BLOCK 16
#define GN_MAX_BLOCK 1024

static int gn_block_min(int c, int cpg, int min)
{
    int b = cpg >= min ? cpg : (min + cpg - 1) / cpg * cpg;
    b = b < c ? b : c;
    return b > GN_MAX_BLOCK && cpg <= GN_MAX_BLOCK ? cpg : b;
}

static int gn_block(int c, int cpg) { return gn_block_min(c, cpg, GN_BLOCK); }

/* the wider blocks of the (image, block) parallel kernels: longer contiguous runs per pixel */
#define GN_WIDE 64
/* pixels summed in float before a double accumulation */
#define GN_CHUNK 32

/* y = act(gn(x')), act = silu or identity, then y += yb (N,C) broadcast when yb and y += yr
 * (N,C,HW) when yr; x' = x + xb (N,C) broadcast, stored into xo, when xb, else x. Images and
 * the (N,C) terms of dtype dt (typed.h): each value stored is rounded to dt once where the
 * unfused ops would store it, so the statistics are those of the stored x', and fp32 gives the
 * unfused fp32 kernels' bits. y may be yr (each element is read before it is written), xo x. */
/* task t of gn_fwd: image t / nblk, channel block t % nblk */
TY_INLINE int gn_fwd_task(int t, void *y, float *mean, float *rstd, void *xo, const void *x,
                          const void *xb, const void *yb, const void *yr, const float *gamma,
                          const float *beta, int c, int hw, int groups, float eps, int silu,
                          int blk, int nblk, int dt)
{
    const int cpg = c / groups;
    const double cnt = (double)cpg * hw;
    const void *xs = xb ? (const void *)xo : x; /* what the statistics are of */
    {
        const int img = t / nblk, c0 = (t % nblk) * blk, nc = c - c0 < blk ? c - c0 : blk;
        const size_t base = (size_t)img * hw * c + c0;
        double acc[GN_MAX_BLOCK], mu[GN_MAX_BLOCK];
        float buf[GN_MAX_BLOCK], obuf[GN_MAX_BLOCK], rbuf[GN_MAX_BLOCK];
        for (int k = 0; k < nc; k++) acc[k] = 0.0;
        if (xb) { /* x' = round(x + xb), stored, summed as stored */
            float bb[GN_MAX_BLOCK];
            for (int k = 0; k < nc; k++) bb[k] = ty_ld(xb, (size_t)img * c + c0 + k, dt);
            for (int p = 0; p < hw; p++) {
                const float *xr = ty_row(x, base + (size_t)p * c, (size_t)nc, dt, buf);
                float *o = ty_out(xo, base + (size_t)p * c, dt, obuf);
#pragma omp simd
                for (int k = 0; k < nc; k++) {
                    o[k] = ty_round(xr[k] + bb[k], dt);
                    acc[k] += o[k];
                }
                ty_put(xo, base + (size_t)p * c, (size_t)nc, dt, obuf);
            }
        } else {
            for (int p = 0; p < hw; p++) {
                const float *xr = ty_row(x, base + (size_t)p * c, (size_t)nc, dt, buf);
#pragma omp simd
                for (int k = 0; k < nc; k++) acc[k] += xr[k];
            }
        }
        for (int k0 = 0; k0 < nc; k0 += cpg) {
            double sum = 0.0;
            for (int k = k0; k < k0 + cpg; k++) sum += acc[k];
            for (int k = k0; k < k0 + cpg; k++) mu[k] = sum / cnt;
        }
        for (int k = 0; k < nc; k++) acc[k] = 0.0;
        for (int p = 0; p < hw; p++) {
            const float *xr = ty_row(xs, base + (size_t)p * c, (size_t)nc, dt, buf);
#pragma omp simd
            for (int k = 0; k < nc; k++) {
                double d = (double)xr[k] - mu[k];
                acc[k] += d * d;
            }
        }
        float m[GN_MAX_BLOCK], rs[GN_MAX_BLOCK], gm[GN_MAX_BLOCK], bt[GN_MAX_BLOCK];
        float ybv[GN_MAX_BLOCK];
        for (int k0 = 0; k0 < nc; k0 += cpg) {
            double ss = 0.0;
            for (int k = k0; k < k0 + cpg; k++) ss += acc[k];
            int gi = img * groups + (c0 + k0) / cpg;
            mean[gi] = (float)mu[k0];
            rstd[gi] = (float)(1.0 / sqrt(ss / cnt + (double)eps));
            for (int k = k0; k < k0 + cpg; k++) {
                m[k] = mean[gi];
                rs[k] = rstd[gi];
            }
        }
        for (int k = 0; k < nc; k++) {
            gm[k] = gamma ? gamma[c0 + k] : 1.0f;
            bt[k] = beta ? beta[c0 + k] : 0.0f;
            ybv[k] = yb ? ty_ld(yb, (size_t)img * c + c0 + k, dt) : 0.0f;
        }
        for (int p = 0; p < hw; p++) {
            const size_t off = base + (size_t)p * c;
            const float *xr = ty_row(xs, off, (size_t)nc, dt, buf);
            const float *rr = yr ? ty_row(yr, off, (size_t)nc, dt, rbuf) : NULL;
            float *o = ty_out(y, off, dt, obuf);
            if (!yb && !yr && silu) {
#pragma omp simd
                for (int k = 0; k < nc; k++) o[k] = vm_silu((xr[k] - m[k]) * rs[k] * gm[k] + bt[k]);
            } else if (!yb && !yr) {
#pragma omp simd
                for (int k = 0; k < nc; k++) o[k] = (xr[k] - m[k]) * rs[k] * gm[k] + bt[k];
            } else { /* the fused adds after the norm: its output rounded as stored, then summed */
#pragma omp simd
                for (int k = 0; k < nc; k++) {
                    float v = (xr[k] - m[k]) * rs[k] * gm[k] + bt[k];
                    if (silu) v = vm_silu(v);
                    if (yb) v = ty_round(v, dt) + ybv[k];
                    if (yr) v = ty_round(v, dt) + rr[k];
                    o[k] = v;
                }
            }
            ty_put(y, off, (size_t)nc, dt, obuf);
        }
    }
    return BK_OK;
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
    const int blk = gn_block_min(c, c / groups, GN_WIDE), nblk = (c + blk - 1) / blk;
    if (blk > GN_MAX_BLOCK) return BK_ERR_INVALID;
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
    for (int t = 0; t < n * nblk; t++)
        TY_DISPATCH_IN(dt, gn_fwd_task, t, y, mean, rstd, xo, x, xb, yb, yr, gamma, beta, c, hw,
                       groups, eps, silu, blk, nblk);
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

/* dx = rstd (g - mean(g) - xhat mean(g xhat)) over the group, g = dy gamma; dgamma = sum of
 * dy xhat, dbeta = sum of dy. For one image and one channel block, one pass gathers the
 * per-channel sums of g and g xhat (which give both the group means and the parameter
 * gradients), a second writes dx. silu: dy is the gradient of silu(z), z = gn(x) recomputed
 * from x, mean, rstd, gamma, beta, and g = dy silu'(z), kept between the passes in gzbuf
 * (hw x nc floats). The image's per-channel sums go to sg, sb. dx, dy, x and db of dtype dt
 * (typed.h); db (the block's nc values of the image, may be NULL): (=/+= db_accum) the sum over
 * the pixels, in double in pixel order as add_bcast_bwd's, of dx as stored (db_of_dx) or of dy. */
TY_INLINE int gn_bwd_image(void *dx, double *sg, double *sb, void *db, const void *dy,
                            const void *x, const float *gamma, const float *beta,
                            const float *mean, const float *rstd, int accum, int db_accum,
                            int db_of_dx, int c, int hw, int groups, int img, int c0, int nc,
                            float *gzbuf, int dt)
{
    const int silu = gzbuf != NULL;
    const int cpg = c / groups;
    const double cnt = (double)cpg * hw;
    const size_t off = (size_t)img * hw * c + c0;
    double rs[GN_MAX_BLOCK], dbs[GN_MAX_BLOCK];
    float mf[GN_MAX_BLOCK], rf[GN_MAX_BLOCK], gm[GN_MAX_BLOCK], bt[GN_MAX_BLOCK];
    float xbuf[GN_MAX_BLOCK], dbuf[GN_MAX_BLOCK], obuf[GN_MAX_BLOCK];
    for (int k = 0; k < nc; k++) {
        int gi = img * groups + (c0 + k) / cpg;
        mf[k] = mean[gi];
        rs[k] = rf[k] = rstd[gi];
        sg[k] = sb[k] = 0.0;
        dbs[k] = 0.0;
        gm[k] = gamma ? gamma[c0 + k] : 1.0f;
        bt[k] = beta ? beta[c0 + k] : 0.0f;
    }
    const int db_dy = db && !db_of_dx;
    /* float sums over GN_CHUNK pixels, added into the double sums chunk by chunk */
    float fg[GN_MAX_BLOCK], fb[GN_MAX_BLOCK];
    for (int p0 = 0; p0 < hw; p0 += GN_CHUNK) {
        const int p1 = p0 + GN_CHUNK < hw ? p0 + GN_CHUNK : hw;
        for (int k = 0; k < nc; k++) fg[k] = fb[k] = 0.0f;
        for (int p = p0; p < p1; p++) {
            const float *xr = ty_row(x, off + (size_t)p * c, (size_t)nc, dt, xbuf);
            const float *dr = ty_row(dy, off + (size_t)p * c, (size_t)nc, dt, dbuf);
            if (db_dy)
#pragma omp simd
                for (int k = 0; k < nc; k++) dbs[k] += (double)dr[k];
            if (silu) {
                float *gz = gzbuf + (size_t)p * nc;
#pragma omp simd
                for (int k = 0; k < nc; k++)
                    gz[k] = dr[k] * vm_silu_grad((xr[k] - mf[k]) * rf[k] * gm[k] + bt[k]);
                dr = gz;
            }
#pragma omp simd
            for (int k = 0; k < nc; k++) {
                fg[k] += dr[k] * ((xr[k] - mf[k]) * rf[k]);
                fb[k] += dr[k];
            }
        }
        for (int k = 0; k < nc; k++) {
            sg[k] += fg[k];
            sb[k] += fb[k];
        }
    }
    if (dx) {
        /* per group: a = mean(g gamma), b = mean(g gamma xhat); then dx = A g + B (x - mean) +
         * C per channel, in float */
        float ca[GN_MAX_BLOCK], cb[GN_MAX_BLOCK], cc[GN_MAX_BLOCK];
        for (int k0 = 0; k0 < nc; k0 += cpg) {
            double s1 = 0.0, s2 = 0.0;
            for (int k = k0; k < k0 + cpg; k++) {
                s1 += sb[k] * gm[k];
                s2 += sg[k] * gm[k];
            }
            const double a = s1 / cnt, b = s2 / cnt;
            for (int k = k0; k < k0 + cpg; k++) {
                ca[k] = (float)(rs[k] * gm[k]);
                cb[k] = (float)(-rs[k] * rs[k] * b);
                cc[k] = (float)(-rs[k] * a);
            }
        }
        for (int p = 0; p < hw; p++) {
            const size_t po = off + (size_t)p * c;
            const float *xr = ty_row(x, po, (size_t)nc, dt, xbuf);
            const float *dr = silu ? gzbuf + (size_t)p * nc : ty_row(dy, po, (size_t)nc, dt, dbuf);
            float *o = ty_out(dx, po, dt, obuf);
            if (accum) {
                if (dt != BK_DTYPE_F32) cpu_convert_run(obuf, BK_DTYPE_F32, ty_at(dx, po, dt), dt,
                                                        (size_t)nc);
#pragma omp simd
                for (int k = 0; k < nc; k++)
                    o[k] += ca[k] * dr[k] + cb[k] * (xr[k] - mf[k]) + cc[k];
            } else {
#pragma omp simd
                for (int k = 0; k < nc; k++) o[k] = ca[k] * dr[k] + cb[k] * (xr[k] - mf[k]) + cc[k];
            }
            ty_put(dx, po, (size_t)nc, dt, obuf);
            if (db && db_of_dx)
#pragma omp simd
                for (int k = 0; k < nc; k++) dbs[k] += (double)ty_round(o[k], dt);
        }
    }
    if (db) {
        const size_t bo = (size_t)img * c + c0;
        for (int k = 0; k < nc; k++)
            ty_st(db, bo + k,
                  db_accum ? (float)((double)ty_ld(db, bo + k, dt) + dbs[k]) : (float)dbs[k], dt);
    }
    return BK_OK;
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
    size_t blk = (size_t)gn_block_min(c, c / groups, GN_WIDE);
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
    const int blk = gn_block_min(c, c / groups, GN_WIDE);
    const int nblk = (c + blk - 1) / blk;
    double *part = ws; /* (N, 2, C) */
    float *gzs = (float *)(part + (size_t)n * 2 * c);
#pragma omp parallel num_threads(cpu_threads(ctx))
    {
        float *gz = silu ? gzs + (size_t)omp_get_thread_num() * hw * blk : NULL;
#pragma omp for schedule(static)
        for (int t = 0; t < n * nblk; t++) {
            const int img = t / nblk, c0 = (t % nblk) * blk, nc = c - c0 < blk ? c - c0 : blk;
            double *sg = part + (size_t)img * 2 * c + c0, *sb = sg + c;
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
