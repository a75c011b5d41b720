/* test_gpu_ops.c - every op of the CUDA backend against the CPU backend on fresh random inputs:
 * outputs poisoned with NaN before each run (accumulating outputs start from the same random
 * values on both), every CUDA call and launch checked (DDPMD_CUDA_SYNC=1 synchronizes after each
 * launch), and the norm-wise relative error of every output tensor under 1e-5 (parity mode).
 * Every compared value must be finite on both backends (a NaN on both is a failure, not a
 * match); an output a kernel must leave alone is checked to still hold its NaN poison.
 * Philox fills equal philox.h's (u32 exactly, Gaussians within 1e-6). Without a GPU it prints
 * "SKIPPED: no CUDA device" and exits 77, which ctest reports as skipped.
 * Both backends store images NHWC. The typed kernels (convolution, linear, attention, and the
 * memory-bound ones of backend.typed: norms with their fusions, element-wise, layout, resampling,
 * dropout) run in f32, bf16 and f16. A 16-bit run's inputs are 16-bit values on both sides; the
 * CPU reference is what the executor makes of a 16-bit tensor on a backend without 16-bit
 * kernels: the CPU's fp32 kernel on the widened values, its result rounded to the 16-bit type
 * (half.h); an accumulating 16-bit output of a convolution or linear (dx +=) is
 * round(y + round(r)) (backend.h, t_accum16_ref), of a memory-bound kernel round(y + r). See
 * t_cmp16 for the tolerances.
 */
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend_load.h"
#include "half.h"
#include "philox.h"
#include "test_util.h"

#define TOL 1e-5
#define DEV_BYTES ((size_t)512 << 20)

static const struct backend *G, *C;
static int emulated; /* the device is tests/gpu/emu's */
static bk_ctx *gctx, *cctx;
static unsigned char *dev_base;
static size_t dev_used;
static const char *cur_op = "";

/* device memory: bump allocation out of the test's one reservation, reset per op */
static void *dalloc(size_t bytes)
{
    size_t off = (dev_used + 255) & ~(size_t)255;
    if (off + bytes > DEV_BYTES) {
        fprintf(stderr, "test_gpu_ops: device arena exhausted (%s)\n", cur_op);
        exit(1);
    }
    dev_used = off + bytes;
    return dev_base + off;
}

struct t {
    size_t n;
    float *h; /* the CPU's copy (input, or the CPU backend's output), fp32 */
    float *d; /* the GPU's, elements of dt */
    int dt;   /* enum bk_dtype of the GPU's copy; a 16-bit input's h holds 16-bit values */
};

static uint16_t to16(float v, int dt)
{
    return dt == BK_DTYPE_BF16 ? half_f32_to_bf16(v) : half_f32_to_f16(v);
}
static float from16(uint16_t b, int dt)
{
    return dt == BK_DTYPE_BF16 ? half_bf16_to_f32(b) : half_f16_to_f32(b);
}

static void up(struct t *x)
{
    int rc;
    if (x->dt == BK_DTYPE_F32) {
        rc = G->mem_upload(x->d, x->h, x->n * 4, gctx);
    } else {
        uint16_t *b = malloc((x->n ? x->n : 1) * 2);
        for (size_t i = 0; i < x->n; i++) b[i] = to16(x->h[i], x->dt);
        rc = G->mem_upload(x->d, b, x->n * 2, gctx);
        free(b);
    }
    CHECK(rc == 0, "%s: upload", cur_op);
}

static struct t t_make_dt(size_t n, int dt)
{
    struct t x = {n, malloc((n ? n : 1) * sizeof(float)),
                  dalloc((n ? n : 1) * bk_dtype_size(dt)), dt};
    return x;
}

static struct t t_make(size_t n) { return t_make_dt(n, BK_DTYPE_F32); }

/* an input: the same random values on both sides (of dt: rounded to it) */
static struct t t_in_dt(size_t n, double scale, int dt)
{
    struct t x = t_make_dt(n, dt);
    tu_fill(x.h, n, scale);
    if (dt != BK_DTYPE_F32)
        for (size_t i = 0; i < n; i++) x.h[i] = from16(to16(x.h[i], dt), dt);
    up(&x);
    return x;
}
static struct t t_in(size_t n, double scale) { return t_in_dt(n, scale, BK_DTYPE_F32); }

/* an output written (=): NaN on both sides, so an element a kernel misses shows */
static struct t t_out_dt(size_t n, int dt)
{
    struct t x = t_make_dt(n, dt);
    for (size_t i = 0; i < n; i++) x.h[i] = NAN;
    if (dt == BK_DTYPE_F32)
        CHECK(G->mem_set_f32(x.d, NAN, n, gctx) == 0, "%s: poison", cur_op);
    else
        up(&x);
    return x;
}
static struct t t_out(size_t n) { return t_out_dt(n, BK_DTYPE_F32); }

/* an output accumulated (+=): the same random start on both sides */
static struct t t_acc_dt(size_t n, double scale, int dt) { return t_in_dt(n, scale, dt); }
static struct t t_acc(size_t n, double scale) { return t_in(n, scale); }

static void t_free(struct t *x) { free(x->h); }

/* the GPU's x against the CPU's: every value finite on both sides (inputs are finite, so a
 * NaN or Inf is an element a kernel missed - still the NaN poison - or broke, even when both
 * backends agree on it), and the norm-wise relative error under tol */
static void t_cmp(const char *what, const struct t *x, double tol)
{
    float *g = malloc((x->n ? x->n : 1) * sizeof(float));
    int rc = G->mem_download(g, x->d, x->n * 4, gctx);
    CHECK(rc == 0, "%s %s: download", cur_op, what);
    size_t bad_g = 0, bad_c = 0;
    double num = 0, den = 0;
    for (size_t i = 0; i < x->n; i++) {
        int fg = isfinite(g[i]), fc = isfinite(x->h[i]);
        bad_g += !fg;
        bad_c += !fc;
        if (fg && fc) {
            double d = (double)g[i] - (double)x->h[i];
            num += d * d;
            den += (double)x->h[i] * x->h[i];
        }
    }
    double e = sqrt(num) / (den > 1e-300 ? sqrt(den) : 1e-300);
    if (num == 0) e = 0;
    CHECK(rc == 0 && bad_g == 0 && bad_c == 0 && e < tol,
          "%s %s: rel err %.3g (tol %.0e), non-finite elements: %zu on the GPU, %zu on the CPU, "
          "n %zu", cur_op, what, e, tol, bad_g, bad_c, x->n);
    if (getenv("TEST_GPU_VERBOSE")) printf("  %-28s %-8s rel err %.3g\n", cur_op, what, e);
    free(g);
}

/* tolerances of a 16-bit output against the CPU's fp32 result rounded to the type (what the
 * executor stores there). The two fp32 results differ by summation order only (~1e-6 relative),
 * so their roundings are equal except where the two straddle a rounding boundary, one ulp apart
 * (at most 2u relative; u, the unit roundoff, is 2^-8 for bf16's 8 significant bits and 2^-11
 * for f16's 11). Measured: at most 0.4% of the elements differ, norm-wise under 0.05 u. So: at
 * most TOL16_FRAC of the elements (or one, in a short output) may differ at all (a rounding
 * that is not to nearest even, or a second rounding, changes ~30% of them) and norm-wise
 * tol16 = u/4. Outputs with a bias are
 * rounded twice (the library's result, then + b in fp32: cuDNN and cuBLAS store 16 bits before
 * the bias is added, as PyTorch's autocast does), ~30% differ by one ulp, norm-wise measured 0.5
 * to 0.72 u: tol16 = u, the share not checked. */
#define TOL16_FRAC 0.02
static double tol16(int dt, int bias)
{
    const double u = dt == BK_DTYPE_BF16 ? 1.0 / 256 : 1.0 / 2048; /* the unit roundoff */
    return bias ? u : u / 4;
}

static void t_cmp16(const char *what, const struct t *x, int check_frac)
{
    const size_t n = x->n ? x->n : 1;
    uint16_t *g = malloc(n * 2);
    int rc = G->mem_download(g, x->d, x->n * 2, gctx);
    size_t bad_g = 0, bad_c = 0, differ = 0;
    double num = 0, den = 0;
    for (size_t i = 0; i < x->n; i++) {
        const uint16_t cb = to16(x->h[i], x->dt);
        const float gv = from16(g[i], x->dt), cv = from16(cb, x->dt);
        const int fg = isfinite(gv), fc = isfinite(cv);
        bad_g += !fg;
        bad_c += !fc;
        differ += g[i] != cb;
        if (fg && fc) {
            double d = (double)gv - (double)cv;
            num += d * d;
            den += (double)cv * cv;
        }
    }
    double e = num == 0 ? 0 : sqrt(num) / (den > 1e-300 ? sqrt(den) : 1e-300);
    const double frac = x->n ? (double)differ / (double)x->n : 0.0, tol = tol16(x->dt, !check_frac);
    const char *tn = x->dt == BK_DTYPE_BF16 ? "bf16" : "f16";
    /* one element may always straddle a boundary: a short output's one flip is no failure */
    const int frac_ok = frac <= TOL16_FRAC || differ <= 1;
    CHECK(rc == 0 && bad_g == 0 && bad_c == 0 && e < tol && (!check_frac || frac_ok),
          "%s %s (%s): rel err %.3g (tol %.2g), %.2f%% of the elements differ (at most %.0f%%%s), "
          "non-finite: %zu on the GPU, %zu on the CPU, n %zu", cur_op, what, tn, e, tol,
          100.0 * frac, 100.0 * TOL16_FRAC, check_frac ? "" : ": not checked, a bias", bad_g,
          bad_c, x->n);
    if (getenv("TEST_GPU_VERBOSE"))
        printf("  %-28s %-8s %-4s rel err %.3g, %.2f%% differ\n", cur_op, what, tn, e,
               100.0 * frac);
    free(g);
}

/* an output of either type: fp32 ones within tol, 16-bit ones by t_cmp16 */
static void t_cmp_any(const char *what, const struct t *x, double tol, int check_frac)
{
    if (x->dt == BK_DTYPE_F32)
        t_cmp(what, x, tol);
    else
        t_cmp16(what, x, check_frac);
}

/* the CPU's result rounded to the GPU's type, as the executor stores it: the next kernel's
 * input on both sides */
static void t_round(struct t *x)
{
    if (x->dt != BK_DTYPE_F32)
        for (size_t i = 0; i < x->n; i++) x->h[i] = from16(to16(x->h[i], x->dt), x->dt);
}

/* backend.h's 16-bit +=: the reference of an accumulating 16-bit output is round(y + round(r)),
 * r the CPU's fp32 result of the `=` call (in r_h): y (x->h, its 16-bit start) += r rounded to
 * the type, in fp32; t_cmp16 rounds the sum. A GPU whose library blends in fp32 (round(y + r))
 * differs in 20-32% of the elements (EMU_BLEND_FP32=1 shows it) */
static void t_accum16_ref(struct t *x, const float *r_h)
{
    for (size_t i = 0; i < x->n; i++) x->h[i] += from16(to16(r_h[i], x->dt), x->dt);
}

/* an output both kernels were told to leave alone: still all NaN poison on both sides */
static void t_untouched(const char *what, const struct t *x)
{
    float *g = malloc((x->n ? x->n : 1) * sizeof(float));
    int rc = G->mem_download(g, x->d, x->n * 4, gctx);
    size_t written_g = 0, written_c = 0;
    for (size_t i = 0; i < x->n; i++) {
        written_g += !isnan(g[i]);
        written_c += !isnan(x->h[i]);
    }
    CHECK(rc == 0 && written_g == 0 && written_c == 0,
          "%s %s: must be left alone, but %zu elements changed on the GPU, %zu on the CPU",
          cur_op, what, written_g, written_c);
    free(g);
}

static void gpu_ok(int rc, const char *what)
{
    CHECK(rc == 0, "%s: GPU %s returned %d", cur_op, what, rc);
    CHECK(G->sync(gctx) == 0, "%s: GPU sync after %s", cur_op, what);
}

static void begin(const char *name)
{
    cur_op = name;
    dev_used = 0;
}

/* ---- convolution ---- */

static int conv_accum_first; /* the next test_conv's first data gradient accumulates */

static const char *dt_name(int dt)
{
    return dt == BK_DTYPE_BF16 ? " bf16" : dt == BK_DTYPE_F16 ? " f16" : "";
}

/* the unit roundoff of a 16-bit type (half its ulp, relative): 2^-8 for bf16's 8 significant
 * bits, 2^-11 for f16's 11 */
static double u16(int dt) { return dt == BK_DTYPE_BF16 ? 1.0 / 256 : 1.0 / 2048; }

/* tests/gpu/emu: the library calls made so far with inputs of dt (ddpmd_emu_lib_calls), lib 0
 * cuDNN, 1 cuBLAS, 2 warp matrix multiply-accumulates; (ddpmd_emu_lib_calls_ext, emu_ext.h) 3
 * cuBLAS strided batched GEMMs, 4 batched GEMMs of pointer arrays, 5 cuDNN graphs executed, 6
 * cuDNN graphs refused; -1 on a GPU */
