/* test_ops_dense.c - the CPU conv2d, linear, group/layer norm and attention kernels against
 * float64 references written here as naive loops (forward) and central finite differences of
 * those references (backward); also accum paths, NULL options, bad sizes and determinism.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/attn_tiles.h"
#include "cpu/cpu.h"
#include "nchw_shim.h"
#include "test_ref_conv.h"
#include "test_util.h"

#define TOL_FWD 1e-5
#define TOL_BWD 1e-4
#define TOL_ACC 1e-6 /* accum=1 result against previous contents + the accum=0 result */
#define FD_H 1e-5

static bk_ctx *ctx;

enum { OP_CONV, OP_LINEAR, OP_GROUPNORM, OP_LAYERNORM, OP_ATTN, OP_ATTN_PLAIN, OP_COUNT };
static const char *op_names[OP_COUNT] = {"conv2d", "linear", "groupnorm", "layernorm",
                                         "attn(tiled)", "attn(plain)"};
static double max_fwd[OP_COUNT], max_bwd[OP_COUNT], max_lse;

static void note(double *slot, double err)
{
    if (!(err <= *slot)) *slot = err; /* NaN sticks */
}

static float *falloc(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) abort();
    return p;
}
static double *dalloc(size_t n)
{
    double *p = calloc(n ? n : 1, sizeof(double));
    if (!p) abort();
    return p;
}
static double *to_double(const float *f, size_t n)
{
    double *d = dalloc(n);
    for (size_t i = 0; i < n; i++) d[i] = f[i];
    return d;
}
static double dot_dd(const double *a, const double *b, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}
static void fill_nan(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = NAN;
}
static size_t rand_index(size_t n)
{
    size_t i = (size_t)((tu_rand() + 1.0) * 0.5 * (double)n);
    return i < n ? i : n - 1;
}

/* ---- finite differences: grad of loss() w.r.t. x[idx[s]], against the kernel's g ---- */
typedef double (*loss_fn)(void *arg);

static double fd_err_idx(const float *g, double *x, const size_t *idx, size_t cnt, loss_fn loss,
                         void *arg)
{
    float *gk = falloc(cnt);
    double *gr = dalloc(cnt);
    for (size_t s = 0; s < cnt; s++) {
        size_t i = idx[s];
        double x0 = x[i];
        x[i] = x0 + FD_H;
        double lp = loss(arg);
        x[i] = x0 - FD_H;
        double lm = loss(arg);
        x[i] = x0;
        gr[s] = (lp - lm) / (2 * FD_H);
        gk[s] = g[i];
    }
    double e = tu_rel_err(gk, gr, cnt);
    free(gk);
    free(gr);
    return e;
}

/* every element when n <= max_samples, else max_samples random ones */
static double fd_err(const float *g, double *x, size_t n, size_t max_samples, loss_fn loss,
                     void *arg)
{
    size_t cnt = n <= max_samples ? n : max_samples;
    size_t *idx = malloc(cnt * sizeof *idx);
    if (!idx) abort();
    for (size_t s = 0; s < cnt; s++) idx[s] = n <= max_samples ? s : rand_index(n);
    double e = fd_err_idx(g, x, idx, cnt, loss, arg);
    free(idx);
    return e;
}

/* accum=1 result against prev + g (float): the contract "adds to previous contents" */
static double accum_err(const float *res, const float *prev, const float *g, size_t n)
{
    double *ref = dalloc(n);
    for (size_t i = 0; i < n; i++) ref[i] = (double)prev[i] + (double)g[i];
    double e = tu_rel_err(res, ref, n);
    free(ref);
    return e;
}

/* ======================================================================================== */
/* conv2d                                                                                   */
/* ======================================================================================== */

struct conv_arg {
    const struct bk_conv2d *s;
    double *x, *w, *b, *y;
    const double *r;
    size_t ny;
};
static double conv_loss(void *p)
{
    struct conv_arg *a = p;
    tu_ref_conv(a->y, a->x, a->w, a->b, a->s, 0);
    return dot_dd(a->y, a->r, a->ny);
}

static void test_conv(int n, int ci, int h, int w, int co, int k, int stride, int pt, int pl,
                      int pb, int pr, int bias)
{
    struct bk_conv2d s = {.n = n, .ci = ci, .h = h, .w = w, .co = co, .kh = k, .kw = k,
                          .stride = stride, .pad_t = pt, .pad_l = pl, .pad_b = pb, .pad_r = pr};
    CHECK(bk_conv2d_init(&s) == BK_OK, "conv init");
    char tag[160];
    snprintf(tag, sizeof tag, "conv n%d ci%d %dx%d co%d k%d s%d pad(%d,%d,%d,%d) bias%d", n, ci, h,
             w, co, k, stride, pt, pl, pb, pr, bias);
    size_t nx = (size_t)n * ci * h * w, nw = (size_t)co * ci * k * k,
           ny = (size_t)n * co * s.ho * s.wo;
    size_t wsb = cpu_conv2d_ws_bytes(&s);
    /* the workspace holds at least the NHWC copies of an input- and an output-sized operand */
    CHECK(wsb >= (nx + ny) * sizeof(float), "%s: ws %zu below the operand copies", tag, wsb);
    void *ws = wsb ? malloc(wsb) : NULL;

    float *x = falloc(nx), *wt = falloc(nw), *b = falloc(co), *y = falloc(ny), *y2 = falloc(ny);
    float *r = falloc(ny), *dx = falloc(nx), *dx2 = falloc(nx), *prev = falloc(nx);
    float *dw = falloc(nw), *db = falloc(co), *dw2 = falloc(nw), *db2 = falloc(co);
    tu_fill(x, nx, 1.0);
    tu_fill(wt, nw, 0.5);
    tu_fill(b, co, 0.5);
    tu_fill(r, ny, 1.0);

    /* forward */
    fill_nan(y, ny);
    CHECK(nchw_conv2d_fwd(y, x, wt, bias ? b : NULL, ws, &s, ctx) == BK_OK, "%s: fwd", tag);
    double *xd = to_double(x, nx), *wd = to_double(wt, nw), *bd = to_double(b, co);
    double *rd = to_double(r, ny), *yd = dalloc(ny);
    tu_ref_conv(yd, xd, wd, bias ? bd : NULL, &s, 0);
    double e = tu_rel_err(y, yd, ny);
    note(&max_fwd[OP_CONV], e);
    CHECK(e <= TOL_FWD, "%s: fwd rel err %.3g", tag, e);
    CHECK(nchw_conv2d_fwd(y2, x, wt, bias ? b : NULL, ws, &s, ctx) == BK_OK, "%s: fwd2", tag);
    CHECK(memcmp(y, y2, ny * sizeof(float)) == 0, "%s: fwd not deterministic", tag);

    /* backward: dy = r, so the kernel gradients are those of sum(y * r) */
    fill_nan(dx, nx);
    CHECK(nchw_conv2d_bwd_data(dx, r, wt, 0, ws, &s, ctx) == BK_OK, "%s: bwd_data", tag);
    memset(dw, 0, nw * sizeof(float));
    memset(db, 0, co * sizeof(float));
    CHECK(nchw_conv2d_bwd_filter(dw, bias ? db : NULL, r, x, ws, &s, ctx) == BK_OK,
          "%s: bwd_filter", tag);
    struct conv_arg a = {&s, xd, wd, bias ? bd : NULL, yd, rd, ny};
    double ex = fd_err(dx, xd, nx, 400, conv_loss, &a);
    double ew = fd_err(dw, wd, nw, 400, conv_loss, &a);
    double eb = bias ? fd_err(db, bd, co, 400, conv_loss, &a) : 0.0;
    note(&max_bwd[OP_CONV], ex);
    note(&max_bwd[OP_CONV], ew);
    note(&max_bwd[OP_CONV], eb);
    CHECK(ex <= TOL_BWD, "%s: dx fd err %.3g", tag, ex);
    CHECK(ew <= TOL_BWD, "%s: dw fd err %.3g", tag, ew);
    CHECK(eb <= TOL_BWD, "%s: db fd err %.3g", tag, eb);

    /* accum=1 on dx; dw, db always accumulate */
    tu_fill(prev, nx, 1.0);
    memcpy(dx2, prev, nx * sizeof(float));
    CHECK(nchw_conv2d_bwd_data(dx2, r, wt, 1, ws, &s, ctx) == BK_OK, "%s: bwd_data acc", tag);
    e = accum_err(dx2, prev, dx, nx);
    CHECK(e <= TOL_ACC, "%s: dx accum err %.3g", tag, e);
    float *pw = falloc(nw), *pbias = falloc(co);
    tu_fill(pw, nw, 1.0);
    tu_fill(pbias, co, 1.0);
    memcpy(dw2, pw, nw * sizeof(float));
    memcpy(db2, pbias, co * sizeof(float));
    CHECK(nchw_conv2d_bwd_filter(dw2, db2, r, x, ws, &s, ctx) == BK_OK, "%s: bwd_filter acc", tag);
    e = accum_err(dw2, pw, dw, nw);
    CHECK(e <= TOL_ACC, "%s: dw accum err %.3g", tag, e);
    if (bias) {
        e = accum_err(db2, pbias, db, co);
        CHECK(e <= TOL_ACC, "%s: db accum err %.3g", tag, e);
    } else {
        /* db was NULL in the first call: the bias gradient of this one must be sum(dy) */
        double *sref = dalloc(co);
        for (size_t i = 0; i < ny; i++) sref[(i / ((size_t)s.ho * s.wo)) % co] += r[i];
        for (int o = 0; o < co; o++) sref[o] += pbias[o];
        e = tu_rel_err(db2, sref, co);
        CHECK(e <= TOL_ACC, "%s: db accum err %.3g", tag, e);
        free(sref);
    }

    /* determinism of both backward kernels */
    fill_nan(dx2, nx);
    CHECK(nchw_conv2d_bwd_data(dx2, r, wt, 0, ws, &s, ctx) == BK_OK, "%s: bwd_data 2", tag);
    CHECK(memcmp(dx, dx2, nx * sizeof(float)) == 0, "%s: bwd_data not deterministic", tag);
    memset(dw2, 0, nw * sizeof(float));
    memset(db2, 0, co * sizeof(float));
    CHECK(nchw_conv2d_bwd_filter(dw2, bias ? db2 : NULL, r, x, ws, &s, ctx) == BK_OK,
          "%s: bwd_filter 2", tag);
    CHECK(memcmp(dw, dw2, nw * sizeof(float)) == 0 && memcmp(db, db2, co * sizeof(float)) == 0,
          "%s: bwd_filter not deterministic", tag);

    free(pw); free(pbias); free(ws); free(x); free(wt); free(b); free(y); free(y2); free(r);
    free(dx); free(dx2); free(prev); free(dw); free(db); free(dw2); free(db2);
    free(xd); free(wd); free(bd); free(rd); free(yd);
}

