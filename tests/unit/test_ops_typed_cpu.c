/* test_ops_typed_cpu.c - the CPU backend's typed memory-bound kernels (struct bk_typed, typed.c),
 * a table of cases in the style of ggml's test-backend-ops: each entry in bf16 (and f16 for a
 * few) gives, bit for bit, what its fp32 entry gives on the same values converted to fp32 with
 * the result rounded once (an accumulating output: round(y + r), the sum in fp32: backend.h),
 * at 1 and 2 threads; fp32 through the table gives the fp32 entries' bits, the fused group
 * norms the unfused ops'; and against float64 references on the same bf16 inputs (SiLU, the
 * group norm, the broadcast add's gradient) within half a bf16 ulp of the exact value plus the
 * fp32 arithmetic's slack.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "half.h"
#include "test_util.h"

static bk_ctx *ctx;          /* the thread count under test */
static int dt = BK_DTYPE_BF16; /* the 16-bit type under test */
static const struct bk_typed *T;

/* a 16-bit operand: its bits h and their exact values f */
struct op16 {
    uint16_t *h;
    float *f;
    size_t n;
};

static void *xmalloc(size_t n)
{
    void *p = calloc(1, n ? n : 1);
    if (!p) abort();
    return p;
}

static float r16(float v)
{
    return dt == BK_DTYPE_BF16 ? half_bf16_to_f32(half_f32_to_bf16(v))
                               : half_f16_to_f32(half_f32_to_f16(v));
}
static uint16_t to16(float v)
{
    return dt == BK_DTYPE_BF16 ? half_f32_to_bf16(v) : half_f32_to_f16(v);
}
static float from16(uint16_t h)
{
    return dt == BK_DTYPE_BF16 ? half_bf16_to_f32(h) : half_f16_to_f32(h);
}

static struct op16 mk(size_t n, double scale, double off)
{
    struct op16 o = {xmalloc(n * 2), xmalloc(n * 4), n};
    for (size_t i = 0; i < n; i++) {
        o.h[i] = to16((float)(tu_rand() * scale + off));
        o.f[i] = from16(o.h[i]);
    }
    return o;
}

static void fr(struct op16 *o)
{
    free(o->h);
    free(o->f);
}

/* a copy of o (the prior contents of an accumulating output) */
static struct op16 dup(const struct op16 *o)
{
    struct op16 c = {xmalloc(o->n * 2), xmalloc(o->n * 4), o->n};
    memcpy(c.h, o->h, o->n * 2);
    memcpy(c.f, o->f, o->n * 4);
    return c;
}

/* elements where the typed result got differs from the fp32 result ref rounded once; got's
 * exact values then follow its bits (it may be a later case's input) */
static size_t miss(const struct op16 *got, const float *ref)
{
    size_t bad = 0;
    for (size_t i = 0; i < got->n; i++) {
        uint16_t want = to16(ref[i]);
        if (got->h[i] != want && !(isnan(ref[i]) && isnan(from16(got->h[i])))) bad++;
        if (got->f) got->f[i] = from16(got->h[i]);
    }
    return bad;
}

#define SAME(got, ref, what)                                                                       \
    do {                                                                                           \
        size_t m_ = miss(&(got), (ref));                                                           \
        CHECK(m_ == 0, "%s (%s, %d threads): %zu of %zu elements differ from the fp32 kernel's",  \
              what, dt == BK_DTYPE_BF16 ? "bf16" : "f16", ctx->threads, m_, (got).n);            \
    } while (0)

/* ---- the cases ---- */

