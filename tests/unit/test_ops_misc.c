/* test_ops_misc.c - the CPU backend's element-wise, layout, resampling, embedding, loss, dropout
 * and optimizer kernels against float64 references written here as separate naive loops, their
 * backwards against central finite differences of those references, and bit-identical results
 * at 1, 2 and 3 threads.
 */
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/vmath.h"
#include "philox.h"
#include "nchw_shim.h"
#include "test_util.h"

/* contexts made directly (not by cpu_ctx_init) so this test needs only the kernels it tests */
static bk_ctx ctx1 = {.threads = 1}, ctx2 = {.threads = 2}, ctx3 = {.threads = 3};

static float *fbuf(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) abort();
    return p;
}
static double *dbuf(size_t n)
{
    double *p = malloc((n ? n : 1) * sizeof *p);
    if (!p) abort();
    return p;
}
static void fill_nan(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}
static double max_abs_diff(const float *a, const double *ref, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]);
        if (!(d <= m)) m = d; /* NaN propagates */
    }
    return m;
}

/* ---------------------------------------------------------------------------------------------
 * Generic op case: one differentiable input x (other inputs in p), a float64 reference forward,
 * the kernel forward and optionally the kernel backward (dx from dy, =/+= per accum).
 */
typedef void (*ref_fn)(double *y, const double *x, const void *p);
typedef void (*fwd_fn)(float *y, const float *x, const void *p, bk_ctx *ctx);
typedef void (*bwd_fn)(float *dx, const float *dy, const float *x, int accum, const void *p,
                       bk_ctx *ctx);

struct op_case {
    const char *name;
    size_t nx, ny;
    ref_fn ref;
    fwd_fn fwd;
    bwd_fn bwd; /* NULL: forward only */
    const void *p;
    double fwd_tol;
    double xscale; /* x uniform in [-xscale, xscale) */
};

/* d/dx_idx[k] of L(x) = sum_j ref(x)_j * r_j by central differences in float64, at the nsub
 * coordinates idx (all of x for small inputs, an even spread for large ones) */
static void fd_grad(double *g, ref_fn ref, const void *p, const float *x, size_t nx,
                    const size_t *idx, size_t nsub, const double *r, size_t ny)
{
    double *xd = dbuf(nx), *y = dbuf(ny);
    for (size_t i = 0; i < nx; i++) xd[i] = x[i];
    for (size_t k = 0; k < nsub; k++) {
        size_t i = idx[k];
        double h = 1e-5 * (fabs(xd[i]) > 1 ? fabs(xd[i]) : 1), x0 = xd[i], lp = 0, lm = 0;
        xd[i] = x0 + h;
        ref(y, xd, p);
        for (size_t j = 0; j < ny; j++) lp += y[j] * r[j];
        xd[i] = x0 - h;
        ref(y, xd, p);
        for (size_t j = 0; j < ny; j++) lm += y[j] * r[j];
        xd[i] = x0;
        g[k] = (lp - lm) / (2 * h);
    }
    free(xd);
    free(y);
}

/* relative error of a[idx[k]] against ref[k] */
static double sub_rel_err(const float *a, const size_t *idx, size_t nsub, const double *ref)
{
    float *s = fbuf(nsub);
    for (size_t k = 0; k < nsub; k++) s[k] = a[idx[k]];
    double e = tu_rel_err(s, ref, nsub);
    free(s);
    return e;
}

static int all_finite(const float *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(a[i])) return 0;
    return 1;
}

static void run_case(const struct op_case *oc)
{
    size_t nx = oc->nx, ny = oc->ny;
    float *x = fbuf(nx), *y = fbuf(ny), *y1 = fbuf(ny), *y3 = fbuf(ny);
    double *xd = dbuf(nx), *yref = dbuf(ny);
    tu_fill(x, nx, oc->xscale);
    for (size_t i = 0; i < nx; i++) xd[i] = x[i];
    oc->ref(yref, xd, oc->p);

    fill_nan(y, ny);
    oc->fwd(y, x, oc->p, &ctx2);
    double ef = tu_rel_err(y, yref, ny);
    CHECK(ef <= oc->fwd_tol, "%s fwd rel err %.3e > %.1e", oc->name, ef, oc->fwd_tol);
    fill_nan(y1, ny);
    fill_nan(y3, ny);
    oc->fwd(y1, x, oc->p, &ctx1);
    oc->fwd(y3, x, oc->p, &ctx3);
    CHECK(memcmp(y, y1, ny * sizeof *y) == 0 && memcmp(y, y3, ny * sizeof *y) == 0,
          "%s fwd bit-identical at 1/2/3 threads", oc->name);

    double eb = 0, ea = 0;
    if (oc->bwd) {
        float *dy = fbuf(ny), *dx = fbuf(nx), *dx1 = fbuf(nx), *dx3 = fbuf(nx), *d0 = fbuf(nx);
        /* finite differences cost O(nx * ny): large inputs are checked at 256 coordinates */
        size_t nsub = nx <= 2048 ? nx : 256;
        size_t *idx = malloc(nsub * sizeof *idx);
        double *r = dbuf(ny), *g = dbuf(nsub), *gacc = dbuf(nsub);
        if (!idx) abort();
        for (size_t k = 0; k < nsub; k++) idx[k] = k * nx / nsub;
        tu_fill(dy, ny, 1.0);
        for (size_t j = 0; j < ny; j++) r[j] = dy[j];
        fd_grad(g, oc->ref, oc->p, x, nx, idx, nsub, r, ny);

        fill_nan(dx, nx); /* accum = 0 must write every element */
        oc->bwd(dx, dy, x, 0, oc->p, &ctx2);
        CHECK(all_finite(dx, nx), "%s bwd accum=0 writes every element", oc->name);
        eb = sub_rel_err(dx, idx, nsub, g);
        CHECK(eb <= 1e-4, "%s bwd rel err vs finite differences %.3e", oc->name, eb);

        tu_fill(d0, nx, 1.0);
        memcpy(dx, d0, nx * sizeof *dx);
        oc->bwd(dx, dy, x, 1, oc->p, &ctx2);
        for (size_t k = 0; k < nsub; k++) gacc[k] = (double)d0[idx[k]] + g[k];
        ea = sub_rel_err(dx, idx, nsub, gacc);
        CHECK(ea <= 1e-4, "%s bwd accum=1 rel err %.3e", oc->name, ea);

        fill_nan(dx, nx);
        fill_nan(dx1, nx);
        fill_nan(dx3, nx);
        oc->bwd(dx, dy, x, 0, oc->p, &ctx2);
        oc->bwd(dx1, dy, x, 0, oc->p, &ctx1);
        oc->bwd(dx3, dy, x, 0, oc->p, &ctx3);
        CHECK(memcmp(dx, dx1, nx * sizeof *dx) == 0 && memcmp(dx, dx3, nx * sizeof *dx) == 0,
              "%s bwd bit-identical at 1/2/3 threads", oc->name);
        free(dy);
        free(dx);
        free(dx1);
        free(dx3);
        free(d0);
        free(idx);
        free(r);
        free(g);
        free(gacc);
        printf("  %-28s fwd %.2e  bwd %.2e  bwd+accum %.2e\n", oc->name, ef, eb, ea);
    } else {
        printf("  %-28s fwd %.2e\n", oc->name, ef);
    }
    free(x);
    free(y);
    free(y1);
    free(y3);
    free(xd);
    free(yref);
}

/* ---------------------------------------------------------------------------------------------
 * element-wise
 */
struct p_count {
    size_t n;
    const float *other; /* the second input of add / the non-differentiated inputs */
    float s;
};

static void ref_silu(double *y, const double *x, const void *pv)
{
    const struct p_count *p = pv;
    for (size_t i = 0; i < p->n; i++) y[i] = x[i] / (1.0 + exp(-x[i]));
}
static void fwd_silu(float *y, const float *x, const void *pv, bk_ctx *c)
{
    const struct p_count *p = pv;
    CHECK(cpu_silu_fwd(y, x, p->n, c) == BK_OK, "silu_fwd status");
}
static void bwd_silu(float *dx, const float *dy, const float *x, int accum, const void *pv,
                     bk_ctx *c)
{
    const struct p_count *p = pv;
    CHECK(cpu_silu_bwd(dx, dy, x, accum, p->n, c) == BK_OK, "silu_bwd status");
}

static void ref_gelu(double *y, const double *x, const void *pv)
{
    const struct p_count *p = pv;
    for (size_t i = 0; i < p->n; i++) y[i] = 0.5 * x[i] * (1.0 + erf(x[i] / sqrt(2.0)));
}
static void fwd_gelu(float *y, const float *x, const void *pv, bk_ctx *c)
{
    const struct p_count *p = pv;
    CHECK(cpu_gelu_fwd(y, x, p->n, c) == BK_OK, "gelu_fwd status");
}
static void bwd_gelu(float *dx, const float *dy, const float *x, int accum, const void *pv,
                     bk_ctx *c)
{
    const struct p_count *p = pv;
    CHECK(cpu_gelu_bwd(dx, dy, x, accum, p->n, c) == BK_OK, "gelu_bwd status");
}

