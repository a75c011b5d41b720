/* wino_bench.c - a 3x3 convolution's three passes (forward, data gradient, filter gradient)
 * on the CPU in parity mode (conv.c's direct oneDNN kernels) and in fast mode (wino.c's
 * Winograd F(4x4, 3x3)), the same operands, in one run: ms per call (best of --reps), the ratio
 * direct / Winograd, and the Winograd result's largest difference from the direct one relative
 * to the direct result's largest magnitude. bench/, not a test (test_wino checks correctness).
 *   wino_bench [--bf16] [--reps N] [--threads T]      the presets' 3x3 shapes at batch 8
 *   wino_bench --fast-only ...                        the Winograd side alone (to profile)
 *   wino_bench [--bf16] ... N CI CO HW                one shape
 * Under DNNL_MAX_CPU_ISA=AVX2 both sides run on AVX2 (the GEMMs are oneDNN's).
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu.h"
#include "half.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static float frand(unsigned *st)
{
    *st = *st * 1664525u + 1013904223u;
    return (float)((*st >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static void *filled(size_t count, int bf16, unsigned seed, float scale)
{
    void *p = malloc(count * (bf16 ? 2 : 4));
    for (size_t i = 0; i < count; i++) {
        const float v = scale * frand(&seed);
        if (bf16) ((uint16_t *)p)[i] = half_f32_to_bf16(v);
        else ((float *)p)[i] = v;
    }
    return p;
}

static float val(const void *p, size_t i, int bf16)
{
    return bf16 ? half_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* max |a - b| / max |a| */
static double rel(const void *a, const void *b, size_t count, int bf16)
{
    double d = 0, m = 0;
    for (size_t i = 0; i < count; i++) {
        const double x = val(a, i, bf16), y = val(b, i, bf16);
        if (fabs(x - y) > d) d = fabs(x - y);
        if (fabs(x) > m) m = fabs(x);
    }
    return m > 0 ? d / m : d;
}

struct side {
    bk_ctx *ctx;
    void *ws;
    void *y, *dx;
    float *dw, *db;
};

static int side_init(struct side *sd, int parity, int threads, const struct bk_conv2d *s)
{
    cpu_set_parity(parity);
    if (cpu_ctx_init(&sd->ctx, threads)) return -1;
    const size_t ws = cpu_conv2d_ws_bytes(s), esz = s->dtype ? 2 : 4;
    sd->ws = aligned_alloc(64, (ws + 64) / 64 * 64);
    sd->y = calloc((size_t)s->n * s->co * s->h * s->w, esz);
    sd->dx = calloc((size_t)s->n * s->ci * s->h * s->w, esz);
    sd->dw = calloc((size_t)s->co * s->ci * 9, 4);
    sd->db = calloc((size_t)s->co, 4);
    return sd->ws && sd->y && sd->dx && sd->dw && sd->db ? 0 : -1;
}

static void side_free(struct side *sd)
{
    cpu_ctx_free(sd->ctx);
    free(sd->ws), free(sd->y), free(sd->dx), free(sd->dw), free(sd->db);
}

/* best seconds of reps calls of pass p (0 fwd, 1 data, 2 filter) */
static double timed(struct side *sd, int p, int reps, const void *x, const void *w, const float *b,
                    const void *dy, const struct bk_conv2d *s)
{
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) {
        if (p == 2) { /* the filter gradient accumulates: start from zero each time */
            memset(sd->dw, 0, (size_t)s->co * s->ci * 9 * 4);
            memset(sd->db, 0, (size_t)s->co * 4);
        }
        const double t = now();
        int rc = p == 0   ? cpu_conv2d_fwd(sd->y, x, w, b, sd->ws, s, sd->ctx)
                 : p == 1 ? cpu_conv2d_bwd_data(sd->dx, dy, w, 0, sd->ws, s, sd->ctx)
                          : cpu_conv2d_bwd_filter(sd->dw, sd->db, dy, x, sd->ws, s, sd->ctx);
        const double e = now() - t;
        if (rc) {
            fprintf(stderr, "wino_bench: pass %d failed (%d)\n", p, rc);
            exit(1);
        }
        if (r > 0 && e < best) best = e; /* the first call creates the primitives */
    }
    return best;
}

