/* norm_gn.h - the group norm's task bodies (norm.c): the forward of one (image, channel
 * block) and the backward's per-image pass, included by norm.c (x86-64-v3) and by norm512.c
 * under an AVX-512 target pragma, which wraps them as gn_fwd_task_avx512 / gn_bwd_image_avx512
 * (norm.c takes them with the SiLU fused, which is compute-bound). Every sum is a per-channel chain in pixel
 * order, one vector lane per channel, and vmath.h's operations are correctly rounded with
 * nothing contracted (-std=c11): both copies give the same bits.
 */
#ifndef DDPMD_CPU_NORM_GN_H
#define DDPMD_CPU_NORM_GN_H

#include <math.h>

#include "cpu.h"
#include "typed.h"
#include "vmath.h"

/* Group norm over NHWC images: group g of image i is the cpg channels [g*cpg, (g+1)*cpg) of
 * every pixel. Work is split into channel blocks of whole groups (GN_WIDE channels at least,
 * GN_BLOCK in the workspace-free backward), so a pixel's block is one contiguous run that
 * vectorizes. Every sum is per channel over the pixels in order, in float over chunks of
 * GN_CHUNK pixels added into double (the forward merges the chunks' means and M2s,
 * gn_chunk_merge), then over the group's channels in order: fixed whatever the thread count. */
#define GN_BLOCK 16
#define GN_MAX_BLOCK 1024

static inline int gn_block_min(int c, int cpg, int min)
{
    int b = cpg >= min ? cpg : (min + cpg - 1) / cpg * cpg;
    b = b < c ? b : c;
    return b > GN_MAX_BLOCK && cpg <= GN_MAX_BLOCK ? cpg : b;
}

static inline int gn_block(int c, int cpg) { return gn_block_min(c, cpg, GN_BLOCK); }

/* the wider blocks of the (image, block) parallel kernels: longer contiguous runs per pixel */
#define GN_WIDE 64
/* and a multiple of GN_VEC channels where lcm(cpg, GN_VEC) is at most GN_VEC_UNIT (cpg 3, 6,
 * 12, 24: blocks of 96, not 66 or 72): a bf16 row loop runs GN_VEC lanes a step (two AVX-512
 * vectors), and a block's tail runs scalar, 2 of 66 channels costing 30% of the c192 hw256 bf16
 * forward. A block groups whole groups and GN_VEC_UNIT <= GN_CHUNK_ELEMS / GN_CHUNK keeps the
 * statistics' chunks at GN_CHUNK pixels, so the bits are those of the narrower blocks. */
#define GN_VEC 32
#define GN_VEC_UNIT 128

/* pixels summed in float before a double accumulation */
#define GN_CHUNK 32
/* the forward's statistics chunk: at most GN_CHUNK pixels and GN_CHUNK_ELEMS values */
#define GN_CHUNK_ELEMS 4096

static inline int gn_block_wide(int c, int cpg)
{
    _Static_assert(GN_VEC_UNIT <= GN_CHUNK_ELEMS / GN_CHUNK, "wide blocks: chunks of GN_CHUNK");
    int g = cpg, v = GN_VEC;
    while (v) { /* g = gcd(cpg, GN_VEC) */
        const int r = g % v;
        g = v;
        v = r;
    }
    const long unit = (long)cpg / g * GN_VEC;
    return gn_block_min(c, unit <= GN_VEC_UNIT ? (int)unit : cpg, GN_WIDE);
}

/* Adds a chunk of nb pixels, after p0 already added, into each channel's double mean mu and
 * sum of squared deviations m2 (Chan et al.'s pairwise update). The chunk's float sums: cm its
 * float mean, ce = sum (x - cm), cq = sum (x - cm)^2; its mean is then cm + ce / nb and its M2
 * cq - ce^2 / nb (the corrected two-pass form), both right to first order in cm's error. With
 * u = 2^-24, ce and cq err by about nb u (sum |x - cm| and sum (x - cm)^2), so the mean errs
 * by ~GN_CHUNK u sigma and M2 by ~(GN_CHUNK + 2) u relative, whatever the mean's size (the
 * double merges add ~2^-50) while the mean is below ~sigma / (GN_CHUNK u) (then cm errs by
 * ~sigma); a plain float sum of x and x^2 would lose (mean / sigma)^2 GN_CHUNK u. */