static void ref_add(double *y, const double *x, const void *pv)
{
    const struct p_count *p = pv;
    for (size_t i = 0; i < p->n; i++) y[i] = x[i] + (double)p->other[i];
}
static void fwd_add(float *y, const float *x, const void *pv, bk_ctx *c)
{
    const struct p_count *p = pv;
    CHECK(cpu_add_fwd(y, x, p->other, p->n, c) == BK_OK, "add_fwd status");
}
static void fwd_add_swapped(float *y, const float *x, const void *pv, bk_ctx *c)
{
    const struct p_count *p = pv;
    CHECK(cpu_add_fwd(y, p->other, x, p->n, c) == BK_OK, "add_fwd status");
}
static void bwd_copy(float *dx, const float *dy, const float *x, int accum, const void *pv,
                     bk_ctx *c)
{
    const struct p_count *p = pv;
    CHECK(cpu_copy_grad(dx, dy, accum, p->n, c) == BK_OK, "copy_grad status");
}

static void ref_scale(double *y, const double *x, const void *pv)
{
    const struct p_count *p = pv;
    for (size_t i = 0; i < p->n; i++) y[i] = x[i] * (double)p->s;
}
static void fwd_scale(float *y, const float *x, const void *pv, bk_ctx *c)
{
    const struct p_count *p = pv;
    CHECK(cpu_scale_fwd(y, x, p->s, p->n, c) == BK_OK, "scale_fwd status");
}

/* add_bcast: the differentiable input is b (N,C); x (N,C,HW) is in `other` */
struct p_nchw {
    int n, c, h, w; /* for (N,C,HW) ops h*w is HW */
    int c2;         /* concat: second part's channels */
    int align;      /* bilinear */
    const float *other;
};

static void ref_add_bcast(double *y, const double *b, const void *pv)
{
    const struct p_nchw *p = pv;
    int hw = p->h * p->w;
    for (int s = 0; s < p->n; s++)
        for (int ch = 0; ch < p->c; ch++)
            for (int q = 0; q < hw; q++) {
                size_t i = ((size_t)s * p->c + ch) * hw + q;
                y[i] = (double)p->other[i] + b[s * p->c + ch];
            }
}
static void fwd_add_bcast(float *y, const float *b, const void *pv, bk_ctx *c)
{
    const struct p_nchw *p = pv;
    CHECK(nchw_add_bcast_fwd(y, p->other, b, p->n, p->c, p->h * p->w, c) == BK_OK, "status");
}
static void bwd_add_bcast(float *db, const float *dy, const float *b, int accum, const void *pv,
                          bk_ctx *c)
{
    const struct p_nchw *p = pv;
    CHECK(nchw_add_bcast_bwd(db, dy, accum, p->n, p->c, p->h * p->w, c) == BK_OK, "status");
}

static void test_eltwise(void)
{
    printf("eltwise:\n");
    size_t n = 1031;
    struct p_count pc = {.n = n};
    struct op_case silu = {"silu", n, n, ref_silu, fwd_silu, bwd_silu, &pc, 1e-5, 6.0};
    run_case(&silu);
    struct op_case gelu = {"gelu", n, n, ref_gelu, fwd_gelu, bwd_gelu, &pc, 1e-5, 4.0};
    run_case(&gelu);

    /* large |x|: finite outputs and gradients (no inf/inf or 0*inf) */
    float xs[6] = {-1000.0f, -100.0f, -88.5f, 88.5f, 100.0f, 1000.0f}, ys[6], ones[6], gs[6];
    for (int i = 0; i < 6; i++) ones[i] = 1.0f;
    int finite = 1;
    cpu_silu_fwd(ys, xs, 6, &ctx1);
    cpu_silu_bwd(gs, ones, xs, 0, 6, &ctx1);
    for (int i = 0; i < 6; i++) finite &= isfinite(ys[i]) && isfinite(gs[i]);
    CHECK(finite && ys[5] == 1000.0f && gs[5] == 1.0f && ys[0] == 0.0f && gs[0] == 0.0f,
          "silu at |x| = 1000 saturates cleanly");
    cpu_gelu_fwd(ys, xs, 6, &ctx1);
    cpu_gelu_bwd(gs, ones, xs, 0, 6, &ctx1);
    finite = 1;
    for (int i = 0; i < 6; i++) finite &= isfinite(ys[i]) && isfinite(gs[i]);
    CHECK(finite && ys[5] == 1000.0f && gs[5] == 1.0f && ys[0] == 0.0f && gs[0] == 0.0f,
          "gelu at |x| = 1000 saturates cleanly");

    float *other = fbuf(n);
    tu_fill(other, n, 3.0);
    struct p_count pa = {.n = n, .other = other};
    struct op_case add = {"add (grad a = copy_grad)", n, n, ref_add, fwd_add, bwd_copy, &pa,
                          1e-6, 3.0};
    run_case(&add);
    struct op_case add2 = {"add (grad b = copy_grad)", n, n, ref_add, fwd_add_swapped, bwd_copy,
                           &pa, 1e-6, 3.0};
    run_case(&add2);
    /* the parallel path (count above the threshold) */
    size_t nb = 100003;
    float *xa = fbuf(nb), *xb = fbuf(nb), *y2 = fbuf(nb), *y1 = fbuf(nb);
    tu_fill(xa, nb, 2.0);
    tu_fill(xb, nb, 2.0);
    cpu_add_fwd(y2, xa, xb, nb, &ctx2);
    int exact = 1;
    for (size_t i = 0; i < nb; i++) exact &= y2[i] == xa[i] + xb[i];
    CHECK(exact, "add_fwd exact on 1e5 elements");
    cpu_silu_fwd(y2, xa, nb, &ctx2);
    cpu_silu_fwd(y1, xa, nb, &ctx1);
    CHECK(memcmp(y1, y2, nb * sizeof *y1) == 0, "silu_fwd 1e5: 1 and 2 threads bit-identical");
    free(xa);
    free(xb);
    free(y2);
    free(y1);

    struct p_count ps = {.n = n, .s = 0.18215f};
    struct op_case scale = {"scale", n, n, ref_scale, fwd_scale, NULL, &ps, 1e-6, 5.0};
    run_case(&scale);
    float *xsc = fbuf(n), *ysc = fbuf(n);
    tu_fill(xsc, n, 5.0);
    cpu_scale_fwd(ysc, xsc, ps.s, n, &ctx2);
    exact = 1;
    for (size_t i = 0; i < n; i++) exact &= ysc[i] == xsc[i] * ps.s;
    CHECK(exact, "scale_fwd is the float product");
    free(xsc);
    free(ysc);

    /* add_bcast on odd sizes (N=2, C=3, HW=5x7) and a larger parallel one */
    int shapes[2][3] = {{2, 3, 35}, {3, 17, 4099}};
    for (int k = 0; k < 2; k++) {
        struct p_nchw pb = {.n = shapes[k][0], .c = shapes[k][1], .h = shapes[k][2], .w = 1};
        size_t nxb = (size_t)pb.n * pb.c, ny = nxb * pb.h;
        float *xin = fbuf(ny);
        tu_fill(xin, ny, 1.0);
        pb.other = xin;
        struct op_case ab = {k ? "add_bcast (3,17,4099)" : "add_bcast (2,3,35)", nxb, ny,
                             ref_add_bcast, fwd_add_bcast, bwd_add_bcast, &pb, 1e-6, 1.0};
        run_case(&ab);
        free(xin);
    }
    free(other);
}

/* silu / gelu over a dense grid of [-100, 100], every binade of the float range (subnormals
 * included) and the special values, against float64 references: finite outputs for finite
 * inputs, exact limits at +-inf, NaN for NaN, accum = 1 adding exactly the accum = 0 result,
 * bit-identical at 1/2/3 threads. Forward errors are relative (|ref| > 1e-30; absolute 2e-36
 * below). The derivatives cross zero (silu' at x = -1.278, gelu' at x = -0.752), where the
 * cancellation in s (1 + x (1 - s)) or Phi + x phi leaves no float evaluation a relative
 * accuracy, so their errors are relative to the sum of the magnitudes of the two terms. */
/* the SiLU and GELU blocks in AVX2 and in the machine's AVX-512 (eltwise512.c, cpu_isa) give the
 * same bits on every lane: a sweep of magnitudes with both signs, zeros, subnormals, infinities
 * and NaN, forward and backward (= and +=); on an AVX2-only machine both runs take AVX2 */