static void case_eltwise(size_t count)
{
    struct op16 x = mk(count, 6.0, 0.0), dy = mk(count, 1.0, 0.0), b = mk(count, 2.0, 0.0);
    struct op16 y = mk(count, 1.0, 0.0);
    float *r = xmalloc(count * 4);
    for (int accum = 0; accum < 2; accum++) {
        struct op16 p = dup(&y);
        memcpy(r, p.f, count * 4);
        CHECK(T->silu_bwd(p.h, dy.h, x.h, accum, count, dt, ctx) == BK_OK, "silu_bwd");
        cpu_silu_bwd(r, dy.f, x.f, accum, count, ctx);
        SAME(p, r, accum ? "silu_bwd +=" : "silu_bwd");
        memcpy(p.h, y.h, count * 2);
        memcpy(r, y.f, count * 4);
        CHECK(T->gelu_bwd(p.h, dy.h, x.h, accum, count, dt, ctx) == BK_OK, "gelu_bwd");
        cpu_gelu_bwd(r, dy.f, x.f, accum, count, ctx);
        SAME(p, r, accum ? "gelu_bwd +=" : "gelu_bwd");
        memcpy(p.h, y.h, count * 2);
        memcpy(r, y.f, count * 4);
        CHECK(T->copy_grad(p.h, dy.h, accum, count, dt, ctx) == BK_OK, "copy_grad");
        cpu_copy_grad(r, dy.f, accum, count, ctx);
        SAME(p, r, accum ? "copy_grad +=" : "copy_grad");
        fr(&p);
    }
    CHECK(T->silu_fwd(y.h, x.h, count, dt, ctx) == BK_OK, "silu_fwd");
    cpu_silu_fwd(r, x.f, count, ctx);
    SAME(y, r, "silu_fwd");
    /* against float64: half an ulp of the type plus vmath's few fp32 ulps */
    size_t far = 0;
    for (size_t i = 0; i < count; i++) {
        double v = x.f[i], want = v / (1.0 + exp(-v)), got = from16(y.h[i]);
        double ulp = dt == BK_DTYPE_BF16 ? ldexp(1.0, -8) : ldexp(1.0, -11);
        /* f16's subnormals: absolute steps of 2^-24 */
        double tiny = dt == BK_DTYPE_F16 ? ldexp(1.0, -25) : 1e-30;
        if (!(fabs(got - want) <= ulp * fabs(want) * 1.0001 + 1e-6 * fabs(want) + tiny)) far++;
    }
    CHECK(far == 0, "silu_fwd (%d): %zu of %zu elements beyond half an ulp of float64's", dt, far,
          count);
    CHECK(T->gelu_fwd(y.h, x.h, count, dt, ctx) == BK_OK, "gelu_fwd");
    cpu_gelu_fwd(r, x.f, count, ctx);
    SAME(y, r, "gelu_fwd");
    CHECK(T->add_fwd(y.h, x.h, b.h, count, dt, ctx) == BK_OK, "add_fwd");
    cpu_add_fwd(r, x.f, b.f, count, ctx);
    SAME(y, r, "add_fwd");
    CHECK(T->scale_fwd(y.h, x.h, 0.3f, count, dt, ctx) == BK_OK, "scale_fwd");
    cpu_scale_fwd(r, x.f, 0.3f, count, ctx);
    SAME(y, r, "scale_fwd");
    free(r);
    fr(&x), fr(&dy), fr(&b), fr(&y);
}

static void case_bcast(int n, int c, int hw)
{
    size_t count = (size_t)n * c * hw;
    struct op16 x = mk(count, 3.0, 0.0), b = mk((size_t)n * c, 2.0, 0.0), y = mk(count, 1.0, 0);
    float *r = xmalloc(count * 4);
    CHECK(T->add_bcast_fwd(y.h, x.h, b.h, n, c, hw, dt, ctx) == BK_OK, "add_bcast_fwd");
    cpu_add_bcast_fwd(r, x.f, b.f, n, c, hw, ctx);
    SAME(y, r, "add_bcast_fwd");
    for (int accum = 0; accum < 2; accum++) {
        struct op16 db = dup(&b);
        memcpy(r, b.f, (size_t)n * c * 4);
        CHECK(T->add_bcast_bwd(db.h, x.h, accum, n, c, hw, dt, ctx) == BK_OK, "add_bcast_bwd");
        cpu_add_bcast_bwd(r, x.f, accum, n, c, hw, ctx);
        SAME(db, r, accum ? "add_bcast_bwd +=" : "add_bcast_bwd");
        if (!accum) { /* float64: the sum of the bf16 values, rounded */
            size_t far = 0;
            for (int i = 0; i < n; i++)
                for (int k = 0; k < c; k++) {
                    double s = 0;
                    for (int p = 0; p < hw; p++) s += x.f[((size_t)i * hw + p) * c + k];
                    double got = from16(db.h[(size_t)i * c + k]);
                    if (!(fabs(got - s) <= ldexp(1.0, -8) * fabs(s) * 1.0001 + 1e-30)) far++;
                }
            CHECK(far == 0, "add_bcast_bwd: %zu sums beyond half an ulp of float64's", far);
        }
        fr(&db);
    }
    free(r);
    fr(&x), fr(&b), fr(&y);
}

