/* filter1x1_bench.c - a 1x1 convolution's filter gradient (dw, db) in bf16 through conv.c
 * (a bf16 GEMM where the CPU has AVX512-BF16) against the same op in fp32, in GFLOP per
 * CPU-second of the process (both threads; run under OMP_WAIT_POLICY=PASSIVE, ddpmd's policy,
 * or the spinning thread is counted). bench/, not a test.
 *   filter1x1_bench CI CO HW [N]
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cpu/cpu.h"
#include "half.h"

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* seconds per call of conv2d_bwd_filter on s, best of 3 runs of reps calls */
static double run(const struct bk_conv2d *s, float *dw, float *db, const void *dy, const void *x,
                  bk_ctx *ctx)
{
    void *ws = malloc(cpu_conv2d_ws_bytes(s) + 64);
    double best = 1e30;
    cpu_conv2d_bwd_filter(dw, db, dy, x, ws, s, ctx);
    for (int r = 0; r < 3; r++) {
        double t0 = cpu_s();
        for (int i = 0; i < 10; i++) cpu_conv2d_bwd_filter(dw, db, dy, x, ws, s, ctx);
        double t = (cpu_s() - t0) / 10;
        best = t < best ? t : best;
    }
    free(ws);
    return best;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: filter1x1_bench CI CO HW [N]\n");
        return 2;
    }
    const int ci = atoi(argv[1]), co = atoi(argv[2]), hw = atoi(argv[3]);
    const int n = argc > 4 ? atoi(argv[4]) : 8;
    bk_ctx *ctx;
    if (ci < 1 || co < 1 || hw < 1 || n < 1 || cpu_ctx_init(&ctx, 2)) return 1;
    struct bk_conv2d s = {.n = n, .ci = ci, .h = hw, .w = hw, .co = co, .kh = 1, .kw = 1,
                          .stride = 1, .dtype = BK_DTYPE_BF16};
    if (bk_conv2d_init(&s)) return 1;
    const size_t px = (size_t)n * hw * hw;
    uint16_t *x16 = malloc(px * ci * 2), *dy16 = malloc(px * co * 2);
    float *x = malloc(px * ci * 4), *dy = malloc(px * co * 4);
    float *dw = calloc((size_t)co * ci, 4), *db = calloc((size_t)co, 4);
    for (size_t i = 0; i < px * ci; i++) {
        x16[i] = half_f32_to_bf16((float)rand() / RAND_MAX - 0.5f);
        x[i] = half_bf16_to_f32(x16[i]);
    }
    for (size_t i = 0; i < px * co; i++) {
        dy16[i] = half_f32_to_bf16((float)rand() / RAND_MAX - 0.5f);
        dy[i] = half_bf16_to_f32(dy16[i]);
    }
    const double flops = 2.0 * px * ci * co;
    double t16 = run(&s, dw, db, dy16, x16, ctx);
    s.dtype = BK_DTYPE_F32;
    double t32 = run(&s, dw, db, dy, x, ctx);
    printf("1x1 filter gradient N%d %d->%d %dx%d: bf16 %.1f, fp32 %.1f GFLOP per CPU-second "
           "(bf16 / fp32 %.2fx)\n", n, ci, co, hw, hw, flops / t16 * 1e-9, flops / t32 * 1e-9,
           t32 / t16);
    free(x16), free(dy16), free(x), free(dy), free(dw), free(db);
    cpu_ctx_free(ctx);
    return 0;
}