static void test_eltwise_isa(void)
{
    enum { N = 4 * 4096 + 333 };
    float *x = malloc(N * 4), *dy = malloc(N * 4), *out[2][6];
    tu_seed(91);
    for (int i = 0; i < N; i++) {
        x[i] = (float)(tu_rand() * ldexp(1.0, (int)(tu_rand() * 60) - 30));
        dy[i] = (float)tu_rand();
    }
    const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, 1e-40f, -1e-40f, 88.7f,
                        -88.7f, 104.0f, -104.0f, 5.9f, -5.9f, 20.0f, -20.0f};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) x[37 * i + 5] = sp[i];
    for (int pass = 0; pass < 2; pass++) {
        cpu_isa_cap(pass ? -1 : CPU_ISA_AVX2);
        for (int k = 0; k < 6; k++) {
            out[pass][k] = malloc(N * 4);
            for (int i = 0; i < N; i++) out[pass][k][i] = 0.25f; /* the += base */
        }
        cpu_silu_fwd(out[pass][0], x, N, &ctx2);
        cpu_gelu_fwd(out[pass][1], x, N, &ctx2);
        cpu_silu_bwd(out[pass][2], dy, x, 0, N, &ctx2);
        cpu_gelu_bwd(out[pass][3], dy, x, 0, N, &ctx2);
        cpu_silu_bwd(out[pass][4], dy, x, 1, N, &ctx2);
        cpu_gelu_bwd(out[pass][5], dy, x, 1, N, &ctx2);
    }
    cpu_isa_cap(-1);
    for (int k = 0; k < 6; k++) {
        CHECK(memcmp(out[0][k], out[1][k], N * 4) == 0,
              "eltwise op %d: the AVX2 and the machine's (isa %d) blocks differ", k, cpu_isa());
        free(out[0][k]);
        free(out[1][k]);
    }
    free(x);
    free(dy);
}

/* vm_exp_negabs (the SiLU's e^-|x|) gives vm_expf(-|x|)'s bits for every float but NaN: every
 * 61st bit pattern of both signs (the whole exponent range: 0, subnormal and normal results, the
 * clamp at 110, +-inf), and the patterns next to the subnormal and zero thresholds */
static void test_exp_negabs(void)
{
    size_t diff = 0, n = 0;
    float worst = 0.0f;
    for (uint64_t b = 0; b <= 0xffffffffu; b += 509) {
        const uint32_t u = (uint32_t)b;
        float x;
        memcpy(&x, &u, sizeof x);
        if (isnan(x)) continue;
        const float got = vm_exp_negabs(x), want = vm_expf(-fabsf(x));
        n++;
        if (memcmp(&got, &want, sizeof got)) diff++, worst = x;
    }
    const float edge[] = {87.33654f, 87.33655f, 103.27893f, 103.27894f, 103.97208f, 103.97209f,
                          110.0f, 0x1.b80002p6f, INFINITY, 0.0f, 0x1p-149f, 0.34657359f};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
        for (int sg = -1; sg <= 1; sg += 2) {
            const float x = (float)sg * edge[i], got = vm_exp_negabs(x), want = vm_expf(-edge[i]);
            n++;
            if (memcmp(&got, &want, sizeof got)) diff++, worst = x;
        }
    printf("exp(-|x|): %zu of %zu floats differ from vm_expf's\n", diff, n);
    CHECK(diff == 0, "vm_exp_negabs: %zu of %zu floats differ from vm_expf(-|x|) (x = %.9g)", diff,
          n, worst);
}

static void test_eltwise_sweep(void)
{
    printf("eltwise sweep (silu, gelu over the float range):\n");
    const float big = 0x1.fffffep127f;
    float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, big, -big, 1e30f, -1e30f, 1e10f,
                       -1e10f, 0x1p-126f, -0x1p-126f, 0x1p-149f, -0x1p-149f, 1e-40f, -1e-40f,
                       88.72f, -88.72f, 103.97f, -103.97f, 104.0f, -104.0f, 1000.0f, -1000.0f,
                       13.2f, -13.2f, 20.0f, -20.0f, 1.2784645f, -1.2784645f, -0.7517915f};
    size_t nspec = sizeof special / sizeof special[0], ngrid = 204801, nbin = 2 * 277 * 8;
    size_t n = nspec + ngrid + nbin + 1, k = 0;
    float *x = fbuf(n), *y[3], *g[3], *acc = fbuf(n), *ones = fbuf(n);
    for (int t = 0; t < 3; t++) {
        y[t] = fbuf(n);
        g[t] = fbuf(n);
    }
    for (size_t i = 0; i < nspec; i++) x[k++] = special[i];
    for (size_t i = 0; i < ngrid; i++) x[k++] = (float)((double)i / 1024.0 - 100.0);
    for (int e = -149; e <= 127; e++)
        for (int m = 0; m < 8; m++)
            for (int sg = -1; sg <= 1; sg += 2) x[k++] = (float)(sg * ldexp(1.0 + m / 8.0, e));
    x[k++] = NAN;
    for (size_t i = 0; i < n; i++) ones[i] = 1.0f;

    for (int f = 0; f < 2; f++) {
        const char *name = f ? "gelu" : "silu";
        bk_ctx *cs[3] = {&ctx2, &ctx1, &ctx3};
        for (int t = 0; t < 3; t++) {
            fill_nan(y[t], n);
            fill_nan(g[t], n);
            if (f) {
                cpu_gelu_fwd(y[t], x, n, cs[t]);
                cpu_gelu_bwd(g[t], ones, x, 0, n, cs[t]);
            } else {
                cpu_silu_fwd(y[t], x, n, cs[t]);
                cpu_silu_bwd(g[t], ones, x, 0, n, cs[t]);
            }
        }
        for (size_t i = 0; i < n; i++) acc[i] = x[i] > 0 ? 0.5f : -0.25f;
        if (f)
            cpu_gelu_bwd(acc, ones, x, 1, n, &ctx2);
        else
            cpu_silu_bwd(acc, ones, x, 1, n, &ctx2);
        CHECK(memcmp(y[0], y[1], n * sizeof(float)) == 0 &&
                  memcmp(y[0], y[2], n * sizeof(float)) == 0 &&
                  memcmp(g[0], g[1], n * sizeof(float)) == 0 &&
                  memcmp(g[0], g[2], n * sizeof(float)) == 0,
              "%s sweep: fwd and bwd bit-identical at 1/2/3 threads", name);

        double ef = 0, eb = 0, eabs = 0;
        float xf = 0, xb = 0;
        size_t bad_finite = 0, bad_limit = 0, bad_accum = 0;
        for (size_t i = 0; i < n; i++) {
            double v = x[i], yv = y[0][i], gv = g[0][i];
            float add = (x[i] > 0 ? 0.5f : -0.25f) + g[0][i];
            if (memcmp(&acc[i], &add, sizeof add) != 0 && !(isnan(acc[i]) && isnan(add)))
                bad_accum++;
            if (isnan(v)) {
                bad_limit += !isnan(yv) || !isnan(gv);
                continue;
            }
            if (isinf(v)) { /* silu, gelu: -inf -> (-)0, grad 0; +inf -> +inf, grad 1 */
                bad_limit += v < 0 ? !(yv == 0 && gv == 0) : !(yv == v && gv == 1);
                continue;
            }
            if (!isfinite(yv) || !isfinite(gv)) {
                bad_finite++;
                continue;
            }
            double ref, dref, dscale;
            if (f) {
                double cdf = 0.5 * erfc(-v / sqrt(2.0));
                double pdf = exp(-0.5 * v * v) / 2.5066282746310005024; /* sqrt(2 pi) */
                ref = v * cdf;
                dref = cdf + v * pdf;
                dscale = cdf + fabs(v) * pdf;
            } else {
                double s = 1.0 / (1.0 + exp(-v)), oms = 1.0 / (1.0 + exp(v));
                ref = v * s;
                dref = s * (1.0 + v * oms);
                dscale = s + fabs(v) * s * oms;
            }
            double d = fabs(yv - ref), db = fabs(gv - dref);
            if (fabs(ref) > 1e-30) {
                if (d / fabs(ref) > ef) ef = d / fabs(ref), xf = x[i];
            } else if (d > eabs) {
                eabs = d;
            }
            if (dscale > 1e-30) {
                if (db / dscale > eb) eb = db / dscale, xb = x[i];
            } else if (db > eabs) {
                eabs = db;
            }
        }
        printf("  %-5s fwd max rel %.2e (x = %.9g)  bwd max rel-to-terms %.2e (x = %.9g)  "
               "abs below 1e-30 %.1e\n",
               name, ef, xf, eb, xb, eabs);
        CHECK(bad_finite == 0, "%s sweep: %zu non-finite outputs for finite inputs", name,
              bad_finite);
        CHECK(bad_limit == 0, "%s sweep: %zu wrong results at +-inf / NaN", name, bad_limit);
        CHECK(bad_accum == 0, "%s sweep: accum=1 differs from dx + (accum=0 result) at %zu", name,
              bad_accum);
        CHECK(ef < 2e-6, "%s sweep: fwd rel err %.3e at x = %.9g", name, ef, xf);
        CHECK(eb < 2e-6, "%s sweep: bwd rel err %.3e at x = %.9g", name, eb, xb);
        CHECK(eabs < 2e-36, "%s sweep: abs err %.3e where |ref| <= 1e-30", name, eabs);
    }
    free(x);
    free(acc);
    free(ones);
    for (int t = 0; t < 3; t++) {
        free(y[t]);
        free(g[t]);
    }
}

