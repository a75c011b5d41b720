/* test_wino.c - the CPU's fast-mode 3x3 convolutions (kernels/cpu/wino.c, Winograd F(4x4, 3x3))
 * against a float64 direct reference, NHWC fp32: forward with and without bias, data gradient
 * written and accumulated, filter gradient and bias gradient accumulated onto what was there.
 * Sizes that are not multiples of the 4x4 tiles, several images, more than one chunk of tiles
 * (cpu_wino_chunk_bytes lowered). Accumulation is checked bit for bit against the written
 * result (dx + r); a fast-mode context must take these kernels and a parity one must not, nor
 * any context bf16 operands; two runs give the same bits.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "test_util.h"

struct shape {
    int n, ci, co, h, w;
    size_t chunk; /* cpu_wino_chunk_bytes; 0: the default */
};

static double *rnd(size_t count, double scale)
{
    double *p = malloc(count * sizeof *p);
    for (size_t i = 0; i < count; i++) p[i] = scale * tu_rand();
    return p;
}

/* the operand as the kernel reads it and as the reference does (the same values) */
static float *to_f32(double *v, size_t count)
{
    float *p = malloc(count * sizeof *p);
    for (size_t i = 0; i < count; i++) p[i] = (float)v[i], v[i] = p[i];
    return p;
}

/* NHWC references: y = conv(x, w) + b; dx = conv^T(dy, w); dw, db of dy and x */
static void ref_fwd(double *y, const double *x, const double *w, const double *b,
                    const struct shape *s)
{
    for (int n = 0; n < s->n; n++)
        for (int oy = 0; oy < s->h; oy++)
            for (int ox = 0; ox < s->w; ox++)
                for (int k = 0; k < s->co; k++) {
                    double acc = b ? b[k] : 0;
                    for (int i = 0; i < 3; i++)
                        for (int j = 0; j < 3; j++) {
                            const int iy = oy + i - 1, ix = ox + j - 1;
                            if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w) continue;
                            const double *xp = x + (((size_t)n * s->h + iy) * s->w + ix) * s->ci;
                            for (int c = 0; c < s->ci; c++)
                                acc += xp[c] * w[(((size_t)k * s->ci + c) * 3 + i) * 3 + j];
                        }
                    y[(((size_t)n * s->h + oy) * s->w + ox) * s->co + k] = acc;
                }
}

static void ref_data(double *dx, const double *dy, const double *w, const struct shape *s)
{
    for (int n = 0; n < s->n; n++)
        for (int y = 0; y < s->h; y++)
            for (int x = 0; x < s->w; x++)
                for (int c = 0; c < s->ci; c++) {
                    double acc = 0;
                    for (int i = 0; i < 3; i++)
                        for (int j = 0; j < 3; j++) {
                            const int oy = y - i + 1, ox = x - j + 1;
                            if (oy < 0 || oy >= s->h || ox < 0 || ox >= s->w) continue;
                            const double *g = dy + (((size_t)n * s->h + oy) * s->w + ox) * s->co;
                            for (int k = 0; k < s->co; k++)
                                acc += g[k] * w[(((size_t)k * s->ci + c) * 3 + i) * 3 + j];
                        }
                    dx[(((size_t)n * s->h + y) * s->w + x) * s->ci + c] = acc;
                }
}

static void ref_filter(double *dw, double *db, const double *dy, const double *x,
                       const struct shape *s)
{
    memset(dw, 0, (size_t)s->co * s->ci * 9 * sizeof *dw);
    memset(db, 0, (size_t)s->co * sizeof *db);
    for (int n = 0; n < s->n; n++)
        for (int oy = 0; oy < s->h; oy++)
            for (int ox = 0; ox < s->w; ox++) {
                const double *g = dy + (((size_t)n * s->h + oy) * s->w + ox) * s->co;
                for (int k = 0; k < s->co; k++) db[k] += g[k];
                for (int i = 0; i < 3; i++)
                    for (int j = 0; j < 3; j++) {
                        const int iy = oy + i - 1, ix = ox + j - 1;
                        if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w) continue;
                        const double *xp = x + (((size_t)n * s->h + iy) * s->w + ix) * s->ci;
                        for (int k = 0; k < s->co; k++)
                            for (int c = 0; c < s->ci; c++)
                                dw[(((size_t)k * s->ci + c) * 3 + i) * 3 + j] += g[k] * xp[c];
                    }
            }
}

/* got against ref: |got - ref| <= tol * max |ref|; returns the number of elements outside */
static size_t off(const float *got, const double *ref, size_t count, double tol, const char *what,
                  const struct shape *s)
{
    double mx = 0, worst = 0;
    for (size_t i = 0; i < count; i++) mx = fmax(mx, fabs(ref[i]));
    size_t bad = 0;
    for (size_t i = 0; i < count; i++) {
        const double e = fabs(got[i] - ref[i]);
        if (!(e <= tol * mx)) bad++;
        worst = fmax(worst, e / mx);
    }
    CHECK(bad == 0, "%s N%d %d->%d %dx%d: %zu of %zu outside, worst %.2e of max |ref|", what, s->n,
          s->ci, s->co, s->h, s->w, bad, count, worst);
    return bad;
}

