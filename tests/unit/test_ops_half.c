/* test_ops_half.c - the CPU backend's typed (bf16) convolution and linear kernels against float64
 * references on the same bf16 inputs, element by element: a bf16 output may differ from the
 * exact result by its rounding (half a bf16 ulp, < 2^-8 relative) plus the fp32 accumulation
 * (at most (terms + 2) 2^-24 of the sum of |terms|); an fp32 output (dw, db) by the accumulation
 * only; an accumulating bf16 output (dx +=) is round(prev + round(r)) (backend.h), the `=`
 * result added in fp32 and rounded. Both accum paths, the bias, NULL outputs, the workspace
 * contract of the linears
 * (linear_ws_bytes through ctx_set_workspace, too little refused), f16 refused, and what
 * half_kernels reports. They run wherever oneDNN runs bf16 (natively on AVX512-BF16, emulated
 * elsewhere); the executor only picks them where half_kernels says they pay.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "half.h"
#include "nchw_shim.h"
#include "test_ref_conv.h"
#include "test_util.h"

static bk_ctx *ctx;
static double worst_bf16 = 0, worst_f32 = 0; /* the largest error / bound seen */

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) abort();
    return p;
}

/* n random values of the given scale, rounded to bf16: b (bf16 bits), d (their exact values) */
static void fill_bf16(uint16_t *b, double *d, size_t n, double scale)
{
    for (size_t i = 0; i < n; i++) {
        b[i] = half_f32_to_bf16((float)(tu_rand() * scale));
        d[i] = half_bf16_to_f32(b[i]);
    }
}

/* got (bf16 when b16, else fp32) against ref with |terms| summing to mag, k terms each: the
 * number of elements outside the bound; worst ratio error / bound noted */
static long out_of_bound(const void *got, int b16, const double *ref, const double *mag, long k,
                         size_t n)
{
    long bad = 0;
    const double acc = (double)(k + 2) * ldexp(1.0, -24);
    for (size_t i = 0; i < n; i++) {
        double g = b16 ? half_bf16_to_f32(((const uint16_t *)got)[i]) : ((const float *)got)[i];
        double bound = (b16 ? ldexp(1.0, -8) * fabs(ref[i]) : 0.0) + acc * mag[i] + 1e-30;
        double r = fabs(g - ref[i]) / bound;
        if (!(r <= 1.0)) bad++;
        double *worst = b16 ? &worst_bf16 : &worst_f32;
        if (r > *worst || isnan(r)) *worst = r;
    }
    return bad;
}

/* backend.h's 16-bit +=: acc must be round(prev + eq) (eq: the same kernel's `=` result, i.e.
 * its fp32 result rounded to bf16), the sum in fp32. The elements that are not; a += rounded
 * once from the fp32 sum (round(prev + r)) misses in about a quarter of them */
static size_t accum16_misses(const uint16_t *acc, const uint16_t *prev, const uint16_t *eq,
                             size_t n)
{
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += acc[i] != half_f32_to_bf16(half_bf16_to_f32(prev[i]) + half_bf16_to_f32(eq[i]));
    return bad;
}

/* ---- convolution ---- */

/* dx (N,Ci,H,W) = conv^T(dy, w) (+ prev) and dw (Co,Ci,Kh,Kw) = dy (*) x (+ prev), db = sum dy
 * (+ prev); with abs, of absolute values */
static void ref_conv_bwd(double *dx, double *dw, double *db, const double *dy, const double *x,
                         const double *w, const struct bk_conv2d *s, int abs)
{
    for (int n = 0; n < s->n; n++)
        for (int o = 0; o < s->co; o++)
            for (int oh = 0; oh < s->ho; oh++)
                for (int ow = 0; ow < s->wo; ow++) {
                    double g = dy[(((size_t)n * s->co + o) * s->ho + oh) * s->wo + ow];
                    if (abs) g = fabs(g);
                    db[o] += g;
                    for (int c = 0; c < s->ci; c++)
                        for (int ki = 0; ki < s->kh; ki++)
                            for (int kj = 0; kj < s->kw; kj++) {
                                int ih = oh * s->stride - s->pad_t + ki;
                                int iw = ow * s->stride - s->pad_l + kj;
                                if (ih < 0 || ih >= s->h || iw < 0 || iw >= s->w) continue;
                                size_t xi = (((size_t)n * s->ci + c) * s->h + ih) * s->w + iw;
                                size_t wi = (((size_t)o * s->ci + c) * s->kh + ki) * s->kw + kj;
                                dx[xi] += g * (abs ? fabs(w[wi]) : w[wi]);
                                dw[wi] += g * (abs ? fabs(x[xi]) : x[xi]);
                            }
                }
}