/* the typed group norm, fused and plain, against the fp32 kernels' unfused ops on converted
 * values with the unfused ops' rounding points */
static void case_groupnorm(int n, int c, int hw, int groups, int silu)
{
    const size_t count = (size_t)n * c * hw, nc = (size_t)n * c, ng = (size_t)n * groups;
    struct bk_groupnorm s = {n, c, hw, groups, 1e-5f, silu, dt};
    struct op16 x = mk(count, 2.0, 0.5), xb = mk(nc, 1.0, 0.0), yb = mk(nc, 1.0, 0.0);
    struct op16 yr = mk(count, 1.0, 0.0), y = mk(count, 1.0, 0.0), xo = mk(count, 1.0, 0.0);
    float *gamma = xmalloc(c * 4), *beta = xmalloc(c * 4);
    tu_fill(gamma, (size_t)c, 1.0);
    tu_fill(beta, (size_t)c, 0.5);
    float *m16 = xmalloc(ng * 4), *s16 = xmalloc(ng * 4), *m32 = xmalloc(ng * 4),
          *s32 = xmalloc(ng * 4), *r = xmalloc(count * 4), *xp = xmalloc(count * 4);
    /* plain, then x' = x + xb (into xo), then y = gn + yb, then y = gn + yr (y in yr's place) */
    for (int form = 0; form < 4; form++) {
        const void *bx = form == 1 ? xb.h : NULL, *by = form == 2 ? yb.h : NULL;
        struct op16 yy = form == 3 ? dup(&yr) : dup(&y);
        CHECK(T->groupnorm_fwd(yy.h, m16, s16, xo.h, x.h, bx, by, form == 3 ? yy.h : NULL, gamma,
                               beta, NULL, &s, ctx) == BK_OK,
              "groupnorm_fwd form %d", form);
        memcpy(xp, x.f, count * 4);
        if (form == 1) {
            cpu_add_bcast_fwd(xp, x.f, xb.f, n, c, hw, ctx);
            for (size_t i = 0; i < count; i++) xp[i] = r16(xp[i]);
            struct op16 xo_want = {xo.h, NULL, count};
            SAME(xo_want, xp, "groupnorm_fwd x' = x + xb");
        }
        (silu ? cpu_groupnorm_silu_fwd : cpu_groupnorm_fwd)(r, m32, s32, xp, gamma, beta, n, c,
                                                           hw, groups, 1e-5f, ctx);
        if (form >= 2) {
            for (size_t i = 0; i < count; i++) r[i] = r16(r[i]);
            if (form == 2) cpu_add_bcast_fwd(r, r, yb.f, n, c, hw, ctx);
            else cpu_add_fwd(r, r, yr.f, count, ctx);
        }
        SAME(yy, r, form == 0 ? "groupnorm_fwd" : form == 1 ? "groupnorm_fwd x + xb"
                                               : form == 2 ? "groupnorm_fwd + yb"
                                                           : "groupnorm_fwd + yr in place");
        CHECK(!memcmp(m16, m32, ng * 4) && !memcmp(s16, s32, ng * 4),
              "groupnorm_fwd form %d: statistics differ from the fp32 kernel's", form);
        if (form == 0 && !silu) { /* float64 on the bf16 x */
            size_t far = 0;
            const int cpg = c / groups;
            for (int i = 0; i < n; i++)
                for (int g = 0; g < groups; g++) {
                    double sum = 0, ss = 0, cnt = (double)cpg * hw;
                    for (int p = 0; p < hw; p++)
                        for (int k = g * cpg; k < (g + 1) * cpg; k++)
                            sum += x.f[((size_t)i * hw + p) * c + k];
                    double mu = sum / cnt;
                    for (int p = 0; p < hw; p++)
                        for (int k = g * cpg; k < (g + 1) * cpg; k++) {
                            double d = x.f[((size_t)i * hw + p) * c + k] - mu;
                            ss += d * d;
                        }
                    double rs = 1.0 / sqrt(ss / cnt + 1e-5);
                    for (int p = 0; p < hw; p++)
                        for (int k = g * cpg; k < (g + 1) * cpg; k++) {
                            size_t e = ((size_t)i * hw + p) * c + k;
                            double xn = (x.f[e] - mu) * rs * gamma[k], want = xn + beta[k];
                            double bound = ldexp(1.0, -8) * fabs(want) * 1.0001 +
                                           1e-6 * (fabs(xn) + fabs(beta[k]) + 1.0);
                            if (!(fabs(from16(yy.h[e]) - want) <= bound)) far++;
                        }
                }
            CHECK(far == 0, "groupnorm_fwd: %zu of %zu beyond half an ulp of float64's", far,
                  count);
        }
        fr(&yy);
    }
    /* the backward: dx (=/+=), dgamma/dbeta, db of dx or of dy (=/+=) */
    struct op16 dy = mk(count, 1.0, 0.0), dxp = mk(count, 1.0, 0.0), dbp = mk(nc, 1.0, 0.0);
    size_t wsb = T->groupnorm_ws_bytes(&s, 1);
    void *ws = xmalloc(wsb);
    float *dg16 = xmalloc(c * 4), *dbt16 = xmalloc(c * 4), *dg32 = xmalloc(c * 4),
          *dbt32 = xmalloc(c * 4), *rdb = xmalloc(nc * 4);
    cpu_groupnorm_fwd(r, m32, s32, x.f, gamma, beta, n, c, hw, groups, 1e-5f, ctx);
    for (int form = 0; form < 6; form++) {
        const int accum = form & 1, dbmode = form >> 1; /* 0: no db, 1: of dx, 2: of dy */
        struct op16 dx = dup(&dxp), db = dup(&dbp);
        memset(dg16, 0, c * 4), memset(dbt16, 0, c * 4), memset(dg32, 0, c * 4);
        memset(dbt32, 0, c * 4);
        CHECK(T->groupnorm_bwd(dx.h, dg16, dbt16, dbmode ? db.h : NULL, dy.h, x.h, gamma, beta,
                               m32, s32, accum, accum, dbmode == 1, ws, &s, ctx) == BK_OK,
              "groupnorm_bwd form %d", form);
        memcpy(r, dxp.f, count * 4);
        cpu_groupnorm_bwd_ws(r, dg32, dbt32, dy.f, x.f, gamma, silu ? beta : NULL, m32, s32,
                             accum, n, c, hw, groups, silu, ws, ctx);
        SAME(dx, r, accum ? "groupnorm_bwd dx +=" : "groupnorm_bwd dx");
        CHECK(!memcmp(dg16, dg32, c * 4) && !memcmp(dbt16, dbt32, c * 4),
              "groupnorm_bwd form %d: dgamma/dbeta differ from the fp32 kernel's", form);
        if (dbmode) {
            for (size_t i = 0; i < count; i++) r[i] = r16(r[i]); /* dx as stored */
            memcpy(rdb, dbp.f, nc * 4);
            cpu_add_bcast_bwd(rdb, dbmode == 1 ? r : dy.f, accum, n, c, hw, ctx);
            SAME(db, rdb, dbmode == 1 ? "groupnorm_bwd db of dx" : "groupnorm_bwd db of dy");
        }
        fr(&dx), fr(&db);
    }
    free(ws), free(dg16), free(dbt16), free(dg32), free(dbt32), free(rdb);
    fr(&dy), fr(&dxp), fr(&dbp);
    free(gamma), free(beta), free(m16), free(s16), free(m32), free(s32), free(r), free(xp);
    fr(&x), fr(&xb), fr(&yb), fr(&yr), fr(&y), fr(&xo);
}