static long lib_calls(int lib, int dt)
{
    const char *mod = getenv("DDPMD_CUDA_MODULE");
    void *h = mod ? dlopen(mod, RTLD_NOW | RTLD_NOLOAD) : NULL;
    unsigned long (*f)(int, int) =
        h ? (unsigned long (*)(int, int))dlsym(h, lib < 3 ? "ddpmd_emu_lib_calls"
                                                          : "ddpmd_emu_lib_calls_ext")
          : NULL;
    long r = f ? (long)f(lib, dt) : -1;
    if (h) dlclose(h);
    return r;
}

/* a 16-bit op's kernels: implemented (half_kernels) on this device, and then seen in the
 * library in that type (the emulator counts); where they are not, the call must be refused */
static int typed_native(unsigned bit, int dt)
{
    if (dt == BK_DTYPE_F32) return 1;
    return G->half_kernels && (G->half_kernels(dt) & bit);
}

static void test_conv_dt(int n, int ci, int h, int w, int co, int k, int stride, int pt, int pl,
                         int pb, int pr, int bias, int dt)
{
    char name[128];
    snprintf(name, sizeof name, "conv %dx%dx%dx%d->%d k%d s%d p%d%d%d%d%s%s", n, ci, h, w, co, k,
             stride, pt, pl, pb, pr, bias ? " b" : "", dt_name(dt));
    begin(name);
    struct bk_conv2d s = {.n = n, .ci = ci, .h = h, .w = w, .co = co, .kh = k, .kw = k,
                          .stride = stride, .pad_t = pt, .pad_l = pl, .pad_b = pb, .pad_r = pr,
                          .dtype = dt};
    CHECK(bk_conv2d_init(&s) == 0, "%s: shape", name);
    struct bk_conv2d s32 = s; /* the CPU's: fp32 on the 16-bit values */
    s32.dtype = BK_DTYPE_F32;
    size_t nx = (size_t)n * ci * h * w, ny = (size_t)n * co * s.ho * s.wo,
           nw = (size_t)co * ci * k * k;
    size_t cws = C->conv2d_ws_bytes(&s32), gws = G->conv2d_ws_bytes(&s);
    void *cw = malloc(cws ? cws : 64), *gw = gws ? dalloc(gws) : NULL;
    struct t x = t_in_dt(nx, 1.0, dt), wt = t_in_dt(nw, 0.3, dt), b = t_in((size_t)co, 0.5);
    struct t y = t_out_dt(ny, dt);
    if (!typed_native(BK_HALF_CONV, dt)) {
        CHECK(G->conv2d_fwd(y.d, x.d, wt.d, NULL, gw, &s, gctx) == BK_ERR_INVALID,
              "%s: a convolution in a type the device lacks was not refused", name);
        t_free(&x), t_free(&wt), t_free(&b), t_free(&y), free(cw);
        return;
    }
    const long calls0 = lib_calls(0, dt);
    /* bias outputs: the 16-bit ones are rounded twice (see tol16) */
    const int exact = !bias;
    CHECK(C->conv2d_fwd(y.h, x.h, wt.h, bias ? b.h : NULL, cw, &s32, cctx) == 0, "%s cpu fwd",
          name);
    gpu_ok(G->conv2d_fwd(y.d, x.d, wt.d, bias ? b.d : NULL, gw, &s, gctx), "fwd");
    t_cmp_any("y", &y, TOL, exact);
    struct t dy = t_in_dt(ny, 1.0, dt);
    /* the algorithm search overwrites its output: a first call that accumulates must not search
     * (conv_accum_first runs the accumulating call first on a new shape) */
    for (int a = 0; a < 2; a++) {
        const int accum = conv_accum_first ? 1 - a : a;
        struct t dx = accum ? t_acc_dt(nx, 1.0, dt) : t_out_dt(nx, dt);
        if (accum && dt != BK_DTYPE_F32) {
            float *r = malloc(nx * sizeof *r);
            CHECK(C->conv2d_bwd_data(r, dy.h, wt.h, 0, cw, &s32, cctx) == 0, "%s cpu bwd", name);
            t_accum16_ref(&dx, r);
            free(r);
        } else {
            CHECK(C->conv2d_bwd_data(dx.h, dy.h, wt.h, accum, cw, &s32, cctx) == 0,
                  "%s cpu bwd", name);
        }
        gpu_ok(G->conv2d_bwd_data(dx.d, dy.d, wt.d, accum, gw, &s, gctx), "bwd data");
        t_cmp_any(accum ? "dx+=" : "dx", &dx, TOL, 1);
        t_free(&dx);
    }
    /* filter gradient (fp32): from zero (the strict check) and onto random values (+=). In
     * 16 bits cuDNN's filter gradient is rounded once to the type before it is added: within
     * the unit roundoff */
    const double tol_dw = dt == BK_DTYPE_F32 ? TOL : u16(dt);
    for (int start = 0; start < 2; start++) {
        struct t dw = start ? t_acc(nw, 0.2) : t_make(nw), db = start ? t_acc(co, 0.2) : t_make(co);
        if (!start) {
            memset(dw.h, 0, nw * 4);
            memset(db.h, 0, (size_t)co * 4);
            up(&dw);
            up(&db);
        }
        CHECK(C->conv2d_bwd_filter(dw.h, bias ? db.h : NULL, dy.h, x.h, cw, &s32, cctx) == 0,
              "%s cpu filter", name);
        gpu_ok(G->conv2d_bwd_filter(dw.d, bias ? db.d : NULL, dy.d, x.d, gw, &s, gctx),
               "bwd filter");
        t_cmp(start ? "dw+=" : "dw", &dw, tol_dw);
        if (bias) t_cmp(start ? "db+=" : "db", &db, TOL);
        t_free(&dw);
        t_free(&db);
    }
    /* a second forward (the algorithm now chosen) gives the same */
    struct t y2 = t_out_dt(ny, dt);
    memcpy(y2.h, y.h, ny * 4);
    gpu_ok(G->conv2d_fwd(y2.d, x.d, wt.d, bias ? b.d : NULL, gw, &s, gctx), "fwd again");
    t_cmp_any("y again", &y2, TOL, exact);
    const long calls1 = lib_calls(0, dt);
    CHECK(!emulated || (calls0 >= 0 && calls1 - calls0 >= 6),
          "%s: %ld cuDNN convolutions in this type, want 6: the backend widened its operands",
          name, calls1 - calls0);
    t_free(&y2);
    t_free(&x);
    t_free(&wt);
    t_free(&b);
    t_free(&y);
    t_free(&dy);
    free(cw);
}

/* every shape in fp32, bf16 and f16 */
static void test_conv(int n, int ci, int h, int w, int co, int k, int stride, int pt, int pl,
                      int pb, int pr, int bias)
{
    for (int dt = BK_DTYPE_F32; dt <= BK_DTYPE_BF16; dt++)
        test_conv_dt(n, ci, h, w, co, k, stride, pt, pl, pb, pr, bias, dt);
}

/* ---- linear ---- */

static void test_linear_dt(int m, int k, int n, int dt)
{
    char name[64];
    snprintf(name, sizeof name, "linear %dx%d->%d%s", m, k, n, dt_name(dt));
    begin(name);
    struct t x = t_in_dt((size_t)m * k, 1.0, dt), w = t_in_dt((size_t)n * k, 0.3, dt),
             b = t_in(n, 0.5);
    if (!typed_native(BK_HALF_LINEAR, dt)) {
        struct t y = t_out_dt((size_t)m * n, dt);
        CHECK(G->linear_fwd(y.d, x.d, w.d, NULL, m, k, n, dt, gctx) == BK_ERR_INVALID,
              "%s: a linear in a type the device lacks was not refused", name);
        t_free(&x), t_free(&w), t_free(&b), t_free(&y);
        return;
    }
    /* the CPU's GEMMs take their scratchpad from the workspace a plan would give them */
    const size_t cws_bytes = C->linear_ws_bytes(m, k, n, BK_DTYPE_F32);
    void *cws = malloc(cws_bytes ? cws_bytes : 1);
    CHECK(cws && C->ctx_set_workspace(cctx, cws, cws_bytes) == 0, "%s: cpu workspace", name);
    const long calls0 = lib_calls(1, dt);
    for (int bias = 0; bias < 2; bias++) {
        struct t y = t_out_dt((size_t)m * n, dt);
        CHECK(C->linear_fwd(y.h, x.h, w.h, bias ? b.h : NULL, m, k, n, BK_DTYPE_F32, cctx) == 0,
              "cpu");
        gpu_ok(G->linear_fwd(y.d, x.d, w.d, bias ? b.d : NULL, m, k, n, dt, gctx), "fwd");
        t_cmp_any(bias ? "y (bias)" : "y", &y, TOL, !bias);
        t_free(&y);
    }
    /* dw (fp32) is summed by the GEMM in fp32 from exact products of 16-bit values: TOL in
     * every type */
    struct t dy = t_in_dt((size_t)m * n, 1.0, dt);
    for (int accum = 0; accum < 2; accum++) {
        struct t dx = accum ? t_acc_dt((size_t)m * k, 1.0, dt) : t_out_dt((size_t)m * k, dt);
        struct t dw = t_acc((size_t)n * k, 0.1), db = t_acc(n, 0.1);
        float *r = accum && dt != BK_DTYPE_F32 ? malloc((size_t)m * k * sizeof *r) : NULL;
        CHECK(C->linear_bwd(r ? r : dx.h, dw.h, db.h, dy.h, x.h, w.h, r ? 0 : accum, m, k, n,
                            BK_DTYPE_F32, cctx) == 0,
              "cpu");
        if (r) t_accum16_ref(&dx, r);
        free(r);
        gpu_ok(G->linear_bwd(dx.d, dw.d, db.d, dy.d, x.d, w.d, accum, m, k, n, dt, gctx), "bwd");
        t_cmp_any(accum ? "dx+=" : "dx", &dx, TOL, 1);
        t_cmp("dw+=", &dw, TOL);
        t_cmp("db+=", &db, TOL);
        t_free(&dx);
        t_free(&dw);
        t_free(&db);
    }
    /* dx only */
    struct t dx = t_out_dt((size_t)m * k, dt);
    CHECK(C->linear_bwd(dx.h, NULL, NULL, dy.h, x.h, w.h, 0, m, k, n, BK_DTYPE_F32, cctx) == 0,
          "cpu");
    gpu_ok(G->linear_bwd(dx.d, NULL, NULL, dy.d, x.d, w.d, 0, m, k, n, dt, gctx), "bwd dx only");
    t_cmp_any("dx only", &dx, TOL, 1);
    C->ctx_set_workspace(cctx, NULL, 0);
    free(cws);
    const long calls1 = lib_calls(1, dt);
    CHECK(!emulated || (calls0 >= 0 && calls1 - calls0 >= 7),
          "%s: %ld cuBLAS GEMMs in this type, want 7: the backend widened its operands", name,
          calls1 - calls0);
    t_free(&dx);
    t_free(&x);
    t_free(&w);
    t_free(&b);
    t_free(&dy);
}

static void test_linear(int m, int k, int n)
{
    for (int dt = BK_DTYPE_F32; dt <= BK_DTYPE_BF16; dt++) test_linear_dt(m, k, n, dt);
}

/* ---- normalisation ---- */

static void test_groupnorm(int n, int c, int hw, int groups, int affine)
{
    char name[64];
    snprintf(name, sizeof name, "groupnorm %dx%dx%d g%d%s", n, c, hw, groups, affine ? "" : " -");
    begin(name);
    size_t cnt = (size_t)n * c * hw;
    struct t x = t_in(cnt, 2.0), g = t_in(c, 1.0), b = t_in(c, 1.0);
    for (size_t i = 0; i < cnt; i++) x.h[i] += 0.7f; /* a mean away from zero */
    up(&x);
    struct t y = t_out(cnt), mu = t_out((size_t)n * groups), rs = t_out((size_t)n * groups);
    const float *gh = affine ? g.h : NULL, *bh = affine ? b.h : NULL;
    const float *gd = affine ? g.d : NULL, *bd = affine ? b.d : NULL;
    CHECK(C->groupnorm_fwd(y.h, mu.h, rs.h, x.h, gh, bh, n, c, hw, groups, 1e-5f, cctx) == 0,
          "cpu");
    gpu_ok(G->groupnorm_fwd(y.d, mu.d, rs.d, x.d, gd, bd, n, c, hw, groups, 1e-5f, gctx), "fwd");
    t_cmp("y", &y, TOL);
    t_cmp("mean", &mu, TOL);
    t_cmp("rstd", &rs, TOL);
    struct t dy = t_in(cnt, 1.0);
    for (int accum = 0; accum < 2; accum++) {
        struct t dx = accum ? t_acc(cnt, 1.0) : t_out(cnt);
        struct t dg = t_acc(c, 0.1), dbt = t_acc(c, 0.1);
        /* the statistics are the CPU's on both sides (upload them) */
        up(&mu);
        up(&rs);
        CHECK(C->groupnorm_bwd(dx.h, affine ? dg.h : NULL, affine ? dbt.h : NULL, dy.h, x.h, gh,
                               mu.h, rs.h, accum, n, c, hw, groups, cctx) == 0, "cpu");
        gpu_ok(G->groupnorm_bwd(dx.d, affine ? dg.d : NULL, affine ? dbt.d : NULL, dy.d, x.d, gd,
                                mu.d, rs.d, accum, n, c, hw, groups, gctx), "bwd");
        t_cmp(accum ? "dx+=" : "dx", &dx, TOL);
        if (affine) {
            t_cmp("dgamma+=", &dg, TOL);
            t_cmp("dbeta+=", &dbt, TOL);
        }
        t_free(&dx);
        t_free(&dg);
        t_free(&dbt);
    }
    t_free(&x), t_free(&g), t_free(&b), t_free(&y), t_free(&mu), t_free(&rs), t_free(&dy);
}