static void test_conv_invalid(void)
{
    struct bk_conv2d s = {.n = 1, .ci = 2, .h = 5, .w = 5, .co = 3, .kh = 3, .kw = 3,
                          .stride = 1, .pad_t = 1, .pad_l = 1, .pad_b = 1, .pad_r = 1};
    CHECK(bk_conv2d_init(&s) == BK_OK, "conv init");
    float buf[1024] = {0};
    s.ho = 4; /* inconsistent with the padding */
    CHECK(nchw_conv2d_fwd(buf, buf, buf, NULL, buf, &s, ctx) == BK_ERR_INVALID, "conv bad ho");
    CHECK(cpu_conv2d_ws_bytes(&s) == 0, "conv bad shape ws");
    s.ho = 5;
    s.ci = 0;
    CHECK(nchw_conv2d_bwd_data(buf, buf, buf, 0, buf, &s, ctx) == BK_ERR_INVALID, "conv ci 0");
    s.ci = 2;
    CHECK(nchw_conv2d_bwd_filter(buf, NULL, buf, buf, NULL, &s, ctx) == BK_ERR_INVALID,
          "conv missing ws");
}

/* ======================================================================================== */
/* linear                                                                                   */
/* ======================================================================================== */

static void ref_linear(double *y, const double *x, const double *w, const double *b, int m,
                       int k, int n)
{
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double acc = b ? b[j] : 0.0;
            for (int t = 0; t < k; t++) acc += x[(size_t)i * k + t] * w[(size_t)j * k + t];
            y[(size_t)i * n + j] = acc;
        }
}

struct linear_arg {
    double *x, *w, *b, *y;
    const double *r;
    int m, k, n;
};
static double linear_loss(void *p)
{
    struct linear_arg *a = p;
    ref_linear(a->y, a->x, a->w, a->b, a->m, a->k, a->n);
    return dot_dd(a->y, a->r, (size_t)a->m * a->n);
}