TY_INLINE void gn_chunk_merge(double *mu, double *m2, const float *cm, const float *ce,
                              const float *cq, int nc, int p0, int nb)
{
    const double na = p0, nn = (double)p0 + nb, w = na * nb / nn;
#pragma omp simd
    for (int k = 0; k < nc; k++) {
        const double e = ce[k], mb = cm[k] + e / nb, qb = cq[k] - e * e / nb;
        const double d = mb - mu[k];
        mu[k] += d * nb / nn;
        m2[k] += (qb < 0.0 ? 0.0 : qb) + d * d * w; /* qb < 0 only by rounding; NaN kept */
    }
}

/* a chunk's float sums (gn_chunk_merge) over nb rows xr of nc values of dtype rdt (a constant
 * where inlined: the loops then vectorize) */
TY_INLINE void gn_chunk_sums(float *cm, float *ce, float *cq, const void *const *xr, int nb,
                             int nc, int rdt)
{
    for (int k = 0; k < nc; k++) cm[k] = ce[k] = cq[k] = 0.0f;
    for (int j = 0; j < nb; j++)
#pragma omp simd
        for (int k = 0; k < nc; k++) cm[k] += ty_ld(xr[j], (size_t)k, rdt);
    for (int k = 0; k < nc; k++) cm[k] /= (float)nb;
    for (int j = 0; j < nb; j++)
#pragma omp simd
        for (int k = 0; k < nc; k++) {
            float d = ty_ld(xr[j], (size_t)k, rdt) - cm[k];
            ce[k] += d;
            cq[k] += d * d;
        }
}

/* one pixel's normalized block: o = act(xhat gamma + beta), act = silu or identity, then
 * o += ybv when add_b and o += rr when add_r, the norm's output rounded to dt as stored before
 * each add (gn_fwd_task; o may be rr: each element read before written). o, xr, rr are rows
 * of dtype TY_LDT(dt) (typed.h's ty_rowl). */