static void run_shape(const struct shape *sh)
{
    cpu_wino_chunk_bytes = sh->chunk ? sh->chunk : (8u << 20);
    struct bk_conv2d s = {.n = sh->n, .ci = sh->ci, .h = sh->h, .w = sh->w, .co = sh->co,
                          .kh = 3, .kw = 3, .stride = 1, .pad_t = 1, .pad_l = 1, .pad_b = 1,
                          .pad_r = 1, .ho = sh->h, .wo = sh->w};
    CHECK(cpu_wino_applies(&s), "shape applies");
    const size_t nx = (size_t)sh->n * sh->h * sh->w * sh->ci, ny = (size_t)sh->n * sh->h * sh->w *
                                                                   sh->co,
                 nw = (size_t)sh->co * sh->ci * 9;
    double *x = rnd(nx, 1.0), *dy = rnd(ny, 1.0), *w = rnd(nw, 0.1), *b = rnd(sh->co, 0.5);
    double *pre = rnd(nx, 2.0), *dw0 = rnd(nw, 1.0), *db0 = rnd(sh->co, 1.0);
    float *xk = to_f32(x, nx), *dyk = to_f32(dy, ny), *prek = to_f32(pre, nx);
    float *wk = to_f32(w, nw), *bk = to_f32(b, sh->co);

    cpu_set_parity(0);
    const size_t wsb = cpu_conv2d_ws_bytes(&s);
    CHECK(wsb == cpu_wino_ws_bytes(&s) && wsb > 0, "fast mode plans Winograd's workspace");
    bk_ctx *ctx = NULL;
    CHECK(cpu_ctx_init(&ctx, 2) == BK_OK, "ctx");
    void *ws = aligned_alloc(64, (wsb + 63) / 64 * 64);
    const size_t esz = sizeof(float);
    float *y = malloc(ny * esz), *y2 = malloc(ny * esz), *yb = malloc(ny * esz);
    float *dx = malloc(nx * esz), *dxa = malloc(nx * esz);
    float *dw = malloc(nw * 4), *db = malloc(sh->co * 4);
    double *ry = malloc(ny * sizeof *ry), *rx = malloc(nx * sizeof *rx);
    double *rw = malloc(nw * sizeof *rw), *rb = malloc(sh->co * sizeof *rb);

    /* forward, without and with the bias */
    CHECK(cpu_conv2d_fwd(y, xk, wk, NULL, ws, &s, ctx) == BK_OK, "fwd");
    ref_fwd(ry, x, w, NULL, sh);
    off(y, ry, ny, 5e-5, "fwd", sh);
    CHECK(cpu_conv2d_fwd(yb, xk, wk, bk, ws, &s, ctx) == BK_OK, "fwd bias");
    ref_fwd(ry, x, w, b, sh);
    off(yb, ry, ny, 5e-5, "fwd + bias", sh);
    CHECK(cpu_wino_fwd(y2, xk, wk, NULL, ws, &s, ctx) == BK_OK, "wino fwd");
    CHECK(!memcmp(y, y2, ny * esz), "a fast-mode context runs Winograd (same bits)");
    CHECK(cpu_conv2d_fwd(y2, xk, wk, NULL, ws, &s, ctx) == BK_OK && !memcmp(y, y2, ny * esz),
          "two runs, the same bits");

    /* data gradient, written, then accumulated onto pre */
    CHECK(cpu_conv2d_bwd_data(dx, dyk, wk, 0, ws, &s, ctx) == BK_OK, "data");
    ref_data(rx, dy, w, sh);
    off(dx, rx, nx, 5e-5, "data", sh);
    memcpy(dxa, prek, nx * esz);
    CHECK(cpu_conv2d_bwd_data(dxa, dyk, wk, 1, ws, &s, ctx) == BK_OK, "data +=");
    size_t acc_bad = 0;
    for (size_t i = 0; i < nx; i++) {
        const float want = prek[i] + dx[i];
        acc_bad += memcmp(&want, dxa + i, sizeof want) != 0;
    }
    CHECK(acc_bad == 0, "data += is dx + r: %zu of %zu differ", acc_bad, nx);

    /* filter and bias gradients, added to what was there */
    for (size_t i = 0; i < nw; i++) dw[i] = (float)dw0[i];
    for (int k = 0; k < sh->co; k++) db[k] = (float)db0[k];
    CHECK(cpu_conv2d_bwd_filter(dw, db, dyk, xk, ws, &s, ctx) == BK_OK, "filter");
    ref_filter(rw, rb, dy, x, sh);
    double mw = 0, mb = 0;
    for (size_t i = 0; i < nw; i++) mw = fmax(mw, fabs(rw[i]));
    for (int k = 0; k < sh->co; k++) mb = fmax(mb, fabs(rb[k]));
    size_t bw = 0, bb = 0;
    for (size_t i = 0; i < nw; i++) bw += !(fabs(dw[i] - dw0[i] - rw[i]) <= 5e-5 * mw + 1e-6);
    for (int k = 0; k < sh->co; k++) bb += !(fabs(db[k] - db0[k] - rb[k]) <= 1e-6 * mb + 1e-6);
    CHECK(bw == 0, "filter gradient N%d %d->%d %dx%d: %zu of %zu outside", sh->n, sh->ci, sh->co,
          sh->h, sh->w, bw, nw);
    CHECK(bb == 0, "bias gradient: %zu of %d outside", bb, sh->co);

    /* a workspace planned in parity mode (the direct kernels' bytes, smaller) registered with
     * a fast context: refused, not overrun */
    cpu_set_parity(1);
    const size_t small = cpu_conv2d_ws_bytes(&s);
    if (small < wsb) {
        CHECK(cpu_ctx_set_workspace(ctx, ws, small) == BK_OK, "set workspace");
        CHECK(cpu_conv2d_fwd(y2, xk, wk, NULL, ws, &s, ctx) == BK_ERR_INVALID,
              "a fast context refuses a workspace planned in parity mode");
    }
    CHECK(cpu_ctx_set_workspace(ctx, ws, wsb) == BK_OK &&
              cpu_conv2d_fwd(y2, xk, wk, NULL, ws, &s, ctx) == BK_OK && !memcmp(y, y2, ny * esz),
          "the planned workspace registered: runs, the same bits");

    /* a parity-mode context keeps the direct kernels (other bits) */
    cpu_set_parity(1);
    bk_ctx *pctx = NULL;
    const size_t pws = cpu_conv2d_ws_bytes(&s);
    void *pw = aligned_alloc(64, (pws + 63) / 64 * 64);
    CHECK(cpu_ctx_init(&pctx, 2) == BK_OK && pw, "parity ctx");
    CHECK(cpu_conv2d_fwd(y2, xk, wk, NULL, pw, &s, pctx) == BK_OK, "parity fwd");
    CHECK(memcmp(y, y2, ny * esz) != 0, "a parity-mode context does not run Winograd");
    cpu_ctx_free(pctx);
    free(pw);
    cpu_ctx_free(ctx);
    free(ws), free(y), free(y2), free(yb), free(dx), free(dxa), free(dw), free(db);
    free(ry), free(rx), free(rw), free(rb);
    free(x), free(dy), free(w), free(b), free(pre), free(dw0), free(db0);
    free(xk), free(dyk), free(prek), free(wk), free(bk);
    cpu_wino_chunk_bytes = 8u << 20;
}