static void test_linear(int m, int k, int n, int bias)
{
    char tag[96];
    snprintf(tag, sizeof tag, "linear m%d k%d n%d bias%d", m, k, n, bias);
    size_t nx = (size_t)m * k, nw = (size_t)n * k, ny = (size_t)m * n;
    float *x = falloc(nx), *w = falloc(nw), *b = falloc(n), *y = falloc(ny), *y2 = falloc(ny);
    float *r = falloc(ny), *dx = falloc(nx), *dx2 = falloc(nx), *prev = falloc(nx);
    float *dw = falloc(nw), *db = falloc(n), *dw2 = falloc(nw), *db2 = falloc(n);
    float *pw = falloc(nw), *pb = falloc(n);
    /* the GEMMs' scratchpad comes from the plan's workspace (cpu_ctx_set_workspace) */
    const size_t wsb = cpu_linear_ws_bytes(m, k, n, BK_DTYPE_F32);
    void *ws = malloc(wsb ? wsb : 1);
    CHECK(cpu_ctx_set_workspace(ctx, ws, wsb) == BK_OK, "%s: workspace", tag);
    tu_fill(x, nx, 1.0);
    tu_fill(w, nw, 0.5);
    tu_fill(b, n, 0.5);
    tu_fill(r, ny, 1.0);

    fill_nan(y, ny);
    CHECK(cpu_linear_fwd(y, x, w, bias ? b : NULL, m, k, n, BK_DTYPE_F32, ctx) == BK_OK,
          "%s: fwd", tag);
    double *xd = to_double(x, nx), *wd = to_double(w, nw), *bd = to_double(b, n);
    double *rd = to_double(r, ny), *yd = dalloc(ny);
    ref_linear(yd, xd, wd, bias ? bd : NULL, m, k, n);
    double e = tu_rel_err(y, yd, ny);
    note(&max_fwd[OP_LINEAR], e);
    CHECK(e <= TOL_FWD, "%s: fwd rel err %.3g", tag, e);
    CHECK(cpu_linear_fwd(y2, x, w, bias ? b : NULL, m, k, n, BK_DTYPE_F32, ctx) == BK_OK,
          "%s: fwd2", tag);
    CHECK(memcmp(y, y2, ny * sizeof(float)) == 0, "%s: fwd not deterministic", tag);

    fill_nan(dx, nx);
    memset(dw, 0, nw * sizeof(float));
    memset(db, 0, n * sizeof(float));
    CHECK(cpu_linear_bwd(dx, dw, bias ? db : NULL, r, x, w, 0, m, k, n, BK_DTYPE_F32, ctx) == BK_OK,
          "%s: bwd", tag);
    struct linear_arg a = {xd, wd, bias ? bd : NULL, yd, rd, m, k, n};
    double ex = fd_err(dx, xd, nx, 300, linear_loss, &a);
    double ew = fd_err(dw, wd, nw, 300, linear_loss, &a);
    double eb = bias ? fd_err(db, bd, n, 300, linear_loss, &a) : 0.0;
    note(&max_bwd[OP_LINEAR], ex);
    note(&max_bwd[OP_LINEAR], ew);
    note(&max_bwd[OP_LINEAR], eb);
    CHECK(ex <= TOL_BWD, "%s: dx fd err %.3g", tag, ex);
    CHECK(ew <= TOL_BWD, "%s: dw fd err %.3g", tag, ew);
    CHECK(eb <= TOL_BWD, "%s: db fd err %.3g", tag, eb);

    /* accum=1 dx, accumulating dw / db, and dx = NULL (first layer) */
    tu_fill(prev, nx, 1.0);
    tu_fill(pw, nw, 1.0);
    tu_fill(pb, n, 1.0);
    memcpy(dx2, prev, nx * sizeof(float));
    memcpy(dw2, pw, nw * sizeof(float));
    memcpy(db2, pb, n * sizeof(float));
    CHECK(cpu_linear_bwd(dx2, dw2, db2, r, x, w, 1, m, k, n, BK_DTYPE_F32, ctx) == BK_OK,
          "%s: bwd acc", tag);
    e = accum_err(dx2, prev, dx, nx);
    CHECK(e <= TOL_ACC, "%s: dx accum err %.3g", tag, e);
    e = accum_err(dw2, pw, dw, nw);
    CHECK(e <= TOL_ACC, "%s: dw accum err %.3g", tag, e);
    if (bias) {
        e = accum_err(db2, pb, db, n);
        CHECK(e <= TOL_ACC, "%s: db accum err %.3g", tag, e);
    }
    memset(dw2, 0, nw * sizeof(float));
    memset(db2, 0, n * sizeof(float));
    CHECK(cpu_linear_bwd(NULL, dw2, bias ? db2 : NULL, r, x, w, 0, m, k, n, BK_DTYPE_F32,
                         ctx) == BK_OK,
          "%s: bwd dx NULL", tag);
    CHECK(memcmp(dw, dw2, nw * sizeof(float)) == 0 && memcmp(db, db2, n * sizeof(float)) == 0,
          "%s: bwd not deterministic / dx NULL changed dw", tag);
    CHECK(cpu_linear_fwd(y, x, w, NULL, 0, k, n, BK_DTYPE_F32, ctx) == BK_ERR_INVALID,
          "%s: m 0", tag);
    /* without the workspace it asked for: refused, not run on memory of its own */
    CHECK(cpu_ctx_set_workspace(ctx, NULL, 0) == BK_OK, "%s: no workspace", tag);
    if (wsb)
        CHECK(cpu_linear_bwd(dx, dw, NULL, r, x, w, 0, m, k, n, BK_DTYPE_F32, ctx) ==
                  BK_ERR_INVALID,
              "%s: ran without the %zu bytes of workspace it asked for", tag, wsb);

    free(ws);
    free(x); free(w); free(b); free(y); free(y2); free(r); free(dx); free(dx2); free(prev);
    free(dw); free(db); free(dw2); free(db2); free(pw); free(pb);
    free(xd); free(wd); free(bd); free(rd); free(yd);
}

/* ======================================================================================== */
/* group norm and layer norm                                                                */
/* ======================================================================================== */

/* normalise each of `rows` contiguous runs of `cnt`; per element e its affine index is
 * (e / per) % naff (group norm: per = hw, layer norm: per = 1) */
static void ref_norm(double *y, double *mean, double *rstd, const double *x, const double *gamma,
                     const double *beta, size_t rows, size_t cnt, size_t per, size_t naff,
                     double eps)
{
    for (size_t g = 0; g < rows; g++) {
        const double *xr = x + g * cnt;
        double mu = 0, var = 0;
        for (size_t i = 0; i < cnt; i++) mu += xr[i];
        mu /= (double)cnt;
        for (size_t i = 0; i < cnt; i++) var += (xr[i] - mu) * (xr[i] - mu);
        var /= (double)cnt;
        double rs = 1.0 / sqrt(var + eps);
        if (mean) mean[g] = mu, rstd[g] = rs;
        for (size_t i = 0; i < cnt; i++) {
            size_t e = g * cnt + i, a = (e / per) % naff;
            y[e] = (xr[i] - mu) * rs * (gamma ? gamma[a] : 1.0) + (beta ? beta[a] : 0.0);
        }
    }
}

struct norm_arg {
    double *x, *gamma, *beta, *y;
    const double *r;
    size_t rows, cnt, per, naff, total;
    double eps;
};
static double norm_loss(void *p)
{
    struct norm_arg *a = p;
    ref_norm(a->y, NULL, NULL, a->x, a->gamma, a->beta, a->rows, a->cnt, a->per, a->naff,
             a->eps);
    return dot_dd(a->y, a->r, a->total);
}