static void case_layernorm(int m, int d)
{
    const size_t count = (size_t)m * d;
    struct op16 x = mk(count, 2.0, 0.3), y = mk(count, 1.0, 0.0), dy = mk(count, 1.0, 0.0);
    float *gamma = xmalloc(d * 4), *beta = xmalloc(d * 4), *mu16 = xmalloc(m * 4),
          *rs16 = xmalloc(m * 4), *mu = xmalloc(m * 4), *rs = xmalloc(m * 4),
          *r = xmalloc(count * 4), *g16 = xmalloc(d * 4), *b16 = xmalloc(d * 4),
          *g32 = xmalloc(d * 4), *b32 = xmalloc(d * 4);
    tu_fill(gamma, (size_t)d, 1.0);
    tu_fill(beta, (size_t)d, 0.5);
    CHECK(T->layernorm_fwd(y.h, mu16, rs16, x.h, gamma, beta, m, d, 1e-5f, dt, ctx) == BK_OK,
          "layernorm_fwd");
    cpu_layernorm_fwd(r, mu, rs, x.f, gamma, beta, m, d, 1e-5f, ctx);
    SAME(y, r, "layernorm_fwd");
    CHECK(!memcmp(mu, mu16, m * 4) && !memcmp(rs, rs16, m * 4), "layernorm_fwd statistics");
    for (int accum = 0; accum < 2; accum++) {
        struct op16 dx = dup(&y);
        memcpy(r, y.f, count * 4);
        memset(g16, 0, d * 4), memset(b16, 0, d * 4), memset(g32, 0, d * 4), memset(b32, 0, d * 4);
        CHECK(T->layernorm_bwd(dx.h, g16, b16, dy.h, x.h, gamma, mu, rs, accum, m, d, dt, ctx) ==
                  BK_OK,
              "layernorm_bwd");
        cpu_layernorm_bwd(r, g32, b32, dy.f, x.f, gamma, mu, rs, accum, m, d, ctx);
        SAME(dx, r, accum ? "layernorm_bwd +=" : "layernorm_bwd");
        CHECK(!memcmp(g16, g32, d * 4) && !memcmp(b16, b32, d * 4), "layernorm_bwd dgamma/dbeta");
        fr(&dx);
    }
    free(gamma), free(beta), free(mu16), free(rs16), free(mu), free(rs), free(r), free(g16);
    free(b16), free(g32), free(b32);
    fr(&x), fr(&y), fr(&dy);
}