/* ---------------------------------------------------------------------------------------------
 * layout
 */
static void ref_concat_a(double *y, const double *a, const void *pv)
{
    const struct p_nchw *p = pv; /* c = C1, c2 = C2, other = b, HW = h*w */
    int hw = p->h * p->w, ct = p->c + p->c2;
    for (int s = 0; s < p->n; s++)
        for (int ch = 0; ch < ct; ch++)
            for (int q = 0; q < hw; q++)
                y[((size_t)s * ct + ch) * hw + q] =
                    ch < p->c ? a[((size_t)s * p->c + ch) * hw + q]
                              : (double)p->other[((size_t)s * p->c2 + ch - p->c) * hw + q];
}
static void ref_concat_b(double *y, const double *b, const void *pv)
{
    const struct p_nchw *p = pv; /* other = a */
    int hw = p->h * p->w, ct = p->c + p->c2;
    for (int s = 0; s < p->n; s++)
        for (int ch = 0; ch < ct; ch++)
            for (int q = 0; q < hw; q++)
                y[((size_t)s * ct + ch) * hw + q] =
                    ch < p->c ? (double)p->other[((size_t)s * p->c + ch) * hw + q]
                              : b[((size_t)s * p->c2 + ch - p->c) * hw + q];
}
static void fwd_concat_a(float *y, const float *a, const void *pv, bk_ctx *c)
{
    const struct p_nchw *p = pv;
    CHECK(nchw_concat_fwd(y, a, p->other, p->n, p->c, p->c2, p->h * p->w, c) == BK_OK, "status");
}
static void fwd_concat_b(float *y, const float *b, const void *pv, bk_ctx *c)
{
    const struct p_nchw *p = pv;
    CHECK(nchw_concat_fwd(y, p->other, b, p->n, p->c, p->c2, p->h * p->w, c) == BK_OK, "status");
}
static void bwd_concat_a(float *da, const float *dy, const float *a, int accum, const void *pv,
                         bk_ctx *c)
{
    const struct p_nchw *p = pv;
    CHECK(nchw_concat_bwd(da, NULL, dy, accum, 0, p->n, p->c, p->c2, p->h * p->w, c) == BK_OK,
          "status");
}
static void bwd_concat_b(float *db, const float *dy, const float *b, int accum, const void *pv,
                         bk_ctx *c)
{
    const struct p_nchw *p = pv;
    CHECK(nchw_concat_bwd(NULL, db, dy, 0, accum, p->n, p->c, p->c2, p->h * p->w, c) == BK_OK,
          "status");
}

/* transpose: x (N,C,HW) -> y (N,HW,C); p->c = C, p->h = HW */
static void ref_transpose(double *y, const double *x, const void *pv)
{
    const struct p_nchw *p = pv;
    for (int s = 0; s < p->n; s++)
        for (int ch = 0; ch < p->c; ch++)
            for (int q = 0; q < p->h; q++)
                y[((size_t)s * p->h + q) * p->c + ch] = x[((size_t)s * p->c + ch) * p->h + q];
}
static void fwd_transpose(float *y, const float *x, const void *pv, bk_ctx *c)
{
    const struct p_nchw *p = pv;
    CHECK(cpu_transpose_fwd(y, x, 0, p->n, p->c, p->h, c) == BK_OK, "status");
}
static void bwd_transpose(float *dx, const float *dy, const float *x, int accum, const void *pv,
                          bk_ctx *c)
{
    const struct p_nchw *p = pv; /* the inverse: (hw, c) swapped */
    CHECK(cpu_transpose_fwd(dx, dy, accum, p->n, p->h, p->c, c) == BK_OK, "status");
}

static void test_layout(void)
{
    printf("layout:\n");
    int n = 2, c1 = 3, c2 = 5, hw = 35;
    size_t na = (size_t)n * c1 * hw, nb = (size_t)n * c2 * hw, ny = na + nb;
    float *a = fbuf(na), *b = fbuf(nb);
    tu_fill(a, na, 1.0);
    tu_fill(b, nb, 1.0);
    struct p_nchw pa = {.n = n, .c = c1, .c2 = c2, .h = hw, .w = 1, .other = b};
    struct op_case ca = {"concat (grad a)", na, ny, ref_concat_a, fwd_concat_a, bwd_concat_a,
                         &pa, 1e-6, 1.0};
    run_case(&ca);
    struct p_nchw pb = pa;
    pb.other = a;
    struct op_case cb = {"concat (grad b)", nb, ny, ref_concat_b, fwd_concat_b, bwd_concat_b,
                         &pb, 1e-6, 1.0};
    run_case(&cb);

    /* both halves at once with different accum flags */
    float *y = fbuf(ny), *da = fbuf(na), *db = fbuf(nb), *db0 = fbuf(nb);
    tu_fill(y, ny, 1.0);
    fill_nan(da, na);
    tu_fill(db0, nb, 1.0);
    memcpy(db, db0, nb * sizeof *db);
    nchw_concat_bwd(da, db, y, 0, 1, n, c1, c2, hw, &ctx2);
    int ok = 1;
    for (int s = 0; s < n; s++)
        for (int ch = 0; ch < c1 + c2; ch++)
            for (int q = 0; q < hw; q++) {
                float g = y[((size_t)s * (c1 + c2) + ch) * hw + q];
                if (ch < c1)
                    ok &= da[((size_t)s * c1 + ch) * hw + q] == g;
                else {
                    size_t i = ((size_t)s * c2 + ch - c1) * hw + q;
                    ok &= db[i] == db0[i] + g;
                }
            }
    CHECK(ok, "concat_bwd with accum_a=0, accum_b=1 together");
    free(a);
    free(b);
    free(y);
    free(da);
    free(db);
    free(db0);

    /* transpose: sizes straddling the 32-wide tiles, and a square-ish one with many tiles */
    int tshape[3][3] = {{2, 37, 45}, {1, 1, 7}, {3, 64, 100}};
    for (int k = 0; k < 3; k++) {
        struct p_nchw pt = {.n = tshape[k][0], .c = tshape[k][1], .h = tshape[k][2], .w = 1};
        size_t cnt = (size_t)pt.n * pt.c * pt.h;
        char name[64];
        snprintf(name, sizeof name, "transpose (%d,%d,%d)", pt.n, pt.c, pt.h);
        struct op_case tc = {name, cnt, cnt, ref_transpose, fwd_transpose, bwd_transpose, &pt,
                             1e-6, 1.0};
        run_case(&tc);
        /* exact, forward accum, and the round trip */
        float *x = fbuf(cnt), *t = fbuf(cnt), *back = fbuf(cnt), *acc = fbuf(cnt),
              *acc0 = fbuf(cnt);
        tu_fill(x, cnt, 1.0);
        tu_fill(acc0, cnt, 1.0);
        cpu_transpose_fwd(t, x, 0, pt.n, pt.c, pt.h, &ctx2);
        cpu_transpose_fwd(back, t, 0, pt.n, pt.h, pt.c, &ctx2);
        CHECK(memcmp(back, x, cnt * sizeof *x) == 0, "%s round trip exact", name);
        memcpy(acc, acc0, cnt * sizeof *acc);
        cpu_transpose_fwd(acc, x, 1, pt.n, pt.c, pt.h, &ctx2);
        ok = 1;
        for (size_t i = 0; i < cnt; i++) ok &= acc[i] == acc0[i] + t[i];
        CHECK(ok, "%s accum=1 adds", name);
        free(x);
        free(t);
        free(back);
        free(acc);
        free(acc0);
    }
}

/* ---------------------------------------------------------------------------------------------
 * resampling
 */
static void ref_nearest(double *y, const double *x, const void *pv)
{
    const struct p_nchw *p = pv;
    int ho = 2 * p->h, wo = 2 * p->w;
    for (int pl = 0; pl < p->n * p->c; pl++)
        for (int oy = 0; oy < ho; oy++)
            for (int ox = 0; ox < wo; ox++)
                y[((size_t)pl * ho + oy) * wo + ox] =
                    x[((size_t)pl * p->h + oy / 2) * p->w + ox / 2];
}
static void fwd_nearest(float *y, const float *x, const void *pv, bk_ctx *c)
{
    const struct p_nchw *p = pv;
    CHECK(nchw_upsample_nearest2x_fwd(y, x, p->n, p->c, p->h, p->w, c) == BK_OK, "status");
}
static void bwd_nearest(float *dx, const float *dy, const float *x, int accum, const void *pv,
                        bk_ctx *c)
{
    const struct p_nchw *p = pv;
    CHECK(nchw_upsample_nearest2x_bwd(dx, dy, accum, p->n, p->c, p->h, p->w, c) == BK_OK,
          "status");
}

