/* gemm.c - the CPU backend's one GEMM entry: C = alpha op(A) op(B) + beta C, row-major, split
 * across the job's threads by us, each block a single-threaded OpenBLAS sgemm. Threaded OpenBLAS
 * mallocs on every call and is process-global; this keeps steps allocation-free and results a
 * function of (shape, job thread count) only.
 */
#include <cblas.h>

#include "cpu.h"

/* below this many multiply-adds a split costs more than it saves */
#define GEMM_SPLIT_MIN_FLOPS (1 << 18)

void cpu_gemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float *a, int lda,
              const float *b, int ldb, float beta, float *c, int ldc, bk_ctx *ctx)
{
    const enum CBLAS_TRANSPOSE ta = trans_a ? CblasTrans : CblasNoTrans;
    const enum CBLAS_TRANSPOSE tb = trans_b ? CblasTrans : CblasNoTrans;
    int parts = ctx->threads;
    if ((double)m * n * k < GEMM_SPLIT_MIN_FLOPS) parts = 1;
    /* split the larger of C's dimensions into equal blocks, multiples of 16 */
    int split_n = n >= m;
    int dim = split_n ? n : m;
    int blk = (dim + parts - 1) / parts;
    blk = (blk + 15) / 16 * 16;
    int nblk = (dim + blk - 1) / blk;
    if (nblk <= 1) {
        cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
#pragma omp parallel for num_threads(ctx->threads) schedule(static, 1)
    for (int i = 0; i < nblk; i++) {
        int s = i * blk, e = s + blk < dim ? s + blk : dim;
        if (split_n) {
            /* C[:, s:e] = op(A) op(B)[:, s:e] */
            const float *bb = trans_b ? b + (size_t)s * ldb : b + s;
            cblas_sgemm(CblasRowMajor, ta, tb, m, e - s, k, alpha, a, lda, bb, ldb, beta, c + s,
                        ldc);
        } else {
            /* C[s:e, :] = op(A)[s:e, :] op(B) */
            const float *aa = trans_a ? a + s : a + (size_t)s * lda;
            cblas_sgemm(CblasRowMajor, ta, tb, e - s, n, k, alpha, aa, lda, b, ldb, beta,
                        c + (size_t)s * ldc, ldc);
        }
    }
}