/* group norm when groups > 0 (x (n,c,hw)), else layer norm (x (n,c) over c; hw unused) */
static void test_norm(int n, int c, int hw, int groups, int affine)
{
    const int gn = groups > 0, op = gn ? OP_GROUPNORM : OP_LAYERNORM;
    char tag[96];
    if (gn)
        snprintf(tag, sizeof tag, "groupnorm n%d c%d hw%d g%d affine%d", n, c, hw, groups,
                 affine);
    else
        snprintf(tag, sizeof tag, "layernorm m%d d%d affine%d", n, c, affine);
    const float eps = 1e-5f;
    const size_t total = (size_t)n * c * (gn ? hw : 1), rows = (size_t)n * (gn ? groups : 1);
    const size_t cnt = total / rows;
    float *x = falloc(total), *gamma = falloc(c), *beta = falloc(c), *y = falloc(total);
    float *y2 = falloc(total), *r = falloc(total), *mean = falloc(rows), *rstd = falloc(rows);
    float *m2 = falloc(rows), *s2 = falloc(rows);
    float *dx = falloc(total), *dx2 = falloc(total), *prev = falloc(total);
    float *dg = falloc(c), *dbt = falloc(c), *dg2 = falloc(c), *dbt2 = falloc(c);
    float *pg = falloc(c), *pbt = falloc(c);
    tu_fill(x, total, 1.0);
    for (size_t i = 0; i < total; i++) x[i] += 0.3f; /* a mean away from zero */
    for (int i = 0; i < c; i++) gamma[i] = (float)(1.0 + 0.5 * tu_rand());
    tu_fill(beta, c, 0.5);
    tu_fill(r, total, 1.0);
    const float *gp = affine ? gamma : NULL, *bp = affine ? beta : NULL;

#define NORM_FWD(Y, M, S)                                                                    \
    (gn ? nchw_groupnorm_fwd(Y, M, S, x, gp, bp, n, c, hw, groups, eps, ctx)                  \
        : cpu_layernorm_fwd(Y, M, S, x, gp, bp, n, c, eps, ctx))
#define NORM_BWD(DX, DG, DB, ACC)                                                            \
    (gn ? nchw_groupnorm_bwd(DX, DG, DB, r, x, gp, mean, rstd, ACC, n, c, hw, groups, ctx)     \
        : cpu_layernorm_bwd(DX, DG, DB, r, x, gp, mean, rstd, ACC, n, c, ctx))

    fill_nan(y, total);
    CHECK(NORM_FWD(y, mean, rstd) == BK_OK, "%s: fwd", tag);
    double *xd = to_double(x, total), *gd = to_double(gamma, c), *bd = to_double(beta, c);
    double *rd = to_double(r, total), *yd = dalloc(total), *md = dalloc(rows),
           *sd = dalloc(rows);
    const size_t per = gn ? (size_t)hw : 1;
    ref_norm(yd, md, sd, xd, affine ? gd : NULL, affine ? bd : NULL, rows, cnt, per, (size_t)c,
             eps);
    double e = tu_rel_err(y, yd, total);
    double em = tu_rel_err(mean, md, rows), es = tu_rel_err(rstd, sd, rows);
    note(&max_fwd[op], e);
    note(&max_fwd[op], em);
    note(&max_fwd[op], es);
    CHECK(e <= TOL_FWD, "%s: fwd rel err %.3g", tag, e);
    CHECK(em <= TOL_FWD && es <= TOL_FWD, "%s: mean err %.3g rstd err %.3g", tag, em, es);
    CHECK(NORM_FWD(y2, m2, s2) == BK_OK, "%s: fwd2", tag);
    CHECK(memcmp(y, y2, total * sizeof(float)) == 0 && memcmp(mean, m2, rows * 4) == 0 &&
              memcmp(rstd, s2, rows * 4) == 0,
          "%s: fwd not deterministic", tag);

    fill_nan(dx, total);
    memset(dg, 0, c * sizeof(float));
    memset(dbt, 0, c * sizeof(float));
    CHECK(NORM_BWD(dx, dg, dbt, 0) == BK_OK, "%s: bwd", tag);
    struct norm_arg a = {xd, affine ? gd : NULL, affine ? bd : NULL, yd, rd, rows, cnt, per,
                         (size_t)c, total, eps};
    double ex = fd_err(dx, xd, total, 300, norm_loss, &a);
    note(&max_bwd[op], ex);
    CHECK(ex <= TOL_BWD, "%s: dx fd err %.3g", tag, ex);
    if (affine) {
        double eg = fd_err(dg, gd, c, 300, norm_loss, &a);
        double eb = fd_err(dbt, bd, c, 300, norm_loss, &a);
        note(&max_bwd[op], eg);
        note(&max_bwd[op], eb);
        CHECK(eg <= TOL_BWD, "%s: dgamma fd err %.3g", tag, eg);
        CHECK(eb <= TOL_BWD, "%s: dbeta fd err %.3g", tag, eb);
    }

    /* accum=1 dx, accumulating dgamma / dbeta, NULL dx */
    tu_fill(prev, total, 1.0);
    tu_fill(pg, c, 1.0);
    tu_fill(pbt, c, 1.0);
    memcpy(dx2, prev, total * sizeof(float));
    memcpy(dg2, pg, c * sizeof(float));
    memcpy(dbt2, pbt, c * sizeof(float));
    CHECK(NORM_BWD(dx2, dg2, dbt2, 1) == BK_OK, "%s: bwd acc", tag);
    e = accum_err(dx2, prev, dx, total);
    CHECK(e <= TOL_ACC, "%s: dx accum err %.3g", tag, e);
    e = accum_err(dg2, pg, dg, c);
    CHECK(e <= TOL_ACC, "%s: dgamma accum err %.3g", tag, e);
    e = accum_err(dbt2, pbt, dbt, c);
    CHECK(e <= TOL_ACC, "%s: dbeta accum err %.3g", tag, e);
    memset(dg2, 0, c * sizeof(float));
    memset(dbt2, 0, c * sizeof(float));
    CHECK(NORM_BWD(NULL, dg2, dbt2, 0) == BK_OK, "%s: bwd dx NULL", tag);
    CHECK(memcmp(dg, dg2, c * 4) == 0 && memcmp(dbt, dbt2, c * 4) == 0,
          "%s: dgamma/dbeta not deterministic", tag);
    fill_nan(dx2, total);
    CHECK(NORM_BWD(dx2, NULL, NULL, 0) == BK_OK, "%s: bwd params NULL", tag);
    CHECK(memcmp(dx, dx2, total * 4) == 0, "%s: dx not deterministic", tag);
#undef NORM_FWD
#undef NORM_BWD

    free(x); free(gamma); free(beta); free(y); free(y2); free(r); free(mean); free(rstd);
    free(m2); free(s2); free(dx); free(dx2); free(prev); free(dg); free(dbt); free(dg2);
    free(dbt2); free(pg); free(pbt);
    free(xd); free(gd); free(bd); free(rd); free(yd); free(md); free(sd);
}

/* the layer norm forward runs several rows' double sums side by side (norm.c LN_ROWS): each row's
 * bits are those of the row alone (m = 1), forward and backward, whatever the rows around it */
static void test_layernorm_rows(int m, int d)
{
    const size_t total = (size_t)m * d;
    float *x = falloc(total), *dy = falloc(total), *gamma = falloc(d), *beta = falloc(d);
    float *y = falloc(total), *y1 = falloc(total), *dx = falloc(total), *dx1 = falloc(total);
    float *mean = falloc(m), *rstd = falloc(m), *m1 = falloc(m), *s1 = falloc(m);
    tu_fill(x, total, 2.0);
    tu_fill(dy, total, 1.0);
    tu_fill(gamma, d, 1.0);
    tu_fill(beta, d, 1.0);
    CHECK(cpu_layernorm_fwd(y, mean, rstd, x, gamma, beta, m, d, 1e-5f, ctx) == BK_OK &&
              cpu_layernorm_bwd(dx, NULL, NULL, dy, x, gamma, mean, rstd, 0, m, d, ctx) == BK_OK,
          "layernorm rows m%d d%d", m, d);
    for (int i = 0; i < m; i++) {
        const size_t o = (size_t)i * d;
        cpu_layernorm_fwd(y1 + o, m1 + i, s1 + i, x + o, gamma, beta, 1, d, 1e-5f, ctx);
        cpu_layernorm_bwd(dx1 + o, NULL, NULL, dy + o, x + o, gamma, m1 + i, s1 + i, 0, 1, d,
                          ctx);
    }
    CHECK(!memcmp(y, y1, total * 4) && !memcmp(mean, m1, (size_t)m * 4) &&
              !memcmp(rstd, s1, (size_t)m * 4) && !memcmp(dx, dx1, total * 4),
          "layernorm m%d d%d: rows together differ from each row alone", m, d);
    free(x); free(dy); free(gamma); free(beta); free(y); free(y1); free(dx); free(dx1);
    free(mean); free(rstd); free(m1); free(s1);
}

static void test_norm_invalid(void)
{
    float buf[64] = {0};
    CHECK(nchw_groupnorm_fwd(buf, buf, buf, buf, NULL, NULL, 1, 6, 2, 4, 1e-5f, ctx) ==
              BK_ERR_INVALID,
          "groupnorm c %% groups");
    CHECK(cpu_layernorm_bwd(buf, NULL, NULL, buf, buf, NULL, buf, buf, 0, 0, 4, ctx) ==
              BK_ERR_INVALID,
          "layernorm m 0");
}

/* ======================================================================================== */
/* attention                                                                                */
/* ======================================================================================== */

