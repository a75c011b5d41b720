/* filter_bench.c - a convolution's filter gradient (dw, db) through conv.c in three forms, in
 * GFLOP per CPU-second of the process (both threads; run under OMP_WAIT_POLICY=PASSIVE, ddpmd's
 * policy, or the spinning thread is counted): fp32; bf16 as fp32 (x and dy converted, then the
 * fp32 op: what conv.c's conv_filter_f32 does); bf16 (the op on bf16 operands: conv.c's choice,
 * im2col + bf16 GEMM where the CPU has AVX512-BF16 without AMX). bench/, not a test.
 *   filter_bench                          the presets' shapes (examples/, cpu_bench's configs)
 *   FILTER_BENCH_BF16=1 filter_bench ...  the bf16 op only: per CPU-second and wall (ms per call)
 *   filter_bench K CI CO HW [N] [STRIDE]  one shape (3x3 padded by 1; stride 2 pads right and
 *                                         bottom by 1, diffusers' downsample; 1x1 unpadded)
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cpu/cpu.h"
#include "half.h"

static double clock_s(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static double cpu_s(void) { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }

static double wall_best; /* run's best wall seconds per call (a loaded machine stretches it) */

/* CPU seconds per call of conv2d_bwd_filter on s (x and dy converted to fp32 first when cvt),
 * best of 3 runs of 5 calls after one */
static double run(const struct bk_conv2d *s, int cvt, float *dw, float *db, const void *dy,
                  const void *x, float *dy32, float *x32, bk_ctx *ctx)
{
    struct bk_conv2d s32 = *s;
    s32.dtype = BK_DTYPE_F32;
    const struct bk_conv2d *sr = cvt ? &s32 : s;
    void *ws = malloc(cpu_conv2d_ws_bytes(sr) + 64);
    const size_t nx = (size_t)s->n * s->h * s->w * s->ci, ny = (size_t)s->n * s->ho * s->wo * s->co;
    double best = 1e30;
    wall_best = 1e30;
    for (int r = 0; r < 4; r++) {
        const double w0 = clock_s(CLOCK_MONOTONIC), t0 = cpu_s();
        for (int i = 0; i < (r ? 5 : 1); i++) {
            if (cvt) {
                cpu_convert(x32, BK_DTYPE_F32, x, s->dtype, nx, ctx);
                cpu_convert(dy32, BK_DTYPE_F32, dy, s->dtype, ny, ctx);
            }
            cpu_conv2d_bwd_filter(dw, db, cvt ? dy32 : dy, cvt ? x32 : x, ws, sr, ctx);
        }
        const double t = (cpu_s() - t0) / 5, w = (clock_s(CLOCK_MONOTONIC) - w0) / 5;
        if (r) best = t < best ? t : best;
        if (r) wall_best = w < wall_best ? w : wall_best;
    }
    free(ws);
    return best;
}

