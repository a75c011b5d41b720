/* test_cpu_wgrad16.c - the CPU backend's bf16 filter gradient (conv.c: im2col + bf16 GEMM, in
 * chunks of pixels, where the CPU has AVX512-BF16 without AMX; at a small dw in per-thread slices
 * of chunks with partial sums, or the direct loop at 1 input or output channel; fp32 on converted
 * operands where it has not) against a float64 reference on the same bf16 operands, every dw and
 * db element. The bound: the products of bf16 values are exact in fp32, so dw's and db's only
 * error is fp32 summation: at most (terms + 2) 2^-24 of the sum of |terms|, the terms being the
 * P pixels' products, one partial sum per chunk or slice (at most P / 16: a chunk holds 16 pixels
 * or more, a slice one chunk or more) and the previous dw (the kernel adds). Shapes: the
 * presets' (3x3 padded by 1, diffusers' stride-2 downsample padded right and bottom, 1x1),
 * channel counts that are not multiples of 16, N=1, shapes of several chunks with a shorter last
 * one, slices of unequal chunk counts, fewer chunks than slices, the thin shapes; at 1 and 2
 * threads, each run twice (the same bits at a thread count), the workspace exactly
 * cpu_conv2d_ws_bytes (ASan sees past it).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu.h"
#include "cpu/onednn.h"
#include "half.h"
#include "test_util.h"

static double worst; /* the largest error / bound seen */

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) abort();
    return p;
}

/* n random bf16 values of scale 1: b (bits), d (their exact values) */
static void fill_bf16(uint16_t *b, double *d, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        b[i] = half_f32_to_bf16((float)tu_rand());
        d[i] = half_bf16_to_f32(b[i]);
    }
}

/* dw (Co,Ci,Kh,Kw) and db (Co) of NHWC x and dy, float64; with abs, of absolute values */
static void ref_filter(double *dw, double *db, const double *x, const double *dy,
                       const struct bk_conv2d *s, int abs)
{
    for (int n = 0; n < s->n; n++)
        for (int oy = 0; oy < s->ho; oy++)
            for (int ox = 0; ox < s->wo; ox++) {
                const double *g = dy + (((size_t)n * s->ho + oy) * s->wo + ox) * s->co;
                for (int ky = 0; ky < s->kh; ky++)
                    for (int kx = 0; kx < s->kw; kx++) {
                        const int iy = oy * s->stride - s->pad_t + ky;
                        const int ix = ox * s->stride - s->pad_l + kx;
                        if (iy < 0 || iy >= s->h || ix < 0 || ix >= s->w) continue;
                        const double *xr = x + (((size_t)n * s->h + iy) * s->w + ix) * s->ci;
                        for (int o = 0; o < s->co; o++)
                            for (int c = 0; c < s->ci; c++) {
                                double t = g[o] * xr[c];
                                dw[(((size_t)o * s->ci + c) * s->kh + ky) * s->kw + kx] +=
                                    abs ? fabs(t) : t;
                            }
                    }
                for (int o = 0; o < s->co; o++) db[o] += abs ? fabs(g[o]) : g[o];
            }
}

/* the elements of got outside ref's bound (k terms, |terms| summing to mag) */
static long out_of_bound(const float *got, const double *ref, const double *mag, long k, size_t n)
{
    long bad = 0;
    const double acc = (double)(k + 2) * ldexp(1.0, -24);
    for (size_t i = 0; i < n; i++) {
        double r = fabs((double)got[i] - ref[i]) / (acc * mag[i] + 1e-30);
        if (!(r <= 1.0)) bad++;
        if (r > worst || isnan(r)) worst = r;
    }
    return bad;
}

/* the scratch ranges conv.c handed wgrad_bf16.c in one call (cpu_wgrad_bf16_scratch) */
enum { MAX_RANGES = 256 };
static struct range { int t; const char *p; size_t n; } ranges[MAX_RANGES];
static int nranges;

static void note_scratch(int t, const void *p, size_t n)
{
    const int i = __atomic_fetch_add(&nranges, 1, __ATOMIC_RELAXED);
    if (i < MAX_RANGES) ranges[i] = (struct range){t, p, n};
}