/* o (N,L,H*D) dense, lse (N,H,L) and p (N,H,L,L) when not NULL; q, k, v rows of stride ld */
static void ref_attn(double *o, double *lse, double *p, const double *q, const double *k,
                     const double *v, const struct bk_attn *s, double *srow /* (L) */)
{
    const int L = s->l, H = s->heads, D = s->d;
    const size_t ld = (size_t)s->ld, hd = (size_t)H * D;
    for (int n = 0; n < s->n; n++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < L; i++) {
                const double *qi = q + ((size_t)n * L + i) * ld + (size_t)h * D;
                double mx = -INFINITY;
                for (int j = 0; j < L; j++) {
                    const double *kj = k + ((size_t)n * L + j) * ld + (size_t)h * D;
                    double acc = 0;
                    for (int t = 0; t < D; t++) acc += qi[t] * kj[t];
                    srow[j] = acc * (double)s->scale;
                    if (srow[j] > mx) mx = srow[j];
                }
                double sum = 0;
                for (int j = 0; j < L; j++) sum += exp(srow[j] - mx);
                if (lse) lse[((size_t)n * H + h) * L + i] = mx + log(sum);
                double *oi = o + ((size_t)n * L + i) * hd + (size_t)h * D;
                for (int t = 0; t < D; t++) oi[t] = 0;
                for (int j = 0; j < L; j++) {
                    double pj = exp(srow[j] - mx) / sum;
                    if (p) p[(((size_t)n * H + h) * L + i) * L + j] = pj;
                    const double *vj = v + ((size_t)n * L + j) * ld + (size_t)h * D;
                    for (int t = 0; t < D; t++) oi[t] += pj * vj[t];
                }
            }
}

struct attn_arg {
    const struct bk_attn *s;
    double *q, *k, *v, *o, *srow;
    const double *r;
    size_t no;
};
static double attn_loss(void *p)
{
    struct attn_arg *a = p;
    ref_attn(a->o, NULL, NULL, a->q, a->k, a->v, a->s, a->srow);
    return dot_dd(a->o, a->r, a->no);
}

/* q, k, v (and dq, dk, dv) live in one buffer: packed (N,L,3C) with ld = 3C, or three dense
 * (N,L,C) blocks one after another with ld = C */
static void test_attn(int n, int l, int heads, int d, int packed, int samples)
{
    char tag[96];
    snprintf(tag, sizeof tag, "attn n%d l%d h%d d%d %s", n, l, heads, d,
             packed ? "packed" : "dense");
    const int c = heads * d;
    struct bk_attn s = {.n = n, .l = l, .heads = heads, .d = d, .ld = packed ? 3 * c : c,
                        .scale = 1.0f / sqrtf((float)d)};
    const size_t nbuf = (size_t)3 * n * l * c, no = (size_t)n * l * c;
    const size_t nlse = (size_t)n * heads * l, np = nlse * l;
    const size_t toff = packed ? (size_t)c : no; /* offset from q to k and k to v */
    /* tiled: per thread two 128 x 128 tiles, the key block's k and v and the query block's q
     * and dout transposed and L floats (no L x L), plus a dq per chunk when a pair is split */
    size_t wst = cpu_attn_ws_bytes(&s, 1);
    const size_t procs = (size_t)cpu_threads(NULL);
    CHECK(wst > 0 && wst <= procs * (2 * 128 * 128 + (size_t)l + 256 + 4 * 128 * (size_t)d) *
                                    sizeof(float) +
                                2 * procs * l * d * sizeof(float),
          "%s: tiled ws %zu", tag, wst);
    void *wt = malloc(wst);
    size_t wsb = cpu_attn_ws_bytes(&s, 0);
    /* the larger of: pairs on threads, a slot per pair in flight (at most one per core) of S or
     * dS (L, L16), k or v and q or dout packed (D, L16 each); pairs in turn, one L x L dS (64-byte aligned) and
     * the scratchpad of the largest of the six GEMMs: q k^T, p v, dout v^T, dS k, dS^T q,
     * p^T dout */
    const int ld = s.ld, hd = c;
    const struct cpu_gemm_shape pg[6] = {{0, 1, l, l, d, ld, ld, l, 0, 0, 0, 0, 0, 0, 0, 0},
                                         {0, 0, l, d, l, l, ld, hd, 0, 0, 0, 0, 0, 0, 0, 0},
                                         {0, 1, l, l, d, hd, ld, l, 0, 0, 0, 0, 0, 0, 0, 0},
                                         {0, 0, l, d, l, l, ld, ld, 0, 0, 0, 0, 0, 0, 0, 0},
                                         {1, 0, l, d, l, l, ld, ld, 0, 0, 0, 0, 0, 0, 0, 0},
                                         {1, 0, l, d, l, l, hd, ld, 0, 0, 0, 0, 0, 0, 0, 0}};
    size_t wsg = 0;
    for (int i = 0; i < 6; i++)
        if (cpu_gemm_ws_bytes(&pg[i]) > wsg) wsg = cpu_gemm_ws_bytes(&pg[i]);
    const size_t pairs = (size_t)n * heads, l16 = ((size_t)l + 15) / 16 * 16;
    const size_t ws_slots = (pairs < procs ? pairs : procs) * ((size_t)l + 2 * d) * l16 * 4;
    const size_t ws_turn = ((size_t)l * l * sizeof(float) + 63) / 64 * 64 + wsg;
    CHECK(wsb == (ws_slots > ws_turn ? ws_slots : ws_turn), "%s: plain ws %zu", tag, wsb);
    void *ws = malloc(wsb);

    float *buf = falloc(nbuf), *r = falloc(no), *o = falloc(no), *o2 = falloc(no);
    float *lse = falloc(nlse), *lse2 = falloc(nlse), *p = falloc(np), *p2 = falloc(np);
    float *g = falloc(nbuf), *g2 = falloc(nbuf), *gp = falloc(nbuf);
    tu_fill(buf, nbuf, 1.5);
    tu_fill(r, no, 1.0);
    const float *q = buf, *k = buf + toff, *v = buf + 2 * toff;
    double *bd = to_double(buf, nbuf), *rd = to_double(r, no), *od = dalloc(no);
    double *lsed = dalloc(nlse), *pd = dalloc(np), *srow = dalloc((size_t)l);
    ref_attn(od, lsed, pd, bd, bd + toff, bd + 2 * toff, &s, srow);

    /* tiled forward */
    fill_nan(o, no);
    fill_nan(lse, nlse);
    CHECK(cpu_attn_fwd(o, lse, q, k, v, wt, &s, ctx) == BK_OK, "%s: fwd", tag);
    double e = tu_rel_err(o, od, no), el = tu_rel_err(lse, lsed, nlse);
    note(&max_fwd[OP_ATTN], e);
    note(&max_lse, el);
    CHECK(e <= TOL_FWD, "%s: tiled o rel err %.3g", tag, e);
    CHECK(el <= TOL_FWD, "%s: tiled lse rel err %.3g", tag, el);
    CHECK(cpu_attn_fwd(o2, lse2, q, k, v, wt, &s, ctx) == BK_OK, "%s: fwd2", tag);
    CHECK(memcmp(o, o2, no * 4) == 0 && memcmp(lse, lse2, nlse * 4) == 0,
          "%s: tiled fwd not deterministic", tag);

    /* plain forward */
    fill_nan(o2, no);
    fill_nan(p, np);
    CHECK(cpu_attn_plain_fwd(o2, p, q, k, v, ws, &s, ctx) == BK_OK, "%s: plain fwd", tag);
    e = tu_rel_err(o2, od, no);
    double ep = tu_rel_err(p, pd, np);
    note(&max_fwd[OP_ATTN_PLAIN], e);
    note(&max_fwd[OP_ATTN_PLAIN], ep);
    CHECK(e <= TOL_FWD, "%s: plain o rel err %.3g", tag, e);
    CHECK(ep <= TOL_FWD, "%s: plain p rel err %.3g", tag, ep);
    CHECK(cpu_attn_plain_fwd(o2, p2, q, k, v, ws, &s, ctx) == BK_OK, "%s: plain fwd2", tag);
    CHECK(memcmp(p, p2, np * 4) == 0, "%s: plain fwd not deterministic", tag);

    /* backward of sum(o * r); dq, dk, dv are written, never read: start them as NaN */
    fill_nan(g, nbuf);
    CHECK(cpu_attn_bwd(g, g + toff, g + 2 * toff, r, q, k, v, o, lse, wt, &s, ctx) == BK_OK,
          "%s: bwd", tag);
    fill_nan(gp, nbuf);
    CHECK(cpu_attn_plain_bwd(gp, gp + toff, gp + 2 * toff, r, q, k, v, p, ws, &s, ctx) == BK_OK,
          "%s: plain bwd", tag);

    /* FD at `samples` random elements of each of q, k, v (all when small) */
    size_t per = (size_t)n * l * c, cnt = 0;
    size_t *idx = malloc(3 * (per < (size_t)samples ? per : (size_t)samples) * sizeof *idx);
    if (!idx) abort();
    for (int t = 0; t < 3; t++) {
        size_t m = per < (size_t)samples ? per : (size_t)samples;
        for (size_t j = 0; j < m; j++) {
            size_t e_ = per <= (size_t)samples ? j : rand_index(per);
            size_t row = e_ / c, col = e_ % c;
            idx[cnt++] = (size_t)t * toff + row * (size_t)s.ld + col;
        }
    }
    struct attn_arg a = {&s, bd, bd + toff, bd + 2 * toff, od, srow, rd, no};
    double eg = fd_err_idx(g, bd, idx, cnt, attn_loss, &a);
    double egp = fd_err_idx(gp, bd, idx, cnt, attn_loss, &a);
    note(&max_bwd[OP_ATTN], eg);
    note(&max_bwd[OP_ATTN_PLAIN], egp);
    CHECK(eg <= TOL_BWD, "%s: tiled dqkv fd err %.3g", tag, eg);
    CHECK(egp <= TOL_BWD, "%s: plain dqkv fd err %.3g", tag, egp);
    /* every element: tiled and plain are independent implementations. In the packed layout
     * the whole buffer is q|k|v; in the dense one too (three blocks). */
    e = tu_rel_err_f(g, gp, nbuf);
    note(&max_bwd[OP_ATTN], e);
    CHECK(e <= TOL_BWD, "%s: tiled vs plain grads rel err %.3g", tag, e);

    fill_nan(g2, nbuf);
    CHECK(cpu_attn_bwd(g2, g2 + toff, g2 + 2 * toff, r, q, k, v, o, lse, wt, &s, ctx) == BK_OK,
          "%s: bwd2", tag);
    CHECK(memcmp(g, g2, nbuf * 4) == 0, "%s: tiled bwd not deterministic", tag);
    /* one thread: the same bits, forward always, backward while no pair is split (at least
     * as many (n, h) pairs as the 2 threads of ctx) */
    if (cpu_threads(ctx) == 2) {
        bk_ctx *one = NULL;
        CHECK(cpu_ctx_init(&one, 1) == BK_OK, "ctx 1");
        fill_nan(o2, no);
        CHECK(cpu_attn_fwd(o2, lse2, q, k, v, wt, &s, one) == BK_OK, "%s: fwd 1 thread", tag);
        CHECK(memcmp(o, o2, no * 4) == 0 && memcmp(lse, lse2, nlse * 4) == 0,
              "%s: tiled fwd differs at 1 thread", tag);
        if (n * heads >= 2) {
            fill_nan(g2, nbuf);
            CHECK(cpu_attn_bwd(g2, g2 + toff, g2 + 2 * toff, r, q, k, v, o, lse, wt, &s, one) ==
                      BK_OK,
                  "%s: bwd 1 thread", tag);
            CHECK(memcmp(g, g2, nbuf * 4) == 0, "%s: tiled bwd differs at 1 thread", tag);
            /* the plain form too: pairs on threads, each pair's products on one thread */
            fill_nan(o2, no);
            CHECK(cpu_attn_plain_fwd(o2, p2, q, k, v, ws, &s, one) == BK_OK,
                  "%s: plain fwd 1 thread", tag);
            CHECK(memcmp(p, p2, np * 4) == 0, "%s: plain fwd differs at 1 thread", tag);
            fill_nan(g2, nbuf);
            CHECK(cpu_attn_plain_bwd(g2, g2 + toff, g2 + 2 * toff, r, q, k, v, p, ws, &s, one) ==
                      BK_OK,
                  "%s: plain bwd 1 thread", tag);
            CHECK(memcmp(gp, g2, nbuf * 4) == 0, "%s: plain bwd differs at 1 thread", tag);
        }
        cpu_ctx_free(one);
    }
    fill_nan(g2, nbuf);
    CHECK(cpu_attn_plain_bwd(g2, g2 + toff, g2 + 2 * toff, r, q, k, v, p, ws, &s, ctx) == BK_OK,
          "%s: plain bwd2", tag);
    CHECK(memcmp(gp, g2, nbuf * 4) == 0, "%s: plain bwd not deterministic", tag);

    free(idx); free(ws); free(wt); free(buf); free(r); free(o); free(o2); free(lse); free(lse2);
    free(p); free(p2); free(g); free(g2); free(gp); free(bd); free(rd); free(od); free(lsed); free(pd);
    free(srow);
}