/* one shape: a line of GFLOP per CPU-second */
static int bench(int k, int ci, int co, int hw, int n, int stride, bk_ctx *ctx)
{
    struct bk_conv2d s = {.n = n, .ci = ci, .h = hw, .w = hw, .co = co, .kh = k, .kw = k,
                          .stride = stride, .dtype = BK_DTYPE_BF16};
    if (k > 1 && stride == 1) s.pad_t = s.pad_l = s.pad_b = s.pad_r = k / 2;
    if (k > 1 && stride == 2) s.pad_b = s.pad_r = 1;
    if (bk_conv2d_init(&s)) return 1;
    const size_t nx = (size_t)n * hw * hw * ci, ny = (size_t)n * s.ho * s.wo * co;
    uint16_t *x16 = malloc(nx * 2), *dy16 = malloc(ny * 2);
    float *x = malloc(nx * 4), *dy = malloc(ny * 4), *x32 = malloc(nx * 4), *dy32 = malloc(ny * 4);
    float *dw = calloc((size_t)co * ci * k * k, 4), *db = calloc((size_t)co, 4);
    for (size_t i = 0; i < nx; i++) {
        x16[i] = half_f32_to_bf16((float)rand() / RAND_MAX - 0.5f);
        x[i] = half_bf16_to_f32(x16[i]);
    }
    for (size_t i = 0; i < ny; i++) {
        dy16[i] = half_f32_to_bf16((float)rand() / RAND_MAX - 0.5f);
        dy[i] = half_bf16_to_f32(dy16[i]);
    }
    const double gf = 2e-9 * ny * ci * k * k;
    const double t16 = run(&s, 0, dw, db, dy16, x16, dy32, x32, ctx);
    if (getenv("FILTER_BENCH_BF16")) {
        printf("%dx%d s%d N%-2d %4d -> %4d %2dx%-2d  bf16 %6.1f GFLOP/CPU-s %7.3f ms CPU, "
               "%6.1f GFLOP/s %7.3f ms wall\n", k, k, stride, n, ci, co, hw, hw, gf / t16,
               1e3 * t16, gf / wall_best, 1e3 * wall_best);
    } else {
        const double tc = run(&s, 1, dw, db, dy16, x16, dy32, x32, ctx);
        s.dtype = BK_DTYPE_F32;
        const double t32 = run(&s, 0, dw, db, dy, x, dy32, x32, ctx);
        printf("%dx%d s%d N%d %4d -> %4d %2dx%-2d  fp32 %6.1f  bf16-as-fp32 %6.1f  bf16 %6.1f  "
               "(bf16 / fp32 %.2fx, / bf16-as-fp32 %.2fx)\n", k, k, stride, n, ci, co, hw, hw,
               gf / t32, gf / tc, gf / t16, t32 / t16, tc / t16);
    }
    fflush(stdout);
    free(x16), free(dy16), free(x), free(dy), free(x32), free(dy32), free(dw), free(db);
    return 0;
}

int main(int argc, char **argv)
{
    bk_ctx *ctx;
    if (cpu_ctx_init(&ctx, 2)) return 1;
    printf("filter gradient, GFLOP per CPU-second (2 threads)\n");
    int rc = 0;
    if (argc >= 5) {
        const int k = atoi(argv[1]), ci = atoi(argv[2]), co = atoi(argv[3]), hw = atoi(argv[4]);
        const int n = argc > 5 ? atoi(argv[5]) : 8, st = argc > 6 ? atoi(argv[6]) : 1;
        if (k < 1 || ci < 1 || co < 1 || hw < 1 || n < 1 || st < 1) {
            fprintf(stderr, "usage: filter_bench [K CI CO HW [N] [STRIDE]]\n");
            rc = 2;
        } else {
            rc = bench(k, ci, co, hw, n, st, ctx);
        }
    } else {
        /* k, ci, co, hw, stride, N: the presets' filter gradients, the most frequent and the
         * costliest (cpu_bench --profile-cpu lists them), at N8; fmnist-tiny's at N32 (its
         * batch, cpu_bench --config fmnist-tiny --batch 32), its 1-channel input and output */
        static const int shapes[][6] = {
            {3, 128, 128, 32, 1, 8}, {3, 256, 256, 16, 1, 8}, {3, 256, 256, 8, 1, 8},
            {3, 256, 256, 4, 1, 8},  {3, 512, 256, 8, 1, 8},  {3, 384, 128, 32, 1, 8},
            {3, 128, 128, 32, 2, 8}, {3, 256, 256, 16, 2, 8}, {3, 64, 64, 32, 1, 8},
            {3, 32, 32, 32, 1, 8},   {3, 96, 32, 32, 1, 8},   {3, 64, 64, 8, 1, 8},
            {3, 128, 128, 64, 1, 8}, {3, 512, 512, 8, 1, 8},  {3, 3, 128, 32, 1, 8},
            {3, 128, 3, 32, 1, 8},   {3, 1, 32, 32, 1, 8},    {1, 384, 128, 32, 1, 8},
            {1, 512, 256, 16, 1, 8}, {1, 256, 128, 32, 1, 8}, {3, 32, 32, 32, 1, 32},
            {3, 64, 32, 32, 1, 32},  {3, 96, 32, 32, 1, 32},  {3, 64, 64, 16, 1, 32},
            {3, 32, 32, 32, 2, 32},  {3, 32, 1, 32, 1, 32},   {3, 1, 32, 32, 1, 32},
        };
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0] && !rc; i++)
            rc = bench(shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3], shapes[i][5],
                       shapes[i][4], ctx);
    }
    cpu_ctx_free(ctx);
    return rc;
}