/* PyTorch's bilinear source coordinate for scale 2, in float64 */
static double ref_bilinear_src(int dst, int in, int align)
{
    int out = 2 * in;
    double s;
    if (align)
        s = out > 1 ? dst * (double)(in - 1) / (double)(out - 1) : 0.0;
    else {
        s = (dst + 0.5) / 2.0 - 0.5;
        if (s < 0) s = 0;
    }
    return s;
}
static void ref_bilinear(double *y, const double *x, const void *pv)
{
    const struct p_nchw *p = pv;
    int h = p->h, w = p->w, ho = 2 * h, wo = 2 * w;
    for (int pl = 0; pl < p->n * p->c; pl++)
        for (int oy = 0; oy < ho; oy++)
            for (int ox = 0; ox < wo; ox++) {
                double sy = ref_bilinear_src(oy, h, p->align);
                double sx = ref_bilinear_src(ox, w, p->align);
                int iy0 = (int)floor(sy), ix0 = (int)floor(sx);
                if (iy0 > h - 1) iy0 = h - 1;
                if (ix0 > w - 1) ix0 = w - 1;
                int iy1 = iy0 + 1 < h ? iy0 + 1 : h - 1, ix1 = ix0 + 1 < w ? ix0 + 1 : w - 1;
                double ly = sy - iy0, lx = sx - ix0;
                const double *xp = x + (size_t)pl * h * w;
                double top = (1 - lx) * xp[iy0 * w + ix0] + lx * xp[iy0 * w + ix1];
                double bot = (1 - lx) * xp[iy1 * w + ix0] + lx * xp[iy1 * w + ix1];
                y[((size_t)pl * ho + oy) * wo + ox] = (1 - ly) * top + ly * bot;
            }
}
static void fwd_bilinear(float *y, const float *x, const void *pv, bk_ctx *c)
{
    const struct p_nchw *p = pv;
    CHECK(nchw_upsample_bilinear2x_fwd(y, x, p->align, p->n, p->c, p->h, p->w, c) == BK_OK,
          "status");
}
static void bwd_bilinear(float *dx, const float *dy, const float *x, int accum, const void *pv,
                         bk_ctx *c)
{
    const struct p_nchw *p = pv;
    CHECK(nchw_upsample_bilinear2x_bwd(dx, dy, p->align, accum, p->n, p->c, p->h, p->w, c) ==
              BK_OK,
          "status");
}

static void ref_maxpool(double *y, const double *x, const void *pv)
{
    const struct p_nchw *p = pv;
    int h = p->h, w = p->w, ho = h / 2, wo = w / 2;
    for (int pl = 0; pl < p->n * p->c; pl++)
        for (int oy = 0; oy < ho; oy++)
            for (int ox = 0; ox < wo; ox++) {
                double m = -INFINITY;
                for (int dy = 0; dy < 2; dy++)
                    for (int dx = 0; dx < 2; dx++) {
                        double v = x[((size_t)pl * h + 2 * oy + dy) * w + 2 * ox + dx];
                        if (v > m) m = v;
                    }
                y[((size_t)pl * ho + oy) * wo + ox] = m;
            }
}
static void fwd_maxpool(float *y, const float *x, const void *pv, bk_ctx *c)
{
    const struct p_nchw *p = pv;
    CHECK(nchw_maxpool2x2_fwd(y, x, p->n, p->c, p->h, p->w, c) == BK_OK, "status");
}
static void bwd_maxpool(float *dx, const float *dy, const float *x, int accum, const void *pv,
                        bk_ctx *c)
{
    const struct p_nchw *p = pv;
    CHECK(nchw_maxpool2x2_bwd(dx, dy, x, accum, p->n, p->c, p->h, p->w, c) == BK_OK, "status");
}

static void test_resample(void)
{
    printf("resample:\n");
    /* odd sizes, degenerate 1-wide/1-high planes, and a size above the parallel threshold */
    int shapes[4][4] = {{2, 3, 5, 7}, {1, 2, 1, 3}, {2, 1, 4, 1}, {2, 8, 33, 40}};
    for (int k = 0; k < 4; k++) {
        struct p_nchw p = {.n = shapes[k][0], .c = shapes[k][1], .h = shapes[k][2],
                           .w = shapes[k][3]};
        size_t nx = (size_t)p.n * p.c * p.h * p.w, ny4 = nx * 4;
        size_t nyp = (size_t)p.n * p.c * (p.h / 2) * (p.w / 2);
        char name[96];
        snprintf(name, sizeof name, "nearest2x (%d,%d,%d,%d)", p.n, p.c, p.h, p.w);
        struct op_case cn = {name, nx, ny4, ref_nearest, fwd_nearest, bwd_nearest, &p, 1e-6, 1.0};
        run_case(&cn);
        for (int al = 0; al < 2; al++) {
            struct p_nchw pbl = p;
            pbl.align = al;
            char nm[96];
            snprintf(nm, sizeof nm, "bilinear2x ac=%d (%d,%d,%d,%d)", al, p.n, p.c, p.h, p.w);
            /* 1e-5: like PyTorch, the source coordinate is computed in float (for
             * align_corners=1 the scale (in-1)/(out-1) is rounded), not exactly */
            struct op_case cbl = {nm, nx, ny4, ref_bilinear, fwd_bilinear, bwd_bilinear, &pbl,
                                  1e-5, 1.0};
            run_case(&cbl);
        }
        if (nyp) {
            char nm[96];
            snprintf(nm, sizeof nm, "maxpool2x2 (%d,%d,%d,%d)", p.n, p.c, p.h, p.w);
            struct op_case cm = {nm, nx, nyp, ref_maxpool, fwd_maxpool, bwd_maxpool, &p, 1e-6,
                                 1.0};
            run_case(&cm);
        }
    }

    /* the examples of torch.nn.Upsample's documentation, input [[1,2],[3,4]] */
    float xin[4] = {1, 2, 3, 4}, y[16];
    const double want_nearest[16] = {1, 1, 2, 2, 1, 1, 2, 2, 3, 3, 4, 4, 3, 3, 4, 4};
    const double want_ac0[16] = {1.0, 1.25, 1.75, 2.0, 1.5, 1.75, 2.25, 2.5,
                                 2.5, 2.75, 3.25, 3.5, 3.0, 3.25, 3.75, 4.0};
    const double want_ac1[16] = {1.0,    1.3333, 1.6667, 2.0,    1.6667, 2.0,    2.3333, 2.6667,
                                 2.3333, 2.6667, 3.0,    3.3333, 3.0,    3.3333, 3.6667, 4.0};
    nchw_upsample_nearest2x_fwd(y, xin, 1, 1, 2, 2, &ctx1);
    CHECK(max_abs_diff(y, want_nearest, 16) == 0, "nearest matches the torch docs example");
    nchw_upsample_bilinear2x_fwd(y, xin, 0, 1, 1, 2, 2, &ctx1);
    CHECK(max_abs_diff(y, want_ac0, 16) == 0, "bilinear ac=0 matches the torch docs example");
    nchw_upsample_bilinear2x_fwd(y, xin, 1, 1, 1, 2, 2, &ctx1);
    CHECK(max_abs_diff(y, want_ac1, 16) < 1e-4, "bilinear ac=1 matches the torch docs example");

    /* maxpool ties, NaN and -inf follow PyTorch: the first maximum wins, NaN propagates */
    /* one 2x6 plane, windows [1 3; 3 2], [5 3; NaN 2], [2 1; -inf -inf] */
    float xm[12] = {1, 3, 5, 3, 2, 1, 3, 2, NAN, 2, -INFINITY, -INFINITY};
    float ym[3], dym[3] = {10, 20, 30}, dxm[12];
    nchw_maxpool2x2_fwd(ym, xm, 1, 1, 2, 6, &ctx1);
    CHECK(ym[0] == 3 && isnan(ym[1]) && ym[2] == 2, "maxpool tie/NaN forward");
    nchw_maxpool2x2_bwd(dxm, dym, xm, 0, 1, 1, 2, 6, &ctx1);
    const float want_dx[12] = {0, 10, 0, 0, 30, 0, 0, 0, 20, 0, 0, 0};
    CHECK(memcmp(dxm, want_dx, sizeof dxm) == 0,
          "maxpool backward: first maximum of a tie, NaN takes the gradient");
    /* the same plane in 16 channels: the vectorized channel loops (8 lanes) give each lane the
     * scalar scan's answer */
    {
        enum { MC = 16 };
        float xc[MC * 12], yc[MC * 3], dyc[MC * 3], dxc[MC * 12];
        for (int ch = 0; ch < MC; ch++) {
            memcpy(xc + ch * 12, xm, sizeof xm);
            memcpy(dyc + ch * 3, dym, sizeof dym);
        }
        nchw_maxpool2x2_fwd(yc, xc, 1, MC, 2, 6, &ctx1);
        nchw_maxpool2x2_bwd(dxc, dyc, xc, 0, 1, MC, 2, 6, &ctx1);
        int bad = 0;
        for (int ch = 0; ch < MC; ch++)
            bad += !(yc[ch * 3] == 3 && isnan(yc[ch * 3 + 1]) && yc[ch * 3 + 2] == 2) ||
                   memcmp(dxc + ch * 12, want_dx, sizeof want_dx) != 0;
        CHECK(bad == 0, "maxpool tie/NaN in 16 channels: %d channels differ", bad);
    }
    float xi[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY}, yi, gi = 1, dxi[4];
    nchw_maxpool2x2_fwd(&yi, xi, 1, 1, 2, 2, &ctx1);
    nchw_maxpool2x2_bwd(dxi, &gi, xi, 0, 1, 1, 2, 2, &ctx1);
    CHECK(yi == -INFINITY && dxi[0] == 1 && dxi[1] == 0 && dxi[2] == 0 && dxi[3] == 0,
          "maxpool all -inf window: gradient to the first element");
}

