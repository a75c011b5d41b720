/* onednn.c - the CPU backend's oneDNN engine and the small helpers conv.c and linear.c share
 * (see onednn.h).
 */
#include <pthread.h>
#include <stdlib.h>

#include "onednn.h"

static dnnl_engine_t g_engine;
static pthread_once_t g_engine_once = PTHREAD_ONCE_INIT;

static void engine_init(void)
{
    if (dnnl_engine_create(&g_engine, dnnl_cpu, 0) != dnnl_success) g_engine = NULL;
}

dnnl_engine_t onednn_engine(void)
{
    pthread_once(&g_engine_once, engine_init);
    return g_engine;
}

size_t onednn_md_bytes(const_dnnl_primitive_desc_t pd, dnnl_query_t what)
{
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, what, 0);
    return md ? dnnl_memory_desc_get_size(md) : 0;
}

int onednn_make_prim(dnnl_primitive_t *out, const_dnnl_primitive_desc_t pd)
{
    return dnnl_primitive_create(out, pd) == dnnl_success ? 0 : -1;
}

int onednn_make_mem(dnnl_memory_t *m, const dnnl_memory_desc_t *md)
{
    return dnnl_memory_create(m, md, onednn_engine(), DNNL_MEMORY_NONE) == dnnl_success ? 0 : -1;
}

int onednn_make_scratch_mem(dnnl_memory_t *m, size_t bytes)
{
    dnnl_dims_t d = {(dnnl_dim_t)(bytes ? bytes : 1)};
    dnnl_memory_desc_t md;
    if (dnnl_memory_desc_init_by_tag(&md, 1, d, dnnl_u8, dnnl_x)) return -1;
    return onednn_make_mem(m, &md);
}

int onednn_make_attr(dnnl_primitive_attr_t *out, int sum)
{
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    int rc = -1;
    if (dnnl_primitive_attr_create(&attr) ||
        dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user))
        goto out;
    if (sum && (dnnl_post_ops_create(&po) || dnnl_post_ops_append_sum(po, 1.0f) ||
                dnnl_primitive_attr_set_post_ops(attr, po)))
        goto out;
    rc = 0;
out:
    if (po) dnnl_post_ops_destroy(po);
    if (rc && attr) {
        dnnl_primitive_attr_destroy(attr);
        attr = NULL;
    }
    *out = attr;
    return rc;
}

/* What pays, measured per op against fp32 (bench/cpu_bench --ceilings, bench/RESULTS.md). On
 * AVX512-BF16 (vdpbf16ps: two bf16 products per fp32 lane) oneDNN 2.6's bf16 kernels, on a
 * 2-core EPYC (Zen 4, no AMX), per CPU-second: linear forward + backward 2048 x 256 -> 256 1.7-
 * 2.0x, the 256 -> 256 3x3 convolution's forward 1.9-2.1x and backward-data 1.5-2.2x, its
 * backward-weights 0.55x, which conv.c therefore replaces where there is no AMX: im2col in bf16
 * and one bf16 GEMM (gemm.c's oneDNN matmul, brgemm on vdpbf16ps) per chunk of pixels
 * (conv_filter_gemm: 1.3-2.2x fp32 at the presets' 3x3 shapes, bench/filter_bench; the route
 * before, fp32 on converted x and dy, made 0.87-1.04x). With AMX oneDNN runs bf16 on the
 * tiles. (On a Xeon of the same ISA measured earlier, oneDNN's bf16 matmuls ran at 0.6x: there
 * the linears stayed fp32; cpu_bench --ceilings tells which machine this is.) Without
 * AVX512-BF16 (an AVX2 CPU, or DNNL_MAX_CPU_ISA capped below it): none. f16: oneDNN 2.6 has
 * no f16 convolutions or matmuls on CPUs. The tiled attention on AVX512-BF16: our own vdpbf16ps
 * tiles (attn_bf16.c), per CPU-second 1.36-1.39x the fp32 tiles' forward and 1.57-1.79x
 * their backward at the seed-64 shapes (cpu_bench --attn --precision bf16), besides the
 * conversions of q, k, v and the gradients it saves; the plain form (the 32x32 presets' L 256)
 * on the same tiles: 255-272 GFLOP/s forward, 306-318 backward per CPU-second in the
 * cifar-small and ddpm-cifar10 b8 steps where the fp32 plain form made 88-110 and 138-148
 * (cpu_bench --profile-cpu --precision bf16). With them, the
 * memory-bound kernels in bf16 too (typed.c: half the bytes, no conversions around them; the
 * same bits as the converted fp32 kernels): bf16 steps, CPU seconds, 0.685 -> 0.606 s
 * fmnist-tiny b32, 0.980 -> 0.870 cifar-small b8, 2.638 -> 2.548 ddpm-cifar10 b8
 * (bench/RESULTS.md). */
unsigned cpu_half_kernels(int dtype)
{
    if (dtype != BK_DTYPE_BF16 || cpu_isa() < CPU_ISA_AVX512_BF16) return 0;
    return BK_HALF_LINEAR | BK_HALF_CONV | BK_HALF_ATTN | BK_HALF_ATTN_PLAIN | BK_HALF_NORM |
           BK_HALF_ELTWISE;
}


int onednn_amx(void)
{
    const unsigned amx = (unsigned)dnnl_cpu_isa_avx512_core_amx;
    return ((unsigned)dnnl_get_effective_cpu_isa() & amx) == amx;
}

static int g_isa = -1, g_isa_cap = -1;

int cpu_isa(void)
{
    if (g_isa < 0) {
        const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
        const unsigned avx512 = (unsigned)dnnl_cpu_isa_avx512_core;
        const unsigned bf16 = (unsigned)dnnl_cpu_isa_avx512_core_bf16;
        g_isa = (isa & bf16) == bf16 ? CPU_ISA_AVX512_BF16
                : (isa & avx512) == avx512 ? CPU_ISA_AVX512
                                           : CPU_ISA_AVX2;
    }
    return g_isa_cap >= 0 && g_isa_cap < g_isa ? g_isa_cap : g_isa;
}

void cpu_isa_cap(int max) { g_isa_cap = max; }

int onednn_run(dnnl_primitive_t p, dnnl_stream_t stream, int nargs, const dnnl_exec_arg_t *args)
{
    return dnnl_primitive_execute(p, stream, nargs, args) == dnnl_success ? 0 : -1;
}

struct onednn_cache *onednn_cache_get(struct onednn_cache **pc)
{
    if (*pc) return *pc;
    struct onednn_cache *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    if (!onednn_engine() ||
        dnnl_stream_create(&c->stream, onednn_engine(), dnnl_stream_default_flags)) {
        free(c);
        return NULL;
    }
    *pc = c;
    return c;
}

void *onednn_cache_slot(struct onednn_cache *c, size_t elem)
{
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 16;
        void *ne = realloc(c->e, (size_t)cap * elem);
        if (!ne) return NULL;
        c->e = ne;
        c->cap = cap;
    }
    return (char *)c->e + (size_t)c->n * elem;
}

void onednn_cache_free(struct onednn_cache **pc, size_t elem, void (*entry_free)(void *entry))
{
    struct onednn_cache *c = *pc;
    if (!c) return;
    for (int i = 0; i < c->n; i++) entry_free((char *)c->e + (size_t)i * elem);
    free(c->e);
    if (c->stream) dnnl_stream_destroy(c->stream);
    free(c);
    *pc = NULL;
}