/* the ranges noted since nranges was 0: each inside the workspace ws .. ws + wsb - 1, and two
 * threads' ranges disjoint (a thread's own calls run one after another and may share) */
static void check_ranges(const char *ws, size_t wsb, const char *tag, int threads)
{
    CHECK(nranges <= MAX_RANGES, "%s: %d scratch ranges, more than noted", tag, nranges);
    const int n = nranges < MAX_RANGES ? nranges : MAX_RANGES;
    for (int i = 0; i < n; i++) {
        const struct range *a = &ranges[i];
        CHECK(a->p >= ws && a->n <= wsb && (size_t)(a->p - ws) <= wsb - a->n,
              "%s, %d threads: scratch %zu bytes at +%td, outside the workspace of %zu", tag,
              threads, a->n, a->p - ws, wsb);
        for (int j = 0; j < i; j++) {
            const struct range *b = &ranges[j];
            CHECK(a->t == b->t || a->p + a->n <= b->p || b->p + b->n <= a->p,
                  "%s, %d threads: threads %d and %d share scratch (+%td, +%td)", tag, threads,
                  a->t, b->t, a->p - ws, b->p - ws);
        }
    }
}

/* whether conv.c takes the im2col + bf16 GEMM path here */
static int gemm_path(void) { return cpu_isa() >= CPU_ISA_AVX512_BF16 && !onednn_amx(); }

static void test_filter(int n, int ci, int h, int w, int co, int kh, int kw, int stride, int pt,
                        int pl, int pb, int pr)
{
    struct bk_conv2d s = {.n = n, .ci = ci, .h = h, .w = w, .co = co, .kh = kh, .kw = kw,
                          .stride = stride, .pad_t = pt, .pad_l = pl, .pad_b = pb, .pad_r = pr,
                          .dtype = BK_DTYPE_BF16};
    CHECK(bk_conv2d_init(&s) == BK_OK, "conv init");
    char tag[160];
    snprintf(tag, sizeof tag, "bf16 filter n%d ci%d %dx%d co%d k%dx%d s%d pad(%d,%d,%d,%d)", n,
             ci, h, w, co, kh, kw, stride, pt, pl, pb, pr);
    const size_t nx = (size_t)n * h * w * ci, ny = (size_t)n * s.ho * s.wo * co,
                 nw = (size_t)co * ci * kh * kw;
    uint16_t *x = xmalloc(2 * nx), *dy = xmalloc(2 * ny);
    double *xd = xmalloc(8 * nx), *dyd = xmalloc(8 * ny);
    double *rdw = calloc(nw, 8), *mdw = calloc(nw, 8), *rdb = calloc(co, 8), *mdb = calloc(co, 8);
    float *prev = xmalloc(4 * nw), *prevb = xmalloc(4 * co);
    float *dw[2][2], *db[2][2]; /* [threads - 1][run] */
    if (!rdw || !mdw || !rdb || !mdb) abort();
    fill_bf16(x, xd, nx);
    fill_bf16(dy, dyd, ny);
    ref_filter(rdw, rdb, xd, dyd, &s, 0);
    ref_filter(mdw, mdb, xd, dyd, &s, 1);
    for (size_t i = 0; i < nw; i++) {
        prev[i] = (float)tu_rand();
        rdw[i] += prev[i];
        mdw[i] += fabs(prev[i]);
    }
    for (int o = 0; o < co; o++) {
        prevb[o] = (float)tu_rand();
        rdb[o] += prevb[o];
        mdb[o] += fabs(prevb[o]);
    }
    const long px = (long)n * s.ho * s.wo, k = px + px / 16 + 2;
    for (int t = 1; t <= 2; t++) {
        bk_ctx *ctx;
        CHECK(cpu_ctx_init(&ctx, t) == BK_OK, "%s: context of %d threads", tag, t);
        const size_t wsb = cpu_conv2d_ws_bytes(&s);
        CHECK(wsb > 0, "%s: no workspace size", tag);
        void *ws = xmalloc(wsb);
        for (int r = 0; r < 2; r++) {
            dw[t - 1][r] = xmalloc(4 * nw);
            db[t - 1][r] = xmalloc(4 * co);
            memcpy(dw[t - 1][r], prev, 4 * nw);
            memcpy(db[t - 1][r], prevb, 4 * co);
            nranges = 0;
            cpu_wgrad_bf16_scratch = note_scratch;
            CHECK(cpu_conv2d_bwd_filter(dw[t - 1][r], db[t - 1][r], dy, x, ws, &s, ctx) == BK_OK,
                  "%s: %d threads, run %d", tag, t, r);
            cpu_wgrad_bf16_scratch = NULL;
            check_ranges(ws, wsb, tag, t);
        }
        long bad = out_of_bound(dw[t - 1][0], rdw, mdw, k, nw);
        CHECK(bad == 0, "%s, %d threads: dw, %ld of %zu elements out of bounds", tag, t, bad, nw);
        bad = out_of_bound(db[t - 1][0], rdb, mdb, k, (size_t)co);
        CHECK(bad == 0, "%s, %d threads: db, %ld of %d elements out of bounds", tag, t, bad, co);
        CHECK(!memcmp(dw[t - 1][0], dw[t - 1][1], 4 * nw) &&
                  !memcmp(db[t - 1][0], db[t - 1][1], 4 * co),
              "%s, %d threads: two runs differ", tag, t);
        free(ws);
        cpu_ctx_free(ctx);
    }
    /* the im2col path gives the same bits at 1 and 2 threads here (the columns are copies,
     * oneDNN's matmul does not split the pixels at these shapes, and the slices depend on the
     * shape only); oneDNN's fp32 backward-weights need not (noted) */
    const int same = !memcmp(dw[0][0], dw[1][0], 4 * nw) && !memcmp(db[0][0], db[1][0], 4 * co);
    if (gemm_path())
        CHECK(same, "%s: 1 and 2 threads give different bits", tag);
    else if (!same)
        printf("note: %s (fp32 path): 1 and 2 threads give different bits\n", tag);
    for (int t = 0; t < 2; t++)
        for (int r = 0; r < 2; r++) free(dw[t][r]), free(db[t][r]);
    free(x), free(dy), free(xd), free(dyd), free(rdw), free(mdw), free(rdb), free(mdb);
    free(prev), free(prevb);
}