static void test_layernorm(int m, int d)
{
    char name[64];
    snprintf(name, sizeof name, "layernorm %dx%d", m, d);
    begin(name);
    size_t cnt = (size_t)m * d;
    struct t x = t_in(cnt, 2.0), g = t_in(d, 1.0), b = t_in(d, 1.0);
    struct t y = t_out(cnt), mu = t_out(m), rs = t_out(m);
    CHECK(C->layernorm_fwd(y.h, mu.h, rs.h, x.h, g.h, b.h, m, d, 1e-5f, cctx) == 0, "cpu");
    gpu_ok(G->layernorm_fwd(y.d, mu.d, rs.d, x.d, g.d, b.d, m, d, 1e-5f, gctx), "fwd");
    t_cmp("y", &y, TOL);
    t_cmp("mean", &mu, TOL);
    t_cmp("rstd", &rs, TOL);
    up(&mu);
    up(&rs);
    struct t dy = t_in(cnt, 1.0);
    for (int accum = 0; accum < 2; accum++) {
        struct t dx = accum ? t_acc(cnt, 1.0) : t_out(cnt);
        struct t dg = t_acc(d, 0.1), dbt = t_acc(d, 0.1);
        CHECK(C->layernorm_bwd(dx.h, dg.h, dbt.h, dy.h, x.h, g.h, mu.h, rs.h, accum, m, d, cctx) ==
                  0,
              "cpu");
        gpu_ok(G->layernorm_bwd(dx.d, dg.d, dbt.d, dy.d, x.d, g.d, mu.d, rs.d, accum, m, d, gctx),
               "bwd");
        t_cmp(accum ? "dx+=" : "dx", &dx, TOL);
        t_cmp("dgamma+=", &dg, TOL);
        t_cmp("dbeta+=", &dbt, TOL);
        t_free(&dx);
        t_free(&dg);
        t_free(&dbt);
    }
    t_free(&x), t_free(&g), t_free(&b), t_free(&y), t_free(&mu), t_free(&rs), t_free(&dy);
}

/* ---- element-wise ---- */

static void test_eltwise(size_t cnt)
{
    begin("eltwise");
    struct t x = t_in(cnt, 6.0), a = t_in(cnt, 1.0), dy = t_in(cnt, 1.0);
    x.h[0] = -100.0f; /* silu's overflow branch */
    x.h[1] = 40.0f;
    up(&x);
    struct t y;
    cur_op = "silu";
    y = t_out(cnt);
    C->silu_fwd(y.h, x.h, cnt, cctx);
    gpu_ok(G->silu_fwd(y.d, x.d, cnt, gctx), "fwd");
    t_cmp("y", &y, TOL);
    t_free(&y);
    cur_op = "gelu";
    y = t_out(cnt);
    C->gelu_fwd(y.h, x.h, cnt, cctx);
    gpu_ok(G->gelu_fwd(y.d, x.d, cnt, gctx), "fwd");
    t_cmp("y", &y, TOL);
    t_free(&y);
    for (int accum = 0; accum < 2; accum++) {
        cur_op = accum ? "silu bwd +=" : "silu bwd";
        y = accum ? t_acc(cnt, 1.0) : t_out(cnt);
        C->silu_bwd(y.h, dy.h, x.h, accum, cnt, cctx);
        gpu_ok(G->silu_bwd(y.d, dy.d, x.d, accum, cnt, gctx), "bwd");
        t_cmp("dx", &y, TOL);
        t_free(&y);
        cur_op = accum ? "gelu bwd +=" : "gelu bwd";
        y = accum ? t_acc(cnt, 1.0) : t_out(cnt);
        C->gelu_bwd(y.h, dy.h, x.h, accum, cnt, cctx);
        gpu_ok(G->gelu_bwd(y.d, dy.d, x.d, accum, cnt, gctx), "bwd");
        t_cmp("dx", &y, TOL);
        t_free(&y);
        cur_op = accum ? "copy_grad +=" : "copy_grad";
        y = accum ? t_acc(cnt, 1.0) : t_out(cnt);
        C->copy_grad(y.h, dy.h, accum, cnt, cctx);
        gpu_ok(G->copy_grad(y.d, dy.d, accum, cnt, gctx), "copy");
        t_cmp("dx", &y, TOL);
        t_free(&y);
    }
    cur_op = "add";
    y = t_out(cnt);
    C->add_fwd(y.h, x.h, a.h, cnt, cctx);
    gpu_ok(G->add_fwd(y.d, x.d, a.d, cnt, gctx), "add");
    t_cmp("y", &y, TOL);
    t_free(&y);
    cur_op = "scale";
    y = t_out(cnt);
    C->scale_fwd(y.h, x.h, -0.37f, cnt, cctx);
    gpu_ok(G->scale_fwd(y.d, x.d, -0.37f, cnt, gctx), "scale");
    t_cmp("y", &y, TOL);
    t_free(&y);
    t_free(&x), t_free(&a), t_free(&dy);
}

static void test_bcast(int n, int c, int hw)
{
    begin("add_bcast");
    size_t cnt = (size_t)n * c * hw;
    struct t x = t_in(cnt, 1.0), b = t_in((size_t)n * c, 1.0), dy = t_in(cnt, 1.0);
    struct t y = t_out(cnt);
    C->add_bcast_fwd(y.h, x.h, b.h, n, c, hw, cctx);
    gpu_ok(G->add_bcast_fwd(y.d, x.d, b.d, n, c, hw, gctx), "fwd");
    t_cmp("y", &y, TOL);
    for (int accum = 0; accum < 2; accum++) {
        struct t db = accum ? t_acc((size_t)n * c, 1.0) : t_out((size_t)n * c);
        C->add_bcast_bwd(db.h, dy.h, accum, n, c, hw, cctx);
        gpu_ok(G->add_bcast_bwd(db.d, dy.d, accum, n, c, hw, gctx), "bwd");
        t_cmp(accum ? "db+=" : "db", &db, TOL);
        t_free(&db);
    }
    t_free(&x), t_free(&b), t_free(&dy), t_free(&y);
}

/* ---- layout ---- */

static void test_layout(int n, int c1, int c2, int hw)
{
    begin("concat");
    size_t na = (size_t)n * c1 * hw, nb = (size_t)n * c2 * hw, ny = na + nb;
    struct t a = t_in(na, 1.0), b = t_in(nb, 1.0), y = t_out(ny), dy = t_in(ny, 1.0);
    C->concat_fwd(y.h, a.h, b.h, n, c1, c2, hw, cctx);
    gpu_ok(G->concat_fwd(y.d, a.d, b.d, n, c1, c2, hw, gctx), "fwd");
    t_cmp("y", &y, TOL);
    for (int v = 0; v < 3; v++) {
        /* v 0: both (=), 1: da += and db =, 2: da only */
        struct t da = v == 1 ? t_acc(na, 1.0) : t_out(na), db = t_out(nb);
        float *dbh = v == 2 ? NULL : db.h, *dbd = v == 2 ? NULL : db.d;
        C->concat_bwd(da.h, dbh, dy.h, v == 1, 0, n, c1, c2, hw, cctx);
        gpu_ok(G->concat_bwd(da.d, dbd, dy.d, v == 1, 0, n, c1, c2, hw, gctx), "bwd");
        t_cmp("da", &da, TOL);
        if (v == 2)
            t_untouched("db", &db); /* no db asked for */
        else
            t_cmp("db", &db, TOL);
        t_free(&da);
        t_free(&db);
    }
    t_free(&a), t_free(&b), t_free(&y), t_free(&dy);

    begin("transpose");
    int c = c1 + c2;
    struct t x = t_in((size_t)n * c * hw, 1.0);
    for (int accum = 0; accum < 2; accum++) {
        struct t t1 = accum ? t_acc(x.n, 1.0) : t_out(x.n);
        C->transpose_fwd(t1.h, x.h, accum, n, c, hw, cctx);
        gpu_ok(G->transpose_fwd(t1.d, x.d, accum, n, c, hw, gctx), "to tokens");
        t_cmp(accum ? "y+=" : "y", &t1, TOL);
        struct t t2 = accum ? t_acc(x.n, 1.0) : t_out(x.n);
        C->transpose_fwd(t2.h, x.h, accum, n, hw, c, cctx);
        gpu_ok(G->transpose_fwd(t2.d, x.d, accum, n, hw, c, gctx), "to image");
        t_cmp(accum ? "y'+=" : "y'", &t2, TOL);
        t_free(&t1);
        t_free(&t2);
    }
    t_free(&x);
}

/* ---- resampling ---- */

static void test_resample(int n, int c, int h, int w)
{
    char name[64];
    size_t ni = (size_t)n * c * h * w, no = ni * 4;
    snprintf(name, sizeof name, "nearest %dx%dx%dx%d", n, c, h, w);
    begin(name);
    struct t x = t_in(ni, 1.0), dy = t_in(no, 1.0), y = t_out(no);
    C->upsample_nearest2x_fwd(y.h, x.h, n, c, h, w, cctx);
    gpu_ok(G->upsample_nearest2x_fwd(y.d, x.d, n, c, h, w, gctx), "fwd");
    t_cmp("y", &y, TOL);
    t_free(&y);
    for (int accum = 0; accum < 2; accum++) {
        struct t dx = accum ? t_acc(ni, 1.0) : t_out(ni);
        C->upsample_nearest2x_bwd(dx.h, dy.h, accum, n, c, h, w, cctx);
        gpu_ok(G->upsample_nearest2x_bwd(dx.d, dy.d, accum, n, c, h, w, gctx), "bwd");
        t_cmp(accum ? "dx+=" : "dx", &dx, TOL);
        t_free(&dx);
    }
    for (int ac = 0; ac < 2; ac++) {
        snprintf(name, sizeof name, "bilinear ac%d %dx%dx%dx%d", ac, n, c, h, w);
        cur_op = name;
        y = t_out(no);
        C->upsample_bilinear2x_fwd(y.h, x.h, ac, n, c, h, w, cctx);
        gpu_ok(G->upsample_bilinear2x_fwd(y.d, x.d, ac, n, c, h, w, gctx), "fwd");
        t_cmp("y", &y, TOL);
        t_free(&y);
        for (int accum = 0; accum < 2; accum++) {
            struct t dx = accum ? t_acc(ni, 1.0) : t_out(ni);
            C->upsample_bilinear2x_bwd(dx.h, dy.h, ac, accum, n, c, h, w, cctx);
            gpu_ok(G->upsample_bilinear2x_bwd(dx.d, dy.d, ac, accum, n, c, h, w, gctx), "bwd");
            t_cmp(accum ? "dx+=" : "dx", &dx, TOL);
            t_free(&dx);
        }
    }
    t_free(&x), t_free(&dy);

    /* max pool, with ties (values on a coarse grid) */
    snprintf(name, sizeof name, "maxpool %dx%dx%dx%d", n, c, h, w);
    begin(name);
    x = t_in(ni, 1.0);
    for (size_t i = 0; i < ni; i++) x.h[i] = roundf(x.h[i] * 3.0f);
    up(&x);
    size_t np = (size_t)n * c * (h / 2) * (w / 2);
    y = t_out(np);
    C->maxpool2x2_fwd(y.h, x.h, n, c, h, w, cctx);
    gpu_ok(G->maxpool2x2_fwd(y.d, x.d, n, c, h, w, gctx), "fwd");
    t_cmp("y", &y, TOL);
    dy = t_in(np, 1.0);
    for (int accum = 0; accum < 2; accum++) {
        struct t dx = accum ? t_acc(ni, 1.0) : t_out(ni);
        C->maxpool2x2_bwd(dx.h, dy.h, x.h, accum, n, c, h, w, cctx);
        gpu_ok(G->maxpool2x2_bwd(dx.d, dy.d, x.d, accum, n, c, h, w, gctx), "bwd");
        t_cmp(accum ? "dx+=" : "dx", &dx, TOL);
        t_free(&dx);
    }
    t_free(&x), t_free(&y), t_free(&dy);
}

static void test_embed(int n, int dim, int flip, float shift)
{
    char name[64];
    snprintf(name, sizeof name, "timestep_embed %dx%d f%d s%g", n, dim, flip, shift);
    begin(name);
    struct t t = t_make(n), y = t_out((size_t)n * dim);
    for (int i = 0; i < n; i++) t.h[i] = (float)((i * 377) % 1000);
    up(&t);
    CHECK(C->timestep_embed_fwd(y.h, t.h, n, dim, flip, shift, 10000.0f, cctx) == 0, "cpu");
    gpu_ok(G->timestep_embed_fwd(y.d, t.d, n, dim, flip, shift, 10000.0f, gctx), "fwd");
    t_cmp("y", &y, TOL);
    t_free(&t), t_free(&y);
}

/* ---- attention ---- */

