/* linear.cu - fully connected layer y (M,N) = x (M,K) w (N,K)^T + b (N) through cuBLAS SGEMM
 * (row-major operands read as their column-major transposes; pedantic fp32 math in parity mode),
 * and the bias-gradient reductions shared with conv.cu: column sums and per-channel sums, each
 * output summed in double by one block in a fixed order (no atomics: deterministic).
 */
#include "cuda_backend.h"

#define COLSUM_COLS 32
#define COLSUM_ROWS 32

/* db[j] += sum over i of dy[i][j], dy (M,N): a block owns 32 columns, its 32 x 32 threads walk
 * the rows (coalesced), the 32 partial sums of a column are added in order */
__global__ void k_colsum_add(float *db, const float *dy, int m, int n)
{
    __shared__ double part[COLSUM_ROWS][COLSUM_COLS + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int j = blockIdx.x * COLSUM_COLS + tx;
    double acc = 0.0;
    if (j < n)
        for (int i = ty; i < m; i += COLSUM_ROWS) acc += (double)dy[(size_t)i * n + j];
    part[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && j < n) {
        double s = 0.0;
        for (int r = 0; r < COLSUM_ROWS; r++) s += part[r][tx];
        db[j] += (float)s;
    }
}

int cu_colsum_add(float *db, const float *dy, int m, int n, bk_ctx *ctx)
{
    if (m < 1 || n < 1) return BK_OK;
    dim3 block(COLSUM_COLS, COLSUM_ROWS);
    CU_LAUNCH(k_colsum_add, (n + COLSUM_COLS - 1) / COLSUM_COLS, block, 0, ctx->stream)(
        db, dy, m, n);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

/* db[c] += sum over n, hw of dy (N,C,HW): one block per channel */
__global__ void k_chansum_add(float *db, const float *dy, int n, int c, int hw)
{
    __shared__ double sh[33];
    const int ch = blockIdx.x;
    double acc = 0.0;
    for (int ni = 0; ni < n; ni++) {
        const float *r = dy + ((size_t)ni * c + ch) * hw;
        for (int p = threadIdx.x; p < hw; p += blockDim.x) acc += (double)r[p];
    }
    acc = cu_block_sum(acc, sh);
    if (threadIdx.x == 0) db[ch] += (float)acc;
}

int cu_chansum_add(float *db, const float *dy, int n, int c, int hw, bk_ctx *ctx)
{
    if (n < 1 || c < 1 || hw < 1) return BK_OK;
    CU_LAUNCH(k_chansum_add, c, CU_THREADS, 0, ctx->stream)(db, dy, n, c, hw);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

/* y (M,N) = b broadcast over rows */
__global__ void k_rows_bias(float *y, const float *b, int n, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = b[i % n];
}

int cu_linear_fwd(void *yv, const void *xv, const void *wv, const float *b, int m, int k, int n,
                  int dtype, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!yv || !xv || !wv || m < 1 || k < 1 || n < 1) return BK_ERR_INVALID;
    if (dtype != BK_DTYPE_F32) return BK_ERR_INVALID; /* no 16-bit kernels yet */
    float *y = (float *)yv;
    const float *x = (const float *)xv, *w = (const float *)wv;
    const float one = 1.0f, zero = 0.0f;
    if (b) {
        /* as the CPU: y = b, then y += x w^T */
        size_t total = (size_t)m * n;
        CU_LAUNCH(k_rows_bias, cu_blocks(total, CU_THREADS), CU_THREADS, 0, ctx->stream)(
            y, b, n, total);
        CU_LAUNCHED(ctx);
    }
    /* column-major: y^T (N,M) = w (N,K) x^T (K,M); w row-major is w^T column-major */
    CUBLAS_CHECK(cublasSgemm(ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one, w, k, x, k,
                             b ? &one : &zero, y, n));
    if (cu_sync_checks) CU_LAUNCHED(ctx);
    return BK_OK;
}

int cu_linear_bwd(void *dxv, float *dw, float *db, const void *dyv, const void *xv,
                  const void *wv, int accum, int m, int k, int n, int dtype, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!dyv || m < 1 || k < 1 || n < 1) return BK_ERR_INVALID;
    if ((dxv && !wv) || (dw && !xv)) return BK_ERR_INVALID;
    if (dtype != BK_DTYPE_F32) return BK_ERR_INVALID; /* no 16-bit kernels yet */
    float *dx = (float *)dxv;
    const float *dy = (const float *)dyv, *x = (const float *)xv, *w = (const float *)wv;
    const float one = 1.0f, zero = 0.0f;
    /* dx (M,K) = dy (M,N) w (N,K); column-major dx^T (K,M) = w^T (K,N) dy^T (N,M) */
    if (dx)
        CUBLAS_CHECK(cublasSgemm(ctx->cublas, CUBLAS_OP_N, CUBLAS_OP_N, k, m, n, &one, w, k, dy,
                                 n, accum ? &one : &zero, dx, k));
    /* dw (N,K) += dy^T (N,M) x (M,K); column-major dw^T (K,N) += x^T (K,M) dy (M,N) */
    if (dw)
        CUBLAS_CHECK(cublasSgemm(ctx->cublas, CUBLAS_OP_N, CUBLAS_OP_T, k, n, m, &one, x, k, dy,
                                 n, &one, dw, k));
    if (db) {
        int rc = cu_colsum_add(db, dy, m, n, ctx);
        if (rc) return rc;
    }
    if (cu_sync_checks) CU_LAUNCHED(ctx);
    return BK_OK;
}
