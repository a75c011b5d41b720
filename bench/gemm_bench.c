/* gemm_bench.c - the CPU backend's GEMM (cpu_gemm: oneDNN matmul) against OpenBLAS's
 * cblas_sgemm (the engine's GEMM before), one thread, on the engine's shapes: the linears of the
 * UNets' attention blocks (forward, dx, dw) and the plain attention's products. Best of --reps
 * in thread CPU time (the machines are shared). Run it under OPENBLAS_CORETYPE and
 * DNNL_MAX_CPU_ISA to compare the kernels each library picks. Not a test: ratios > 1 mean
 * cpu_gemm is ahead.
 *   ./build/gemm_bench [--reps N]
 */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu.h"

static double thread_cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv)
{
    int reps = 15;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else return fprintf(stderr, "usage: gemm_bench [--reps N]\n"), 2;
    }
    /* ta tb m n k: linear forward, dx, dw of 2048 tokens 256 -> 256 (ddpm-cifar10's attention)
     * and 64 -> 64 (fmnist-tiny's); the plain attention's q k^T and p v at L = D = 256 and 64 */
    static const int sh[][5] = {{0, 1, 2048, 256, 256}, {0, 0, 2048, 256, 256},
                                {1, 0, 256, 256, 2048}, {0, 1, 2048, 64, 64},
                                {0, 0, 2048, 64, 64},   {1, 0, 64, 64, 2048},
                                {0, 1, 256, 256, 256},  {0, 0, 256, 256, 256},
                                {0, 1, 64, 64, 64},     {0, 0, 64, 64, 64}};
    bk_ctx *ctx = NULL;
    if (cpu_ctx_init(&ctx, 1)) return 1;
    openblas_set_num_threads(1);
    double tot[2] = {0, 0};
    int rc = 0;
    printf("# one thread, best of %d; GFLOP/s; ratio = OpenBLAS time / cpu_gemm time\n", reps);
    for (size_t i = 0; i < sizeof sh / sizeof sh[0] && !rc; i++) {
        const int ta = sh[i][0], tb = sh[i][1], m = sh[i][2], n = sh[i][3], k = sh[i][4];
        const int lda = ta ? m : k, ldb = tb ? k : n;
        const struct cpu_gemm_shape s = {ta, tb, m, n, k, lda, ldb, n,
                                         BK_DTYPE_F32, BK_DTYPE_F32, 0, 0, 0, 0, 0, 0};
        const size_t wsb = cpu_gemm_ws_bytes(&s);
        float *a = malloc((size_t)m * k * sizeof(float)), *b = malloc((size_t)k * n * sizeof(float));
        float *c = malloc((size_t)m * n * sizeof(float));
        void *ws = malloc(wsb ? wsb : 1);
        if (!a || !b || !c || !ws) rc = 1;
        for (size_t j = 0; !rc && j < (size_t)m * k; j++) a[j] = (float)(j % 97) / 97.0f;
        for (size_t j = 0; !rc && j < (size_t)k * n; j++) b[j] = (float)(j % 89) / 89.0f;
        double best[2] = {1e30, 1e30};
        for (int r = 0; !rc && r < reps; r++) {
            double t0 = thread_cpu_s();
            if (cpu_gemm(&s, c, a, b, NULL, ws, wsb, ctx)) rc = 1;
            double t1 = thread_cpu_s();
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                        tb ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, lda, b, ldb, 0.0f, c, n);
            double t2 = thread_cpu_s();
            if (t1 - t0 < best[0]) best[0] = t1 - t0;
            if (t2 - t1 < best[1]) best[1] = t2 - t1;
        }
        if (!rc) {
            const double f = 2e-9 * m * n * k;
            tot[0] += best[0];
            tot[1] += best[1];
            printf("%c%c %5d x %4d x %4d  cpu_gemm %7.3f ms %6.1f  OpenBLAS %7.3f ms %6.1f  "
                   "ratio %.2f\n", ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, best[0] * 1e3,
                   f / best[0], best[1] * 1e3, f / best[1], best[1] / best[0]);
        }
        free(a);
        free(b);
        free(c);
        free(ws);
    }
    if (!rc)
        printf("sum: cpu_gemm %.3f ms, OpenBLAS %.3f ms, ratio %.2f\n", tot[0] * 1e3,
               tot[1] * 1e3, tot[1] / tot[0]);
    cpu_ctx_free(ctx);
    return rc;
}