static void test_attn_invalid(void)
{
    float buf[64] = {0};
    struct bk_attn s = {.n = 1, .l = 2, .heads = 2, .d = 4, .ld = 7, .scale = 0.5f};
    CHECK(cpu_attn_fwd(buf, buf, buf, buf, buf, NULL, &s, ctx) == BK_ERR_INVALID,
          "attn ld < H*D");
    s.ld = 8;
    CHECK(cpu_attn_fwd(buf, buf, buf, buf, buf, NULL, &s, ctx) == BK_ERR_INVALID,
          "attn tiled fwd without ws");
    CHECK(cpu_attn_bwd(buf, buf, buf, buf, buf, buf, buf, buf, buf, NULL, &s, ctx) ==
              BK_ERR_INVALID,
          "attn tiled bwd without ws");
    CHECK(cpu_attn_plain_bwd(buf, buf, buf, buf, buf, buf, buf, buf, NULL, &s, ctx) ==
              BK_ERR_INVALID,
          "attn plain bwd without ws");
}

/* the workspace backward (silu or not, gradient g_in) against the plain group-norm backward on
 * g_ref (dy silu'(z) for silu, else g_in itself), dx written or accumulated onto equal data */
static void gn_bwd_ws_check(const char *tag, const char *what, const float *g_in,
                            const float *g_ref, const float *x, const float *gm, const float *bt,
                            const float *m, const float *r, int accum, int n, int c, int hw,
                            int groups, int silu, void *ws, double tol, bk_ctx *ctx)
{
    size_t nx = (size_t)n * c * hw;
    float *dx = falloc(nx), *dx2 = falloc(nx);
    float *dg = calloc(c, 4), *db = calloc(c, 4), *dg2 = calloc(c, 4), *db2 = calloc(c, 4);
    tu_fill(dx, nx, 1.0);
    memcpy(dx2, dx, nx * 4);
    cpu_groupnorm_bwd(dx, dg, db, g_ref, x, gm, m, r, accum, n, c, hw, groups, ctx);
    CHECK(cpu_groupnorm_bwd_ws(dx2, dg2, db2, g_in, x, gm, silu ? bt : NULL, m, r, accum, n, c, hw,
                               groups, silu, ws, ctx) == BK_OK,
          "%s: %s status", tag, what);
    double ex = tu_rel_err_f(dx2, dx, nx), eg = tu_rel_err_f(dg2, dg, c),
           eb = tu_rel_err_f(db2, db, c);
    CHECK(ex < tol && eg < tol && eb < tol, "%s accum %d: %s rel err dx %.3g dgamma %.3g dbeta %.3g",
          tag, accum, what, ex, eg, eb);
    free(dx); free(dx2); free(dg); free(db); free(dg2); free(db2);
}