static void case_layout(int n, int c1, int c2, int hw)
{
    const size_t ct = (size_t)c1 + c2, count = (size_t)n * ct * hw;
    struct op16 a = mk((size_t)n * c1 * hw, 1.0, 0), b = mk((size_t)n * c2 * hw, 1.0, 0);
    struct op16 y = mk(count, 1.0, 0);
    float *r = xmalloc(count * 4), *ra = xmalloc(a.n * 4), *rb = xmalloc(b.n * 4);
    CHECK(T->concat_fwd(y.h, a.h, b.h, n, c1, c2, hw, dt, ctx) == BK_OK, "concat_fwd");
    cpu_concat_fwd(r, a.f, b.f, n, c1, c2, hw, ctx);
    SAME(y, r, "concat_fwd");
    for (int accum = 0; accum < 2; accum++) {
        struct op16 da = dup(&a), db = dup(&b);
        memcpy(ra, a.f, a.n * 4), memcpy(rb, b.f, b.n * 4);
        CHECK(T->concat_bwd(da.h, db.h, y.h, accum, !accum, n, c1, c2, hw, dt, ctx) == BK_OK,
              "concat_bwd");
        cpu_concat_bwd(ra, rb, y.f, accum, !accum, n, c1, c2, hw, ctx);
        SAME(da, ra, "concat_bwd da");
        SAME(db, rb, "concat_bwd db");
        /* the transpose (N,C,HW) -> (N,HW,C), = and += */
        struct op16 t = dup(&y);
        memcpy(r, y.f, count * 4);
        CHECK(T->transpose_fwd(t.h, a.h, accum, n, c1, hw, dt, ctx) == BK_OK,
              "transpose_fwd");
        cpu_transpose_fwd(r, a.f, accum, n, c1, hw, ctx);
        t.n = a.n;
        SAME(t, r, accum ? "transpose_fwd +=" : "transpose_fwd");
        t.n = count;
        fr(&da), fr(&db), fr(&t);
    }
    free(r), free(ra), free(rb);
    fr(&a), fr(&b), fr(&y);
}

