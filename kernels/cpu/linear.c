/* linear.c - CPU fully connected layer y (M,N) = x (M,K) @ w (N,K)^T + b (N), forward and
 * backward. fp32 through OpenBLAS sgemm (cpu_gemm). bf16 through oneDNN matmul primitives: bf16
 * x, w, y, dy, dx with fp32 accumulation, the bias fp32, dw fp32 (+=, a sum post-op), an
 * accumulating dx rounded once from fp32 (dx + result); created once per shape on first use and
 * cached in the job's context like the convolutions, their scratchpad in the plan's workspace
 * (cpu_ctx_set_workspace; sized by cpu_linear_ws_bytes at the machine's core count).
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "half.h"
#include "onednn.h"

/* column block of the bias-gradient reduction: rows are summed in order within a block */
#define LINEAR_DB_BLOCK 64

/* ---- bf16: oneDNN matmul ---- */

enum mm_kind {
    MM_FWD,      /* y = x w^T */
    MM_FWD_BIAS, /* y = x w^T + b */
    MM_DX,       /* dx = dy w */
    MM_DX_ACC,   /* dx += dy w */
    MM_DW,       /* dw += dy^T x (fp32) */
    MM_KINDS
};

struct mm_entry {
    int kind, m, k, n, dtype;
    size_t scratch;
    dnnl_primitive_t prim;
    dnnl_memory_t src, wei, dst, bias, scr;
};

/* a (rows, cols) matrix of type t whose element (i, j) is at i * rs + j * cs */
static int mm_md(dnnl_memory_desc_t *md, dnnl_dim_t rows, dnnl_dim_t cols, dnnl_data_type_t t,
                 dnnl_dim_t rs, dnnl_dim_t cs)
{
    dnnl_dims_t d = {rows, cols}, st = {rs, cs};
    return dnnl_memory_desc_init_by_strides(md, 2, d, t, st) == dnnl_success ? 0 : -1;
}

/* the descriptors of kind for (m, k, n); src, wei, dst (and bias) filled for the memories */
static int mm_pd_make(dnnl_primitive_desc_t *pd, int kind, int m, int k, int n,
                      dnnl_memory_desc_t md[4])
{
    const dnnl_data_type_t t = dnnl_bf16;
    dnnl_memory_desc_t *src = &md[0], *wei = &md[1], *dst = &md[2], *bias = &md[3];
    int rc = 0;
    memset(md, 0, 4 * sizeof *md);
    switch (kind) {
    case MM_FWD:
    case MM_FWD_BIAS: /* x (M,K) @ w^T (K,N): w row-major (N,K) read with strides (1, K) */
        rc = mm_md(src, m, k, t, k, 1) || mm_md(wei, k, n, t, 1, k) || mm_md(dst, m, n, t, n, 1) ||
             (kind == MM_FWD_BIAS && mm_md(bias, 1, n, dnnl_f32, n, 1));
        break;
    case MM_DX:
    case MM_DX_ACC: /* dy (M,N) @ w (N,K) */
        rc = mm_md(src, m, n, t, n, 1) || mm_md(wei, n, k, t, k, 1) || mm_md(dst, m, k, t, k, 1);
        break;
    default: /* dy^T (N,M) @ x (M,K) into fp32 dw (N,K) */
        rc = mm_md(src, n, m, t, 1, n) || mm_md(wei, m, k, t, k, 1) ||
             mm_md(dst, n, k, dnnl_f32, k, 1);
        break;
    }
    if (rc) return -1;
    dnnl_matmul_desc_t d;
    dnnl_primitive_attr_t attr = NULL;
    rc = -1;
    if (!onednn_engine() || onednn_make_attr(&attr, kind == MM_DX_ACC || kind == MM_DW) ||
        dnnl_matmul_desc_init(&d, src, wei, kind == MM_FWD_BIAS ? bias : NULL, dst) ||
        dnnl_primitive_desc_create(pd, &d, attr, onednn_engine(), NULL))
        goto out;
    rc = 0;
out:
    if (attr) dnnl_primitive_attr_destroy(attr);
    return rc;
}