/* silu(group norm) fused (NHWC, the CPU layout) against group norm then SiLU through the
 * unfused kernels: forward, and backward with dx written and accumulated; and the workspace
 * backward without silu against the plain one */
static void test_groupnorm_silu(int n, int c, int hw, int groups)
{
    bk_ctx ctx2 = {.threads = 2};
    char tag[96];
    snprintf(tag, sizeof tag, "groupnorm+silu n%d c%d hw%d g%d", n, c, hw, groups);
    size_t nx = (size_t)n * c * hw, ns = (size_t)n * groups;
    float *x = falloc(nx), *gm = falloc(c), *bt = falloc(c), *dy = falloc(nx);
    float *z = falloc(nx), *y = falloc(nx), *y2 = falloc(nx), *m = falloc(ns), *r = falloc(ns);
    float *m2 = falloc(ns), *r2 = falloc(ns), *gz = falloc(nx);
    void *ws = malloc(cpu_groupnorm_bwd_ws_bytes(n, c, hw, groups, 1));
    tu_fill(x, nx, 2.0);
    tu_fill(gm, c, 1.0);
    tu_fill(bt, c, 1.0);
    tu_fill(dy, nx, 1.0);
    cpu_groupnorm_fwd(z, m, r, x, gm, bt, n, c, hw, groups, 1e-5f, &ctx2);
    cpu_silu_fwd(y, z, nx, &ctx2);
    CHECK(cpu_groupnorm_silu_fwd(y2, m2, r2, x, gm, bt, n, c, hw, groups, 1e-5f, &ctx2) == BK_OK,
          "%s: fwd status", tag);
    CHECK(!memcmp(m, m2, ns * 4) && !memcmp(r, r2, ns * 4), "%s: statistics differ", tag);
    double ef = tu_rel_err_f(y2, y, nx);
    CHECK(ef < 1e-6, "%s: fwd rel err %.3g", tag, ef);
    cpu_silu_bwd(gz, dy, z, 0, nx, &ctx2);
    for (int accum = 0; accum < 2; accum++) {
        gn_bwd_ws_check(tag, "bwd", dy, gz, x, gm, bt, m, r, accum, n, c, hw, groups, 1, ws, 1e-5,
                        &ctx2);
        gn_bwd_ws_check(tag, "plain ws", gz, gz, x, gm, bt, m, r, accum, n, c, hw, groups, 0, ws,
                        1e-6, &ctx2);
    }
    free(x); free(gm); free(bt); free(dy); free(z); free(y); free(y2); free(m); free(r);
    free(m2); free(r2); free(gz); free(ws);
}

/* the group norm's statistics (NHWC, the CPU layout) against float64 on a mean far from zero
 * (1000, sigma ~0.6): one pass in float chunks of up to GN_CHUNK pixels merged in double
 * (norm_gn.h) keeps the mean within ~GN_CHUNK u sigma of the true one and the variance within
 * ~(GN_CHUNK + 2) u, u = 2^-24, whatever the mean; bounded here at 64 u sigma (+ the float
 * mean's rounding) and 24 u on rstd. The plain (silu = 0, AVX2) and SiLU (AVX-512 where the
 * machine has it) forms give the same statistics. */
static void test_groupnorm_stats(int n, int c, int hw, int groups)
{
    const size_t nx = (size_t)n * c * hw, ns = (size_t)n * groups;
    const int cpg = c / groups;
    const double u = ldexp(1.0, -24);
    float *x = falloc(nx), *y = falloc(nx), *m = falloc(ns), *r = falloc(ns), *m2 = falloc(ns),
          *r2 = falloc(ns);
    for (size_t i = 0; i < nx; i++) x[i] = (float)(1000.0 + (double)(i % c % 7) + tu_rand());
    CHECK(cpu_groupnorm_fwd(y, m, r, x, NULL, NULL, n, c, hw, groups, 1e-5f, ctx) == BK_OK &&
              cpu_groupnorm_silu_fwd(y, m2, r2, x, NULL, NULL, n, c, hw, groups, 1e-5f, ctx) ==
                  BK_OK,
          "groupnorm stats n%d c%d hw%d g%d: status", n, c, hw, groups);
    CHECK(!memcmp(m, m2, ns * 4) && !memcmp(r, r2, ns * 4),
          "groupnorm stats n%d c%d hw%d g%d: plain and silu statistics differ", n, c, hw, groups);
    double worst_m = 0.0, worst_r = 0.0; /* in units of their bounds */
    for (int i = 0; i < n; i++)
        for (int g = 0; g < groups; g++) {
            double sum = 0.0, ss = 0.0, cnt = (double)cpg * hw;
            for (int p = 0; p < hw; p++)
                for (int k = g * cpg; k < (g + 1) * cpg; k++)
                    sum += x[((size_t)i * hw + p) * c + k];
            const double mu = sum / cnt;
            for (int p = 0; p < hw; p++)
                for (int k = g * cpg; k < (g + 1) * cpg; k++) {
                    double d = x[((size_t)i * hw + p) * c + k] - mu;
                    ss += d * d;
                }
            const double var = ss / cnt, rs = 1.0 / sqrt(var + 1e-5);
            const double em = fabs(m[i * groups + g] - mu) / (u * fabs(mu) + 64.0 * u * sqrt(var));
            const double er = fabs(r[i * groups + g] - rs) / (24.0 * u * rs);
            note(&worst_m, em);
            note(&worst_r, er);
        }
    printf("groupnorm stats n%d c%d hw%d g%d: mean err %.3g, rstd err %.3g of the bounds\n", n, c,
           hw, groups, worst_m, worst_r);
    CHECK(worst_m <= 1.0 && worst_r <= 1.0,
          "groupnorm stats n%d c%d hw%d g%d: mean err %.3g, rstd err %.3g of the bounds", n, c, hw,
          groups, worst_m, worst_r);
    free(x), free(y), free(m), free(r), free(m2), free(r2);
}

/* the attention's shapes, through whichever tiles cpu_isa() now picks */
static void test_attn_shapes(void)
{
    /* n, l, heads, d, packed, FD samples per q/k/v */
    test_attn(1, 1, 1, 1, 0, 40);
    test_attn(2, 7, 2, 8, 1, 40);
    test_attn(1, 33, 4, 8, 0, 40);
    test_attn(2, 33, 1, 24, 1, 40);
    test_attn(1, 64, 2, 1, 1, 40);
    test_attn(1, 100, 2, 24, 1, 30);
    test_attn(1, 130, 1, 8, 0, 30);
    test_attn(2, 130, 4, 24, 1, 20);
    test_attn(1, 40, 1, 512, 0, 20); /* the largest head dim the UNet presets use */
    test_attn(2, 70, 2, 100, 1, 20); /* tiled: a column chunk of 64, then 4 full vectors and 4
                                      * masked lanes */
    /* several query and key blocks (128), the last ones partial: the seed's head dims */
    test_attn(2, 300, 4, 16, 1, 12);
    test_attn(1, 260, 2, 32, 0, 12);
    test_attn(1, 300, 1, 16, 1, 12); /* one pair, 2 threads: its keys split in 2 chunks */

}

/* The AVX-512 tiles against the AVX2 ones: the same S = alpha A B^T, the same dsoftmax (its
 * vectorised exp against vm_expf, over the whole float range: large, subnormal and zero results,
 * inf and NaN) and the same W X and W^T X products, bit for bit. */
