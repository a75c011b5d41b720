/* linear.c - CPU fully connected layer y (M,N) = x (M,K) @ w (N,K)^T + b (N), forward and
 * backward, through OpenBLAS sgemm.
 */
#include "cpu.h"

/* column block of the bias-gradient reduction: rows are summed in order within a block */
#define LINEAR_DB_BLOCK 64

int cpu_linear_fwd(void *yv, const void *xv, const void *wv, const float *b, int m, int k, int n,
                   int dtype, bk_ctx *ctx)
{
    if (!yv || !xv || !wv || !ctx || m < 1 || k < 1 || n < 1) return BK_ERR_INVALID;
    if (dtype != BK_DTYPE_F32) return BK_ERR_INVALID;
    float *y = yv;
    const float *x = xv, *w = wv;
    if (b) {
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
        for (int i = 0; i < m; i++)
            for (int j = 0; j < n; j++) y[(size_t)i * n + j] = b[j];
    }
    cpu_gemm(0, 1, m, n, k, 1.0f, x, k, w, k,
                b ? 1.0f : 0.0f, y, n, ctx);
    return BK_OK;
}

/* dx (M,K) (=/+= per accum, may be NULL), dw (N,K) +=, db (N) += (may be NULL) */
int cpu_linear_bwd(void *dxv, float *dw, float *db, const void *dyv, const void *xv,
                   const void *wv, int accum, int m, int k, int n, int dtype, bk_ctx *ctx)
{
    if (!dyv || !ctx || m < 1 || k < 1 || n < 1) return BK_ERR_INVALID;
    if ((dxv && !wv) || (dw && !xv)) return BK_ERR_INVALID;
    if (dtype != BK_DTYPE_F32) return BK_ERR_INVALID;
    float *dx = dxv;
    const float *dy = dyv, *x = xv, *w = wv;
    /* dx (M,K) = dy (M,N) @ w (N,K) */
    if (dx)
        cpu_gemm(0, 0, m, k, n, 1.0f, dy, n, w, k,
                    accum ? 1.0f : 0.0f, dx, k, ctx);
    /* dw (N,K) += dy^T (N,M) @ x (M,K) */
    if (dw)
        cpu_gemm(1, 0, n, k, m, 1.0f, dy, n, x, k, 1.0f,
                    dw, k, ctx);
    if (db) {
        const int nblk = (n + LINEAR_DB_BLOCK - 1) / LINEAR_DB_BLOCK;
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
        for (int bi = 0; bi < nblk; bi++) {
            int j0 = bi * LINEAR_DB_BLOCK;
            int nb = n - j0 < LINEAR_DB_BLOCK ? n - j0 : LINEAR_DB_BLOCK;
            double acc[LINEAR_DB_BLOCK] = {0};
            for (int i = 0; i < m; i++) {
                const float *r = dy + (size_t)i * n + j0;
                for (int j = 0; j < nb; j++) acc[j] += r[j];
            }
            for (int j = 0; j < nb; j++) db[j0 + j] += (float)acc[j];
        }
    }
    return BK_OK;
}
