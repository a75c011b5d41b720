/* gemm.c - the CPU backend's one GEMM entry: C (M,N) (+)= op(A) op(B) (+ bias) on strided
 * row-major matrices of fp32 or bf16, as oneDNN matmul primitives. oneDNN picks its kernels for
 * the instructions the CPU has (brgemm with AVX-512, its jit GEMM with AVX2); OpenBLAS's own CPU
 * detection fell back to its SSE3 kernels on CPUs it does not know (Debian's 0.3.21 on
 * AVX512-BF16 Xeons: 4-7x slower). A primitive is created on the first call of its shape and kept
 * in the job's context; it runs on the job's threads, so results are a function of (shape, thread
 * count), and takes its scratchpad from the caller's workspace (planned: cpu_gemm_ws_bytes).
 */
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "onednn.h"

struct gemm_entry {
    struct cpu_gemm_shape s;
    size_t scratch;
    dnnl_primitive_t prim;
    dnnl_memory_t a, b, c, bias, scr;
};

static dnnl_data_type_t gemm_dt(int dtype) { return dtype == BK_DTYPE_BF16 ? dnnl_bf16 : dnnl_f32; }

static int gemm_shape_ok(const struct cpu_gemm_shape *s)
{
    const int ac = s->ta ? s->m : s->k, bc = s->tb ? s->k : s->n; /* A's, B's columns */
    const int ok_t = (s->dtype == BK_DTYPE_F32 || s->dtype == BK_DTYPE_BF16) &&
                     (s->c_dtype == BK_DTYPE_F32 || s->c_dtype == s->dtype);
    const int ok_b = s->batch <= 1 || (!s->bias && s->sa >= 0 && s->sb >= 0 && s->sc > 0);
    return ok_t && ok_b && s->m > 0 && s->n > 0 && s->k > 0 && s->lda >= ac && s->ldb >= bc &&
           s->ldc >= s->n;
}

/* a (rows, cols) matrix of type dtype whose element (i, j) is at i * rs + j * cs; with
 * batch > 1, that many of them, bs elements apart */
static int gemm_md(dnnl_memory_desc_t *md, dnnl_dim_t rows, dnnl_dim_t cols, int dtype,
                   dnnl_dim_t rs, dnnl_dim_t cs, int batch, dnnl_dim_t bs)
{
    dnnl_dims_t d = {rows, cols}, st = {rs, cs};
    int nd = 2;
    if (batch > 1) {
        d[0] = batch, d[1] = rows, d[2] = cols;
        st[0] = bs, st[1] = rs, st[2] = cs;
        nd = 3;
    }
    return dnnl_memory_desc_init_by_strides(md, nd, d, gemm_dt(dtype), st) == dnnl_success ? 0
                                                                                           : -1;
}

/* the primitive descriptor of s at the threads now set (omp_set_num_threads); md: A, B, C, bias */
static int gemm_pd_make(dnnl_primitive_desc_t *pd, const struct cpu_gemm_shape *s,
                        dnnl_memory_desc_t md[4])
{
    memset(md, 0, 4 * sizeof *md);
    /* op(A) (M,K): A^T is A (K,M) read with strides (1, lda); likewise op(B) (K,N) */
    const int nb = s->batch;
    if (gemm_md(&md[0], s->m, s->k, s->dtype, s->ta ? 1 : s->lda, s->ta ? s->lda : 1, nb, s->sa) ||
        gemm_md(&md[1], s->k, s->n, s->dtype, s->tb ? 1 : s->ldb, s->tb ? s->ldb : 1, nb, s->sb) ||
        gemm_md(&md[2], s->m, s->n, s->c_dtype, s->ldc, 1, nb, s->sc) ||
        (s->bias && gemm_md(&md[3], 1, s->n, BK_DTYPE_F32, s->n, 1, 1, 0)))
        return -1;
    dnnl_matmul_desc_t d;
    dnnl_primitive_attr_t attr = NULL;
    int rc = -1;
    if (!onednn_engine() || onednn_make_attr(&attr, s->accum) ||
        dnnl_matmul_desc_init(&d, &md[0], &md[1], s->bias ? &md[3] : NULL, &md[2]) ||
        dnnl_primitive_desc_create(pd, &d, attr, onednn_engine(), NULL))
        goto out;
    rc = 0;
out:
    if (attr) dnnl_primitive_attr_destroy(attr);
    return rc;
}

size_t cpu_gemm_ws_bytes(const struct cpu_gemm_shape *s)
{
    if (!s || !gemm_shape_ok(s)) return 0;
    int saved = omp_get_max_threads();
    omp_set_num_threads(cpu_threads(NULL));
    dnnl_primitive_desc_t pd;
    dnnl_memory_desc_t md[4];
    size_t b = 0;
    if (!gemm_pd_make(&pd, s, md)) {
        b = onednn_md_bytes(pd, dnnl_query_scratchpad_md);
        dnnl_primitive_desc_destroy(pd);
    }
    omp_set_num_threads(saved);
    return ONEDNN_ALIGN64(b);
}