int main(void)
{
    tu_seed(7);
    /* tile edges (9 = 2 * 4 + 1, 6 x 13), several images, one chunk and several (at least 16
     * tiles a chunk, evened out), a shorter last chunk, Ci != Co both ways */
    const struct shape shapes[] = {
        {2, 32, 40, 9, 9, 0},
        {3, 48, 32, 6, 13, 0},
        {2, 32, 32, 16, 16, 64 << 10},
        {1, 40, 64, 11, 8, 64 << 10},
        {37, 32, 40, 4, 4, 64 << 10}, /* 37 tiles: chunks of 13, 13 and 11 */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) run_shape(&shapes[i]);

    /* what does not apply: stride 2, 1x1, uneven padding, few or odd channels */
    struct bk_conv2d s = {.n = 1, .ci = 32, .h = 8, .w = 8, .co = 32, .kh = 3, .kw = 3,
                          .stride = 1, .pad_t = 1, .pad_l = 1, .pad_b = 1, .pad_r = 1, .ho = 8,
                          .wo = 8};
    CHECK(cpu_wino_applies(&s), "the base shape applies");
    struct bk_conv2d t = s;
    t.stride = 2, t.ho = t.wo = 4;
    CHECK(!cpu_wino_applies(&t), "stride 2");
    t = s, t.kh = t.kw = 1, t.pad_t = t.pad_l = t.pad_b = t.pad_r = 0;
    CHECK(!cpu_wino_applies(&t), "1x1");
    t = s, t.pad_b = 0, t.ho = 7;
    CHECK(!cpu_wino_applies(&t), "uneven padding");
    t = s, t.ci = 3;
    CHECK(!cpu_wino_applies(&t), "3 input channels");
    t = s, t.co = 36;
    CHECK(!cpu_wino_applies(&t), "36 output channels (not a multiple of 8)");
    t = s, t.dtype = BK_DTYPE_F16;
    CHECK(!cpu_wino_applies(&t), "f16");
    t = s, t.dtype = BK_DTYPE_BF16;
    CHECK(!cpu_wino_applies(&t), "bf16 (oneDNN's direct bf16 kernels)");
    cpu_set_parity(0);
    const size_t fast_ws = cpu_conv2d_ws_bytes(&t);
    cpu_set_parity(1);
    CHECK(fast_ws == cpu_conv2d_ws_bytes(&t), "bf16 plans the direct workspace in fast mode");
    return tu_finish("test_wino");
}