static void case_resample(int n, int c, int h, int w)
{
    const size_t small = (size_t)n * c * h * w, big = 4 * small;
    const size_t half = (size_t)n * c * (h / 2) * (w / 2);
    struct op16 x = mk(small, 2.0, 0), g = mk(big, 1.0, 0), y = mk(big, 1.0, 0);
    struct op16 dx = mk(small, 1.0, 0), q = mk(half, 1.0, 0);
    float *r = xmalloc(big * 4);
    CHECK(T->upsample_nearest2x_fwd(y.h, x.h, n, c, h, w, dt, ctx) == BK_OK, "nearest fwd");
    cpu_upsample_nearest2x_fwd(r, x.f, n, c, h, w, ctx);
    SAME(y, r, "upsample_nearest2x_fwd");
    for (int ac = 0; ac < 2; ac++) {
        CHECK(T->upsample_bilinear2x_fwd(y.h, x.h, ac, n, c, h, w, dt, ctx) == BK_OK,
              "bilinear fwd");
        cpu_upsample_bilinear2x_fwd(r, x.f, ac, n, c, h, w, ctx);
        SAME(y, r, "upsample_bilinear2x_fwd");
    }
    CHECK(T->maxpool2x2_fwd(q.h, x.h, n, c, h, w, dt, ctx) == BK_OK, "maxpool fwd");
    cpu_maxpool2x2_fwd(r, x.f, n, c, h, w, ctx);
    SAME(q, r, "maxpool2x2_fwd");
    for (int form = 0; form < 4; form++) {
        const int accum = form & 1, ac = form >> 1;
        struct op16 d = dup(&dx);
        memcpy(r, dx.f, small * 4);
        CHECK(T->upsample_nearest2x_bwd(d.h, g.h, accum, n, c, h, w, dt, ctx) == BK_OK, "nb");
        cpu_upsample_nearest2x_bwd(r, g.f, accum, n, c, h, w, ctx);
        SAME(d, r, accum ? "upsample_nearest2x_bwd +=" : "upsample_nearest2x_bwd");
        memcpy(d.h, dx.h, small * 2);
        memcpy(r, dx.f, small * 4);
        CHECK(T->upsample_bilinear2x_bwd(d.h, g.h, ac, accum, n, c, h, w, dt, ctx) == BK_OK,
              "bilinear bwd");
        cpu_upsample_bilinear2x_bwd(r, g.f, ac, accum, n, c, h, w, ctx);
        SAME(d, r, accum ? "upsample_bilinear2x_bwd +=" : "upsample_bilinear2x_bwd");
        memcpy(d.h, dx.h, small * 2);
        memcpy(r, dx.f, small * 4);
        CHECK(T->maxpool2x2_bwd(d.h, q.h, x.h, accum, n, c, h, w, dt, ctx) == BK_OK, "mp bwd");
        cpu_maxpool2x2_bwd(r, q.f, x.f, accum, n, c, h, w, ctx);
        SAME(d, r, accum ? "maxpool2x2_bwd +=" : "maxpool2x2_bwd");
        fr(&d);
    }
    free(r);
    fr(&x), fr(&g), fr(&y), fr(&dx), fr(&q);
}