static void gemm_entry_free(void *entry)
{
    struct gemm_entry *e = entry;
    if (e->prim) dnnl_primitive_destroy(e->prim);
    dnnl_memory_t *ms[] = {&e->a, &e->b, &e->c, &e->bias, &e->scr};
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        if (*ms[i]) dnnl_memory_destroy(*ms[i]);
}

void cpu_gemm_cache_free(bk_ctx *ctx)
{
    onednn_cache_free(&ctx->mm, sizeof(struct gemm_entry), gemm_entry_free);
}

static int gemm_entry_init(struct gemm_entry *e, const struct cpu_gemm_shape *s)
{
    memset(e, 0, sizeof *e);
    e->s = *s;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_memory_desc_t md[4];
    int rc = -1;
    if (gemm_pd_make(&pd, s, md)) return -1;
    e->scratch = onednn_md_bytes(pd, dnnl_query_scratchpad_md);
    if (onednn_make_prim(&e->prim, pd) || onednn_make_mem(&e->a, &md[0]) ||
        onednn_make_mem(&e->b, &md[1]) || onednn_make_mem(&e->c, &md[2]) ||
        (s->bias && onednn_make_mem(&e->bias, &md[3])) ||
        onednn_make_scratch_mem(&e->scr, e->scratch))
        goto out;
    rc = 0;
out:
    dnnl_primitive_desc_destroy(pd);
    if (rc) gemm_entry_free(e);
    return rc;
}

static int gemm_shape_eq(const struct cpu_gemm_shape *a, const struct cpu_gemm_shape *b)
{
    return a->ta == b->ta && a->tb == b->tb && a->m == b->m && a->n == b->n && a->k == b->k &&
           a->lda == b->lda && a->ldb == b->ldb && a->ldc == b->ldc && a->dtype == b->dtype &&
           a->c_dtype == b->c_dtype && a->bias == b->bias && a->accum == b->accum &&
           (a->batch > 1 ? a->batch : 1) == (b->batch > 1 ? b->batch : 1) &&
           (a->batch <= 1 || (a->sa == b->sa && a->sb == b->sb && a->sc == b->sc));
}

/* the cached primitive of shape s (created on first use), or NULL */
static struct gemm_entry *gemm_get(const struct cpu_gemm_shape *s, bk_ctx *ctx)
{
    struct onednn_cache *c = onednn_cache_get(&ctx->mm);
    if (!c) return NULL;
    struct gemm_entry *es = c->e, *e;
    for (int i = 0; i < c->n; i++)
        if (gemm_shape_eq(&es[i].s, s)) return &es[i];
    if (!(e = onednn_cache_slot(c, sizeof *e))) return NULL;
    if (gemm_entry_init(e, s)) {
        fprintf(stderr, "ddpmd: oneDNN has no matmul for %d x %d x %d (dtype %d)\n", s->m, s->n,
                s->k, s->dtype);
        return NULL;
    }
    c->n++;
    return e;
}

int cpu_gemm(const struct cpu_gemm_shape *s, void *c, const void *a, const void *b,
             const float *bias, void *ws, size_t ws_bytes, bk_ctx *ctx)
{
    if (!s || !c || !a || !b || !ctx || !gemm_shape_ok(s) || (s->bias && !bias))
        return BK_ERR_INVALID;
    omp_set_num_threads(cpu_threads(ctx));
    struct gemm_entry *e = gemm_get(s, ctx);
    if (!e) return BK_ERR_INVALID;
    if (e->scratch > ws_bytes || (e->scratch && !ws)) {
        fprintf(stderr, "ddpmd: GEMM %d x %d x %d needs %zu bytes of workspace, it was given %zu\n",
                s->m, s->n, s->k, e->scratch, ws_bytes);
        return BK_ERR_INVALID;
    }
    onednn_set(e->a, a);
    onednn_set(e->b, b);
    onednn_set(e->c, c);
    onednn_set(e->scr, ws);
    dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, e->a},
                               {DNNL_ARG_WEIGHTS, e->b},
                               {DNNL_ARG_DST, e->c},
                               {DNNL_ARG_SCRATCHPAD, e->scr},
                               {DNNL_ARG_BIAS, e->bias}};
    if (s->bias) onednn_set(e->bias, bias);
    return onednn_run(e->prim, ctx->mm->stream, s->bias ? 5 : 4, args) ? BK_ERR_DEVICE : BK_OK;
}