/* ---------------------------------------------------------------------------------------------
 * timestep embedding
 */
static void ref_embed(double *y, const float *t, int n, int dim, int flip, float shift,
                      float max_period, int round_like_kernel)
{
    int half = dim / 2;
    for (int s = 0; s < n; s++) {
        for (int i = 0; i < half; i++) {
            double e = -log((double)max_period) * i / ((double)half - (double)shift);
            double f = exp(e), arg;
            if (round_like_kernel)
                arg = (double)(t[s] * (float)f); /* float frequency, float product */
            else
                arg = (double)t[s] * f;
            double sv = sin(arg), cv = cos(arg);
            y[(size_t)s * dim + i] = flip ? cv : sv;
            y[(size_t)s * dim + half + i] = flip ? sv : cv;
        }
        if (dim % 2) y[(size_t)s * dim + dim - 1] = 0.0;
    }
}

static void test_embed(void)
{
    printf("timestep_embed:\n");
    float t[10] = {0, 1, 2, 17, 250, 499.5f, 500, 998, 999, 0};
    t[9] = (float)(tu_rand() * 500 + 500);
    int n = 10, dims[4] = {128, 65, 320, 2};
    double worst = 0;
    for (int di = 0; di < 4; di++)
        for (int flip = 0; flip < 2; flip++)
            for (int sh = 0; sh < 2; sh++) {
                int dim = dims[di];
                if (dim / 2 == sh) continue; /* half - shift = 0 is rejected, tested below */
                size_t cnt = (size_t)n * dim;
                float *y = fbuf(cnt), *y1 = fbuf(cnt);
                double *r = dbuf(cnt), *rd = dbuf(cnt);
                fill_nan(y, cnt);
                int st = cpu_timestep_embed_fwd(y, t, n, dim, flip, (float)sh, 10000.0f, &ctx2);
                cpu_timestep_embed_fwd(y1, t, n, dim, flip, (float)sh, 10000.0f, &ctx1);
                ref_embed(r, t, n, dim, flip, (float)sh, 10000.0f, 1);
                ref_embed(rd, t, n, dim, flip, (float)sh, 10000.0f, 0);
                double e = max_abs_diff(y, r, cnt), ed = max_abs_diff(y, rd, cnt);
                if (e > worst) worst = e;
                CHECK(st == BK_OK && e <= 1e-6,
                      "embed dim=%d flip=%d shift=%d: max abs err %.3e vs the rounding-exact "
                      "reference", dim, flip, sh, e);
                /* all-double math differs only by the float rounding of t*freq (|t| <= 999) */
                CHECK(ed <= 2e-4, "embed dim=%d flip=%d shift=%d: max abs err %.3e vs float64",
                      dim, flip, sh, ed);
                CHECK(memcmp(y, y1, cnt * sizeof *y) == 0, "embed bit-identical at 1/2 threads");
                if (dim % 2) {
                    int z = 1;
                    for (int s = 0; s < n; s++) z &= y[(size_t)s * dim + dim - 1] == 0.0f;
                    CHECK(z, "embed odd dim: last column zero");
                }
                free(y);
                free(y1);
                free(r);
                free(rd);
            }
    /* t = 0: sin = 0, cos = 1 exactly, in the flipped order too */
    float y0[8];
    float tz = 0;
    cpu_timestep_embed_fwd(y0, &tz, 1, 8, 1, 1.0f, 10000.0f, &ctx1);
    CHECK(y0[0] == 1 && y0[3] == 1 && y0[4] == 0 && y0[7] == 0, "embed t=0, flipped: [cos, sin]");
    CHECK(cpu_timestep_embed_fwd(y0, &tz, 1, 2, 0, 1.0f, 10000.0f, &ctx1) == BK_ERR_INVALID,
          "embed rejects half - freq_shift == 0");
    printf("  timestep_embed max abs err %.2e (bound 1e-6)\n", worst);
}

/* ---------------------------------------------------------------------------------------------
 * loss: mse and dropout
 */
static void ref_mse(double *y, const double *x, const void *pv)
{
    const struct p_count *p = pv;
    double s = 0;
    for (size_t i = 0; i < p->n; i++) {
        double d = x[i] - (double)p->other[i];
        s += d * d;
    }
    y[0] = s / (double)p->n;
}
static void fwd_mse(float *y, const float *x, const void *pv, bk_ctx *c)
{
    const struct p_count *p = pv;
    CHECK(cpu_mse_fwd(y, x, p->other, p->n, c) == BK_OK, "mse_fwd status");
}
static void bwd_mse(float *dx, const float *dy, const float *x, int accum, const void *pv,
                    bk_ctx *c)
{
    const struct p_count *p = pv; /* dy[0] is dL/dloss: the loss scale */
    CHECK(cpu_mse_bwd(dx, x, p->other, dy[0], accum, p->n, c) == BK_OK, "mse_bwd status");
}

static void test_mse(void)
{
    printf("mse:\n");
    size_t n = 1013;
    float *tg = fbuf(n);
    tu_fill(tg, n, 1.0);
    struct p_count p = {.n = n, .other = tg};
    struct op_case cm = {"mse", n, 1, ref_mse, fwd_mse, bwd_mse, &p, 1e-6, 1.0};
    run_case(&cm);
    free(tg);

    /* a large one: double accumulation, thread-count independent */
    size_t nb = 3000017;
    float *a = fbuf(nb), *b = fbuf(nb), l1, l2, l3;
    tu_fill(a, nb, 1.0);
    tu_fill(b, nb, 1.0);
    double s = 0;
    for (size_t i = 0; i < nb; i++) {
        double d = (double)a[i] - (double)b[i];
        s += d * d;
    }
    cpu_mse_fwd(&l1, a, b, nb, &ctx1);
    cpu_mse_fwd(&l2, a, b, nb, &ctx2);
    cpu_mse_fwd(&l3, a, b, nb, &ctx3);
    double e = fabs(l2 - s / nb) / (s / nb);
    CHECK(e <= 1e-6, "mse 3e6 elements rel err %.3e", e);
    CHECK(l1 == l2 && l2 == l3, "mse 3e6 elements bit-identical at 1/2/3 threads");
    printf("  mse 3e6 elements rel err %.2e\n", e);
    free(a);
    free(b);
}

static int dropout_mask_ref(float p, uint64_t seed, uint64_t step, uint32_t op, int sample,
                            uint32_t e)
{
    return philox_uniform_at(seed, PHILOX_TAG_DROPOUT, step, (uint32_t)sample, op, e) >= p;
}

static size_t count_kept(const float *y, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += y[i] != 0.0f;
    return k;
}
static size_t count_mask_diff(const float *a, const float *b, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += (a[i] != 0.0f) != (b[i] != 0.0f);
    return k;
}