TY_INLINE void gn_norm_row(void *o, const void *xr, const void *rr, const float *m,
                           const float *rs, const float *gm, const float *bt, const float *ybv,
                           int nc, int silu, int add_b, int add_r, int dt)
{
    const int ldt = TY_LDT(dt);
#pragma omp simd
    for (int k = 0; k < nc; k++) {
        float v = (ty_ld(xr, (size_t)k, ldt) - m[k]) * rs[k] * gm[k] + bt[k];
        if (silu) v = vm_silu(v);
        if (add_b) v = ty_round(v, dt) + ybv[k];
        if (add_r) v = ty_round(v, dt) + ty_ld(rr, (size_t)k, ldt);
        ty_st(o, (size_t)k, v, ldt);
    }
}

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
        /* the statistics in one pass over memory, a chunk of crow pixels at a time (its rows
         * stay in L1): float sums over the chunk about its float mean, merged into the
         * per-channel double mean and M2 (gn_chunk_merge) */
        const int crow = nc <= GN_CHUNK_ELEMS / GN_CHUNK ? GN_CHUNK : GN_CHUNK_ELEMS / nc;
        double mu[GN_MAX_BLOCK], m2[GN_MAX_BLOCK];
        float buf[GN_MAX_BLOCK], obuf[GN_MAX_BLOCK], rbuf[GN_MAX_BLOCK];
        float cbuf[dt == BK_DTYPE_F32 ? 1 : GN_CHUNK_ELEMS], bb[GN_MAX_BLOCK];
        float cm[GN_MAX_BLOCK], ce[GN_MAX_BLOCK], cq[GN_MAX_BLOCK];
        if (xb)
            for (int k = 0; k < nc; k++) bb[k] = ty_ld(xb, (size_t)img * c + c0 + k, dt);
        for (int k = 0; k < nc; k++) mu[k] = m2[k] = 0.0;
        for (int p0 = 0; p0 < hw; p0 += crow) {
            const int nb = hw - p0 < crow ? hw - p0 : crow;
            const void *xr[GN_CHUNK]; /* fp32 rows with xb, else of dtype TY_LDT(dt) */
            for (int j = 0; j < nb; j++) {
                const size_t off = base + (size_t)(p0 + j) * c;
                float *cb = dt == BK_DTYPE_F32 ? NULL : cbuf + (size_t)j * nc;
                if (xb) { /* x' = round(x + xb), stored, summed as stored */
                    const float *xf = ty_row(x, off, (size_t)nc, dt, cb);
                    float *o = ty_out(xo, off, dt, cb); /* xo may be x: read before written */
#pragma omp simd
                    for (int k = 0; k < nc; k++) o[k] = ty_round(xf[k] + bb[k], dt);
                    ty_put(xo, off, (size_t)nc, dt, o);
                    xr[j] = o;
                } else {
                    xr[j] = ty_rowl(x, off, (size_t)nc, dt, cb);
                }
            }
            if (xb) gn_chunk_sums(cm, ce, cq, xr, nb, nc, BK_DTYPE_F32);
            else gn_chunk_sums(cm, ce, cq, xr, nb, nc, TY_LDT(dt));
            gn_chunk_merge(mu, m2, cm, ce, cq, nc, p0, nb);
        }
        float m[GN_MAX_BLOCK], rs[GN_MAX_BLOCK], gm[GN_MAX_BLOCK], bt[GN_MAX_BLOCK];
        float ybv[GN_MAX_BLOCK];
        for (int k0 = 0; k0 < nc; k0 += cpg) {
            /* the channels' (hw, mean, M2) merged: all of one count */
            double gmu = 0.0, ss = 0.0, sd = 0.0;
            for (int k = k0; k < k0 + cpg; k++) gmu += mu[k];
            gmu /= cpg;
            for (int k = k0; k < k0 + cpg; k++) {
                const double d = mu[k] - gmu;
                ss += m2[k];
                sd += d * d;
            }
            ss += sd * hw;
            int gi = img * groups + (c0 + k0) / cpg;
            mean[gi] = (float)gmu;
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
            const void *xr = ty_rowl(xs, off, (size_t)nc, dt, buf);
            const void *rr = yr ? ty_rowl(yr, off, (size_t)nc, dt, rbuf) : NULL;
            void *o = ty_outl(y, off, dt, obuf);
            /* the form as constants, one inlined loop each: with the flags tested inside, the
             * loop has control flow and stays scalar (no loop unswitching at -O2) */
            switch ((silu ? 4 : 0) | (yb ? 2 : 0) | (yr ? 1 : 0)) {
            case 0: gn_norm_row(o, xr, rr, m, rs, gm, bt, ybv, nc, 0, 0, 0, dt); break;
            case 1: gn_norm_row(o, xr, rr, m, rs, gm, bt, ybv, nc, 0, 0, 1, dt); break;
            case 2: gn_norm_row(o, xr, rr, m, rs, gm, bt, ybv, nc, 0, 1, 0, dt); break;
            case 3: gn_norm_row(o, xr, rr, m, rs, gm, bt, ybv, nc, 0, 1, 1, dt); break;
            case 4: gn_norm_row(o, xr, rr, m, rs, gm, bt, ybv, nc, 1, 0, 0, dt); break;
            case 5: gn_norm_row(o, xr, rr, m, rs, gm, bt, ybv, nc, 1, 0, 1, dt); break;
            case 6: gn_norm_row(o, xr, rr, m, rs, gm, bt, ybv, nc, 1, 1, 0, dt); break;
            default: gn_norm_row(o, xr, rr, m, rs, gm, bt, ybv, nc, 1, 1, 1, dt); break;
            }
            ty_putl(y, off, (size_t)nc, dt, obuf);
        }
    }
    return BK_OK;
}

/* one pixel's dx block from the per-channel coefficients: o (=, += when accum) ca g +
 * cb (x - mean) + cc; o and xr of dtype ldt, g of gt (gn_bwd_image) */
