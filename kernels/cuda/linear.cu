/* linear.cu - fully connected layer y (M,N) = x (M,K) w (N,K)^T + b (N) through cuBLAS (row-major
 * operands read as their column-major transposes): SGEMM for fp32 (pedantic fp32 math in parity
 * mode), cublasGemmEx for 16-bit x, w, y, dy, dx (f16, bf16) with fp32 accumulation
 * (CUBLAS_COMPUTE_32F, tensor cores, in parity mode too) and dw accumulated straight into its
 * fp32 gradient; and the bias-gradient reductions shared with conv.cu: column sums and
 * per-channel sums, each output summed in double by one block in a fixed order (no atomics:
 * deterministic).
 */
#include "cuda_backend.h"

#include <stdlib.h>

#define COLSUM_COLS 32

/* the linear shapes planned in this process, per (device, parity), and whether cu_mem_alloc's
 * warm-up ran them (under cu_query_lock) */
struct lin_shape {
    struct lin_shape *next;
    int device, parity, warmed;
    struct cu_gemm_shape s;
};
static struct lin_shape *g_lin;

size_t cu_linear_ws_bytes(int m, int k, int n, int dtype)
{
    if (m < 1 || k < 1 || n < 1 || !cu_dtype_ok(dtype)) return 0;
    const int device = cu_default_device(), parity = cu_thread_parity();
    cu_query_lock();
    struct lin_shape *l = g_lin;
    while (l && !(l->device == device && l->parity == parity && l->s.m == m && l->s.k == k &&
                  l->s.n == n && l->s.dtype == dtype))
        l = l->next;
    if (!l && (l = (struct lin_shape *)calloc(1, sizeof *l))) {
        l->device = device;
        l->parity = parity;
        l->s.m = m;
        l->s.k = k;
        l->s.n = n;
        l->s.dtype = dtype;
        l->next = g_lin;
        g_lin = l;
    }
    cu_query_unlock();
    return 0;
}

int cu_linear_unwarmed(int device, int parity, struct cu_gemm_shape *shapes, int max)
{
    int n = 0;
    cu_query_lock();
    for (struct lin_shape *l = g_lin; l && n < max; l = l->next)
        if (l->device == device && l->parity == parity && !l->warmed) {
            l->warmed = 1;
            shapes[n++] = l->s;
        }
    cu_query_unlock();
    return n;
}
#define COLSUM_ROWS 32

/* db[j] += sum over i of dy[i][j], dy (M,N): a block owns 32 columns, its 32 x 32 threads walk
 * the rows (coalesced), the 32 partial sums of a column are added in order */
template <typename T> __global__ void k_colsum_add(float *db, const T *dy, int m, int n)
{
    __shared__ double part[COLSUM_ROWS][COLSUM_COLS + 1];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int j = blockIdx.x * COLSUM_COLS + tx;
    double acc = 0.0;
    if (j < n)
        for (int i = ty; i < m; i += COLSUM_ROWS) acc += (double)cu_ld(dy[(size_t)i * n + j]);
    part[ty][tx] = acc;
    __syncthreads();
    if (ty == 0 && j < n) {
        double s = 0.0;
        for (int r = 0; r < COLSUM_ROWS; r++) s += part[r][tx];
        db[j] += (float)s;
    }
}