static void test_dropout(void)
{
    printf("dropout:\n");
    int n = 4;
    size_t per = 25003, tot = (size_t)n * per; /* 1e5 elements, per_sample not a multiple of 4 */
    uint64_t seed = 0xDEADBEEF12345ull, step = 123;
    uint32_t op = 7;
    float *x = fbuf(tot), *y = fbuf(tot), *y1 = fbuf(tot), *y3 = fbuf(tot);
    float *dy = fbuf(tot), *dx = fbuf(tot), *d0 = fbuf(tot);
    for (size_t i = 0; i < tot; i++) x[i] = (float)(1.5 + tu_rand()); /* never 0 */
    tu_fill(dy, tot, 1.0);
    tu_fill(d0, tot, 1.0);

    const float ps[3] = {0.1f, 0.5f, 0.3f};
    for (int k = 0; k < 3; k++) {
        float p = ps[k], sc = 1.0f / (1.0f - p);
        fill_nan(y, tot);
        CHECK(cpu_dropout_fwd(y, x, p, seed, step, op, 0, n, per, 0, &ctx2) == BK_OK, "status");
        double rate = (double)count_kept(y, tot) / tot;
        CHECK(fabs(rate - (1 - p)) <= 0.01 * (1 - p), "dropout p=%.1f keep rate %.4f", p, rate);
        printf("  dropout p=%.1f keep rate %.4f (expect %.4f)\n", p, rate, 1 - p);
        int exact = 1;
        for (int s = 0; s < n; s++)
            for (size_t e = 0; e < per; e++) {
                size_t i = s * per + e;
                int keep = dropout_mask_ref(p, seed, step, op, s, (uint32_t)e);
                exact &= keep ? y[i] == x[i] * sc : (y[i] == 0.0f && !signbit(y[i]));
            }
        CHECK(exact, "dropout p=%.1f: mask is Philox(u) >= p, kept values x * (1/(1-p)) exactly",
              p);
        fill_nan(y1, tot);
        fill_nan(y3, tot);
        cpu_dropout_fwd(y1, x, p, seed, step, op, 0, n, per, 0, &ctx1);
        cpu_dropout_fwd(y3, x, p, seed, step, op, 0, n, per, 0, &ctx3);
        CHECK(memcmp(y, y1, tot * sizeof *y) == 0 && memcmp(y, y3, tot * sizeof *y) == 0,
              "dropout bit-identical at 1/2/3 threads");

        /* backward: the same mask, the same scale, =/+= */
        fill_nan(dx, tot);
        cpu_dropout_bwd(dx, dy, p, seed, step, op, 0, 0, n, per, 0, &ctx2);
        exact = 1;
        for (size_t i = 0; i < tot; i++)
            exact &= (y[i] != 0.0f) ? dx[i] == dy[i] * sc : dx[i] == 0.0f;
        CHECK(exact, "dropout p=%.1f backward reproduces the mask", p);
        memcpy(dx, d0, tot * sizeof *dx);
        cpu_dropout_bwd(dx, dy, p, seed, step, op, 0, 1, n, per, 0, &ctx2);
        exact = 1;
        for (size_t i = 0; i < tot; i++)
            exact &= dx[i] == d0[i] + ((y[i] != 0.0f) ? dy[i] * sc : 0.0f);
        CHECK(exact, "dropout p=%.1f backward accum=1", p);
    }

    /* different step, op, sample, seed give different masks (about 2p(1-p) of positions) */
    float p = 0.5f;
    cpu_dropout_fwd(y, x, p, seed, step, op, 0, n, per, 0, &ctx2);
    cpu_dropout_fwd(y1, x, p, seed, step + 1, op, 0, n, per, 0, &ctx2);
    size_t diff = count_mask_diff(y, y1, tot);
    CHECK(diff > tot / 2 * 9 / 10 && diff < tot / 2 * 11 / 10, "step changes the mask (%zu)", diff);
    cpu_dropout_fwd(y1, x, p, seed, step, op + 1, 0, n, per, 0, &ctx2);
    diff = count_mask_diff(y, y1, tot);
    CHECK(diff > tot / 2 * 9 / 10 && diff < tot / 2 * 11 / 10, "op changes the mask (%zu)", diff);
    cpu_dropout_fwd(y1, x, p, seed + 1, step, op, 0, n, per, 0, &ctx2);
    diff = count_mask_diff(y, y1, tot);
    CHECK(diff > tot / 2 * 9 / 10 && diff < tot / 2 * 11 / 10, "seed changes the mask (%zu)", diff);
    diff = count_mask_diff(y, y + per, per);
    CHECK(diff > per / 2 * 9 / 10 && diff < per / 2 * 11 / 10,
          "samples 0 and 1 have different masks (%zu)", diff);

    /* sample_base: a micro-batch holding samples 2..3 equals rows 2..3 of the full batch */
    cpu_dropout_fwd(y1, x + 2 * per, p, seed, step, op, 2, 2, per, 0, &ctx2);
    CHECK(memcmp(y1, y + 2 * per, 2 * per * sizeof *y) == 0,
          "dropout micro-batch (sample_base=2) equals rows 2..3 of the full batch");
    cpu_dropout_bwd(dx, dy + 2 * per, p, seed, step, op, 2, 0, 2, per, 0, &ctx2);
    int ok = 1;
    for (size_t i = 0; i < 2 * per; i++) ok &= (dx[i] != 0.0f) == (y[2 * per + i] != 0.0f);
    CHECK(ok, "dropout backward micro-batch reproduces rows 2..3 of the mask");

    /* p = 0: an exact copy */
    cpu_dropout_fwd(y, x, 0.0f, seed, step, op, 0, n, per, 0, &ctx2);
    CHECK(memcmp(y, x, tot * sizeof *y) == 0, "dropout p=0 is an exact copy");
    memcpy(dx, d0, tot * sizeof *dx);
    cpu_dropout_bwd(dx, dy, 0.0f, seed, step, op, 0, 1, n, per, 0, &ctx2);
    ok = 1;
    for (size_t i = 0; i < tot; i++) ok &= dx[i] == d0[i] + dy[i];
    CHECK(ok, "dropout p=0 backward accum=1 adds dy");
    CHECK(cpu_dropout_fwd(y, x, 1.0f, seed, step, op, 0, n, per, 0, &ctx2) == BK_ERR_INVALID,
          "dropout rejects p = 1");
    CHECK(cpu_dropout_fwd(y, x, -0.1f, seed, step, op, 0, n, per, 0, &ctx2) == BK_ERR_INVALID,
          "dropout rejects p < 0");

    free(x);
    free(y);
    free(y1);
    free(y3);
    free(dy);
    free(dx);
    free(d0);
}

/* dst (n, C, HW) = src (n, HW, C) */
static void nhwc_to_nchw(float *dst, const float *src, int n, int c, int hw)
{
    size_t per = (size_t)c * hw;
    for (int s = 0; s < n; s++)
        for (int k = 0; k < c; k++)
            for (int q = 0; q < hw; q++)
                dst[s * per + (size_t)k * hw + q] = src[s * per + (size_t)q * c + k];
}

/* dropout on an NHWC image (channels > 1): memory element (pixel, c) draws the mask of logical
 * element c * HW + pixel, so it equals the flat (NCHW) path on the same image transposed, at
 * every thread count, forward and backward (=/+=), for HW a multiple of 4 and not, a sample_base
 * and a micro-batch of one */
static void test_dropout_nhwc(void)
{
    printf("dropout nhwc:\n");
    const int shapes[4][3] = {{3, 5, 64}, {2, 64, 256}, {2, 3, 9}, {1, 7, 2}}; /* n, C, HW */
    uint64_t seed = 0x5EEDull, step = 41;
    uint32_t op = 3;
    for (int t = 0; t < 4; t++) {
        int n = shapes[t][0], c = shapes[t][1], hw = shapes[t][2], base = t;
        size_t per = (size_t)c * hw, tot = (size_t)n * per;
        float *xh = fbuf(tot), *xc = fbuf(tot), *yh = fbuf(tot), *yc = fbuf(tot);
        float *dh = fbuf(tot), *dc = fbuf(tot);
        tu_fill(xh, tot, 1.0);
        nhwc_to_nchw(xc, xh, n, c, hw);
        int same[2] = {1, 1};
        bk_ctx *ctxs[3] = {&ctx1, &ctx2, &ctx3};
        for (int accum = 0; accum <= 1; accum++)
            for (int th = 0; th < 3; th++) {
                tu_fill(dh, tot, 2.0);
                nhwc_to_nchw(dc, dh, n, c, hw);
                fill_nan(yh, tot);
                CHECK(cpu_dropout_fwd(yh, xh, 0.3f, seed, step, op, base, n, per, c, ctxs[th]) ==
                          BK_OK,
                      "status");
                cpu_dropout_fwd(yc, xc, 0.3f, seed, step, op, base, n, per, 0, ctxs[th]);
                cpu_dropout_bwd(dh, xh, 0.3f, seed, step, op, base, accum, n, per, c, ctxs[th]);
                cpu_dropout_bwd(dc, xc, 0.3f, seed, step, op, base, accum, n, per, 0, ctxs[th]);
                for (int s = 0; s < n; s++)
                    for (int k = 0; k < c; k++)
                        for (int q = 0; q < hw; q++) {
                            size_t ih = s * per + (size_t)q * c + k, ic = s * per + (size_t)k * hw + q;
                            same[0] &= memcmp(&yh[ih], &yc[ic], sizeof(float)) == 0;
                            same[1] &= memcmp(&dh[ih], &dc[ic], sizeof(float)) == 0;
                        }
            }
        CHECK(same[0], "dropout nhwc n=%d C=%d HW=%d: forward equals the NCHW mask", n, c, hw);
        CHECK(same[1], "dropout nhwc n=%d C=%d HW=%d: backward (=, +=) equals the NCHW mask", n, c,
              hw);
        free(xh);
        free(xc);
        free(yh);
        free(yc);
        free(dh);
        free(dc);
    }
}

/* ---------------------------------------------------------------------------------------------
 * optimizer: sumsq, AdamW, EMA
 */
static void test_sumsq(void)
{
    printf("sumsq:\n");
    size_t sizes[4] = {0, 5, 16384 * 3 + 1, 2000003};
    for (int k = 0; k < 4; k++) {
        size_t n = sizes[k];
        float *x = fbuf(n);
        tu_fill(x, n, 2.0);
        double ref = 0, s1 = -1, s2 = -1, s3 = -1;
        for (size_t i = 0; i < n; i++) ref += (double)x[i] * (double)x[i];
        CHECK(cpu_sumsq(&s2, x, n, &ctx2) == BK_OK, "sumsq status");
        cpu_sumsq(&s1, x, n, &ctx1);
        cpu_sumsq(&s3, x, n, &ctx3);
        double e = n ? fabs(s2 - ref) / ref : fabs(s2);
        CHECK(e <= 1e-12, "sumsq n=%zu rel err %.3e", n, e);
        CHECK(memcmp(&s1, &s2, sizeof s1) == 0 && memcmp(&s2, &s3, sizeof s2) == 0,
              "sumsq n=%zu bit-identical at 1/2/3 threads", n);
        printf("  sumsq n=%zu rel err %.2e\n", n, e);
        free(x);
    }
}