TY_INLINE void gn_dx_row(void *o, const void *xr, const void *g, const float *ca, const float *cb,
                         const float *cc, const float *mf, int nc, int accum, int ldt, int gt)
{
#pragma omp simd
    for (int k = 0; k < nc; k++) {
        const float v = ca[k] * ty_ld(g, (size_t)k, gt) +
                        cb[k] * (ty_ld(xr, (size_t)k, ldt) - mf[k]) + cc[k];
        ty_st(o, (size_t)k, accum ? ty_ld(o, (size_t)k, ldt) + v : v, ldt);
    }
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
    const int ldt = TY_LDT(dt); /* the rows' dtype in the loops (typed.h's ty_rowl) */
    for (int p0 = 0; p0 < hw; p0 += GN_CHUNK) {
        const int p1 = p0 + GN_CHUNK < hw ? p0 + GN_CHUNK : hw;
        for (int k = 0; k < nc; k++) fg[k] = fb[k] = 0.0f;
        for (int p = p0; p < p1; p++) {
            const void *xr = ty_rowl(x, off + (size_t)p * c, (size_t)nc, dt, xbuf);
            const void *dr = ty_rowl(dy, off + (size_t)p * c, (size_t)nc, dt, dbuf);
            if (db_dy)
#pragma omp simd
                for (int k = 0; k < nc; k++) dbs[k] += (double)ty_ld(dr, (size_t)k, ldt);
            if (silu) { /* one loop: xhat once, g stored and summed while in registers */
                float *gz = gzbuf + (size_t)p * nc;
#pragma omp simd
                for (int k = 0; k < nc; k++) {
                    const float xh = (ty_ld(xr, (size_t)k, ldt) - mf[k]) * rf[k];
                    const float g = ty_ld(dr, (size_t)k, ldt) * vm_silu_grad(xh * gm[k] + bt[k]);
                    gz[k] = g;
                    fg[k] += g * xh;
                    fb[k] += g;
                }
            } else {
#pragma omp simd
                for (int k = 0; k < nc; k++) {
                    const float d = ty_ld(dr, (size_t)k, ldt);
                    fg[k] += d * ((ty_ld(xr, (size_t)k, ldt) - mf[k]) * rf[k]);
                    fb[k] += d;
                }
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
            const void *xr = ty_rowl(x, po, (size_t)nc, dt, xbuf);
            void *o = ty_outl(dx, po, dt, obuf);
            if (accum && dt == BK_DTYPE_F16)
                cpu_convert_run(obuf, BK_DTYPE_F32, ty_at(dx, po, dt), dt, (size_t)nc);
            /* g: the fp32 gz row (silu) or dy's row; the flags as constants (gn_norm_row) */
            if (silu && accum)
                gn_dx_row(o, xr, gzbuf + (size_t)p * nc, ca, cb, cc, mf, nc, 1, ldt, BK_DTYPE_F32);
            else if (silu)
                gn_dx_row(o, xr, gzbuf + (size_t)p * nc, ca, cb, cc, mf, nc, 0, ldt, BK_DTYPE_F32);
            else if (accum)
                gn_dx_row(o, xr, ty_rowl(dy, po, (size_t)nc, dt, dbuf), ca, cb, cc, mf, nc, 1, ldt,
                          ldt);
            else
                gn_dx_row(o, xr, ty_rowl(dy, po, (size_t)nc, dt, dbuf), ca, cb, cc, mf, nc, 0, ldt,
                          ldt);
            ty_putl(dx, po, (size_t)nc, dt, obuf);
            if (db && db_of_dx) /* dx as stored: o holds it rounded unless an f16 buffer */
#pragma omp simd
                for (int k = 0; k < nc; k++)
                    dbs[k] += (double)ty_round(ty_ld(o, (size_t)k, ldt), dt);
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

/* norm512.c: the two bodies above in AVX-512, on operands of dtype dt (any of the three) */
int gn_fwd_task_avx512(int t, void *y, float *mean, float *rstd, void *xo, const void *x,
                       const void *xb, const void *yb, const void *yr, const float *gamma,
                       const float *beta, int c, int hw, int groups, float eps, int silu, int blk,
                       int nblk, int dt);
int gn_bwd_image_avx512(void *dx, double *sg, double *sb, void *db, const void *dy, const void *x,
                        const float *gamma, const float *beta, const float *mean,
                        const float *rstd, int accum, int db_accum, int db_of_dx, int c, int hw,
                        int groups, int img, int c0, int nc, float *gzbuf, int dt);

#endif