static void test_attention_dt(int n, int l, int heads, int d, int packed, int dt)
{
    char name[96];
    snprintf(name, sizeof name, "attention n%d l%d h%d d%d%s%s", n, l, heads, d,
             packed ? " packed" : "", dt_name(dt));
    begin(name);
    const int cdim = heads * d, ld = packed ? 3 * cdim : cdim;
    struct bk_attn s = {.n = n, .l = l, .heads = heads, .d = d, .ld = ld,
                        .scale = 1.0f / sqrtf((float)d), .dtype = dt};
    struct bk_attn s32 = s; /* the CPU's: fp32 on the 16-bit values */
    s32.dtype = BK_DTYPE_F32;
    size_t nrow = (size_t)n * l, nq = nrow * ld, no = nrow * cdim, nl = (size_t)n * heads * l;
    /* packed: one (N,L,3C) buffer; q, k, v are views at column offsets 0, C, 2C */
    struct t qkv = t_in_dt(packed ? nq : 3 * nq, 2.0, dt);
    const size_t koff = packed ? (size_t)cdim : nq, voff = packed ? 2 * (size_t)cdim : 2 * nq;
    const size_t es = bk_dtype_size(dt);
#define DV(t, off) ((char *)(t).d + (off) * es) /* a view into a device tensor of dt */
    struct t o = t_out_dt(no, dt), lse = t_out(nl), dout = t_in_dt(no, 1.0, dt);
    size_t cws = C->attn_ws_bytes(&s32, 1), gws = G->attn_ws_bytes(&s, 1);
    void *cw = malloc(cws ? cws : 64), *gw = dalloc(gws ? gws : 64);
    CHECK(typed_native(BK_HALF_ATTN | BK_HALF_ATTN_PLAIN, dt),
          "%s: the attention kernels are not native in this type", name);
    CHECK(C->attn_fwd(o.h, lse.h, qkv.h, qkv.h + koff, qkv.h + voff, cw, &s32, cctx) == 0, "cpu");
    const long mma0 = lib_calls(2, dt);
    gpu_ok(G->attn_fwd(o.d, lse.d, qkv.d, DV(qkv, koff), DV(qkv, voff), gw, &s, gctx),
           "tiled fwd");
    /* the tiled forward on tensor cores: 16-bit, D a multiple of 16 up to 128, the type's
     * compute capability (that of the libraries' 16-bit tensor cores: f16 sm_70, bf16 sm_80) */
    if (emulated && dt != BK_DTYPE_F32) {
        const int tc = d % 16 == 0 && d <= 128 && typed_native(BK_HALF_CONV, dt);
        const long mma = mma0 < 0 ? -1 : lib_calls(2, dt) - mma0;
        CHECK(tc ? mma > 0 : mma == 0, "%s: %ld warp MMAs in the tiled forward, want %s", name,
              mma, tc ? "some" : "none");
    }
    t_cmp_any("o", &o, TOL, 1);
    t_cmp("lse", &lse, TOL);
    /* the backward from the CPU's o (as stored: rounded to dt) and lse on both sides */
    t_round(&o);
    up(&o);
    up(&lse);
    struct t dqkv = t_out_dt(qkv.n, dt);
    CHECK(C->attn_bwd(dqkv.h, dqkv.h + koff, dqkv.h + voff, dout.h, qkv.h, qkv.h + koff,
                      qkv.h + voff, o.h, lse.h, cw, &s32, cctx) == 0, "cpu");
    const long bmma0 = lib_calls(2, dt);
    gpu_ok(G->attn_bwd(dqkv.d, DV(dqkv, koff), DV(dqkv, voff), dout.d, qkv.d, DV(qkv, koff),
                       DV(qkv, voff), o.d, lse.d, gw, &s, gctx), "tiled bwd");
    /* the FlashAttention-2 backward's Q K^T and dO V^T on tensor cores where the forward's are */
    if (emulated && dt != BK_DTYPE_F32) {
        const int tc = d % 16 == 0 && d <= 128 && typed_native(BK_HALF_CONV, dt);
        const long mma = bmma0 < 0 ? -1 : lib_calls(2, dt) - bmma0;
        CHECK(tc ? mma > 0 : mma == 0, "%s: %ld warp MMAs in the tiled backward, want %s", name,
              mma, tc ? "some" : "none");
    }
    t_cmp_any("dqkv", &dqkv, TOL, 1);
    free(cw);
    t_free(&dqkv);

    /* plain: batched GEMMs over all (n, head) pairs (one strided batch for one head, else one
     * batch of pointer arrays) where cuBLAS takes the type, the warp kernels elsewhere; cuBLAS
     * given the same workspace, as a plan's ctx_set_workspace does */
    cws = C->attn_ws_bytes(&s32, 0);
    gws = G->attn_ws_bytes(&s, 0);
    cw = malloc(cws ? cws : 64);
    gw = dalloc(gws ? gws : 64);
    gpu_ok(G->ctx_set_workspace(gctx, gw, gws), "ctx_set_workspace");
    /* 16-bit: dQ and dK are fp32 GEMMs (dS has no bound to split it into 16-bit halves by) */
    const long strided0 = lib_calls(3, dt) + (dt ? lib_calls(3, 0) : 0),
               ptrs0 = lib_calls(4, dt) + (dt ? lib_calls(4, 0) : 0);
    struct t o2 = t_out_dt(no, dt), p = t_out(nl * l);
    CHECK(C->attn_plain_fwd(o2.h, p.h, qkv.h, qkv.h + koff, qkv.h + voff, cw, &s32, cctx) == 0,
          "cpu");
    gpu_ok(G->attn_plain_fwd(o2.d, p.d, qkv.d, DV(qkv, koff), DV(qkv, voff), gw, &s, gctx),
           "plain fwd");
    t_cmp_any("o (plain)", &o2, TOL, 1);
    t_cmp("p", &p, TOL);
    up(&p);
    dqkv = t_out_dt(qkv.n, dt);
    CHECK(C->attn_plain_bwd(dqkv.h, dqkv.h + koff, dqkv.h + voff, dout.h, qkv.h, qkv.h + koff,
                            qkv.h + voff, p.h, cw, &s32, cctx) == 0, "cpu");
    gpu_ok(G->attn_plain_bwd(dqkv.d, DV(dqkv, koff), DV(dqkv, voff), dout.d, qkv.d,
                             DV(qkv, koff), DV(qkv, voff), p.d, gw, &s, gctx), "plain bwd");
    t_cmp_any("dqkv (plain)", &dqkv, TOL, 1);
    gpu_ok(G->ctx_set_workspace(gctx, NULL, 0), "ctx_set_workspace(NULL)");
    if (emulated) {
        /* per chunk of pairs the forward's GEMMs, S and O (16-bit: O in two), and the
         * backward's, dP, dV, dQ, dK (16-bit: dV in two), each one batched call */
        const long strided = lib_calls(3, dt) + (dt ? lib_calls(3, 0) : 0) - strided0,
                   ptrs = lib_calls(4, dt) + (dt ? lib_calls(4, 0) : 0) - ptrs0;
        const long per = typed_native(BK_HALF_LINEAR, dt) ? (dt ? 8 : 6) : 0;
        const long got = heads == 1 ? strided : ptrs, other = heads == 1 ? ptrs : strided;
        CHECK(other == 0 && (per ? got >= per && got % per == 0 : got == 0),
              "%s: %ld strided and %ld pointer-array batched GEMMs in the plain form (per chunk "
              "%ld, %s)", name, strided, ptrs, per, heads == 1 ? "strided" : "pointer arrays");
    }
#undef DV
    free(cw);
    t_free(&dqkv), t_free(&o2), t_free(&p), t_free(&qkv), t_free(&o), t_free(&lse), t_free(&dout);
}

static void test_attention(int n, int l, int heads, int d, int packed)
{
    for (int dt = BK_DTYPE_F32; dt <= BK_DTYPE_BF16; dt++)
        test_attention_dt(n, l, heads, d, packed, dt);
}

/* a fast-mode (parity off) context: the tiled attention's 16-bit operands on cuDNN's fused
 * attention where cuDNN has an engine for them */
static bk_ctx *gfast;
static int device_cc;

/* the GPU's 16-bit x against the CPU's fp32 result (not rounded): norm-wise relative error
 * under tol, every value finite */
static void t_cmp_near(const char *what, const struct t *x, double tol)
{
    const size_t n = x->n ? x->n : 1;
    uint16_t *g = malloc(n * 2);
    int rc = G->mem_download(g, x->d, x->n * 2, gctx);
    size_t bad = 0;
    double num = 0, den = 0;
    for (size_t i = 0; i < x->n; i++) {
        const float gv = from16(g[i], x->dt);
        bad += !isfinite(gv) || !isfinite(x->h[i]);
        if (isfinite(gv) && isfinite(x->h[i])) {
            num += ((double)gv - x->h[i]) * ((double)gv - x->h[i]);
            den += (double)x->h[i] * x->h[i];
        }
    }
    const double e = num == 0 ? 0 : sqrt(num) / (den > 1e-300 ? sqrt(den) : 1e-300);
    CHECK(rc == 0 && bad == 0 && e < tol, "%s %s: rel err %.3g (tol %.2g), %zu non-finite, n %zu",
          cur_op, what, e, tol, bad, x->n);
    if (getenv("TEST_GPU_VERBOSE")) printf("  %-44s %-8s rel err %.3g\n", cur_op, what, e);
    free(g);
}

/* cu_mem_alloc's warm-up (DDPMD_CUDA_WARM, on by default) runs a planned attention's library
 * calls before the job's reservation, as it does the convolutions' and linears': cuBLAS's
 * batched GEMMs (the plain form) and cuDNN's fused attention (the tiled form's 16-bit operands in
 * fast mode, sm_80 on) load their kernels at first use, which must not fall inside a step. Once
 * per planned shape: a second reservation runs nothing. The emulator counts the calls. */
static void test_attention_warm(int dt)
{
    static char name[64]; /* cur_op while the test runs */
    snprintf(name, sizeof name, "attention warm-up%s", dt_name(dt));
    begin(name);
    if (!emulated || getenv("DDPMD_CUDA_WARM")) return;
    struct bk_attn s = {.n = 2, .l = 24, .heads = 2, .d = 16, .ld = 96, .scale = 0.25f,
                        .dtype = dt};
    const int blas = dt == BK_DTYPE_F32 || typed_native(BK_HALF_LINEAR, dt);
    const int dnn = dt != BK_DTYPE_F32 && device_cc >= 80;
    /* first the shapes the tests before planned, so that the counts below are this one's */
    void *p0 = NULL;
    gpu_ok(G->mem_alloc(&p0, 4096, gctx), "reservation");
    G->mem_free(p0, gctx);
    gpu_ok(G->mem_alloc(&p0, 4096, gfast), "reservation (fast mode)");
    G->mem_free(p0, gfast);
    (void)G->attn_ws_bytes(&s, 0);
    G->set_parity(0);
    (void)G->attn_ws_bytes(&s, 1);
    G->set_parity(1);
    for (int again = 0; again < 2; again++) {
        const long b0 = lib_calls(3, dt) + lib_calls(4, dt), g0 = lib_calls(5, dt);
        void *p = NULL, *pf = NULL;
        gpu_ok(G->mem_alloc(&p, 4096, gctx), "reservation");
        const long b1 = lib_calls(3, dt) + lib_calls(4, dt);
        gpu_ok(G->mem_alloc(&pf, 4096, gfast), "reservation (fast mode)");
        const long g1 = lib_calls(5, dt);
        CHECK(b1 - b0 == (blas && !again ? 6 : 0),
              "%s: %ld batched GEMMs before the reservation, want %d", name, b1 - b0,
              blas && !again ? 6 : 0);
        CHECK(g1 - g0 == (dnn && !again ? 2 : 0),
              "%s: %ld cuDNN graphs run before the fast-mode reservation, want %d", name,
              g1 - g0, dnn && !again ? 2 : 0);
        G->mem_free(p, gctx);
        G->mem_free(pf, gfast);
    }
}

/* the tiled form in fast mode: cuDNN's fused attention where it has an engine (16-bit, sm_80
 * on, head dims multiples of 8 up to 128; the emulator counts its graphs run and refused), our
 * kernels elsewhere. cuDNN rounds P (and dS) to 16 bits before its second GEMMs, so its outputs
 * are checked against the CPU's unrounded fp32 result within 2u (u the unit roundoff: a product
 * of P's rounding is a relative error of about u), lse within 1e-5 as always. */