static void test_conv(int n, int ci, int h, int w, int co, int k, int stride, int pt, int pl,
                      int pb, int pr, int bias)
{
    struct bk_conv2d s = {.n = n, .ci = ci, .h = h, .w = w, .co = co, .kh = k, .kw = k,
                          .stride = stride, .pad_t = pt, .pad_l = pl, .pad_b = pb, .pad_r = pr,
                          .dtype = BK_DTYPE_BF16};
    CHECK(bk_conv2d_init(&s) == BK_OK, "conv init");
    char tag[160];
    snprintf(tag, sizeof tag, "bf16 conv n%d ci%d %dx%d co%d k%d s%d pad(%d,%d,%d,%d) bias%d", n,
             ci, h, w, co, k, stride, pt, pl, pb, pr, bias);
    const size_t nx = (size_t)n * ci * h * w, nw = (size_t)co * ci * k * k,
                 ny = (size_t)n * co * s.ho * s.wo;
    size_t wsb = cpu_conv2d_ws_bytes(&s);
    CHECK(wsb > 0, "%s: no workspace size", tag);
    void *ws = xmalloc(wsb);
    uint16_t *x = xmalloc(2 * nx), *wt = xmalloc(2 * nw), *y = xmalloc(2 * ny),
             *dy = xmalloc(2 * ny), *dx = xmalloc(2 * nx), *prev = xmalloc(2 * nx);
    double *xd = xmalloc(8 * nx), *wd = xmalloc(8 * nw), *dyd = xmalloc(8 * ny),
           *prevd = xmalloc(8 * nx);
    float *b = xmalloc(4 * co), *dw = xmalloc(4 * nw), *db = xmalloc(4 * co);
    double *bd = xmalloc(8 * co), *ref = calloc(nx + nw + ny + co, 8),
           *mag = calloc(nx + nw + ny + co, 8);
    fill_bf16(x, xd, nx, 1.0);
    fill_bf16(wt, wd, nw, 0.5);
    fill_bf16(dy, dyd, ny, 1.0);
    fill_bf16(prev, prevd, nx, 1.0);
    for (int i = 0; i < co; i++) bd[i] = b[i] = (float)(tu_rand() * 0.5);

    /* forward: y = round(conv(x, w) + b) */
    CHECK(nchw_conv2d_fwd(y, x, wt, bias ? b : NULL, ws, &s, ctx) == BK_OK, "%s: fwd", tag);
    tu_ref_conv(ref, xd, wd, bias ? bd : NULL, &s, 0);
    tu_ref_conv(mag, xd, wd, bias ? bd : NULL, &s, 1);
    long bad = out_of_bound(y, 1, ref, mag, (long)ci * k * k + 1, ny);
    CHECK(bad == 0, "%s: fwd, %ld of %zu elements out of bounds", tag, bad, ny);

    /* backward data, written then accumulated: dx = round(prev + round(conv^T(dy, w))) */
    double *rdx = ref, *rdw = ref + nx, *rdb = ref + nx + nw;
    double *mdx = mag, *mdw = mag + nx, *mdb = mag + nx + nw;
    memset(ref, 0, (nx + nw + ny + co) * 8);
    memset(mag, 0, (nx + nw + ny + co) * 8);
    ref_conv_bwd(rdx, rdw, rdb, dyd, xd, wd, &s, 0);
    ref_conv_bwd(mdx, mdw, mdb, dyd, xd, wd, &s, 1);
    const long kd = (long)co * k * k; /* terms of a dx element at most */
    CHECK(nchw_conv2d_bwd_data(dx, dy, wt, 0, ws, &s, ctx) == BK_OK, "%s: bwd data", tag);
    bad = out_of_bound(dx, 1, rdx, mdx, kd, nx);
    CHECK(bad == 0, "%s: bwd data (=), %ld of %zu elements out of bounds", tag, bad, nx);
    uint16_t *eq = xmalloc(2 * nx);
    memcpy(eq, dx, 2 * nx);
    memcpy(dx, prev, 2 * nx);
    CHECK(nchw_conv2d_bwd_data(dx, dy, wt, 1, ws, &s, ctx) == BK_OK, "%s: bwd data +=", tag);
    /* round(prev + round(r)): exactly, the `=` result added (the same primitive's r) */
    size_t miss = accum16_misses(dx, prev, eq, nx);
    CHECK(miss == 0, "%s: bwd data (+=): %zu of %zu elements are not round(prev + round(r))",
          tag, miss, nx);
    free(eq);

    /* the same forward and data gradient from fp32 weights (w_f32: rounded in the kernel's
     * weight reorder), bit for bit: weights with bits below bf16's, rounding to the bf16 wt */
    struct bk_conv2d s32 = s;
    s32.w_f32 = 1;
    size_t wsb32 = cpu_conv2d_ws_bytes(&s32);
    void *ws32 = xmalloc(wsb32 ? wsb32 : 1);
    float *wf = xmalloc(4 * nw);
    for (size_t i = 0; i < nw; i++) {
        float f = half_bf16_to_f32(wt[i]), next = half_bf16_to_f32((uint16_t)(wt[i] + 1));
        /* within half a bf16 step of wt (a third exactly on it; the rare one that would round
         * elsewhere, at a power of two, kept on it) */
        wf[i] = i % 3 ? f + (next - f) * (float)(0.45 * tu_rand()) : f;
        if (half_f32_to_bf16(wf[i]) != wt[i]) wf[i] = f;
    }
    uint16_t *y32 = xmalloc(2 * ny), *dx32 = xmalloc(2 * nx), *dxe = xmalloc(2 * nx);
    CHECK(wsb32 > 0 && nchw_conv2d_fwd(y32, x, wf, bias ? b : NULL, ws32, &s32, ctx) == BK_OK,
          "%s: fwd from fp32 weights", tag);
    CHECK(memcmp(y32, y, 2 * ny) == 0, "%s: fwd from fp32 weights differs from bf16's", tag);
    CHECK(nchw_conv2d_bwd_data(dxe, dy, wt, 0, ws, &s, ctx) == BK_OK &&
              nchw_conv2d_bwd_data(dx32, dy, wf, 0, ws32, &s32, ctx) == BK_OK,
          "%s: bwd data from fp32 weights", tag);
    CHECK(memcmp(dx32, dxe, 2 * nx) == 0, "%s: bwd data from fp32 weights differs", tag);
    memcpy(dx32, prev, 2 * nx);
    memcpy(dxe, prev, 2 * nx);
    CHECK(nchw_conv2d_bwd_data(dxe, dy, wt, 1, ws, &s, ctx) == BK_OK &&
              nchw_conv2d_bwd_data(dx32, dy, wf, 1, ws32, &s32, ctx) == BK_OK &&
              memcmp(dx32, dxe, 2 * nx) == 0,
          "%s: bwd data (+=) from fp32 weights differs", tag);
    free(ws32);
    free(wf);
    free(y32);
    free(dx32);
    free(dxe);

    /* backward filter: fp32 dw, db += onto previous contents */
    for (size_t i = 0; i < nw; i++) {
        dw[i] = (float)tu_rand();
        rdw[i] += dw[i];
        mdw[i] += fabs(dw[i]);
    }
    for (int i = 0; i < co; i++) {
        db[i] = (float)tu_rand();
        rdb[i] += db[i];
        mdb[i] += fabs(db[i]);
    }
    CHECK(nchw_conv2d_bwd_filter(dw, bias ? db : NULL, dy, x, ws, &s, ctx) == BK_OK,
          "%s: bwd filter", tag);
    const long kw = (long)n * s.ho * s.wo + 1;
    bad = out_of_bound(dw, 0, rdw, mdw, kw, nw);
    CHECK(bad == 0, "%s: dw (+=), %ld of %zu elements out of bounds", tag, bad, nw);
    if (bias) {
        bad = out_of_bound(db, 0, rdb, mdb, kw, (size_t)co);
        CHECK(bad == 0, "%s: db (+=), %ld of %d elements out of bounds", tag, bad, co);
    }
    free(ws);
    free(x);
    free(wt);
    free(y);
    free(dy);
    free(dx);
    free(prev);
    free(xd);
    free(wd);
    free(dyd);
    free(prevd);
    free(b);
    free(dw);
    free(db);
    free(bd);
    free(ref);
    free(mag);
}