size_t cpu_linear_ws_bytes(int m, int k, int n, int dtype)
{
    if (dtype != BK_DTYPE_BF16 || m < 1 || k < 1 || n < 1) return 0;
    int saved = omp_get_max_threads();
    omp_set_num_threads(cpu_threads(NULL));
    size_t most = 0;
    for (int kind = 0; kind < MM_KINDS; kind++) {
        dnnl_primitive_desc_t pd;
        dnnl_memory_desc_t md[4];
        if (mm_pd_make(&pd, kind, m, k, n, md)) continue;
        size_t b = onednn_md_bytes(pd, dnnl_query_scratchpad_md);
        if (b > most) most = b;
        dnnl_primitive_desc_destroy(pd);
    }
    omp_set_num_threads(saved);
    return ONEDNN_ALIGN64(most);
}

static void mm_entry_free(void *entry)
{
    struct mm_entry *e = entry;
    if (e->prim) dnnl_primitive_destroy(e->prim);
    dnnl_memory_t *ms[] = {&e->src, &e->wei, &e->dst, &e->bias, &e->scr};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        if (*ms[i]) dnnl_memory_destroy(*ms[i]);
}

void cpu_mm_cache_free(bk_ctx *ctx)
{
    onednn_cache_free(&ctx->mm, sizeof(struct mm_entry), mm_entry_free);
}

static int mm_entry_init(struct mm_entry *e, int kind, int m, int k, int n, int dtype)
{
    memset(e, 0, sizeof *e);
    e->kind = kind;
    e->m = m;
    e->k = k;
    e->n = n;
    e->dtype = dtype;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_memory_desc_t md[4];
    int rc = -1;
    if (mm_pd_make(&pd, kind, m, k, n, md)) return -1;
    e->scratch = onednn_md_bytes(pd, dnnl_query_scratchpad_md);
    if (onednn_make_prim(&e->prim, pd) || onednn_make_mem(&e->src, &md[0]) ||
        onednn_make_mem(&e->wei, &md[1]) || onednn_make_mem(&e->dst, &md[2]) ||
        (kind == MM_FWD_BIAS && onednn_make_mem(&e->bias, &md[3])) ||
        onednn_make_scratch_mem(&e->scr, e->scratch))
        goto out;
    rc = 0;
out:
    dnnl_primitive_desc_destroy(pd);
    if (rc) mm_entry_free(e);
    return rc;
}

/* the cached primitive of this kind and shape (created on first use), or NULL */
static struct mm_entry *mm_get(int kind, int m, int k, int n, int dtype, bk_ctx *ctx)
{
    struct onednn_cache *c = onednn_cache_get(&ctx->mm);
    if (!c) return NULL;
    struct mm_entry *es = c->e, *e;
    for (int i = 0; i < c->n; i++)
        if (es[i].kind == kind && es[i].m == m && es[i].k == k && es[i].n == n &&
            es[i].dtype == dtype)
            return &es[i];
    if (!(e = onednn_cache_slot(c, sizeof *e))) return NULL;
    if (mm_entry_init(e, kind, m, k, n, dtype)) {
        fprintf(stderr, "ddpmd: oneDNN has no bf16 matmul for %d x %d x %d\n", m, k, n);
        return NULL;
    }
    c->n++;
    return e;
}

/* dst (=, or += for the accumulating kinds) = src @ wei (+ bias) in the job's threads, the
 * scratchpad from the workspace */