static void test_attention_fast(int n, int l, int heads, int d, int packed, int dt)
{
    char name[112];
    snprintf(name, sizeof name, "attention fast n%d l%d h%d d%d%s%s", n, l, heads, d,
             packed ? " packed" : "", dt_name(dt));
    begin(name);
    const int cdim = heads * d, ld = packed ? 3 * cdim : cdim;
    struct bk_attn s = {.n = n, .l = l, .heads = heads, .d = d, .ld = ld,
                        .scale = 1.0f / sqrtf((float)d), .dtype = dt};
    struct bk_attn s32 = s;
    s32.dtype = BK_DTYPE_F32;
    const size_t nrow = (size_t)n * l, nq = nrow * ld, no = nrow * cdim, nl = (size_t)n * heads * l;
    struct t qkv = t_in_dt(packed ? nq : 3 * nq, 2.0, dt);
    const size_t koff = packed ? (size_t)cdim : nq, voff = packed ? 2 * (size_t)cdim : 2 * nq;
    const size_t es = bk_dtype_size(dt);
#define DV(t, off) ((char *)(t).d + (off) * es)
    struct t o = t_out_dt(no, dt), lse = t_out(nl), dout = t_in_dt(no, 1.0, dt);
    const size_t cws = C->attn_ws_bytes(&s32, 1);
    const long refused0 = lib_calls(6, dt);
    G->set_parity(0); /* planning in fast mode builds cuDNN's graphs (their workspace) */
    const size_t gws = G->attn_ws_bytes(&s, 1);
    G->set_parity(1);
    void *cw = malloc(cws ? cws : 64), *gw = dalloc(gws ? gws : 64);
    const long run0 = lib_calls(5, dt);
    CHECK(C->attn_fwd(o.h, lse.h, qkv.h, qkv.h + koff, qkv.h + voff, cw, &s32, cctx) == 0, "cpu");
    gpu_ok(G->attn_fwd(o.d, lse.d, qkv.d, DV(qkv, koff), DV(qkv, voff), gw, &s, gfast), "fwd");
    const int dnn = dt != BK_DTYPE_F32 && device_cc >= 80 && d % 8 == 0 && d <= 128;
    const double u = dt == BK_DTYPE_BF16 ? 1.0 / 256 : 1.0 / 2048;
    if (dnn)
        t_cmp_near("o", &o, 2 * u);
    else
        t_cmp_any("o", &o, TOL, 1);
    t_cmp("lse", &lse, TOL);
    t_round(&o);
    up(&o);
    up(&lse);
    struct t dqkv = t_out_dt(qkv.n, dt);
    CHECK(C->attn_bwd(dqkv.h, dqkv.h + koff, dqkv.h + voff, dout.h, qkv.h, qkv.h + koff,
                      qkv.h + voff, o.h, lse.h, cw, &s32, cctx) == 0, "cpu");
    gpu_ok(G->attn_bwd(dqkv.d, DV(dqkv, koff), DV(dqkv, voff), dout.d, qkv.d, DV(qkv, koff),
                       DV(qkv, voff), o.d, lse.d, gw, &s, gfast), "bwd");
    if (dnn)
        t_cmp_near("dqkv", &dqkv, 2 * u);
    else
        t_cmp_any("dqkv", &dqkv, TOL, 1);
#undef DV
    if (emulated) {
        /* run where it has an engine; refused by the emulated cuDNN itself beyond 128 and below
         * sm_80 (the frontend refuses head dims off multiples of 8 before it sees them) */
        const long runs = lib_calls(5, dt) - run0, refused = lib_calls(6, dt) - refused0;
        CHECK(runs == (dnn ? 2 : 0), "%s: %ld cuDNN graphs run, want %d", name, runs,
              dnn ? 2 : 0);
        if (dt != BK_DTYPE_F32 && d % 8 == 0 && !dnn)
            CHECK(refused > 0, "%s: the emulated cuDNN did not refuse it", name);
    }
    free(cw);
    t_free(&dqkv), t_free(&qkv), t_free(&o), t_free(&lse), t_free(&dout);
}

/* ---- losses, dropout ---- */

static void test_losses(size_t cnt, int rows, int k)
{
    begin("mse");
    struct t pred = t_in(cnt, 1.0), tgt = t_in(cnt, 1.0), loss = t_out(1);
    C->mse_fwd(loss.h, pred.h, tgt.h, cnt, cctx);
    gpu_ok(G->mse_fwd(loss.d, pred.d, tgt.d, cnt, gctx), "fwd");
    t_cmp("loss", &loss, TOL);
    for (int accum = 0; accum < 2; accum++) {
        struct t dp = accum ? t_acc(cnt, 1.0) : t_out(cnt);
        C->mse_bwd(dp.h, pred.h, tgt.h, 0.5f, accum, cnt, cctx);
        gpu_ok(G->mse_bwd(dp.d, pred.d, tgt.d, 0.5f, accum, cnt, gctx), "bwd");
        t_cmp(accum ? "dpred+=" : "dpred", &dp, TOL);
        t_free(&dp);
    }
    t_free(&pred), t_free(&tgt), t_free(&loss);

    begin("xent");
    size_t nk = (size_t)rows * k;
    struct t z = t_in(nk, 4.0), tg = t_make(nk), l2 = t_out(1), prob = t_out(nk);
    memset(tg.h, 0, nk * 4);
    for (int i = 0; i < rows; i++) tg.h[(size_t)i * k + (i * 7) % k] = 1.0f; /* one-hot */
    up(&tg);
    C->xent_fwd(l2.h, prob.h, z.h, tg.h, rows, k, cctx);
    gpu_ok(G->xent_fwd(l2.d, prob.d, z.d, tg.d, rows, k, gctx), "fwd");
    t_cmp("loss", &l2, TOL);
    t_cmp("prob", &prob, TOL);
    up(&prob);
    for (int accum = 0; accum < 2; accum++) {
        struct t dz = accum ? t_acc(nk, 1.0) : t_out(nk);
        C->xent_bwd(dz.h, prob.h, tg.h, 2.0f, accum, rows, k, cctx);
        gpu_ok(G->xent_bwd(dz.d, prob.d, tg.d, 2.0f, accum, rows, k, gctx), "bwd");
        t_cmp(accum ? "dlogits+=" : "dlogits", &dz, TOL);
        t_free(&dz);
    }
    t_free(&z), t_free(&tg), t_free(&l2), t_free(&prob);
}

static void test_dropout(int n, size_t per_sample, float p)
{
    char name[64];
    snprintf(name, sizeof name, "dropout p%.2f", p);
    begin(name);
    size_t cnt = (size_t)n * per_sample;
    struct t x = t_in(cnt, 1.0), y = t_out(cnt);
    C->dropout_fwd(y.h, x.h, p, 1234, 77, 5, 3, n, per_sample, 0, cctx);
    gpu_ok(G->dropout_fwd(y.d, x.d, p, 1234, 77, 5, 3, n, per_sample, 0, gctx), "fwd");
    t_cmp("y", &y, TOL);
    /* the masks are equal, so the outputs are bit-identical */
    float *g = malloc(cnt * 4);
    G->mem_download(g, y.d, cnt * 4, gctx);
    CHECK(memcmp(g, y.h, cnt * 4) == 0, "%s: the GPU's mask differs from the CPU's", name);
    free(g);
    for (int accum = 0; accum < 2; accum++) {
        struct t dx = accum ? t_acc(cnt, 1.0) : t_out(cnt);
        C->dropout_bwd(dx.h, x.h, p, 1234, 77, 5, 3, accum, n, per_sample, 0, cctx);
        gpu_ok(G->dropout_bwd(dx.d, x.d, p, 1234, 77, 5, 3, accum, n, per_sample, 0, gctx), "bwd");
        t_cmp(accum ? "dx+=" : "dx", &dx, TOL);
        t_free(&dx);
    }
    t_free(&x), t_free(&y);
}

/* ---- the typed memory-bound kernels (backend.typed) in f32, bf16 and f16 ---- */

#define TK (G->typed)

/* an fp32 output within TOL; a 16-bit one by t_cmp16 (every element rounded once) */
static void t_cmp_dt(const char *what, const struct t *x) { t_cmp_any(what, x, TOL, 1); }

static void test_eltwise_dt(size_t cnt, int dt)
{
    char name[64];
    begin("typed eltwise");
    struct t x = t_in_dt(cnt, 6.0, dt), a = t_in_dt(cnt, 1.0, dt), dy = t_in_dt(cnt, 1.0, dt);
    x.h[0] = -100.0f; /* silu's overflow branch */
    x.h[1] = 40.0f;
    up(&x);
    struct t y;
#define EW_NAME(op) (snprintf(name, sizeof name, "typed %s%s", op, dt_name(dt)), cur_op = name)
    EW_NAME("silu");
    y = t_out_dt(cnt, dt);
    C->silu_fwd(y.h, x.h, cnt, cctx);
    gpu_ok(TK->silu_fwd(y.d, x.d, cnt, dt, gctx), "fwd");
    t_cmp_dt("y", &y);
    t_free(&y);
    EW_NAME("gelu");
    y = t_out_dt(cnt, dt);
    C->gelu_fwd(y.h, x.h, cnt, cctx);
    gpu_ok(TK->gelu_fwd(y.d, x.d, cnt, dt, gctx), "fwd");
    t_cmp_dt("y", &y);
    t_free(&y);
    for (int accum = 0; accum < 2; accum++) {
        EW_NAME(accum ? "silu bwd +=" : "silu bwd");
        y = accum ? t_acc_dt(cnt, 1.0, dt) : t_out_dt(cnt, dt);
        C->silu_bwd(y.h, dy.h, x.h, accum, cnt, cctx);
        gpu_ok(TK->silu_bwd(y.d, dy.d, x.d, accum, cnt, dt, gctx), "bwd");
        t_cmp_dt("dx", &y);
        t_free(&y);
        EW_NAME(accum ? "gelu bwd +=" : "gelu bwd");
        y = accum ? t_acc_dt(cnt, 1.0, dt) : t_out_dt(cnt, dt);
        C->gelu_bwd(y.h, dy.h, x.h, accum, cnt, cctx);
        gpu_ok(TK->gelu_bwd(y.d, dy.d, x.d, accum, cnt, dt, gctx), "bwd");
        t_cmp_dt("dx", &y);
        t_free(&y);
        EW_NAME(accum ? "copy_grad +=" : "copy_grad");
        y = accum ? t_acc_dt(cnt, 1.0, dt) : t_out_dt(cnt, dt);
        C->copy_grad(y.h, dy.h, accum, cnt, cctx);
        gpu_ok(TK->copy_grad(y.d, dy.d, accum, cnt, dt, gctx), "copy");
        t_cmp_dt("dx", &y);
        t_free(&y);
    }
    EW_NAME("add");
    y = t_out_dt(cnt, dt);
    C->add_fwd(y.h, x.h, a.h, cnt, cctx);
    gpu_ok(TK->add_fwd(y.d, x.d, a.d, cnt, dt, gctx), "add");
    t_cmp_dt("y", &y);
    t_free(&y);
    EW_NAME("scale");
    y = t_out_dt(cnt, dt);
    C->scale_fwd(y.h, x.h, -0.37f, cnt, cctx);
    gpu_ok(TK->scale_fwd(y.d, x.d, -0.37f, cnt, dt, gctx), "scale");
    t_cmp_dt("y", &y);
    t_free(&y);
    /* misaligned operands (one element in): the element-wise path */
    EW_NAME("add, misaligned");
    const size_t es = bk_dtype_size(dt);
    y = t_out_dt(cnt, dt);
    C->add_fwd(y.h + 1, x.h + 1, a.h + 1, cnt - 1, cctx);
    y.h[0] = 0.0f;
    gpu_ok(G->mem_upload(y.d, dt == BK_DTYPE_F32 ? (const void *)y.h : (const void *)"\0\0", es,
                         gctx), "zero");
    gpu_ok(TK->add_fwd((char *)y.d + es, (char *)x.d + es, (char *)a.d + es, cnt - 1, dt, gctx),
           "add");
    t_cmp_dt("y", &y);
    t_free(&y);
#undef EW_NAME
    t_free(&x), t_free(&a), t_free(&dy);
}

static void test_bcast_dt(int n, int c, int hw, int dt)
{
    char name[64];
    snprintf(name, sizeof name, "typed add_bcast %dx%dx%d%s", n, c, hw, dt_name(dt));
    begin(name);
    size_t cnt = (size_t)n * c * hw;
    struct t x = t_in_dt(cnt, 1.0, dt), b = t_in_dt((size_t)n * c, 1.0, dt),
             dy = t_in_dt(cnt, 1.0, dt), y = t_out_dt(cnt, dt);
    C->add_bcast_fwd(y.h, x.h, b.h, n, c, hw, cctx);
    gpu_ok(TK->add_bcast_fwd(y.d, x.d, b.d, n, c, hw, dt, gctx), "fwd");
    t_cmp_dt("y", &y);
    for (int accum = 0; accum < 2; accum++) {
        struct t db = accum ? t_acc_dt((size_t)n * c, 1.0, dt) : t_out_dt((size_t)n * c, dt);
        C->add_bcast_bwd(db.h, dy.h, accum, n, c, hw, cctx);
        gpu_ok(TK->add_bcast_bwd(db.d, dy.d, accum, n, c, hw, dt, gctx), "bwd");
        t_cmp_dt(accum ? "db+=" : "db", &db);
        t_free(&db);
    }
    t_free(&x), t_free(&b), t_free(&dy), t_free(&y);
}

static void test_layout_dt(int n, int c1, int c2, int hw, int dt)
{
    char name[64];
    snprintf(name, sizeof name, "typed concat %dx(%d+%d)x%d%s", n, c1, c2, hw, dt_name(dt));
    begin(name);
    size_t na = (size_t)n * c1 * hw, nb = (size_t)n * c2 * hw, ny = na + nb;
    struct t a = t_in_dt(na, 1.0, dt), b = t_in_dt(nb, 1.0, dt), y = t_out_dt(ny, dt),
             dy = t_in_dt(ny, 1.0, dt);
    C->concat_fwd(y.h, a.h, b.h, n, c1, c2, hw, cctx);
    gpu_ok(TK->concat_fwd(y.d, a.d, b.d, n, c1, c2, hw, dt, gctx), "fwd");
    t_cmp_dt("y", &y);
    for (int v = 0; v < 3; v++) {
        /* v 0: both (=), 1: da += and db =, 2: da only */
        struct t da = v == 1 ? t_acc_dt(na, 1.0, dt) : t_out_dt(na, dt), db = t_out_dt(nb, dt);
        C->concat_bwd(da.h, v == 2 ? NULL : db.h, dy.h, v == 1, 0, n, c1, c2, hw, cctx);
        gpu_ok(TK->concat_bwd(da.d, v == 2 ? NULL : db.d, dy.d, v == 1, 0, n, c1, c2, hw, dt,
                              gctx), "bwd");
        t_cmp_dt("da", &da);
        if (v != 2) t_cmp_dt("db", &db);
        t_free(&da);
        t_free(&db);
    }
    t_free(&a), t_free(&b), t_free(&y), t_free(&dy);
    snprintf(name, sizeof name, "typed transpose %dx%dx%d%s", n, c1 + c2, hw, dt_name(dt));
    begin(name);
    const int c = c1 + c2;
    struct t x = t_in_dt((size_t)n * c * hw, 1.0, dt);
    for (int accum = 0; accum < 2; accum++) {
        struct t t1 = accum ? t_acc_dt(x.n, 1.0, dt) : t_out_dt(x.n, dt);
        C->transpose_fwd(t1.h, x.h, accum, n, c, hw, cctx);
        gpu_ok(TK->transpose_fwd(t1.d, x.d, accum, n, c, hw, dt, gctx), "transpose");
        t_cmp_dt(accum ? "y+=" : "y", &t1);
        t_free(&t1);
    }
    t_free(&x);
}