/* ---- linear ---- */

static void test_linear(int m, int k, int n, int bias)
{
    char tag[96];
    snprintf(tag, sizeof tag, "bf16 linear m%d k%d n%d bias%d", m, k, n, bias);
    const size_t nx = (size_t)m * k, nw = (size_t)n * k, ny = (size_t)m * n;
    size_t wsb = cpu_linear_ws_bytes(m, k, n, BK_DTYPE_BF16);
    void *ws = xmalloc(wsb);
    CHECK(cpu_ctx_set_workspace(ctx, ws, wsb) == BK_OK, "%s: workspace", tag);
    uint16_t *x = xmalloc(2 * nx), *w = xmalloc(2 * nw), *y = xmalloc(2 * ny),
             *dy = xmalloc(2 * ny), *dx = xmalloc(2 * nx), *prev = xmalloc(2 * nx),
             *eq = xmalloc(2 * nx);
    double *xd = xmalloc(8 * nx), *wd = xmalloc(8 * nw), *dyd = xmalloc(8 * ny),
           *prevd = xmalloc(8 * nx);
    float *b = xmalloc(4 * n), *dw = xmalloc(4 * nw), *db = xmalloc(4 * n);
    size_t most = nx > ny ? nx : ny;
    most = most > nw ? most : nw;
    double *ref = xmalloc(8 * most), *mag = xmalloc(8 * most);
    fill_bf16(x, xd, nx, 1.0);
    fill_bf16(w, wd, nw, 0.5);
    fill_bf16(dy, dyd, ny, 1.0);
    fill_bf16(prev, prevd, nx, 1.0);
    for (int j = 0; j < n; j++) b[j] = (float)(tu_rand() * 0.5);

    CHECK(cpu_linear_fwd(y, x, w, bias ? b : NULL, m, k, n, BK_DTYPE_BF16, ctx) == BK_OK,
          "%s: fwd", tag);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double r = bias ? b[j] : 0.0, a = bias ? fabs(b[j]) : 0.0;
            for (int c = 0; c < k; c++) {
                r += xd[(size_t)i * k + c] * wd[(size_t)j * k + c];
                a += fabs(xd[(size_t)i * k + c] * wd[(size_t)j * k + c]);
            }
            ref[(size_t)i * n + j] = r;
            mag[(size_t)i * n + j] = a;
        }
    long bad = out_of_bound(y, 1, ref, mag, k + 1, ny);
    CHECK(bad == 0, "%s: fwd, %ld of %zu elements out of bounds", tag, bad, ny);

    for (int accum = 0; accum < 2; accum++) {
        memcpy(dx, prev, 2 * nx);
        for (size_t i = 0; i < nw; i++) dw[i] = (float)tu_rand();
        for (int j = 0; j < n; j++) db[j] = (float)tu_rand();
        float *dw0 = xmalloc(4 * nw), *db0 = xmalloc(4 * n);
        memcpy(dw0, dw, 4 * nw);
        memcpy(db0, db, 4 * n);
        CHECK(cpu_linear_bwd(dx, dw, bias ? db : NULL, dy, x, w, accum, m, k, n, BK_DTYPE_BF16,
                             ctx) == BK_OK,
              "%s: bwd accum %d", tag, accum);
        if (!accum) {
            memcpy(eq, dx, 2 * nx);
        } else {
            /* round(prev + round(r)): the `=` result added (bf16 and fp32 outputs of one GEMM
             * may round differently where the two matmuls' sums differ: a few elements) */
            size_t miss = accum16_misses(dx, prev, eq, nx);
            CHECK(miss <= nx / 50, "%s: dx (+=): %zu of %zu elements are not round(prev + "
                  "round(r))", tag, miss, nx);
        }
        for (int i = 0; i < m; i++)
            for (int c = 0; c < k; c++) {
                double r = accum ? prevd[(size_t)i * k + c] : 0.0, a = fabs(r);
                for (int j = 0; j < n; j++) {
                    r += dyd[(size_t)i * n + j] * wd[(size_t)j * k + c];
                    a += fabs(dyd[(size_t)i * n + j] * wd[(size_t)j * k + c]);
                }
                ref[(size_t)i * k + c] = r;
                mag[(size_t)i * k + c] = a;
            }
        if (!accum) { /* += is the rule over this result, checked above */
            bad = out_of_bound(dx, 1, ref, mag, n + 1, nx);
            CHECK(bad == 0, "%s: dx (=), %ld of %zu elements out of bounds", tag, bad, nx);
        }
        for (int j = 0; j < n; j++)
            for (int c = 0; c < k; c++) {
                double r = dw0[(size_t)j * k + c], a = fabs(r);
                for (int i = 0; i < m; i++) {
                    r += dyd[(size_t)i * n + j] * xd[(size_t)i * k + c];
                    a += fabs(dyd[(size_t)i * n + j] * xd[(size_t)i * k + c]);
                }
                ref[(size_t)j * k + c] = r;
                mag[(size_t)j * k + c] = a;
            }
        bad = out_of_bound(dw, 0, ref, mag, m + 1, nw);
        CHECK(bad == 0, "%s: dw (+=), %ld of %zu elements out of bounds", tag, bad, nw);
        if (bias) {
            for (int j = 0; j < n; j++) {
                double r = db0[j], a = fabs(r);
                for (int i = 0; i < m; i++) {
                    r += dyd[(size_t)i * n + j];
                    a += fabs(dyd[(size_t)i * n + j]);
                }
                ref[j] = r;
                mag[j] = a;
            }
            bad = out_of_bound(db, 0, ref, mag, m + 1, (size_t)n);
            CHECK(bad == 0, "%s: db (+=), %ld of %d elements out of bounds", tag, bad, n);
        }
        free(dw0);
        free(db0);
    }
    /* dx not wanted: dw alone, the same bits as with dx */
    float *dw2 = xmalloc(4 * nw), *dw3 = xmalloc(4 * nw);
    memcpy(dw2, dw, 4 * nw);
    memcpy(dw3, dw, 4 * nw);
    CHECK(cpu_linear_bwd(dx, dw2, NULL, dy, x, w, 0, m, k, n, BK_DTYPE_BF16, ctx) == BK_OK &&
              cpu_linear_bwd(NULL, dw3, NULL, dy, x, w, 0, m, k, n, BK_DTYPE_BF16, ctx) == BK_OK,
          "%s: bwd without dx", tag);
    CHECK(memcmp(dw2, dw3, 4 * nw) == 0, "%s: dw differs without dx", tag);
    /* without the workspace (oneDNN's bf16 matmuls here take scratch): refused, not run on
     * memory of their own */
    CHECK(cpu_ctx_set_workspace(ctx, NULL, 0) == BK_OK, "%s: no workspace", tag);
    if (wsb)
        CHECK(cpu_linear_fwd(y, x, w, b, m, k, n, BK_DTYPE_BF16, ctx) == BK_ERR_INVALID,
              "%s: ran without the %zu bytes of workspace it asked for", tag, wsb);
    free(ws);
    free(x);
    free(w);
    free(y);
    free(dy);
    free(dx);
    free(prev);
    free(eq);
    free(xd);
    free(wd);
    free(dyd);
    free(prevd);
    free(b);
    free(dw);
    free(db);
    free(dw2);
    free(dw3);
    free(ref);
    free(mag);
}