static void test_shapes(void)
{
    /* ddpm-cifar10's 128 -> 128 3x3 at N=1: 448-pixel chunks, 448 + 448 + 128 */
    test_filter(1, 128, 32, 32, 128, 3, 3, 1, 1, 1, 1, 1);
    /* diffusers' downsample (stride 2, padded right and bottom) over 3 chunks of 896, 896, 256 */
    test_filter(2, 64, 64, 64, 64, 3, 3, 2, 0, 0, 1, 1);
    /* stride 2 padded on every side, odd sizes, channels not multiples of 16 */
    test_filter(3, 40, 9, 11, 24, 3, 3, 2, 1, 1, 1, 1);
    /* the data's input (3 and 1 channels) and the output conv (3 channels) */
    test_filter(1, 3, 32, 32, 72, 3, 3, 1, 1, 1, 1, 1);
    test_filter(2, 1, 16, 16, 32, 3, 3, 1, 1, 1, 1, 1);
    test_filter(1, 96, 16, 16, 3, 3, 3, 1, 1, 1, 1, 1);
    /* a kernel not square, padded unevenly (tap order across rows and columns) */
    test_filter(2, 24, 7, 10, 40, 1, 3, 1, 0, 2, 0, 0);
    test_filter(2, 20, 8, 6, 36, 3, 2, 1, 1, 0, 1, 1);
    /* 1x1: x is the column matrix (unstrided, unpadded; 40 outputs: not wgrad_bf16.c's), or
     * strided and padded */
    test_filter(2, 48, 8, 8, 40, 1, 1, 1, 0, 0, 0, 0);
    test_filter(2, 40, 9, 9, 24, 1, 1, 2, 1, 1, 0, 0);
    /* ddpm-cifar10's 256 -> 256 at 4x4 (the most frequent) */
    test_filter(2, 256, 4, 4, 256, 3, 3, 1, 1, 1, 1, 1);
    /* the slices (a dw under WGRAD_SLICE_MN elements): fmnist-tiny's 32 -> 32 at N4 (4096
     * pixels: 9 chunks of 448 and a short one of 64 in 8 slices of 1 or 2 chunks), 64 -> 32 (3
     * chunks, 3 slices), 24 -> 40 at odd sizes (5 chunks of 592 and a short one, 6 slices) */
    test_filter(4, 32, 32, 32, 32, 3, 3, 1, 1, 1, 1, 1);
    test_filter(2, 64, 16, 16, 32, 3, 3, 1, 1, 1, 1, 1);
    test_filter(3, 24, 37, 29, 40, 3, 3, 1, 1, 1, 1, 1);
    /* fewer chunks than slices (3), and one chunk (one slice) */
    test_filter(1, 64, 24, 24, 16, 3, 3, 1, 1, 1, 1, 1);
    test_filter(1, 16, 6, 6, 16, 3, 3, 1, 1, 1, 1, 1);
    /* wgrad_bf16.c (stride 1, Co a multiple of 16, Wo 16 or more; the shapes above of 32 and
     * 16 output channels at 32x32, 16x16 and 24x24 and the 128 -> 128 at N1 too), sliced: 48
     * outputs (a 32-channel and a 16-channel block), 24 inputs (a tail of 8), odd widths (a last
     * pixel without its pair), 37 rows (blocks of 8 and a shorter one, slices across images); a
     * kernel not square, padded unevenly; a 1x3 padded left by 2; 4 rows in 3 slices (blocks of
     * up to 3 rows: the pair copies fill the columns); split (dw of 64 x 1152 or more): 128 ->
     * 64 in 2 channel groups, 202 -> 48 in 4 (56, 56, 56 and 34: tails of 2); blocks of whole
     * images (rows under 16 pixels, 2048 pixels or more): 16 -> 32 at 8x8 N32 (4 images a
     * block, slices cutting images), 24 -> 48 at 9x11 N21 (odd width, 2 images a block), split
     * 128 -> 64 at 8x8 N32 */
    test_filter(3, 24, 37, 29, 48, 3, 3, 1, 1, 1, 1, 1);
    test_filter(2, 20, 8, 17, 32, 3, 2, 1, 1, 0, 1, 1);
    test_filter(2, 24, 7, 18, 48, 1, 3, 1, 0, 2, 0, 0);
    test_filter(1, 128, 4, 64, 16, 3, 3, 1, 1, 1, 1, 1);
    test_filter(2, 128, 16, 16, 64, 3, 3, 1, 1, 1, 1, 1);
    test_filter(1, 202, 17, 20, 48, 3, 3, 1, 1, 1, 1, 1);
    test_filter(32, 16, 8, 8, 32, 3, 3, 1, 1, 1, 1, 1);
    test_filter(21, 24, 9, 11, 48, 3, 3, 1, 1, 1, 1, 1);
    test_filter(32, 128, 8, 8, 64, 3, 3, 1, 1, 1, 1, 1);
    /* split at rows under 16 pixels and fewer than 2048 pixels: 64 -> 144 at 8x10 N2 (whole
     * images a block, 4 32-channel and a 16-channel output block) */
    test_filter(2, 64, 8, 10, 144, 3, 3, 1, 1, 1, 1, 1);
    /* an unpadded 1x1 in slices through wgrad_bf16.c (x is not the column matrix there) */
    test_filter(4, 40, 16, 18, 32, 1, 1, 1, 0, 0, 0, 0);
    /* the thin shapes, the direct loop: fmnist-tiny's output (32 -> 1) and input (1 -> 32)
     * convs, channels not multiples of 16 (a tail block), strided, rows cut by slices */
    test_filter(4, 32, 28, 28, 1, 3, 3, 1, 1, 1, 1, 1);
    test_filter(4, 1, 28, 28, 32, 3, 3, 1, 1, 1, 1, 1);
    test_filter(3, 40, 13, 11, 1, 3, 3, 1, 1, 1, 1, 1);
    test_filter(3, 1, 13, 11, 24, 3, 3, 2, 1, 1, 1, 1);
    test_filter(2, 20, 9, 10, 1, 3, 2, 2, 0, 1, 1, 0);
    test_filter(1, 1, 3, 3, 5, 3, 3, 1, 1, 1, 1, 1);
}