static void test_attn_tiles(void)
{
    if (cpu_isa() < CPU_ISA_AVX512) {
        printf("attention tiles: no AVX-512 on this CPU, the AVX2 tiles only\n");
        return;
    }
    enum { NR = 37, NC = 45, NCP = 48, D = 19 };
    static float at[D * NR], bt[D * NCP], s1[NR * NCP], s2[NR * NCP], x[NC * D];
    static float p1[NR * NCP], p2[NR * NCP], d1[NR * NCP], d2[NR * NCP], y1[NC * D], y2[NC * D];
    float lse[NR], di[NR];
    tu_fill(at, D * NR, 1.0);
    tu_fill(bt, D * NCP, 1.0);
    tu_fill(x, NC * D, 1.0);
    for (int e = 0; e < D; e++)
        for (int c = NC; c < NCP; c++) bt[e * NCP + c] = 0.0f;
    attn_tiles_avx2.abt(s1, NCP, at, NR, bt, NCP, NCP, NR, D, 0.37f);
    attn_tiles_avx512.abt(s2, NCP, at, NR, bt, NCP, NCP, NR, D, 0.37f);
    CHECK(memcmp(s1, s2, sizeof s1) == 0, "attention tiles: abt differs");
    /* P over [-130, 100] in steps that hit the clamps, the subnormal results and exact 0 */
    for (int i = 0; i < NR * NCP; i++) {
        p1[i] = p2[i] = -130.0f + 230.0f * (float)i / (NR * NCP) + 1e-3f * (float)(i % 7);
        d1[i] = d2[i] = s1[i];
    }
    p1[5] = p2[5] = NAN;
    p1[6] = p2[6] = INFINITY;
    p1[7] = p2[7] = -INFINITY;
    for (int r = 0; r < NR; r++) {
        lse[r] = 0.25f * (float)(r % 3);
        di[r] = 0.1f * (float)r;
    }
    attn_tiles_avx2.dsoftmax(p1, d1, NCP, lse, di, NR, NC, 0.37f);
    attn_tiles_avx512.dsoftmax(p2, d2, NCP, lse, di, NR, NC, 0.37f);
    long diff = 0;
    for (int i = 0; i < NR * NCP; i++)
        diff += memcmp(&p1[i], &p2[i], 4) != 0 && !(isnan(p1[i]) && isnan(p2[i]));
    CHECK(diff == 0, "attention tiles: exp differs at %ld of %d", diff, NR * NCP);
    diff = 0;
    for (int i = 0; i < NR * NCP; i++)
        diff += memcmp(&d1[i], &d2[i], 4) != 0 && !(isnan(d1[i]) && isnan(d2[i]));
    CHECK(diff == 0, "attention tiles: dS differs at %ld of %d", diff, NR * NCP);
    /* W X (rows of P, stride NCP) and W^T X, written then accumulated */
    for (int acc = 0; acc < 2; acc++) {
        for (int t = 0; t < 2; t++) {
            const size_t sw = t ? 1 : NCP, st = t ? NCP : 1;
            const int ny = t ? NC : NR, nt = t ? NR : NC;
            attn_tiles_avx2.wx(y1, D, s1, sw, st, x, D, ny < NC ? ny : NC, nt < NC ? nt : NC, D,
                               acc);
            attn_tiles_avx512.wx(y2, D, s1, sw, st, x, D, ny < NC ? ny : NC, nt < NC ? nt : NC,
                                 D, acc);
            CHECK(memcmp(y1, y2, sizeof y1) == 0, "attention tiles: wx (%s, acc %d) differs",
                  t ? "W^T X" : "W X", acc);
        }
    }
}

int main(void)
{
    tu_seed(20240611);
    CHECK(cpu_ctx_init(&ctx, 2) == BK_OK, "ctx");

    /* n, ci, h, w, co, k, stride, pad t l b r, bias */
    test_conv(2, 3, 7, 7, 5, 3, 1, 1, 1, 1, 1, 1);
    test_conv(1, 5, 9, 8, 7, 3, 2, 1, 1, 1, 1, 0);
    test_conv(2, 3, 8, 9, 5, 3, 2, 0, 0, 1, 1, 1); /* diffusers' downsample, padding 0 */
    test_conv(2, 3, 6, 7, 5, 3, 1, 0, 0, 1, 1, 0);
    test_conv(2, 7, 5, 6, 3, 1, 1, 0, 0, 0, 0, 1); /* pointwise: no im2col, no ws */
    test_conv(1, 5, 7, 5, 3, 1, 1, 0, 0, 0, 0, 0);
    test_conv(1, 5, 7, 5, 3, 1, 2, 0, 0, 0, 0, 1); /* 1x1 stride 2 goes through im2col */
    test_conv(1, 3, 5, 5, 7, 1, 1, 1, 0, 0, 1, 0); /* padded 1x1 */
    test_conv_invalid();

    test_linear(5, 7, 3, 1);
    test_linear(17, 33, 9, 0);
    test_linear(1, 1, 1, 1);
    test_linear(33, 13, 70, 1); /* crosses the 64-column bias-gradient block */

    /* group norm: n, c, hw, groups, affine */
    test_norm(2, 6, 5, 1, 1);
    test_norm(2, 6, 5, 3, 1);
    test_norm(2, 6, 5, 6, 1);
    test_norm(3, 12, 7, 4, 1);
    test_norm(2, 10, 9, 5, 0);
    test_norm(2, 120, 6, 10, 1); /* cpg 12: blocks of 96 (norm_gn.h gn_block_wide), then 24 */
    test_groupnorm_silu(2, 32, 37, 8);
    test_groupnorm_silu(3, 96, 16, 32);
    test_groupnorm_silu(1, 20, 9, 1);
    test_groupnorm_silu(2, 120, 20, 10); /* the workspace backward's blocks of 96 and 24 */
    test_groupnorm_stats(2, 15, 1061, 5); /* odd channels, a chunk tail of 5 pixels */
    test_groupnorm_stats(1, 96, 1024, 32);
    test_groupnorm_stats(2, 320, 100, 1); /* a block of 320: chunks of 12 pixels, tail 4 */
    /* layer norm: m, d, (unused), 0, affine */
    test_norm(5, 7, 1, 0, 1);
    test_norm(3, 33, 1, 0, 1);
    test_norm(4, 130, 1, 0, 1);
    test_norm(3, 9, 1, 0, 0);
    test_norm(3, 1100, 1, 0, 1); /* longer than LN_ROWS rows of the row buffers: one at a time */
    test_layernorm_rows(11, 40);
    test_layernorm_rows(6, 1100);
    test_norm_invalid();

    /* every instruction set this CPU has: the AVX2 tiles, then the machine's (AVX-512) */
    test_attn_tiles();
    const int machine_isa = cpu_isa();
    for (int pass = 0; pass < (machine_isa > CPU_ISA_AVX2 ? 2 : 1); pass++) {
        cpu_isa_cap(pass ? machine_isa : CPU_ISA_AVX2);
        printf("attention tiles: %s\n", pass ? "AVX-512" : "AVX2");
        test_attn_shapes();
    }
    cpu_isa_cap(-1);
    test_attn_invalid();

    printf("max rel errors (fwd vs float64 ref | bwd vs finite differences):\n");
    for (int i = 0; i < OP_COUNT; i++)
        printf("  %-12s fwd %.3g  bwd %.3g\n", op_names[i], max_fwd[i], max_bwd[i]);
    printf("  %-12s %.3g\n", "attn lse", max_lse);
    cpu_ctx_free(ctx);
    return tu_finish("test_ops_dense");
}