/* ---- attention (tiled, bf16 on AVX512-BF16) ----
 * The bound, per element, from the float64 reference on the same bf16 inputs (u = 2^-8, bf16's
 * unit roundoff; e = 2^-24, fp32's). The kernel's products are exact (bf16 x bf16 fits fp32) and
 * summed in fp32; P and dS are rounded to bf16 before the products with v, k, q and dout.
 * Scores: dS_rc = scale e D sum_e |q_re k_ce| + e |S_rc| (the sum and the scale's product).
 * p = exp(S - m) in fp32 is off by rho_r <= max_c dS_rc + 3 e range_r + 2^-21 relative (range_r
 * = max - min of row r's scores: the subtraction of the running max and the rescale by
 * exp(m_old - m), the exponential's few ulps).
 * Forward: o = sum_c bf16(p_rc) v_c / sum_c p_rc, rounded:
 *   |o - o*| <= u |o*| + (u + 2 rho_r + (L + 8) e) A,  A = sum_c p_rc |v_c|.
 *   |lse - lse*| <= rho_r + (L + 2) e + 2 e |lse*|.
 * Backward, given o = bf16(o*) and lse = fp32(lse*): p off by rho'_rc = dS_rc + 2 e |lse*| +
 * 2^-21 relative; dP = dout v^T off by dP_rc = e D sum_e |dout_re v_ce|; Di = dout . o off by
 * dI_r = (u + (D + 1) e)(1 + u) sum_e |dout_re o*_re|; so
 *   E_dS_rc = scale p (rho' |dP - Di| + dP_rc + dI_r) + (u + 3 e) |dS*_rc|  (dS as bf16),
 *   E_P_rc = p (rho' + u)  (P as bf16), and
 *   |dv - dv*| <= sum_r E_P |dout| + L e sum_r p |dout| + u |dv*|,
 *   |dk - dk*| <= sum_r E_dS |q| + L e sum_r |dS*| |q| + u |dk*|, dq likewise with k over c.
 * Each bound is taken 1.05 times (second-order terms). Rows are sampled where L > 512 (the
 * reference is exact on them: lse and Di of every row are computed). */
static double worst_attn = 0;

/* the query or key rows checked: all, or 64 spread ones and the last */
static int attn_sampled(int i, int L) { return L <= 512 || i % (L / 64) == 0 || i == L - 1; }