template <typename T> static int colsum_add(float *db, const void *dy, int m, int n, bk_ctx *ctx)
{
    dim3 block(COLSUM_COLS, COLSUM_ROWS);
    CU_LAUNCH(k_colsum_add<T>, (n + COLSUM_COLS - 1) / COLSUM_COLS, block, 0, ctx->stream)(
        db, (const T *)dy, m, n);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

int cu_colsum_add(float *db, const void *dy, int dtype, int m, int n, bk_ctx *ctx)
{
    if (m < 1 || n < 1) return BK_OK;
    return CU_TYPED(dtype, colsum_add, db, dy, m, n, ctx);
}

/* db[c] += sum over n, hw of dy (N,C,HW): one block per channel */
template <typename T> __global__ void k_chansum_add(float *db, const T *dy, int n, int c, int hw)
{
    __shared__ double sh[33];
    const int ch = blockIdx.x;
    double acc = 0.0;
    for (int ni = 0; ni < n; ni++) {
        const T *r = dy + ((size_t)ni * c + ch) * hw;
        for (int p = threadIdx.x; p < hw; p += blockDim.x) acc += (double)cu_ld(r[p]);
    }
    acc = cu_block_sum(acc, sh);
    if (threadIdx.x == 0) db[ch] += (float)acc;
}

template <typename T>
static int chansum_add(float *db, const void *dy, int n, int c, int hw, bk_ctx *ctx)
{
    CU_LAUNCH(k_chansum_add<T>, c, CU_THREADS, 0, ctx->stream)(db, (const T *)dy, n, c, hw);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

int cu_chansum_add(float *db, const void *dy, int dtype, int n, int c, int hw, bk_ctx *ctx)
{
    if (n < 1 || c < 1 || hw < 1) return BK_OK;
    return CU_TYPED(dtype, chansum_add, db, dy, n, c, hw, ctx);
}

/* y (M,N) = b broadcast over rows */
__global__ void k_rows_bias(float *y, const float *b, int n, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = b[i % n];
}

/* y (M,N) of T += b broadcast over rows, the sum in fp32 rounded once */
template <typename T> __global__ void k_rows_bias_add(T *y, const float *b, int n, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = cu_to<T>(cu_ld(y[i]) + b[i % n]);
}

template <typename T> static int rows_bias_add(void *y, const float *b, int m, int n, bk_ctx *ctx)
{
    const size_t total = (size_t)m * n;
    CU_LAUNCH(k_rows_bias_add<T>, cu_blocks(total, CU_THREADS), CU_THREADS, 0, ctx->stream)(
        (T *)y, b, n, total);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

static cudaDataType blas_type(int dtype) { return dtype == BK_DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF; }

/* column-major C (m,n) = op(A) op(B) + beta C through cublasGemmEx: A, B of dtype (16-bit), C of
 * dtype or fp32 (c32), fp32 accumulation */
static int gemm16(bk_ctx *ctx, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                  const void *a, int lda, const void *b, int ldb, float beta, void *c, int c32,
                  int ldc, int dtype)
{
    const float one = 1.0f;
    const cudaDataType t = blas_type(dtype);
    CUBLAS_CHECK(cublasGemmEx(ctx->cublas, ta, tb, m, n, k, &one, a, t, lda, b, t, ldb, &beta, c,
                              c32 ? CUDA_R_32F : t, ldc, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
    return BK_OK;
}

/* a parity context's handle is pedantic (fp32 without TF32), which would keep 16-bit GEMMs off
 * the tensor cores: around them the handle runs the default math, then is pedantic again */
static int math16(bk_ctx *ctx, int on)
{
    if (!ctx->parity) return BK_OK;
    CUBLAS_CHECK(cublasSetMathMode(ctx->cublas, on ? CUBLAS_DEFAULT_MATH : CUBLAS_PEDANTIC_MATH));
    return BK_OK;
}

static int linear_fwd16(void *y, const void *x, const void *w, const float *b, int m, int k,
                        int n, int dtype, bk_ctx *ctx)
{
    int rc = math16(ctx, 1);
    if (!rc) rc = gemm16(ctx, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, w, k, x, k, 0.0f, y, 0, n, dtype);
    int rc2 = math16(ctx, 0);
    if (rc || (rc = rc2)) return rc;
    if (b) return CU_TYPED(dtype, rows_bias_add, y, b, m, n, ctx);
    return BK_OK;
}

int cu_linear_fwd(void *y, const void *x, const void *w, const float *b, int m, int k, int n,
                  int dtype, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!y || !x || !w || m < 1 || k < 1 || n < 1 || !cu_dtype_ok(dtype)) return BK_ERR_INVALID;
    if (dtype != BK_DTYPE_F32) {
        if (!(cu_device_half(ctx->device, dtype) & BK_HALF_LINEAR)) return BK_ERR_INVALID;
        int rc = linear_fwd16(y, x, w, b, m, k, n, dtype, ctx);
        if (!rc && cu_sync_checks) CU_LAUNCHED(ctx);
        return rc;
    }
    const float one = 1.0f, zero = 0.0f;
    if (b) {
        /* as the CPU: y = b, then y += x w^T */
        size_t total = (size_t)m * n;
        CU_LAUNCH(k_rows_bias, cu_blocks(total, CU_THREADS), CU_THREADS, 0, ctx->stream)(
            (float *)y, b, n, total);
        CU_LAUNCHED(ctx);
    }
    /* column-major: y^T (N,M) = w (N,K) x^T (K,M); w row-major is w^T column-major */
    CUBLAS_CHECK(cublasSgemm(ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, n, m, k, &one,
                             (const float *)w, k, (const float *)x, k, b ? &one : &zero,
                             (float *)y, n));
    if (cu_sync_checks) CU_LAUNCHED(ctx);
    return BK_OK;
}

static int linear_bwd16(void *dx, float *dw, const void *dy, const void *x, const void *w,
                        int accum, int m, int k, int n, int dtype, bk_ctx *ctx)
{
    int rc = math16(ctx, 1);
    /* as the fp32 GEMMs below; accumulating, dx = round(dx + round(dy w)) (backend.h): the
     * tensor-core epilogue with beta 1 rounds the product to the type before it blends; dw
     * (fp32) accumulated by the GEMM itself (C fp32, beta 1) */
    if (!rc && dx)
        rc = gemm16(ctx, CUBLAS_OP_N, CUBLAS_OP_N, k, m, n, w, k, dy, n, accum ? 1.0f : 0.0f, dx,
                    0, k, dtype);
    if (!rc && dw)
        rc = gemm16(ctx, CUBLAS_OP_N, CUBLAS_OP_T, k, n, m, x, k, dy, n, 1.0f, dw, 1, k, dtype);
    int rc2 = math16(ctx, 0);
    return rc ? rc : rc2;
}

int cu_linear_bwd(void *dx, float *dw, float *db, const void *dy, const void *x, const void *w,
                  int accum, int m, int k, int n, int dtype, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!dy || m < 1 || k < 1 || n < 1 || !cu_dtype_ok(dtype)) return BK_ERR_INVALID;
    if ((dx && !w) || (dw && !x)) return BK_ERR_INVALID;
    if (dtype != BK_DTYPE_F32) {
        if (!(cu_device_half(ctx->device, dtype) & BK_HALF_LINEAR)) return BK_ERR_INVALID;
        int rc = linear_bwd16(dx, dw, dy, x, w, accum, m, k, n, dtype, ctx);
        if (rc) return rc;
    } else {
        const float one = 1.0f, zero = 0.0f;
        /* dx (M,K) = dy (M,N) w (N,K); column-major dx^T (K,M) = w^T (K,N) dy^T (N,M) */
        if (dx)
            CUBLAS_CHECK(cublasSgemm(ctx->cublas, CUBLAS_OP_N, CUBLAS_OP_N, k, m, n, &one,
                                     (const float *)w, k, (const float *)dy, n,
                                     accum ? &one : &zero, (float *)dx, k));
        /* dw (N,K) += dy^T (N,M) x (M,K); column-major dw^T (K,N) += x^T (K,M) dy (M,N) */
        if (dw)
            CUBLAS_CHECK(cublasSgemm(ctx->cublas, CUBLAS_OP_N, CUBLAS_OP_T, k, n, m, &one,
                                     (const float *)x, k, (const float *)dy, n, &one, dw, k));
    }
    if (db) {
        int rc = cu_colsum_add(db, dy, dtype, m, n, ctx);
        if (rc) return rc;
    }
    if (cu_sync_checks) CU_LAUNCHED(ctx);
    return BK_OK;
}