static int fast_only; /* --fast-only: the Winograd side alone (to profile it) */

static void one(int n, int ci, int co, int hw, int bf16, int reps, int threads)
{
    struct bk_conv2d s = {.n = n, .ci = ci, .h = hw, .w = hw, .co = co, .kh = 3, .kw = 3,
                          .stride = 1, .pad_t = 1, .pad_l = 1, .pad_b = 1, .pad_r = 1,
                          .ho = hw, .wo = hw, .dtype = bf16 ? BK_DTYPE_BF16 : BK_DTYPE_F32,
                          .w_f32 = bf16};
    const size_t nx = (size_t)n * ci * hw * hw, ny = (size_t)n * co * hw * hw;
    void *x = filled(nx, bf16, 1, 1.0f), *dy = filled(ny, bf16, 2, 1.0f);
    float *w = filled((size_t)co * ci * 9, 0, 3, 0.05f), *b = filled(co, 0, 4, 0.1f);
    struct side d, f;
    if (side_init(&d, 1, threads, &s) || side_init(&f, 0, threads, &s)) exit(1);
    const char *pass[3] = {"fwd", "data", "filter"};
    double flops = 2.0 * n * hw * hw * (double)ci * co * 9;
    printf("N%d %4d -> %4d %3dx%-3d %s ws direct %.1f MiB, winograd %.1f MiB\n", n, ci, co, hw, hw,
           bf16 ? "bf16" : "f32 ", (cpu_set_parity(1), cpu_conv2d_ws_bytes(&s)) / 1048576.0,
           (cpu_set_parity(0), cpu_conv2d_ws_bytes(&s)) / 1048576.0);
    for (int p = 0; p < 3 && fast_only; p++)
        printf("  %-6s winograd %7.2f ms\n", pass[p], 1e3 * timed(&f, p, reps, x, w, b, dy, &s));
    for (int p = 0; p < 3 && !fast_only; p++) {
        const double td = timed(&d, p, reps, x, w, b, dy, &s);
        const double tw = timed(&f, p, reps, x, w, b, dy, &s);
        const double e = p == 0   ? rel(d.y, f.y, ny, bf16)
                         : p == 1 ? rel(d.dx, f.dx, nx, bf16)
                                  : rel(d.dw, f.dw, (size_t)co * ci * 9, 0);
        printf("  %-6s direct %7.2f ms (%5.0f GFLOP/s)  winograd %7.2f ms (%5.0f eff.)  %.2fx  "
               "err %.1e\n",
               pass[p], td * 1e3, flops / td * 1e-9, tw * 1e3, flops / tw * 1e-9, td / tw, e);
    }
    side_free(&d), side_free(&f);
    free(x), free(dy), free(w), free(b);
}

int main(int argc, char **argv)
{
    int bf16 = 0, reps = 5, threads = 2, i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "--bf16")) bf16 = 1;
        else if (!strcmp(argv[i], "--fast-only")) fast_only = 1;
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: wino_bench [--bf16] [--fast-only] [--reps N] [--threads T] [N CI CO HW]\n");
            return 2;
        }
    }
    if (argc - i == 4) {
        one(atoi(argv[i]), atoi(argv[i + 1]), atoi(argv[i + 2]), atoi(argv[i + 3]), bf16, reps,
            threads);
        return 0;
    }
    /* the presets' 3x3 stride-1 shapes (ddpm-cifar10, seed-64, fmnist-tiny / cifar-small) */
    static const int sh[][4] = {{8, 128, 128, 32}, {8, 256, 256, 32}, {8, 384, 128, 32},
                                {8, 256, 256, 16}, {8, 512, 256, 16}, {8, 256, 256, 8},
                                {8, 64, 64, 64},   {8, 128, 128, 64}, {8, 512, 512, 16},
                                {32, 32, 32, 32},  {32, 64, 64, 16}};
    for (size_t k = 0; k < sizeof sh / sizeof sh[0]; k++)
        one(sh[k][0], sh[k][1], sh[k][2], sh[k][3], bf16, reps, threads);
    return 0;
}