static double attn_bound_check(double got, double ref, double bound, long *bad)
{
    double r = fabs(got - ref) / (1.05 * bound + 1e-30);
    if (!(r <= 1.0)) (*bad)++;
    if (r > worst_attn || isnan(r)) worst_attn = r;
    return r;
}

static void test_attn(int n, int L, int H, int D, int packed, int plain)
{
    char tag[96];
    snprintf(tag, sizeof tag, "bf16 %s attention n%d l%d h%d d%d %s", plain ? "plain" : "tiled",
             n, L, H, D, packed ? "packed" : "dense");
    const int C = H * D, ld = packed ? 3 * C : C;
    struct bk_attn s = {.n = n, .l = L, .heads = H, .d = D, .ld = ld,
                        .scale = 1.0f / sqrtf((float)D), .dtype = BK_DTYPE_BF16};
    const size_t wsb = cpu_attn_ws_bytes(&s, !plain);
    if (cpu_isa() < CPU_ISA_AVX512_BF16) {
        CHECK(wsb == 0, "%s: a workspace without AVX512-BF16", tag);
        return;
    }
    CHECK(wsb > 0, "%s: no workspace", tag);
    const size_t nt = (size_t)n * L, nbuf = nt * (size_t)(packed ? ld : 3 * C), no = nt * C;
    const size_t nl = (size_t)n * H * L;
    /* q, k, v: one packed (N, L, 3C) buffer, or three dense (N, L, C) ones */
    uint16_t *in = xmalloc(2 * nbuf), *dout = xmalloc(2 * no), *o = xmalloc(2 * no);
    uint16_t *oin = xmalloc(2 * no), *g = xmalloc(2 * nbuf), *g2 = xmalloc(2 * nbuf);
    uint16_t *o2 = xmalloc(2 * no);
    double *ind = xmalloc(8 * nbuf), *doutd = xmalloc(8 * no);
    float *lse = xmalloc(4 * nl), *lse2 = xmalloc(4 * nl), *lsein = xmalloc(4 * (nl + 16));
    /* the plain form: its p, again, and the backward's p* rounded to fp32 (N, H, L, L); Di's
     * error bound as the plain backward computes it (rowsum(p dP), not dout . o) */
    const size_t np = plain ? nl * (size_t)L : 1;
    float *pq = xmalloc(4 * np), *pq2 = xmalloc(4 * np), *pin = xmalloc(4 * np);
    double *dip = xmalloc(8 * nl);
    /* NaN after the backward's lse: a row read past the last one (a partner row that does not
     * exist, multiplied by zeros) turns the gradients NaN instead of passing unseen */
    for (size_t i = nl; i < nl + 16; i++) lsein[i] = NAN;
    /* the workspace all ones (NaN as fp32 and as bf16): a scratch element read before it is
     * written (a padding column taken for a zero) turns the results NaN */
    void *ws = xmalloc(wsb);
    memset(ws, 0xff, wsb);
    fill_bf16(in, ind, nbuf, 1.0);
    fill_bf16(dout, doutd, no, 1.0);
    memset(g, 0, 2 * nbuf);
    const size_t qo = 0, ko = packed ? (size_t)C : no, vo = packed ? 2 * (size_t)C : 2 * no;
#define QD(ni, i, h, e) ind[qo + ((size_t)(ni) * L + (i)) * ld + (size_t)(h) * D + (e)]
#define KD(ni, i, h, e) ind[ko + ((size_t)(ni) * L + (i)) * ld + (size_t)(h) * D + (e)]
#define VD(ni, i, h, e) ind[vo + ((size_t)(ni) * L + (i)) * ld + (size_t)(h) * D + (e)]
#define HD(a, ni, i, h, e) (a)[((size_t)(ni) * L + (i)) * C + (size_t)(h) * D + (e)]
    CHECK((plain ? cpu_attn_plain_fwd(o, pq, in + qo, in + ko, in + vo, ws, &s, ctx)
                 : cpu_attn_fwd(o, lse, in + qo, in + ko, in + vo, ws, &s, ctx)) == BK_OK,
          "%s: fwd", tag);

    const double u = ldexp(1.0, -8), e24 = ldexp(1.0, -24), sc = s.scale;
    double *S = xmalloc(8 * L), *P = xmalloc(8 * L);
    double *lsed = xmalloc(8 * nl), *di = xmalloc(8 * nl), *rho = xmalloc(8 * nl);
    double *od = xmalloc(8 * no), *A = xmalloc(8 * D), *Bv = xmalloc(8 * D);
    long bad_o = 0, bad_l = 0, bad_dq = 0, bad_dk = 0, bad_dv = 0, bad_p = 0;
    for (int ni = 0; ni < n; ni++)
        for (int h = 0; h < H; h++) {
            const size_t pr = (size_t)ni * H + h;
            for (int i = 0; i < L; i++) {
                /* o*, lse* and Di of every row (the backward's reference needs them); the
                 * bounds' magnitudes on the sampled rows */
                const int chk = attn_sampled(i, L);
                double mx = -INFINITY, mn = INFINITY, dsmax = 0, z = 0;
                for (int c = 0; c < L; c++) {
                    double acc = 0, mag = 0;
                    for (int e = 0; e < D; e++) acc += QD(ni, i, h, e) * KD(ni, c, h, e);
                    if (chk)
                        for (int e = 0; e < D; e++) mag += fabs(QD(ni, i, h, e) * KD(ni, c, h, e));
                    S[c] = sc * acc;
                    const double ds = sc * e24 * D * mag + e24 * fabs(S[c]);
                    if (ds > dsmax) dsmax = ds;
                    if (S[c] > mx) mx = S[c];
                    if (S[c] < mn) mn = S[c];
                }
                for (int c = 0; c < L; c++) z += P[c] = exp(S[c] - mx);
                lsed[pr * L + i] = mx + log(z);
                rho[pr * L + i] = dsmax + 3 * e24 * (mx - mn) + ldexp(1.0, -21);
                if (plain) {
                    /* p (fp32): 2^(S - max) within rho and 2 ulp, summed over L, divided */
                    double dacc_p = 0;
                    for (int c = 0; c < L; c++) {
                        const double pc = P[c] / z;
                        pin[(pr * L + i) * L + c] = (float)pc;
                        if (chk)
                            attn_bound_check(pq[(pr * L + i) * L + c], pc,
                                             pc * (2 * rho[pr * L + i] + (L + 8) * e24), &bad_p);
                        /* rowsum(p dP) from p* in fp32 and dP = dout v^T (within e D sum
                         * |dout v|), summed over L */
                        double dpc = 0, mpc = 0;
                        for (int e = 0; e < D; e++) {
                            dpc += HD(doutd, ni, i, h, e) * VD(ni, c, h, e);
                            mpc += fabs(HD(doutd, ni, i, h, e) * VD(ni, c, h, e));
                        }
                        dacc_p += pc * (e24 * D * mpc + (L + 3) * e24 * fabs(dpc));
                    }
                    dip[pr * L + i] = dacc_p;
                }
                for (int e = 0; e < D; e++) A[e] = Bv[e] = 0;
                for (int c = 0; c < L; c++) {
                    const double pc = P[c] / z;
                    for (int e = 0; e < D; e++) Bv[e] += pc * VD(ni, c, h, e);
                    if (chk)
                        for (int e = 0; e < D; e++) A[e] += pc * fabs(VD(ni, c, h, e));
                }
                double dacc = 0;
                for (int e = 0; e < D; e++) {
                    HD(od, ni, i, h, e) = Bv[e];
                    dacc += HD(doutd, ni, i, h, e) * Bv[e];
                    if (!chk) continue;
                    const double got = half_bf16_to_f32(HD(o, ni, i, h, e));
                    const double bound =
                        u * fabs(Bv[e]) + (u + 2 * rho[pr * L + i] + (L + 8) * e24) * A[e];
                    attn_bound_check(got, Bv[e], bound, &bad_o);
                }
                di[pr * L + i] = dacc;
                if (chk && !plain)
                    attn_bound_check(lse[pr * L + i], lsed[pr * L + i],
                                     rho[pr * L + i] + (L + 2) * e24 +
                                         2 * e24 * fabs(lsed[pr * L + i]),
                                     &bad_l);
            }
        }
    CHECK(bad_o == 0 && bad_l == 0 && bad_p == 0,
          "%s: forward outside the bound: o %ld, lse %ld, p %ld", tag, bad_o, bad_l, bad_p);

    /* the backward from o* rounded to bf16 and lse* to fp32 */
    for (size_t i = 0; i < no; i++) oin[i] = half_f32_to_bf16((float)od[i]);
    for (size_t i = 0; i < nl; i++) lsein[i] = (float)lsed[i];
    CHECK((plain ? cpu_attn_plain_bwd(g + qo, g + ko, g + vo, dout, in + qo, in + ko, in + vo, pin,
                                      ws, &s, ctx)
                 : cpu_attn_bwd(g + qo, g + ko, g + vo, dout, in + qo, in + ko, in + vo, oin,
                                lsein, ws, &s, ctx)) == BK_OK,
          "%s: bwd", tag);
    /* p_rc, dS*_rc and their error bounds for one (query r, key c) */
#define PDS(ni, h, r, c, pp, ds, eds, ep)                                                     \
    do {                                                                                      \
        const size_t pr_ = (size_t)(ni) * H + (h);                                            \
        double s_ = 0, m_ = 0, dp_ = 0, mp_ = 0, mo_ = 0;                                     \
        for (int e = 0; e < D; e++) {                                                         \
            s_ += QD(ni, r, h, e) * KD(ni, c, h, e);                                          \
            m_ += fabs(QD(ni, r, h, e) * KD(ni, c, h, e));                                    \
            dp_ += HD(doutd, ni, r, h, e) * VD(ni, c, h, e);                                  \
            mp_ += fabs(HD(doutd, ni, r, h, e) * VD(ni, c, h, e));                            \
            mo_ += fabs(HD(doutd, ni, r, h, e) * HD(od, ni, r, h, e));                        \
        }                                                                                     \
        const double lr_ = lsed[pr_ * L + (r)];                                               \
        pp = exp(sc * s_ - lr_);                                                              \
        ds = sc * pp * (dp_ - di[pr_ * L + (r)]);                                             \
        /* plain: p given as fp32(p*), Di as rowsum(p dP) */                                   \
        const double rh_ = plain ? 2 * e24                                                    \
                                 : sc * e24 * D * m_ + e24 * fabs(sc * s_) +                  \
                                       2 * e24 * fabs(lr_) + ldexp(1.0, -21);                 \
        const double di_ = plain ? dip[pr_ * L + (r)]                                         \
                                 : (u + (D + 1) * e24) * (1 + u) * mo_;                       \
        eds = sc * pp * (rh_ * fabs(dp_ - di[pr_ * L + (r)]) + e24 * D * mp_ + di_) +         \
              (u + 3 * e24) * fabs(ds);                                                       \
        ep = pp * (rh_ + u);                                                                  \
    } while (0)
    double *ref = xmalloc(8 * 3 * D), *bnd = xmalloc(8 * 3 * D);
    for (int ni = 0; ni < n; ni++)
        for (int h = 0; h < H; h++) {
            /* dk, dv of the sampled keys: sums over every query */
            for (int c = 0; c < L; c++) {
                if (!attn_sampled(c, L)) continue;
                for (int e = 0; e < 3 * D; e++) ref[e] = bnd[e] = 0;
                for (int r = 0; r < L; r++) {
                    double pp, ds, eds, ep;
                    PDS(ni, h, r, c, pp, ds, eds, ep);
                    for (int e = 0; e < D; e++) {
                        const double qv = QD(ni, r, h, e), dov = HD(doutd, ni, r, h, e);
                        ref[e] += ds * qv;
                        bnd[e] += eds * fabs(qv) + L * e24 * fabs(ds * qv);
                        ref[D + e] += pp * dov;
                        bnd[D + e] += ep * fabs(dov) + L * e24 * pp * fabs(dov);
                    }
                }
                for (int e = 0; e < D; e++) {
                    const size_t at = ((size_t)ni * L + c) * ld + (size_t)h * D + e;
                    attn_bound_check(half_bf16_to_f32(g[ko + at]), ref[e],
                                     bnd[e] + u * fabs(ref[e]), &bad_dk);
                    attn_bound_check(half_bf16_to_f32(g[vo + at]), ref[D + e],
                                     bnd[D + e] + u * fabs(ref[D + e]), &bad_dv);
                }
            }
            /* dq of the sampled queries: sums over every key */
            for (int r = 0; r < L; r++) {
                if (!attn_sampled(r, L)) continue;
                for (int e = 0; e < D; e++) ref[e] = bnd[e] = 0;
                for (int c = 0; c < L; c++) {
                    double pp, ds, eds, ep;
                    PDS(ni, h, r, c, pp, ds, eds, ep);
                    (void)ep;
                    for (int e = 0; e < D; e++) {
                        const double kv = KD(ni, c, h, e);
                        ref[e] += ds * kv;
                        bnd[e] += eds * fabs(kv) + L * e24 * fabs(ds * kv);
                    }
                }
                for (int e = 0; e < D; e++) {
                    const size_t at = ((size_t)ni * L + r) * ld + (size_t)h * D + e;
                    attn_bound_check(half_bf16_to_f32(g[qo + at]), ref[e],
                                     bnd[e] + u * fabs(ref[e]), &bad_dq);
                }
            }
        }
    CHECK(bad_dq == 0 && bad_dk == 0 && bad_dv == 0,
          "%s: backward outside the bound: dq %ld, dk %ld, dv %ld", tag, bad_dq, bad_dk, bad_dv);
#undef PDS

    /* the same bits again, and at 1 thread (at 2 threads a single pair's keys are split: its dq
     * sums in another order, as the fp32 form's) */
    bk_ctx *one = NULL;
    CHECK(cpu_ctx_init(&one, 1) == BK_OK, "%s: 1-thread context", tag);
    for (int run = 0; run < 2 && one; run++) {
        bk_ctx *c = run ? one : ctx;
        memset(o2, 0, 2 * no);
        memset(g2, 0, 2 * nbuf);
        CHECK((plain ? cpu_attn_plain_fwd(o2, pq2, in + qo, in + ko, in + vo, ws, &s, c)
                     : cpu_attn_fwd(o2, lse2, in + qo, in + ko, in + vo, ws, &s, c)) == BK_OK,
              "%s: fwd %d", tag, run);
        CHECK(!memcmp(o, o2, 2 * no) &&
                  (plain ? !memcmp(pq, pq2, 4 * np) : !memcmp(lse, lse2, 4 * nl)),
              "%s: forward differs %s", tag, run ? "at 1 thread" : "run to run");
        if (run && n * H < 2 && !plain) continue; /* the plain form: a pair per thread */
        CHECK((plain ? cpu_attn_plain_bwd(g2 + qo, g2 + ko, g2 + vo, dout, in + qo, in + ko,
                                          in + vo, pin, ws, &s, c)
                     : cpu_attn_bwd(g2 + qo, g2 + ko, g2 + vo, dout, in + qo, in + ko, in + vo,
                                    oin, lsein, ws, &s, c)) == BK_OK,
              "%s: bwd %d", tag, run);
        CHECK(!memcmp(g, g2, 2 * nbuf), "%s: backward differs %s", tag,
              run ? "at 1 thread" : "run to run");
    }
    if (one) cpu_ctx_free(one);
#undef QD
#undef KD
#undef VD
#undef HD
    free(in);
    free(dout);
    free(o);
    free(oin);
    free(g);
    free(g2);
    free(o2);
    free(ind);
    free(doutd);
    free(lse);
    free(lse2);
    free(lsein);
    free(pq);
    free(pq2);
    free(pin);
    free(dip);
    free(ws);
    free(S);
    free(P);
    free(lsed);
    free(di);
    free(rho);
    free(od);
    free(A);
    free(Bv);
    free(ref);
    free(bnd);
}