static void test_resample_dt(int n, int c, int h, int w, int dt)
{
    char name[80];
    size_t ni = (size_t)n * c * h * w, no = ni * 4, np = (size_t)n * c * (h / 2) * (w / 2);
    snprintf(name, sizeof name, "typed resample %dx%dx%dx%d%s", n, c, h, w, dt_name(dt));
    begin(name);
    struct t x = t_in_dt(ni, 1.0, dt), dy = t_in_dt(no, 1.0, dt), y = t_out_dt(no, dt);
    C->upsample_nearest2x_fwd(y.h, x.h, n, c, h, w, cctx);
    gpu_ok(TK->upsample_nearest2x_fwd(y.d, x.d, n, c, h, w, dt, gctx), "nearest fwd");
    t_cmp_dt("nearest y", &y);
    t_free(&y);
    for (int accum = 0; accum < 2; accum++) {
        struct t dx = accum ? t_acc_dt(ni, 1.0, dt) : t_out_dt(ni, dt);
        C->upsample_nearest2x_bwd(dx.h, dy.h, accum, n, c, h, w, cctx);
        gpu_ok(TK->upsample_nearest2x_bwd(dx.d, dy.d, accum, n, c, h, w, dt, gctx),
               "nearest bwd");
        t_cmp_dt(accum ? "nearest dx+=" : "nearest dx", &dx);
        t_free(&dx);
    }
    for (int ac = 0; ac < 2; ac++) {
        y = t_out_dt(no, dt);
        C->upsample_bilinear2x_fwd(y.h, x.h, ac, n, c, h, w, cctx);
        gpu_ok(TK->upsample_bilinear2x_fwd(y.d, x.d, ac, n, c, h, w, dt, gctx), "bilinear fwd");
        t_cmp_dt(ac ? "bilinear ac y" : "bilinear y", &y);
        t_free(&y);
        for (int accum = 0; accum < 2; accum++) {
            struct t dx = accum ? t_acc_dt(ni, 1.0, dt) : t_out_dt(ni, dt);
            C->upsample_bilinear2x_bwd(dx.h, dy.h, ac, accum, n, c, h, w, cctx);
            gpu_ok(TK->upsample_bilinear2x_bwd(dx.d, dy.d, ac, accum, n, c, h, w, dt, gctx),
                   "bilinear bwd");
            t_cmp_dt(accum ? "bilinear dx+=" : "bilinear dx", &dx);
            t_free(&dx);
        }
    }
    t_free(&x), t_free(&dy);
    /* max pool, with ties (values on a coarse grid) */
    x = t_in_dt(ni, 1.0, dt);
    for (size_t i = 0; i < ni; i++) x.h[i] = roundf(x.h[i] * 3.0f);
    up(&x);
    y = t_out_dt(np, dt);
    C->maxpool2x2_fwd(y.h, x.h, n, c, h, w, cctx);
    gpu_ok(TK->maxpool2x2_fwd(y.d, x.d, n, c, h, w, dt, gctx), "maxpool fwd");
    t_cmp_dt("maxpool y", &y);
    dy = t_in_dt(np, 1.0, dt);
    for (int accum = 0; accum < 2; accum++) {
        struct t dx = accum ? t_acc_dt(ni, 1.0, dt) : t_out_dt(ni, dt);
        C->maxpool2x2_bwd(dx.h, dy.h, x.h, accum, n, c, h, w, cctx);
        gpu_ok(TK->maxpool2x2_bwd(dx.d, dy.d, x.d, accum, n, c, h, w, dt, gctx), "maxpool bwd");
        t_cmp_dt(accum ? "maxpool dx+=" : "maxpool dx", &dx);
        t_free(&dx);
    }
    t_free(&x), t_free(&y), t_free(&dy);
}

/* dropout masks over NHWC images (channels: the NCHW element order the masks are drawn in) and
 * flat tensors (channels 0): the same masks, so the same values before the rounding */
static void test_dropout_dt(int n, int channels, size_t per_sample, float p, int dt)
{
    char name[80];
    snprintf(name, sizeof name, "typed dropout p%.2f c%d x%zu%s", p, channels, per_sample,
             dt_name(dt));
    begin(name);
    size_t cnt = (size_t)n * per_sample;
    struct t x = t_in_dt(cnt, 1.0, dt), y = t_out_dt(cnt, dt);
    C->dropout_fwd(y.h, x.h, p, 1234, 77, 5, 3, n, per_sample, channels, cctx);
    gpu_ok(TK->dropout_fwd(y.d, x.d, p, 1234, 77, 5, 3, n, per_sample, channels, dt, gctx),
           "fwd");
    t_cmp_dt("y", &y);
    for (int accum = 0; accum < 2; accum++) {
        struct t dx = accum ? t_acc_dt(cnt, 1.0, dt) : t_out_dt(cnt, dt);
        C->dropout_bwd(dx.h, x.h, p, 1234, 77, 5, 3, accum, n, per_sample, channels, cctx);
        gpu_ok(TK->dropout_bwd(dx.d, x.d, p, 1234, 77, 5, 3, accum, n, per_sample, channels, dt,
                               gctx), "bwd");
        t_cmp_dt(accum ? "dx+=" : "dx", &dx);
        t_free(&dx);
    }
    /* every masked element is an exact zero on the GPU where the CPU has one */
    if (dt == BK_DTYPE_F32 && p > 0.0f) {
        float *g = malloc(cnt * 4);
        G->mem_download(g, y.d, cnt * 4, gctx);
        size_t bad = 0;
        for (size_t i = 0; i < cnt; i++) bad += (g[i] == 0.0f) != (y.h[i] == 0.0f);
        CHECK(bad == 0, "%s: %zu elements masked on one backend only", name, bad);
        free(g);
    }
    t_free(&x), t_free(&y);
}

static void test_layernorm_dt(int m, int d, int dt)
{
    char name[64];
    snprintf(name, sizeof name, "typed layernorm %dx%d%s", m, d, dt_name(dt));
    begin(name);
    size_t cnt = (size_t)m * d;
    struct t x = t_in_dt(cnt, 2.0, dt), g = t_in(d, 1.0), b = t_in(d, 1.0);
    struct t y = t_out_dt(cnt, dt), mu = t_out(m), rs = t_out(m);
    CHECK(C->layernorm_fwd(y.h, mu.h, rs.h, x.h, g.h, b.h, m, d, 1e-5f, cctx) == 0, "cpu");
    gpu_ok(TK->layernorm_fwd(y.d, mu.d, rs.d, x.d, g.d, b.d, m, d, 1e-5f, dt, gctx), "fwd");
    t_cmp_dt("y", &y);
    t_cmp("mean", &mu, TOL);
    t_cmp("rstd", &rs, TOL);
    up(&mu);
    up(&rs);
    struct t dy = t_in_dt(cnt, 1.0, dt);
    for (int accum = 0; accum < 2; accum++) {
        struct t dx = accum ? t_acc_dt(cnt, 1.0, dt) : t_out_dt(cnt, dt);
        struct t dg = t_acc(d, 0.1), dbt = t_acc(d, 0.1);
        CHECK(C->layernorm_bwd(dx.h, dg.h, dbt.h, dy.h, x.h, g.h, mu.h, rs.h, accum, m, d, cctx) ==
                  0, "cpu");
        gpu_ok(TK->layernorm_bwd(dx.d, dg.d, dbt.d, dy.d, x.d, g.d, mu.d, rs.d, accum, m, d, dt,
                                 gctx), "bwd");
        t_cmp_dt(accum ? "dx+=" : "dx", &dx);
        t_cmp("dgamma+=", &dg, TOL);
        t_cmp("dbeta+=", &dbt, TOL);
        t_free(&dx);
        t_free(&dg);
        t_free(&dbt);
    }
    t_free(&x), t_free(&g), t_free(&b), t_free(&y), t_free(&mu), t_free(&rs), t_free(&dy);
}

/* The typed group norm, plain and with SiLU, and the adds fused into it, against the CPU's
 * unfused ops with the executor's roundings in between (t_round):
 *   forward:  x' = round(x + xb) (stored to xo), y = round(act(gn(x'))), then round(y + yb) or
 *             round(yr + y);
 *   backward: dx (=/+=) of act(gn(x)), dgamma, dbeta +=, db (=/+=) = the sum over the pixels
 *             of dx as stored (the add before the norm) or of dy (the add after it).
 * fuse: 0 plain, 1 xb (add before), 2 yb (add after), 3 yr (residual add after). */
static void test_groupnorm_dt(int n, int c, int hw, int groups, int affine, int silu, int fuse,
                              int dt)
{
    char name[96];
    snprintf(name, sizeof name, "typed groupnorm %dx%dx%d g%d%s%s%s%s", n, c, hw, groups,
             affine ? "" : " -", silu ? " silu" : "", fuse == 1 ? " +b before" :
             fuse == 2 ? " +b after" : fuse == 3 ? " +r after" : "", dt_name(dt));
    begin(name);
    const size_t cnt = (size_t)n * c * hw, nc = (size_t)n * c, ng = (size_t)n * groups;
    const struct bk_groupnorm s = {n, c, hw, groups, 1e-5f, silu, dt};
    void *gws = dalloc(TK->groupnorm_ws_bytes(&s, 1) + TK->groupnorm_ws_bytes(&s, 0) + 64);
    struct t x = t_in_dt(cnt, 2.0, dt), g = t_in(c, 1.0), b = t_in(c, 1.0);
    struct t xb = t_in_dt(nc, 1.0, dt), yb = t_in_dt(nc, 1.0, dt), yr = t_in_dt(cnt, 1.0, dt);
    for (size_t i = 0; i < cnt; i++) x.h[i] += 0.7f; /* a mean away from zero */
    t_round(&x);
    up(&x);
    const float *gh = affine ? g.h : NULL, *bh = affine ? b.h : NULL;
    const float *gd = affine ? g.d : NULL, *bd = affine ? b.d : NULL;
    /* the CPU: the add before, rounded (the norm's input), then the norm, rounded */
    struct t xo = t_out_dt(cnt, dt);
    const float *xin = x.h;
    if (fuse == 1) {
        C->add_bcast_fwd(xo.h, x.h, xb.h, n, c, hw, cctx);
        t_round(&xo);
        xin = xo.h;
    }
    struct t y = t_out_dt(cnt, dt), mu = t_out(ng), rs = t_out(ng);
    CHECK((silu ? C->groupnorm_silu_fwd : C->groupnorm_fwd)(y.h, mu.h, rs.h, xin, gh, bh, n, c,
                                                            hw, groups, 1e-5f, cctx) == 0, "cpu");
    if (fuse == 2) {
        t_round(&y);
        C->add_bcast_fwd(y.h, y.h, yb.h, n, c, hw, cctx);
    } else if (fuse == 3) {
        t_round(&y);
        C->add_fwd(y.h, yr.h, y.h, cnt, cctx);
    }
    gpu_ok(TK->groupnorm_fwd(y.d, mu.d, rs.d, fuse == 1 ? xo.d : NULL, x.d,
                             fuse == 1 ? xb.d : NULL, fuse == 2 ? yb.d : NULL,
                             fuse == 3 ? yr.d : NULL, gd, bd, gws, &s, gctx), "fwd");
    if (fuse == 1) t_cmp_dt("x + b", &xo);
    t_cmp_dt("y", &y);
    t_cmp("mean", &mu, TOL);
    t_cmp("rstd", &rs, TOL);
    /* the backward from the CPU's statistics on both sides; its x is the norm's input */
    up(&mu);
    up(&rs);
    struct t xn = fuse == 1 ? xo : x;
    if (fuse == 1) up(&xn);
    struct t dy = t_in_dt(cnt, 1.0, dt);
    const size_t cws_bytes = C->groupnorm_bwd_ws_bytes(n, c, hw, groups, silu);
    void *cws = malloc(cws_bytes ? cws_bytes : 64);
    for (int accum = 0; accum < 2; accum++) {
        struct t dx = accum ? t_acc_dt(cnt, 1.0, dt) : t_out_dt(cnt, dt);
        struct t dg = t_acc(c, 0.1), dbt = t_acc(c, 0.1);
        struct t db = accum ? t_acc_dt(nc, 1.0, dt) : t_out_dt(nc, dt);
        CHECK(C->groupnorm_bwd_ws(dx.h, affine ? dg.h : NULL, affine ? dbt.h : NULL, dy.h, xn.h,
                                  gh, bh, mu.h, rs.h, accum, n, c, hw, groups, silu, cws,
                                  cctx) == 0, "cpu");
        t_round(&dx);
        /* the residual add's backward is a copy: nothing fused into the norm's */
        const int fb = fuse == 1 || fuse == 2;
        if (fb) C->add_bcast_bwd(db.h, fuse == 1 ? dx.h : dy.h, accum, n, c, hw, cctx);
        gpu_ok(TK->groupnorm_bwd(dx.d, affine ? dg.d : NULL, affine ? dbt.d : NULL,
                                 fb ? db.d : NULL, dy.d, xn.d, gd, bd, mu.d, rs.d, accum, accum,
                                 fuse == 1, gws, &s, gctx), "bwd");
        t_cmp_dt(accum ? "dx+=" : "dx", &dx);
        if (affine) {
            t_cmp("dgamma+=", &dg, TOL);
            t_cmp("dbeta+=", &dbt, TOL);
        }
        if (fb) t_cmp_dt(accum ? "db+=" : "db", &db);
        t_free(&dx), t_free(&dg), t_free(&dbt), t_free(&db);
    }
    free(cws);
    t_free(&x), t_free(&g), t_free(&b), t_free(&xb), t_free(&yb), t_free(&yr), t_free(&xo);
    t_free(&y);
    t_free(&mu), t_free(&rs), t_free(&dy);
}