static void test_adamw(void)
{
    printf("adamw:\n");
    size_t n = 40009; /* above the parallel threshold */
    float *w = fbuf(n), *m = fbuf(n), *v = fbuf(n), *g = fbuf(n);
    float *w1 = fbuf(n), *m1 = fbuf(n), *v1 = fbuf(n);
    double *wd = dbuf(n), *md = dbuf(n), *vd = dbuf(n);
    tu_fill(w, n, 1.0);
    for (size_t i = 0; i < n; i++) {
        m[i] = v[i] = 0.0f;
        wd[i] = w[i];
        md[i] = vd[i] = 0.0;
    }
    memcpy(w1, w, n * sizeof *w);
    memcpy(m1, m, n * sizeof *m);
    memcpy(v1, v, n * sizeof *v);
    struct bk_adamw h = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                         .weight_decay = 0.1f};
    float gscale = 0.5f;
    double ew = 0, em = 0, ev = 0;
    for (int t = 1; t <= 3; t++) {
        tu_fill(g, n, 2.0);
        g[t] = 1e-9f; /* a gradient where eps matters */
        h.bias_c1 = (float)(1.0 - pow(0.9f, t));
        h.bias_c2_sqrt = (float)sqrt(1.0 - pow(0.999f, t));
        CHECK(cpu_adamw_step(w, m, v, g, gscale, &h, n, &ctx2) == BK_OK, "adamw status");
        cpu_adamw_step(w1, m1, v1, g, gscale, &h, n, &ctx1);
        double lr = h.lr, b1 = h.beta1, b2 = h.beta2, eps = h.eps, wdc = h.weight_decay;
        double c1 = h.bias_c1, c2 = h.bias_c2_sqrt;
        for (size_t i = 0; i < n; i++) {
            double gi = (double)g[i] * gscale;
            wd[i] = wd[i] * (1 - lr * wdc);
            md[i] = md[i] + (gi - md[i]) * (1 - b1);
            vd[i] = vd[i] * b2 + (1 - b2) * gi * gi;
            double denom = sqrt(vd[i]) / c2 + eps;
            wd[i] = wd[i] - (lr / c1) * md[i] / denom;
        }
        ew = tu_rel_err(w, wd, n);
        em = tu_rel_err(m, md, n);
        ev = tu_rel_err(v, vd, n);
        CHECK(ew <= 1e-6 && em <= 1e-6 && ev <= 1e-6,
              "adamw step %d rel err w %.3e m %.3e v %.3e", t, ew, em, ev);
    }
    CHECK(memcmp(w, w1, n * sizeof *w) == 0 && memcmp(m, m1, n * sizeof *m) == 0 &&
              memcmp(v, v1, n * sizeof *v) == 0,
          "adamw bit-identical at 1/2 threads");
    printf("  adamw after 3 steps rel err w %.2e m %.2e v %.2e\n", ew, em, ev);
    free(w);
    free(m);
    free(v);
    free(g);
    free(w1);
    free(m1);
    free(v1);
    free(wd);
    free(md);
    free(vd);
}

/* the multi-tensor forms against a call per segment: the same bits at 1, 2 and 3 threads,
 * segments of uneven sizes (empty, below and across the chunk and parallel thresholds) with
 * gaps between their states, in an order unlike their addresses */
static void test_optim_segs(void)
{
    printf("optimizer segments:\n");
    enum { NS = 7 };
    const size_t cnt[NS] = {5, 16384 * 3 + 1, 0, 100003, 17, 2000003, 40000};
    size_t rel[NS], words = 0;
    for (int i = NS - 1; i >= 0; i--) { /* states in reverse order, 3 words apart */
        rel[i] = words;
        words += cnt[i] + 3;
    }
    float *grads = fbuf(words), *st[4], *ref[4];
    tu_fill(grads, words, 2.0);
    struct bk_seg segs[NS];
    for (int i = 0; i < NS; i++) segs[i] = (struct bk_seg){grads + (words - rel[i] - cnt[i]), rel[i],
                                                           cnt[i]};
    bk_ctx *ctxs[3] = {&ctx1, &ctx2, &ctx3};
    for (int c = 0; c < 3; c++) {
        double ss[NS], one;
        for (int i = 0; i < NS; i++) ss[i] = -1;
        CHECK(cpu_sumsq_segs(ss, segs, NS, ctxs[c]) == BK_OK, "sumsq_segs status");
        for (int i = 0; i < NS; i++) {
            cpu_sumsq(&one, segs[i].g, segs[i].count, &ctx2);
            CHECK(memcmp(&one, &ss[i], sizeof one) == 0,
                  "sumsq_segs segment %d (n=%zu) at %d threads: %.17g, sumsq %.17g", i, cnt[i],
                  c + 1, ss[i], one);
        }
    }
    const float decays[2] = {0.999f, 0.0f};
    for (int d = 0; d < 2; d++)
        for (int c = 0; c < 3; c++) {
            for (int k = 0; k < 4; k++) {
                st[k] = fbuf(words);
                ref[k] = fbuf(words);
                tu_fill(st[k], words, k == 2 ? 0.5 : 1.0);
                if (k == 2)
                    for (size_t i = 0; i < words; i++) st[k][i] = fabsf(st[k][i]);
                memcpy(ref[k], st[k], words * sizeof(float));
            }
            struct bk_adamw h = {.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                 .weight_decay = 0.1f, .bias_c1 = 0.19f, .bias_c2_sqrt = 0.0447f};
            CHECK(cpu_adamw_segs(st[0], st[1], st[2], st[3], segs, NS, 0.5f, &h, decays[d],
                                 ctxs[c]) == BK_OK,
                  "adamw_segs status");
            for (int i = 0; i < NS; i++) {
                const size_t r = rel[i];
                if (decays[d] > 0.0f)
                    cpu_adamw_ema_step(ref[0] + r, ref[1] + r, ref[2] + r, ref[3] + r, segs[i].g,
                                       0.5f, &h, decays[d], cnt[i], &ctx2);
                else
                    cpu_adamw_step(ref[0] + r, ref[1] + r, ref[2] + r, segs[i].g, 0.5f, &h,
                                   cnt[i], &ctx2);
            }
            int same = 1;
            for (int k = 0; k < 4; k++) same &= memcmp(st[k], ref[k], words * sizeof(float)) == 0;
            CHECK(same, "adamw_segs (ema decay %g) at %d threads: the per-segment steps' bits, "
                        "the gaps untouched", decays[d], c + 1);
            for (int k = 0; k < 4; k++) {
                free(st[k]);
                free(ref[k]);
            }
        }
    printf("  %d segments, %zu words: sumsq_segs and adamw_segs match a call per segment\n", NS,
           words);
    free(grads);
}

static void test_ema(void)
{
    printf("ema:\n");
    size_t n = 20011;
    float *e = fbuf(n), *w = fbuf(n), *e1 = fbuf(n);
    double *ed = dbuf(n);
    const float decays[3] = {0.9999f, 0.3f, 0.0f};
    for (int k = 0; k < 3; k++) {
        tu_fill(e, n, 1.0);
        tu_fill(w, n, 1.0);
        memcpy(e1, e, n * sizeof *e);
        double d = decays[k];
        for (size_t i = 0; i < n; i++) ed[i] = e[i];
        for (int it = 0; it < 3; it++) {
            for (size_t i = 0; i < n; i++) ed[i] = d * ed[i] + (1 - d) * (double)w[i];
            CHECK(cpu_ema_update(e, w, decays[k], n, &ctx2) == BK_OK, "ema status");
            cpu_ema_update(e1, w, decays[k], n, &ctx1);
        }
        double err = tu_rel_err(e, ed, n);
        CHECK(err <= 1e-6, "ema decay=%g rel err %.3e", d, err);
        CHECK(memcmp(e, e1, n * sizeof *e) == 0, "ema bit-identical at 1/2 threads");
        printf("  ema decay=%g rel err %.2e\n", d, err);
        if (decays[k] == 0.0f) CHECK(memcmp(e, w, n * sizeof *e) == 0, "ema decay=0 copies w");
    }
    free(e);
    free(w);
    free(e1);
    free(ed);
}

int main(void)
{
    tu_seed(20240611);
    test_eltwise();
    test_exp_negabs();
    test_eltwise_sweep();
    test_eltwise_isa();
    test_layout();
    test_resample();
    test_embed();
    test_mse();
    test_dropout();
    test_dropout_nhwc();
    test_sumsq();
    test_adamw();
    test_ema();
    test_optim_segs();
    return tu_finish("test_ops_misc");
}