/* f16 has no CPU kernels: refused, no workspace asked */
static void refused(void)
{
    struct bk_conv2d s = {.n = 1, .ci = 4, .h = 4, .w = 4, .co = 4, .kh = 3, .kw = 3,
                          .stride = 1, .pad_t = 1, .pad_l = 1, .pad_b = 1, .pad_r = 1,
                          .dtype = BK_DTYPE_F16};
    bk_conv2d_init(&s);
    float buf[1024] = {0};
    CHECK(cpu_conv2d_ws_bytes(&s) == 0, "f16 conv: workspace asked");
    CHECK(cpu_conv2d_fwd(buf, buf, buf, NULL, buf, &s, ctx) == BK_ERR_INVALID, "f16 conv ran");
    CHECK(cpu_linear_ws_bytes(4, 4, 4, BK_DTYPE_F16) == 0, "f16 linear: workspace asked");
    CHECK(cpu_linear_fwd(buf, buf, buf, NULL, 4, 4, 4, BK_DTYPE_F16, ctx) == BK_ERR_INVALID,
          "f16 linear ran");
    struct bk_attn a = {.n = 1, .l = 4, .heads = 1, .d = 4, .ld = 4, .scale = 0.5f,
                        .dtype = BK_DTYPE_F16};
    CHECK(cpu_attn_ws_bytes(&a, 0) == 0, "f16 plain attention: workspace asked");
    CHECK(cpu_attn_plain_fwd(buf, buf, buf, buf, buf, buf, &a, ctx) == BK_ERR_INVALID,
          "f16 plain attention ran");
    CHECK(cpu_attn_ws_bytes(&a, 1) == 0, "f16 attention: workspace asked");
    CHECK(cpu_attn_fwd(buf, buf, buf, buf, buf, buf, &a, ctx) == BK_ERR_INVALID,
          "f16 attention ran");
    CHECK(cpu_half_kernels(BK_DTYPE_F16) == 0, "f16 half kernels reported");
    unsigned h = cpu_half_kernels(BK_DTYPE_BF16);
    const unsigned all =
        BK_HALF_CONV | BK_HALF_LINEAR | BK_HALF_ATTN | BK_HALF_ATTN_PLAIN | BK_HALF_NORM |
        BK_HALF_ELTWISE;
    CHECK(cpu_isa() >= CPU_ISA_AVX512_BF16 ? h == all : h == 0, "bf16 half kernels %#x", h);
    /* under an AVX2 cap nothing 16-bit: the bf16 attention refused */
    cpu_isa_cap(CPU_ISA_AVX2);
    a.dtype = BK_DTYPE_BF16;
    CHECK(cpu_half_kernels(BK_DTYPE_BF16) == 0 && cpu_attn_ws_bytes(&a, 1) == 0 &&
              cpu_attn_fwd(buf, buf, buf, buf, buf, buf, &a, ctx) == BK_ERR_INVALID &&
              cpu_attn_ws_bytes(&a, 0) == 0 &&
              cpu_attn_plain_fwd(buf, buf, buf, buf, buf, buf, &a, ctx) == BK_ERR_INVALID,
          "bf16 attention under the AVX2 cap");
    cpu_isa_cap(-1);
    CHECK(backend_cpu()->half_kernels == cpu_half_kernels &&
              backend_cpu()->linear_ws_bytes == cpu_linear_ws_bytes &&
              backend_cpu()->ctx_set_workspace == cpu_ctx_set_workspace,
          "the CPU table lacks its 16-bit entries");
    printf("half_kernels(bf16) = %#x on this CPU: bf16 linears %s, convolutions %s, attention "
           "%s\n", h, h & BK_HALF_LINEAR ? "yes" : "no", h & BK_HALF_CONV ? "yes" : "no",
           h & BK_HALF_ATTN ? "yes" : "no");
}