/* wgrad_bf16.c called directly on n images of h x w, ci -> co (3x3 padded by 1 unless kh 1),
 * in blocks of rb rows, its scratch exactly cpu_wgrad_bf16_bytes' claim followed by poisoned
 * bytes that must stay so: in conv.c a claim short of what the blocks write (a halo) lands in
 * the planned workspace, where ASan sees nothing */
static void test_claim(int n, int ci, int h, int w, int co, int kh, int rb)
{
    if (!gemm_path()) return;
    struct bk_conv2d s = {.n = n, .ci = ci, .h = h, .w = w, .co = co, .kh = kh, .kw = 3,
                          .stride = 1, .pad_t = kh / 2, .pad_l = 1, .pad_b = kh / 2, .pad_r = 1,
                          .dtype = BK_DTYPE_BF16};
    CHECK(bk_conv2d_init(&s) == BK_OK, "conv init");
    enum { GUARD = 4096, POISON = 0xa5 };
    const size_t nx = (size_t)n * h * w * ci, ny = (size_t)n * s.ho * s.wo * co;
    const size_t claim = cpu_wgrad_bf16_bytes(&s, rb, ci), nw = (size_t)co * ci * kh * 3;
    uint16_t *x = xmalloc(2 * nx), *dy = xmalloc(2 * ny);
    double *xd = xmalloc(8 * nx), *dyd = xmalloc(8 * ny);
    float *acc = calloc(nw, 4);
    unsigned char *scr = xmalloc(claim + GUARD);
    if (!acc) abort();
    fill_bf16(x, xd, nx);
    fill_bf16(dy, dyd, ny);
    memset(scr, POISON, claim + GUARD);
    cpu_wgrad_bf16_rows(acc, NULL, dy, x, 0, n * s.ho, 0, ci, rb, &s, scr);
    size_t hit = 0;
    for (size_t i = claim; i < claim + GUARD; i++) hit += scr[i] != POISON;
    CHECK(hit == 0, "wgrad_bf16 n%d ci%d %dx%d co%d k%dx3 rb%d: %zu bytes written past the "
          "claim of %zu", n, ci, h, w, co, kh, rb, hit, claim);
    free(x), free(dy), free(xd), free(dyd), free(acc), free(scr);
}