static void case_dropout(int n, size_t per_sample, int channels)
{
    const size_t count = (size_t)n * per_sample;
    struct op16 x = mk(count, 2.0, 0), y = mk(count, 1.0, 0);
    float *r = xmalloc(count * 4);
    CHECK(T->dropout_fwd(y.h, x.h, 0.3f, 7, 5, 9, 2, n, per_sample, channels, dt, ctx) == BK_OK,
          "dropout_fwd");
    cpu_dropout_fwd(r, x.f, 0.3f, 7, 5, 9, 2, n, per_sample, channels, ctx);
    SAME(y, r, "dropout_fwd");
    for (int accum = 0; accum < 2; accum++) {
        struct op16 d = dup(&y);
        memcpy(r, y.f, count * 4);
        CHECK(T->dropout_bwd(d.h, x.h, 0.3f, 7, 5, 9, 2, accum, n, per_sample, channels, dt,
                             ctx) == BK_OK,
              "dropout_bwd");
        cpu_dropout_bwd(r, x.f, 0.3f, 7, 5, 9, 2, accum, n, per_sample, channels, ctx);
        SAME(d, r, accum ? "dropout_bwd +=" : "dropout_bwd");
        fr(&d);
    }
    free(r);
    fr(&x), fr(&y);
}

/* fp32 through the table: the fp32 entries' bits (the fused group norm against the unfused
 * kernels, y in the residual's place) */
static void case_f32_fused(int n, int c, int hw, int groups)
{
    const size_t count = (size_t)n * c * hw, nc = (size_t)n * c, ng = (size_t)n * groups;
    struct bk_groupnorm s = {n, c, hw, groups, 1e-5f, 1, BK_DTYPE_F32};
    float *x = xmalloc(count * 4), *xb = xmalloc(nc * 4), *res = xmalloc(count * 4),
          *y = xmalloc(count * 4), *r = xmalloc(count * 4), *xo = xmalloc(count * 4),
          *xp = xmalloc(count * 4), *m = xmalloc(ng * 4), *sd = xmalloc(ng * 4);
    tu_fill(x, count, 2.0);
    tu_fill(xb, nc, 1.0);
    tu_fill(res, count, 1.0);
    memcpy(y, res, count * 4);
    CHECK(T->groupnorm_fwd(y, m, sd, xo, x, xb, NULL, y, NULL, NULL, NULL, &s, ctx) == BK_OK,
          "fp32 fused groupnorm_fwd");
    cpu_add_bcast_fwd(xp, x, xb, n, c, hw, ctx);
    cpu_groupnorm_silu_fwd(r, m, sd, xp, NULL, NULL, n, c, hw, groups, 1e-5f, ctx);
    cpu_add_fwd(r, r, res, count, ctx);
    CHECK(!memcmp(xo, xp, count * 4) && !memcmp(y, r, count * 4),
          "fp32: the fused group norm (x + xb, silu, + residual) differs from the unfused ops");
    free(x), free(xb), free(res), free(y), free(r), free(xo), free(xp), free(m), free(sd);
}

/* the group norm's AVX2 body and the machine's AVX-512 one (norm512.c, cpu_isa) give the same
 * bits: forward (plain + SiLU, and x + xb with the residual added in place) and backward (dx +=,
 * dgamma, dbeta, db of dx), fp32 and 16-bit; on an AVX2-only machine both runs take AVX2 */