static int mm_run(int kind, void *dst, const void *src, const void *wei, const float *bias, int m,
                  int k, int n, int dtype, bk_ctx *ctx)
{
    omp_set_num_threads(cpu_threads(ctx));
    struct mm_entry *e = mm_get(kind, m, k, n, dtype, ctx);
    if (!e) return BK_ERR_INVALID;
    if (e->scratch > ctx->ws_bytes) {
        fprintf(stderr, "ddpmd: bf16 linear %d x %d x %d needs %zu bytes of workspace, the plan "
                "gave %zu\n", m, k, n, e->scratch, ctx->ws_bytes);
        return BK_ERR_INVALID;
    }
    onednn_set(e->src, src);
    onednn_set(e->wei, wei);
    onednn_set(e->dst, dst);
    onednn_set(e->scr, ctx->ws);
    dnnl_exec_arg_t a[5] = {{DNNL_ARG_SRC, e->src},
                            {DNNL_ARG_WEIGHTS, e->wei},
                            {DNNL_ARG_DST, e->dst},
                            {DNNL_ARG_SCRATCHPAD, e->scr},
                            {DNNL_ARG_BIAS, e->bias}};
    if (bias) onednn_set(e->bias, bias);
    return onednn_run(e->prim, ctx->mm->stream, bias ? 5 : 4, a) ? BK_ERR_DEVICE : BK_OK;
}

/* ---- the kernels ---- */

static int linear_dtype_ok(int dtype) { return dtype == BK_DTYPE_F32 || dtype == BK_DTYPE_BF16; }

int cpu_linear_fwd(void *yv, const void *xv, const void *wv, const float *b, int m, int k, int n,
                   int dtype, bk_ctx *ctx)
{
    if (!yv || !xv || !wv || !ctx || m < 1 || k < 1 || n < 1 || !linear_dtype_ok(dtype))
        return BK_ERR_INVALID;
    if (dtype == BK_DTYPE_BF16)
        return mm_run(b ? MM_FWD_BIAS : MM_FWD, yv, xv, wv, b, m, k, n, dtype, ctx);
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

/* db (N) += column sums of dy (M,N) of dtype, each column's rows summed in order in double */
static void linear_db(float *db, const void *dy, int dtype, int m, int n, bk_ctx *ctx)
{
    const int nblk = (n + LINEAR_DB_BLOCK - 1) / LINEAR_DB_BLOCK;
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
    for (int bi = 0; bi < nblk; bi++) {
        int j0 = bi * LINEAR_DB_BLOCK;
        int nb = n - j0 < LINEAR_DB_BLOCK ? n - j0 : LINEAR_DB_BLOCK;
        double acc[LINEAR_DB_BLOCK] = {0};
        for (int i = 0; i < m; i++) {
            size_t r = (size_t)i * n + j0;
            if (dtype == BK_DTYPE_BF16)
                for (int j = 0; j < nb; j++)
                    acc[j] += half_bf16_to_f32(((const uint16_t *)dy)[r + j]);
            else
                for (int j = 0; j < nb; j++) acc[j] += ((const float *)dy)[r + j];
        }
        for (int j = 0; j < nb; j++) db[j0 + j] += (float)acc[j];
    }
}

/* dx (M,K) (=/+= per accum, may be NULL), dw (N,K) +=, db (N) += (may be NULL) */
int cpu_linear_bwd(void *dxv, float *dw, float *db, const void *dyv, const void *xv,
                   const void *wv, int accum, int m, int k, int n, int dtype, bk_ctx *ctx)
{
    if (!dyv || !ctx || m < 1 || k < 1 || n < 1 || !linear_dtype_ok(dtype)) return BK_ERR_INVALID;
    if ((dxv && !wv) || (dw && !xv)) return BK_ERR_INVALID;
    if (dtype == BK_DTYPE_BF16) {
        int rc = BK_OK;
        if (dxv) rc = mm_run(accum ? MM_DX_ACC : MM_DX, dxv, dyv, wv, NULL, m, k, n, dtype, ctx);
        if (!rc && dw) rc = mm_run(MM_DW, dw, dyv, xv, NULL, m, k, n, dtype, ctx);
        if (!rc && db) linear_db(db, dyv, dtype, m, n, ctx);
        return rc;
    }
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
    if (db) linear_db(db, dy, dtype, m, n, ctx);
    return BK_OK;
}