static void test_claims(void)
{
    /* blocks of rows of one image (interior blocks write both halo rows), a last shorter one */
    test_claim(2, 24, 12, 20, 32, 3, 3);
    test_claim(1, 16, 9, 17, 16, 3, 4);
    /* blocks of whole images (a halo each), odd widths */
    test_claim(5, 16, 4, 11, 48, 3, 8);
    test_claim(3, 8, 5, 16, 16, 3, 10);
    /* no halo */
    test_claim(2, 16, 6, 16, 32, 1, 2);
}

int main(void)
{
    tu_seed(25);
    if (!gemm_path()) printf("note: no AVX512-BF16 without AMX here: the im2col path is not run\n");
    test_shapes();
    test_claims();
    printf("worst error / bound %.3f\n", worst);
    /* the other path: without AVX512-BF16 (oneDNN's bf16 emulated), the fp32 one on converted
     * operands */
    cpu_isa_cap(CPU_ISA_AVX512);
    test_filter(1, 40, 8, 8, 24, 3, 3, 1, 1, 1, 1, 1);
    test_filter(2, 16, 8, 8, 8, 3, 3, 2, 0, 0, 1, 1);
    cpu_isa_cap(-1);
    printf("worst error / bound %.3f (with the fp32 path)\n", worst);
    return tu_finish("test_cpu_wgrad16");
}