/* every typed memory-bound kernel in every type, odd sizes (the element-wise paths) and
 * multiples of the 16-byte vectors */
static void test_typed(void)
{
    for (int dt = BK_DTYPE_F32; dt <= BK_DTYPE_BF16; dt++) {
        test_eltwise_dt(100003, dt);
        test_bcast_dt(3, 17, 45, dt);
        test_bcast_dt(2, 64, 36, dt);
        test_layout_dt(2, 5, 7, 45, dt);
        test_layout_dt(2, 16, 24, 20, dt);
        test_resample_dt(2, 3, 5, 7, dt);
        test_resample_dt(2, 16, 6, 8, dt);
        test_dropout_dt(3, 0, 1001, 0.1f, dt);
        test_dropout_dt(2, 8, 8 * 36, 0.2f, dt);  /* HW 36: a Philox block per 4 pixels */
        test_dropout_dt(2, 3, 3 * 25, 0.3f, dt);  /* HW 25: a block per element */
        test_dropout_dt(2, 16, 16 * 9, 0.0f, dt); /* p 0: a copy */
        test_layernorm_dt(37, 48, dt);
        test_layernorm_dt(20, 13, dt);
        for (int fuse = 0; fuse < 4; fuse++) {
            test_groupnorm_dt(2, 16, 64, 4, 1, 1, fuse, dt);
            test_groupnorm_dt(3, 12, 25, 3, fuse != 1, 0, fuse, dt);
        }
        test_groupnorm_dt(2, 64, 100, 1, 1, 0, 0, dt);     /* one group (seed) */
        /* chunks of many pixels (cpg > 1: with one channel per group the sum of dx over a
         * channel is zero, its db rounding noise) */
        test_groupnorm_dt(1, 32, 1000, 8, 1, 1, 1, dt);
        test_groupnorm_dt(2, 24, 17, 8, 1, 1, 2, dt);      /* cpg 3 across a vector */
    }
}

/* ---- optimizer ---- */

static void test_optim(size_t cnt)
{
    begin("sumsq");
    struct t g = t_in(cnt, 1.0);
    double sc = 0, sg = 0;
    C->sumsq(&sc, g.h, cnt, cctx);
    gpu_ok(G->sumsq(&sg, g.d, cnt, gctx), "sumsq");
    CHECK(fabs(sg - sc) <= 1e-12 * sc, "sumsq: %.17g vs %.17g", sg, sc);

    cur_op = "adamw";
    struct t w = t_in(cnt, 1.0), m = t_in(cnt, 0.1), v = t_in(cnt, 0.01);
    for (size_t i = 0; i < cnt; i++) v.h[i] = fabsf(v.h[i]);
    up(&v);
    struct bk_adamw h = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                         .weight_decay = 0.01f, .bias_c1 = 0.271f, .bias_c2_sqrt = 0.0632f};
    C->adamw_step(w.h, m.h, v.h, g.h, 0.8f, &h, cnt, cctx);
    gpu_ok(G->adamw_step(w.d, m.d, v.d, g.d, 0.8f, &h, cnt, gctx), "adamw");
    t_cmp("w", &w, TOL);
    t_cmp("m", &m, TOL);
    t_cmp("v", &v, TOL);

    cur_op = "ema";
    struct t e = t_in(cnt, 1.0), w2 = t_in(cnt, 1.0);
    for (int k = 0; k < 2; k++) {
        float decay = k ? 0.0f : 0.999f;
        C->ema_update(e.h, w2.h, decay, cnt, cctx);
        gpu_ok(G->ema_update(e.d, w2.d, decay, cnt, gctx), "ema");
        t_cmp(k ? "ema (decay 0)" : "ema", &e, TOL);
    }
    t_free(&g), t_free(&w), t_free(&m), t_free(&v), t_free(&e), t_free(&w2);
}

/* ---- Philox on the device against philox.h on the host ---- */

static void test_philox(int n, size_t per_sample)
{
    begin("philox");
    size_t cnt = (size_t)n * per_sample;
    uint32_t *ud = dalloc(cnt * 4), *uh = malloc(cnt * 4);
    float *zd = dalloc(cnt * 4), *zh = malloc(cnt * 4);
    gpu_ok(G->philox_u32_fill(ud, 99, PHILOX_TAG_NOISE, 12345678901ull, 3, 7, n, per_sample, gctx),
           "u32 fill");
    gpu_ok(G->philox_normal_fill(zd, 99, PHILOX_TAG_NOISE, 12345678901ull, 3, 7, n, per_sample,
                                 gctx), "normal fill");
    G->mem_download(uh, ud, cnt * 4, gctx);
    G->mem_download(zh, zd, cnt * 4, gctx);
    size_t bad_u = 0, bad_z = 0;
    double worst = 0;
    for (int s = 0; s < n; s++)
        for (size_t e = 0; e < per_sample; e++) {
            size_t i = (size_t)s * per_sample + e;
            bad_u += uh[i] != philox_u32_at(99, PHILOX_TAG_NOISE, 12345678901ull,
                                            (uint32_t)(7 + s), 3, (uint32_t)e);
            double dz = fabs((double)zh[i] -
                             philox_normal(99, PHILOX_TAG_NOISE, 12345678901ull,
                                           (uint32_t)(7 + s), 3, (uint32_t)e));
            if (dz > worst) worst = dz;
            bad_z += !(dz <= 1e-6);
        }
    CHECK(bad_u == 0, "philox: %zu of %zu u32 draws differ", bad_u, cnt);
    CHECK(bad_z == 0, "philox: %zu of %zu Gaussians off by more than 1e-6 (worst %.3g)", bad_z,
          cnt, worst);
    printf("philox: %zu u32 identical, Gaussians within %.3g\n", cnt, worst);
    free(uh);
    free(zh);
}

/* memory entries: set, upload, download; and errors that must not poison the device */
static void test_memory(void)
{
    begin("memory");
    float h[1000], back[1000];
    for (int i = 0; i < 1000; i++) h[i] = (float)i * 0.5f;
    float *d = dalloc(sizeof h);
    gpu_ok(G->mem_upload(d, h, sizeof h, gctx), "upload");
    gpu_ok(G->mem_download(back, d, sizeof h, gctx), "download");
    CHECK(memcmp(h, back, sizeof h) == 0, "upload/download round trip");
    gpu_ok(G->mem_set_f32(d + 10, -2.5f, 7, gctx), "set");
    G->mem_download(back, d, sizeof h, gctx);
    int ok = 1;
    for (int i = 0; i < 1000; i++) ok &= back[i] == (i >= 10 && i < 17 ? -2.5f : h[i]);
    CHECK(ok, "mem_set_f32 wrote outside [10, 17)");
    /* a request over the device's memory fails cleanly and poisons nothing */
    struct bk_device_mem dm;
    CHECK(G->device_mem(0, &dm) == 0, "device_mem");
    void *p = NULL;
    int rc = G->mem_alloc(&p, dm.total + ((size_t)1 << 30), gctx);
    CHECK(rc == BK_ERR_NOMEM && !p, "over-budget mem_alloc: rc %d", rc);
    CHECK(!G->device_poisoned(0), "the device is poisoned after an over-budget request");
    gpu_ok(G->mem_set_f32(d, 1.0f, 4, gctx), "set after the failed request");
}

/* several jobs on one device: each context its own stream and handles, more contexts than the
 * pool made at the warm-up (DDPMD_CUDA_SLOTS, 4), each runs an op, and a context from another
 * thread's set_parity keeps its own mode */
static void test_contexts(void)
{
    begin("contexts");
    enum { NCTX = 8, N = 300 };
    bk_ctx *cx[NCTX] = {0};
    float *buf[NCTX] = {0};
    int made = 0;
    for (int i = 0; i < NCTX; i++) {
        int rc = G->ctx_init(&cx[i], 1);
        CHECK(rc == 0, "ctx_init of context %d (gctx and %d others open): rc %d", i + 2, i, rc);
        if (rc) break;
        made++;
        rc = G->mem_alloc((void **)&buf[i], 2 * N * sizeof(float), cx[i]);
        CHECK(rc == 0, "mem_alloc on context %d: rc %d", i, rc);
        if (rc) break;
        gpu_ok(G->mem_set_f32(buf[i], (float)i, N, cx[i]), "set");
    }
    for (int i = 0; i < made && buf[i]; i++) {
        float back[N];
        gpu_ok(G->silu_fwd(buf[i] + N, buf[i], N, cx[i]), "silu on each context");
        gpu_ok(G->mem_download(back, buf[i] + N, sizeof back, cx[i]), "download");
        const float want = (float)i / (1.0f + expf(-(float)i));
        CHECK(fabsf(back[N - 1] - want) <= 1e-5f * (1.0f + fabsf(want)),
              "context %d: silu %g, want %g", i, back[N - 1], want);
    }
    for (int i = 0; i < made; i++) {
        if (buf[i]) G->mem_free(buf[i], cx[i]);
        G->ctx_free(cx[i]);
    }
    printf("contexts: %d at once on device 0, each with its own stream and handles\n", made);
    /* parity is fixed per context at ctx_init: a later set_parity(0) (another job's planning)
     * must not switch gctx's convolutions to non-parity math (the emulator refuses those) */
    if (G->set_parity) {
        struct bk_conv2d s = {.n = 1, .ci = 3, .h = 6, .w = 5, .co = 4, .kh = 3, .kw = 3,
                              .stride = 1, .pad_t = 1, .pad_l = 1, .pad_b = 1, .pad_r = 1};
        CHECK(bk_conv2d_init(&s) == 0, "parity conv shape");
        size_t ws = G->conv2d_ws_bytes(&s);
        float *x = dalloc((size_t)3 * 30 * 4), *w = dalloc((size_t)4 * 27 * 4);
        float *y = dalloc((size_t)4 * 30 * 4);
        void *wsp = dalloc(ws ? ws : 256);
        gpu_ok(G->mem_set_f32(x, 0.5f, 90, gctx), "set x");
        gpu_ok(G->mem_set_f32(w, 0.25f, 108, gctx), "set w");
        G->set_parity(0);
        gpu_ok(G->conv2d_fwd(y, x, w, NULL, wsp, &s, gctx), "conv on a parity context after "
                                                             "set_parity(0)");
        G->set_parity(1);
    }
}

/* tests/gpu/emu only: the emulator's own planted misuses (ddpmd_emu_selfcheck), then the
 * backend seen through them: copies with a host pointer where the device's belongs fail without
 * poisoning the device */