int main(void)
{
    tu_seed(11);
    if (cpu_ctx_init(&ctx, 2) != BK_OK) return 1;
    refused();
    test_conv(2, 8, 9, 9, 16, 3, 1, 1, 1, 1, 1, 1);
    test_conv(2, 16, 8, 8, 8, 3, 2, 0, 0, 1, 1, 1); /* diffusers' downsample: right/bottom pad */
    test_conv(3, 32, 6, 6, 16, 1, 1, 0, 0, 0, 0, 0);
    test_conv(2, 24, 5, 7, 72, 1, 1, 0, 0, 0, 0, 1); /* 1x1 with a bias: conv.c's GEMM path */
    test_conv(1, 3, 16, 16, 32, 3, 1, 1, 1, 1, 1, 0); /* the data input's 3 channels */
    test_linear(37, 48, 40, 1);
    test_linear(4, 128, 512, 1); /* the time MLP: few rows */
    test_linear(130, 64, 192, 0);
    /* the bf16 attention: odd lengths and head dims (the pairs' zero partners), a key tail, a
     * single pair (its keys split over 2 threads), and every seed-64 shape (heads 4) */
    test_attn(1, 1, 2, 1, 0, 0);
    test_attn(2, 7, 2, 8, 1, 0);
    test_attn(1, 33, 4, 5, 0, 0);
    test_attn(2, 130, 2, 24, 1, 0);
    test_attn(1, 300, 1, 16, 1, 0);
    test_attn(1, 257, 2, 70, 0, 0); /* a column chunk of 64, then 6 masked */
    test_attn(1, 4096, 4, 16, 1, 0);
    test_attn(1, 1024, 4, 32, 1, 0);
    test_attn(1, 1024, 4, 16, 1, 0);
    test_attn(2, 256, 4, 64, 1, 0);
    /* the plain form: odd lengths and head dims, L not a multiple of the tiles' 12 rows and 32
     * columns, the 32x32 presets' shapes (L 256, heads 1, D 128 and 256) and heads 4 */
    test_attn(1, 1, 2, 1, 0, 1);
    test_attn(2, 7, 2, 8, 1, 1);
    test_attn(1, 33, 4, 5, 0, 1);
    test_attn(1, 257, 2, 70, 0, 1);
    test_attn(2, 256, 1, 128, 1, 1);
    test_attn(1, 256, 1, 256, 1, 1);
    test_attn(2, 100, 4, 32, 0, 1);
    printf("worst error / bound: bf16 outputs %.3f, fp32 outputs %.3f, bf16 attention %.3f\n",
           worst_bf16, worst_f32, worst_attn);
    cpu_ctx_free(ctx);
    return tu_finish("test_ops_half");
}