static void case_groupnorm_isa(int n, int c, int hw, int groups)
{
    const size_t count = (size_t)n * c * hw, nc = (size_t)n * c, ng = (size_t)n * groups;
    float *gamma = xmalloc(c * 4), *beta = xmalloc(c * 4);
    tu_fill(gamma, (size_t)c, 1.0);
    tu_fill(beta, (size_t)c, 0.5);
    for (int d = 0; d < 2; d++) {
        const int ty = d ? dt : BK_DTYPE_F32;
        const size_t es = d ? 2 : 4;
        struct bk_groupnorm s = {n, c, hw, groups, 1e-5f, 1, ty};
        unsigned char *in = xmalloc(3 * count * es + nc * es), *out[2];
        for (size_t i = 0; i < 3 * count + nc; i++) { /* x, dy, the residual, xb */
            float v = (float)(2.0 * tu_rand() + (i < count ? 0.5 : 0.0));
            if (d) ((uint16_t *)in)[i] = dt == BK_DTYPE_BF16 ? half_f32_to_bf16(v)
                                                             : half_f32_to_f16(v);
            else ((float *)in)[i] = v;
        }
        const void *x = in, *dy = in + count * es, *res = in + 2 * count * es,
                   *xb = in + 3 * count * es;
        void *ws = xmalloc(T->groupnorm_ws_bytes(&s, 1));
        /* per pass: y, y2 (+ residual), xo, dx (count each), db (nc), 4 stats and dg, dbt */
        const size_t bytes = 4 * count * es + nc * es + 4 * ng * 4 + 2 * (size_t)c * 4;
        for (int pass = 0; pass < 2; pass++) {
            cpu_isa_cap(pass ? -1 : CPU_ISA_AVX2);
            unsigned char *o = out[pass] = xmalloc(bytes);
            void *y = o, *y2 = o + count * es, *xo = o + 2 * count * es, *dx = o + 3 * count * es;
            void *db = o + 4 * count * es;
            float *st = (float *)(o + 4 * count * es + nc * es), *dg = st + 4 * ng, *dbt = dg + c;
            memcpy(y2, res, count * es);
            memcpy(dx, dy, count * es); /* dx += onto these values */
            CHECK(T->groupnorm_fwd(y, st, st + ng, NULL, x, NULL, NULL, NULL, gamma, beta, NULL,
                                   &s, ctx) == BK_OK &&
                      T->groupnorm_fwd(y2, st + 2 * ng, st + 3 * ng, xo, x, xb, NULL, y2, gamma,
                                       beta, NULL, &s, ctx) == BK_OK &&
                      T->groupnorm_bwd(dx, dg, dbt, db, dy, x, gamma, beta, st, st + ng, 1, 0, 1,
                                       ws, &s, ctx) == BK_OK,
                  "groupnorm isa pass %d", pass);
        }
        cpu_isa_cap(-1);
        CHECK(!memcmp(out[0], out[1], bytes),
              "groupnorm (%s, %d threads): the AVX2 and the machine's (isa %d) bodies differ",
              d ? "16-bit" : "fp32", ctx->threads, cpu_isa());
        free(out[0]), free(out[1]), free(in), free(ws);
    }
    free(gamma), free(beta);
}

int main(void)
{
    T = backend_cpu()->typed;
    CHECK(T != NULL, "the CPU backend has typed kernels");
    if (!T) return tu_finish("test_ops_typed_cpu");
    CHECK(T->silu_fwd(NULL, NULL, 1, 7, NULL) == BK_ERR_INVALID, "an unknown dtype is refused");
    for (int threads = 1; threads <= 2; threads++) {
        if (cpu_ctx_init(&ctx, threads) != BK_OK) return 1;
        for (int d = 0; d < 2; d++) {
            dt = d ? BK_DTYPE_F16 : BK_DTYPE_BF16;
            tu_seed(23 + threads);
            case_eltwise(3 * 16384 + 777); /* parallel, a partial last block */
            case_eltwise(1000);            /* one thread */
            case_bcast(2, 96, 200);
            case_bcast(3, 24, 7);
            case_groupnorm(2, 64, 144, 8, 0);
            case_groupnorm(2, 96, 100, 32, 1);
            case_groupnorm(1, 128, 64, 32, 1);
            case_groupnorm(2, 120, 40, 10, 1); /* blocks of 96 and 24: the bf16 loops' tails */
            case_groupnorm_isa(2, 96, 100, 32);
            case_groupnorm_isa(2, 120, 40, 10);
            case_layernorm(300, 96);
            case_layout(2, 48, 80, 130);
            case_resample(2, 70, 6, 10);
            case_resample(1, 16, 5, 7); /* odd rows and columns */
            case_dropout(3, 64 * 36, 64);      /* NHWC, HW a multiple of 4 */
            case_dropout(2, 24 * 9, 24);       /* HW not */
            case_dropout(2, 5000, 0);          /* flat */
        }
        case_f32_fused(2, 64, 144, 8);
        cpu_ctx_free(ctx);
    }
    return tu_finish("test_ops_typed_cpu");
}