static void test_emulator_checks(void)
{
    begin("emulator");
    const char *mod = getenv("DDPMD_CUDA_MODULE");
    void *h = mod ? dlopen(mod, RTLD_NOW | RTLD_NOLOAD) : NULL;
    int (*self)(void) = h ? (int (*)(void))dlsym(h, "ddpmd_emu_selfcheck") : NULL;
    CHECK(self != NULL, "ddpmd_emu_selfcheck not found in %s", mod ? mod : "(no module)");
    if (self) {
        int missed = self();
        CHECK(missed == 0, "the emulator missed %d planted misuses (see above)", missed);
    }
    /* its cuDNN graph API: the refusals of fused attention (fp32, head dims over 128 or off
     * multiples of 8, below sm_80), a matmul's sums, the workspace, variant packs */
    int (*gself)(void) = h ? (int (*)(void))dlsym(h, "ddpmd_emu_graph_selfcheck") : NULL;
    CHECK(gself != NULL, "ddpmd_emu_graph_selfcheck not found");
    if (gself) {
        int missed = gself();
        CHECK(missed == 0, "the emulated cuDNN graph API missed %d checks (see above)", missed);
    }
    if (h) dlclose(h);
    float hbuf[64] = {0}, hsrc[64] = {0};
    float *d = dalloc(sizeof hbuf);
    CHECK(G->mem_upload(hbuf, hsrc, sizeof hbuf, gctx) != 0, "mem_upload to a host pointer");
    CHECK(G->mem_download(hbuf, hsrc, sizeof hbuf, gctx) != 0, "mem_download from a host pointer");
    CHECK(!G->device_poisoned(0), "a refused copy poisoned the device");
    gpu_ok(G->mem_upload(d, hsrc, sizeof hsrc, gctx), "upload after the refused copies");
    /* ctx_set_workspace: cuBLAS runs in the plan's workspace (the emulator's GEMM scribbles over
     * what it uses) and refuses host memory */
    if (G->ctx_set_workspace) {
        enum { WS = 1 << 16 };
        unsigned char *ws = dalloc(WS), *wsh = malloc(WS);
        float *x = dalloc(16 * 16 * 4), *w = dalloc(16 * 16 * 4), *y = dalloc(16 * 16 * 4);
        gpu_ok(G->mem_set_f32((float *)ws, 0.0f, WS / 4, gctx), "zero the workspace");
        gpu_ok(G->mem_set_f32(x, 1.0f, 256, gctx), "set x");
        gpu_ok(G->mem_set_f32(w, 1.0f, 256, gctx), "set w");
        gpu_ok(G->ctx_set_workspace(gctx, ws + 64, WS - 64), "ctx_set_workspace");
        gpu_ok(G->linear_fwd(y, x, w, NULL, 16, 16, 16, BK_DTYPE_F32, gctx),
               "linear in the plan's workspace");
        gpu_ok(G->mem_download(wsh, ws, WS, gctx), "download the workspace");
        int used = 0;
        for (int i = 0; i < WS; i++) used += wsh[i] == 0x5A;
        CHECK(used > 0, "cuBLAS did not run in the workspace ctx_set_workspace gave it");
        CHECK(G->ctx_set_workspace(gctx, wsh, WS) != 0, "ctx_set_workspace took host memory");
        gpu_ok(G->ctx_set_workspace(gctx, NULL, 0), "ctx_set_workspace(NULL)");
        free(wsh);
    }
    printf("emulator: planted misuses caught; refused copies left the device usable\n");
}

/* ---- 16-bit storage conversions: bit-identical to the CPU backend's ---- */

static void test_convert(void)
{
    begin("convert");
    const struct backend *cpu = backend_cpu();
    const size_t n16 = 65536, n32 = 65536 + 200003; /* odd: a partial last block */
    uint16_t *h16 = malloc(n16 * 2), *gh16 = malloc(n32 * 2), *ch16 = malloc(n32 * 2);
    float *x = malloc(n32 * 4), *gy = malloc(n16 * 4), *cy = malloc(n16 * 4);
    void *d16 = dalloc(n32 * 2), *d32 = dalloc(n32 * 4);
    for (size_t i = 0; i < n16; i++) h16[i] = (uint16_t)i;
    /* every 16-bit pattern's f32 value, then ties and random patterns of any kind */
    for (size_t i = 0; i < n16; i++) {
        uint32_t u = (uint32_t)i << 16 | (i & 1 ? 0x8000u : 0x7fffu);
        memcpy(&x[i], &u, 4);
    }
    for (size_t i = n16; i < n32; i++) {
        uint32_t u = (uint32_t)((tu_rand() + 1.0) * 2147483647.0);
        if (i % 3 == 0) u = (u & 0xffffe000u) | 0x1000u; /* an f16 tie */
        memcpy(&x[i], &u, 4);
    }
    for (int dt = BK_DTYPE_F16; dt <= BK_DTYPE_BF16; dt++) {
        const char *name = dt == BK_DTYPE_BF16 ? "bf16" : "f16";
        CHECK(G->mem_upload(d16, h16, n16 * 2, gctx) == 0, "convert: upload");
        gpu_ok(G->convert(d32, BK_DTYPE_F32, d16, dt, n16, gctx), "convert to f32");
        CHECK(G->mem_download(gy, d32, n16 * 4, gctx) == 0, "convert: download");
        cpu->convert(cy, BK_DTYPE_F32, h16, dt, n16, cctx);
        CHECK(memcmp(gy, cy, n16 * 4) == 0, "convert %s -> f32: the 65536 patterns differ from "
              "the CPU's", name);
        CHECK(G->mem_upload(d32, x, n32 * 4, gctx) == 0, "convert: upload");
        gpu_ok(G->convert(d16, dt, d32, BK_DTYPE_F32, n32, gctx), "convert from f32");
        CHECK(G->mem_download(gh16, d16, n32 * 2, gctx) == 0, "convert: download");
        cpu->convert(ch16, dt, x, BK_DTYPE_F32, n32, cctx);
        size_t bad = 0;
        for (size_t i = 0; i < n32; i++) bad += gh16[i] != ch16[i];
        CHECK(bad == 0, "convert f32 -> %s: %zu of %zu values differ from the CPU's", name, bad,
              n32);
    }
    CHECK(G->convert(d16, BK_DTYPE_BF16, d16, BK_DTYPE_F16, 4, gctx) == BK_ERR_INVALID,
          "convert f16 -> bf16 directly accepted");
    free(h16);
    free(gh16);
    free(ch16);
    free(x);
    free(gy);
    free(cy);
}

/* half_kernels by compute capability: cuDNN's and cuBLAS's 16-bit tensor cores take f16 from
 * sm_70 and bf16 from sm_80; the attention and memory-bound kernels read either type anywhere.
 * (test_gpu_ops_emu
 * runs on an emulated sm_90, test_gpu_ops_emu_sm75 on an sm_75, where bf16 convolutions and
 * linears must be refused.) */
static void test_half_kernels(const struct bk_device_mem *dm)
{
    begin("half_kernels");
    const int cc = dm->cc_major * 10 + dm->cc_minor;
    const unsigned attn = BK_HALF_ATTN | BK_HALF_ATTN_PLAIN | BK_HALF_NORM | BK_HALF_ELTWISE,
                   lib = BK_HALF_CONV | BK_HALF_LINEAR;
    CHECK(G->half_kernels != NULL, "the CUDA backend has no half_kernels");
    if (!G->half_kernels) return;
    const unsigned f16 = G->half_kernels(BK_DTYPE_F16), bf16 = G->half_kernels(BK_DTYPE_BF16);
    CHECK(f16 == (attn | (cc >= 70 ? lib : 0u)), "sm_%d: half_kernels(f16) 0x%x", cc, f16);
    CHECK(bf16 == (attn | (cc >= 80 ? lib : 0u)), "sm_%d: half_kernels(bf16) 0x%x", cc, bf16);
    printf("half_kernels on sm_%d: f16 0x%x, bf16 0x%x\n", cc, f16, bf16);
}

static int have_nvidia_device(void)
{
    struct stat st;
    return stat("/dev/nvidia0", &st) == 0 || stat("/proc/driver/nvidia/gpus", &st) == 0;
}

int main(void)
{
    setenv("DDPMD_CUDA_SYNC", "1", 0); /* every launch synchronized and checked */
    /* the plain attention's pairs in chunks of at most 64 KiB of scratch: several per op here */
    setenv("DDPMD_CUDA_ATTN_CHUNK", "65536", 0);
    char err[512] = "";
    int rc = backend_load("cuda", &G, err, sizeof err);
    if (rc != BK_OK) {
        /* a machine with an NVIDIA GPU where the backend does not load is a failure */
        if (have_nvidia_device() && !strstr(err, "no CUDA device")) {
            fprintf(stderr, "test_gpu_ops: an NVIDIA device is present but: %s\n", err);
            return 1;
        }
        printf("SKIPPED: no CUDA device (%s)\n", err);
        return 77;
    }
    /* both backends keep images NHWC */
    C = backend_cpu();
    CHECK(G->nhwc && C->nhwc, "the CUDA backend's images are not NHWC (nhwc %d)", G->nhwc);
    CHECK(G->typed != NULL, "the CUDA backend has no typed memory-bound kernels");
    struct bk_device_mem dm = {0};
    if (G->device_mem(0, &dm) == 0) {
        printf("device: %s (sm_%d%d), %zu MiB, the process holds %zu MiB\n", dm.name, dm.cc_major,
               dm.cc_minor, dm.total >> 20, dm.process >> 20);
        emulated = strstr(dm.name, "emulator") != NULL; /* tests/gpu/emu */
    }
    if (G->ctx_init(&gctx, 1) || C->ctx_init(&cctx, 4)) {
        fprintf(stderr, "test_gpu_ops: ctx_init failed\n");
        return 1;
    }
    if (G->mem_alloc((void **)&dev_base, DEV_BYTES, gctx)) {
        fprintf(stderr, "test_gpu_ops: cannot reserve %zu bytes\n", DEV_BYTES);
        return 1;
    }
    G->set_parity(0);
    const int fast_rc = G->ctx_init(&gfast, 1);
    G->set_parity(1);
    if (fast_rc) {
        fprintf(stderr, "test_gpu_ops: ctx_init (fast mode) failed\n");
        return 1;
    }
    device_cc = dm.cc_major * 10 + dm.cc_minor;
    tu_seed(20240601);
    test_half_kernels(&dm);

    test_memory();
    /* the presets' shapes: 3x3 same, diffusers' downsample (pad right/bottom, stride 2), 1x1
     * shortcuts; and odd ones: odd sizes, asymmetric padding on one axis, no bias */
    test_conv(2, 3, 16, 16, 8, 3, 1, 1, 1, 1, 1, 1);
    test_conv(2, 8, 16, 16, 16, 3, 2, 0, 0, 1, 1, 1);
    test_conv(3, 5, 9, 7, 4, 3, 2, 1, 1, 1, 1, 0);
    test_conv(2, 16, 8, 8, 8, 1, 1, 0, 0, 0, 0, 1);
    test_conv(1, 4, 10, 12, 6, 3, 1, 2, 0, 1, 1, 1);
    test_conv(2, 32, 32, 32, 32, 3, 1, 1, 1, 1, 1, 1);
    conv_accum_first = 1;
    test_conv(2, 6, 12, 12, 5, 3, 1, 1, 1, 1, 1, 1);
    test_conv(2, 6, 12, 12, 5, 3, 2, 0, 0, 1, 1, 1);
    conv_accum_first = 0;
    test_linear(7, 33, 19);
    test_linear(128, 256, 512);
    test_groupnorm(2, 16, 64, 4, 1);
    test_groupnorm(2, 8, 256, 1, 1);
    test_groupnorm(3, 12, 25, 3, 0);
    test_layernorm(37, 48);
    test_layernorm(300, 256);
    test_eltwise(100003);
    test_bcast(3, 17, 45);
    test_layout(2, 5, 7, 45);
    test_layout(3, 40, 24, 64);
    test_resample(2, 3, 5, 7);
    test_resample(1, 2, 1, 1);
    test_resample(2, 4, 16, 16);
    test_embed(5, 32, 1, 0.0f);
    test_embed(4, 33, 0, 1.0f);
    /* head dims 8 to 200 and odd, L off the tiles, several samples and heads, packed qkv */
    test_attention(2, 70, 2, 16, 1);
    test_attention(1, 300, 1, 128, 0);
    test_attention(2, 64, 4, 200, 1);
    test_attention(1, 33, 1, 8, 0);
    test_attention(3, 40, 2, 32, 1);
    test_attention(2, 50, 1, 64, 0);
    test_attention(2, 37, 3, 24, 1);
    test_attention(1, 20, 2, 13, 0);
    /* fast mode: cuDNN's fused attention (head dims 16, 32, 64, 128, with L off its tiles, 2
     * samples, 3 heads, packed qkv), refused beyond 128 and at 13 */
    for (int dt = BK_DTYPE_F32; dt <= BK_DTYPE_BF16; dt++) {
        test_attention_fast(2, 70, 2, 16, 1, dt);
        test_attention_fast(1, 40, 3, 32, 0, dt);
        test_attention_fast(2, 33, 1, 64, 1, dt);
        test_attention_fast(1, 24, 1, 128, 0, dt);
        test_attention_fast(1, 20, 2, 136, 1, dt);
        test_attention_fast(1, 20, 1, 13, 0, dt);
    }
    for (int dt = BK_DTYPE_F32; dt <= BK_DTYPE_BF16; dt++) test_attention_warm(dt);
    test_losses(100003, 37, 10);
    test_dropout(3, 1001, 0.1f);
    test_dropout(2, 17, 0.0f);
    test_typed();
    test_optim(300007);
    test_philox(3, 10007);
    test_convert();
    test_contexts();
    if (emulated) test_emulator_checks();

    CHECK(!G->device_poisoned(0), "device poisoned at the end");
    /* last: a kernel that faults (a wild pointer) poisons the device, and every later call fails
     * at once instead of touching the broken context (the emulator: an untagged pointer) */
    {
        begin("poison");
        float *wild = (float *)(uintptr_t)0x1000;
        int r1 = G->silu_fwd(wild, wild, (size_t)1 << 20, gctx);
        int r2 = G->sync(gctx);
        CHECK(r1 != 0 || r2 != 0, "a wild pointer went unnoticed");
        CHECK(G->device_poisoned(0), "a faulting kernel did not poison the device");
        CHECK(G->mem_set_f32((float *)dev_base, 0.0f, 4, gctx) == BK_ERR_DEVICE,
              "a call on a poisoned device did not fail");
        printf("poison: the fault was reported (%d, %d) and the device is marked poisoned\n", r1,
               r2);
    }
    G->mem_free(dev_base, gctx);
    G->ctx_free(gfast);
    G->ctx_free(gctx);
    C->ctx_free(cctx);
    return tu_finish("test_gpu_ops");
}
