/* linear.c - CPU fully connected layer y (M,N) = x (M,K) @ w (N,K)^T + b (N), forward and
 * backward, as GEMMs (cpu_gemm: oneDNN matmuls, their scratchpad in the plan's workspace given by
 * cpu_ctx_set_workspace and sized by cpu_linear_ws_bytes). fp32, or bf16 x, w, y, dy, dx with
 * fp32 accumulation: the bias fp32, dw fp32 (+=); an accumulating bf16 dx is round(dx +
 * round(dy w)) as backend.h says: dy w in fp32 into the workspace, then cpu_accum16.
 */
#include <stdint.h>

#include "half.h"
#include "cpu.h"
#include "onednn.h"

/* column block of the bias-gradient reduction: rows are summed in order within a block */
#define LINEAR_DB_BLOCK 64

enum linear_gemm {
    LINEAR_FWD,      /* y = x w^T */
    LINEAR_FWD_BIAS, /* y = x w^T + b */
    LINEAR_DX,       /* dx = dy w */
    LINEAR_DX_ACC,   /* dx += dy w */
    LINEAR_DW,       /* dw += dy^T x (fp32) */
    LINEAR_DX32,     /* dx = dy w into fp32 (a 16-bit dx +=: rounded and added after) */
    LINEAR_GEMMS
};

/* the GEMM of kind for the layer (m, k, n) in dtype */
static struct cpu_gemm_shape linear_gemm(int kind, int m, int k, int n, int dtype)
{
    switch (kind) {
    case LINEAR_FWD:
    case LINEAR_FWD_BIAS: /* x (M,K) @ w^T: w (N,K) transposed */
        return (struct cpu_gemm_shape){0, 1, m, n, k, k, k, n, dtype, dtype,
                                       kind == LINEAR_FWD_BIAS, 0, 0, 0, 0, 0};
    case LINEAR_DX:
    case LINEAR_DX_ACC: /* dy (M,N) @ w (N,K) */
        return (struct cpu_gemm_shape){0, 0, m, k, n, n, k, k, dtype, dtype, 0,
                                       kind == LINEAR_DX_ACC, 0, 0, 0, 0};
    case LINEAR_DX32:
        return (struct cpu_gemm_shape){0, 0, m, k, n, n, k, k, dtype, BK_DTYPE_F32, 0, 0, 0, 0, 0, 0};
    default: /* dy^T (N,M) @ x (M,K) into fp32 dw (N,K) */
        return (struct cpu_gemm_shape){1, 0, n, k, m, n, k, k, dtype, BK_DTYPE_F32, 0, 1, 0, 0, 0, 0};
    }
}

static int linear_dtype_ok(int dtype) { return dtype == BK_DTYPE_F32 || dtype == BK_DTYPE_BF16; }

/* a 16-bit dx +=: its fp32 dy w at the workspace's start, the GEMM's scratchpad after it */
static size_t linear_dx32_bytes(int m, int k, int dtype)
{
    return dtype == BK_DTYPE_F32 ? 0 : ONEDNN_ALIGN64((size_t)m * k * sizeof(float));
}

size_t cpu_linear_ws_bytes(int m, int k, int n, int dtype)
{
    if (!linear_dtype_ok(dtype) || m < 1 || k < 1 || n < 1) return 0;
    size_t most = 0;
    for (int kind = 0; kind < LINEAR_GEMMS; kind++) {
        if (kind == LINEAR_DX32 && dtype == BK_DTYPE_F32) continue;
        struct cpu_gemm_shape s = linear_gemm(kind, m, k, n, dtype);
        size_t b = cpu_gemm_ws_bytes(&s);
        if (kind == LINEAR_DX32) b += linear_dx32_bytes(m, k, dtype);
        if (b > most) most = b;
    }
    return most;
}

static int linear_run(int kind, void *c, const void *a, const void *b, const float *bias, int m,
                      int k, int n, int dtype, bk_ctx *ctx)
{
    struct cpu_gemm_shape s = linear_gemm(kind, m, k, n, dtype);
    return cpu_gemm(&s, c, a, b, bias, ctx->ws, ctx->ws_bytes, ctx);
}

int cpu_linear_fwd(void *y, const void *x, const void *w, const float *b, int m, int k, int n,
                   int dtype, bk_ctx *ctx)
{
    if (!y || !x || !w || !ctx || m < 1 || k < 1 || n < 1 || !linear_dtype_ok(dtype))
        return BK_ERR_INVALID;
    return linear_run(b ? LINEAR_FWD_BIAS : LINEAR_FWD, y, x, w, b, m, k, n, dtype, ctx);
}

void cpu_col_sums(float *db, const void *dy, int dtype, int m, int n, bk_ctx *ctx)
{
    const int nblk = (n + LINEAR_DB_BLOCK - 1) / LINEAR_DB_BLOCK;
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
    for (int bi = 0; bi < nblk; bi++) {
        int j0 = bi * LINEAR_DB_BLOCK;
        int nb = n - j0 < LINEAR_DB_BLOCK ? n - j0 : LINEAR_DB_BLOCK;
        double acc[LINEAR_DB_BLOCK] = {0};
        for (int i = 0; i < m; i++) {
            size_t r = (size_t)i * n + j0;
            /* across the columns in vectors: each column's sum still in row order */
            if (dtype == BK_DTYPE_BF16) {
#pragma omp simd
                for (int j = 0; j < nb; j++)
                    acc[j] += half_bf16_to_f32(((const uint16_t *)dy)[r + j]);
            } else {
#pragma omp simd
                for (int j = 0; j < nb; j++) acc[j] += ((const float *)dy)[r + j];
            }
        }
        for (int j = 0; j < nb; j++) db[j0 + j] += (float)acc[j];
    }
}

/* dx (M,K) (=/+= per accum, may be NULL), dw (N,K) +=, db (N) += (may be NULL) */
int cpu_linear_bwd(void *dx, float *dw, float *db, const void *dy, const void *x, const void *w,
                   int accum, int m, int k, int n, int dtype, bk_ctx *ctx)
{
    if (!dy || !ctx || m < 1 || k < 1 || n < 1 || !linear_dtype_ok(dtype)) return BK_ERR_INVALID;
    if ((dx && !w) || (dw && !x)) return BK_ERR_INVALID;
    int rc = BK_OK;
    if (dx && accum && dtype != BK_DTYPE_F32) {
        /* backend.h's 16-bit +=: dy w in fp32, rounded to the type, added, rounded again */
        const size_t t = linear_dx32_bytes(m, k, dtype);
        if (!ctx->ws || ctx->ws_bytes < t) return BK_ERR_INVALID;
        struct cpu_gemm_shape s = linear_gemm(LINEAR_DX32, m, k, n, dtype);
        rc = cpu_gemm(&s, ctx->ws, dy, w, NULL, (char *)ctx->ws + t, ctx->ws_bytes - t, ctx);
        if (!rc) cpu_accum16(dx, (float *)ctx->ws, dtype, (size_t)m * k, ctx);
    } else if (dx) {
        rc = linear_run(accum ? LINEAR_DX_ACC : LINEAR_DX, dx, dy, w, NULL, m, k, n, dtype, ctx);
    }
    if (!rc && dw) rc = linear_run(LINEAR_DW, dw, dy, x, NULL, m, k, n, dtype, ctx);
    if (!rc && db) cpu_col_sums(db, dy, dtype, m, n, ctx);
    return rc;
}
