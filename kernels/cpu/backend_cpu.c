/* backend_cpu.c - the CPU backend's table and its context/memory functions.
 * Memory is plain host memory; the executor takes all of a job's bytes in one cpu_mem_alloc.
 * A context may carry a budget (cpu_ctx_set_budget): the "device" then refuses what would hold
 * more than it at once, so budgets, admission and out-of-budget paths are tested without a GPU.
 * set_parity: every kernel is deterministic either way (a result is a function of the thread
 * count); fast mode (parity off, training's default) runs the fp32 3x3 convolutions as wino.c's
 * Winograd, parity mode (memory.deterministic) on conv.c's direct kernels. No step_* or graph_*
 * entries: the executor
 * keeps the step's scalars on the host and runs every step as it comes.
 */
#define _DEFAULT_SOURCE /* setenv */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <omp.h>

#include "cpu.h"

/* the calling thread's mode for its later contexts and workspace sizes (ops.def's set_parity):
 * parity (the default) keeps conv.c's direct convolutions, fast mode takes wino.c's where they
 * apply */
static _Thread_local int parity_mode = 1;

int cpu_set_parity(int on)
{
    parity_mode = on != 0;
    return BK_OK;
}

int cpu_parity_now(void) { return parity_mode; }

int cpu_ctx_init(bk_ctx **out, int threads)
{
    bk_ctx *c = calloc(1, sizeof *c);
    if (!c) return BK_ERR_NOMEM;
    /* the block records made here, so a job's allocations (its reservation, a host block) make
     * no bookkeeping allocation of their own inside cpu_mem_alloc */
    c->blocks = malloc(8 * sizeof *c->blocks);
    if (!c->blocks) {
        free(c);
        return BK_ERR_NOMEM;
    }
    c->cap_blocks = 8;
    c->threads = threads > 0 ? threads : 1;
    c->fast = !parity_mode;
    *out = c;
    return BK_OK;
}

int cpu_threads(const bk_ctx *ctx)
{
    int procs = omp_get_num_procs();
    return ctx && ctx->threads < procs ? ctx->threads : procs;
}

void cpu_omp_wait_policy(char **argv)
{
    if (getenv("OMP_WAIT_POLICY")) return; /* the user's choice, ACTIVE on a dedicated machine */
    if (setenv("OMP_WAIT_POLICY", "PASSIVE", 1)) return;
    if (!getenv("GOMP_SPINCOUNT") && setenv("GOMP_SPINCOUNT", "3000", 1)) return;
    execv("/proc/self/exe", argv);
    perror("ddpmd: starting again with OMP_WAIT_POLICY=PASSIVE");
}

void cpu_ctx_free(bk_ctx *ctx)
{
    if (!ctx) return;
    cpu_conv_cache_free(ctx);
    cpu_gemm_cache_free(ctx);
    free(ctx->blocks);
    free(ctx->tables);
    free(ctx);
}

void *cpu_tables(bk_ctx *ctx, size_t bytes)
{
    if (bytes <= ctx->tables_bytes) return ctx->tables;
    void *p = realloc(ctx->tables, bytes);
    if (!p) return NULL;
    ctx->tables = p;
    ctx->tables_bytes = bytes;
    return p;
}

int cpu_ctx_set_budget(bk_ctx *ctx, size_t bytes)
{
    if (!ctx) return BK_ERR_INVALID;
    ctx->budget = bytes;
    return BK_OK;
}

int cpu_ctx_set_workspace(bk_ctx *ctx, void *ws, size_t bytes)
{
    if (!ctx || (bytes && !ws)) return BK_ERR_INVALID;
    ctx->ws = ws;
    ctx->ws_bytes = bytes;
    return BK_OK;
}

size_t cpu_mem_high_water(const bk_ctx *ctx) { return ctx ? ctx->high_water : 0; }

/* whether ctx's budget refuses bytes more (kept out of line: cpu_mem_alloc stays a small
 * function, which test_train_reserve's recorder relies on) */
static __attribute__((noinline)) int cpu_mem_refuse(const bk_ctx *ctx, size_t bytes)
{
    return ctx && ctx->budget && (bytes > ctx->budget || ctx->held > ctx->budget - bytes);
}

/* p (bytes) now held by ctx: its size kept for cpu_mem_free; -1 when the table cannot grow */
static __attribute__((noinline)) int cpu_mem_note(bk_ctx *ctx, void *p, size_t bytes)
{
    if (!ctx) return 0;
    if (ctx->n_blocks == ctx->cap_blocks) {
        int cap = ctx->cap_blocks ? 2 * ctx->cap_blocks : 8;
        struct cpu_block *b = realloc(ctx->blocks, (size_t)cap * sizeof *b);
        if (!b) return -1;
        ctx->blocks = b;
        ctx->cap_blocks = cap;
    }
    ctx->blocks[ctx->n_blocks].p = p;
    ctx->blocks[ctx->n_blocks++].bytes = bytes;
    ctx->held += bytes;
    if (ctx->held > ctx->high_water) ctx->high_water = ctx->held;
    return 0;
}

int cpu_mem_alloc(void **out, size_t bytes, bk_ctx *ctx)
{
    if (cpu_mem_refuse(ctx, bytes)) return BK_ERR_NOMEM;
    /* 64-byte alignment: every planned offset is a multiple of 64 too */
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) return BK_ERR_NOMEM;
    if (cpu_mem_note(ctx, p, bytes)) {
        free(p);
        return BK_ERR_NOMEM;
    }
    *out = p;
    return BK_OK;
}

void cpu_mem_free(void *p, bk_ctx *ctx)
{
    if (p && ctx)
        for (int i = 0; i < ctx->n_blocks; i++)
            if (ctx->blocks[i].p == p) {
                ctx->held -= ctx->blocks[i].bytes;
                ctx->blocks[i] = ctx->blocks[--ctx->n_blocks];
                break;
            }
    free(p);
}

int cpu_mem_upload(void *dst, const void *src_host, size_t bytes, bk_ctx *ctx)
{
    (void)ctx;
    memcpy(dst, src_host, bytes);
    return BK_OK;
}

int cpu_mem_download(void *dst_host, const void *src, size_t bytes, bk_ctx *ctx)
{
    (void)ctx;
    memcpy(dst_host, src, bytes);
    return BK_OK;
}

int cpu_mem_set_f32(float *dst, float value, size_t count, bk_ctx *ctx)
{
    (void)ctx;
    for (size_t i = 0; i < count; i++) dst[i] = value;
    return BK_OK;
}

int cpu_sync(bk_ctx *ctx)
{
    (void)ctx;
    return BK_OK;
}

static const struct backend cpu_backend = {
    .name = "cpu",
    .ctx_init = cpu_ctx_init,
    .ctx_free = cpu_ctx_free,
    .set_parity = cpu_set_parity,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .mem_upload = cpu_mem_upload,
    .mem_download = cpu_mem_download,
    .mem_set_f32 = cpu_mem_set_f32,
    .sync = cpu_sync,
    .conv2d_ws_bytes = cpu_conv2d_ws_bytes,
    .conv2d_fwd = cpu_conv2d_fwd,
    .conv2d_bwd_data = cpu_conv2d_bwd_data,
    .conv2d_bwd_filter = cpu_conv2d_bwd_filter,
    .linear_fwd = cpu_linear_fwd,
    .linear_bwd = cpu_linear_bwd,
    .groupnorm_fwd = cpu_groupnorm_fwd,
    .groupnorm_bwd = cpu_groupnorm_bwd,
    .layernorm_fwd = cpu_layernorm_fwd,
    .layernorm_bwd = cpu_layernorm_bwd,
    .silu_fwd = cpu_silu_fwd,
    .silu_bwd = cpu_silu_bwd,
    .gelu_fwd = cpu_gelu_fwd,
    .gelu_bwd = cpu_gelu_bwd,
    .add_fwd = cpu_add_fwd,
    .copy_grad = cpu_copy_grad,
    .add_bcast_fwd = cpu_add_bcast_fwd,
    .add_bcast_bwd = cpu_add_bcast_bwd,
    .scale_fwd = cpu_scale_fwd,
    .concat_fwd = cpu_concat_fwd,
    .concat_bwd = cpu_concat_bwd,
    .transpose_fwd = cpu_transpose_fwd,
    .upsample_nearest2x_fwd = cpu_upsample_nearest2x_fwd,
    .upsample_nearest2x_bwd = cpu_upsample_nearest2x_bwd,
    .upsample_bilinear2x_fwd = cpu_upsample_bilinear2x_fwd,
    .upsample_bilinear2x_bwd = cpu_upsample_bilinear2x_bwd,
    .maxpool2x2_fwd = cpu_maxpool2x2_fwd,
    .maxpool2x2_bwd = cpu_maxpool2x2_bwd,
    .timestep_embed_fwd = cpu_timestep_embed_fwd,
    .attn_ws_bytes = cpu_attn_ws_bytes,
    .attn_fwd = cpu_attn_fwd,
    .attn_bwd = cpu_attn_bwd,
    .attn_plain_fwd = cpu_attn_plain_fwd,
    .attn_plain_bwd = cpu_attn_plain_bwd,
    .mse_fwd = cpu_mse_fwd,
    .mse_bwd = cpu_mse_bwd,
    .xent_fwd = cpu_xent_fwd,
    .xent_bwd = cpu_xent_bwd,
    .dropout_fwd = cpu_dropout_fwd,
    .dropout_bwd = cpu_dropout_bwd,
    .sumsq = cpu_sumsq,
    .adamw_step = cpu_adamw_step,
    .ema_update = cpu_ema_update,
    .nhwc = 1,
    .conv_w_f32 = 1,
    .typed = &cpu_typed,
    .adamw_ema_step = cpu_adamw_ema_step,
    .sumsq_segs = cpu_sumsq_segs,
    .adamw_segs = cpu_adamw_segs,
    .groupnorm_silu_fwd = cpu_groupnorm_silu_fwd,
    .groupnorm_bwd_ws = cpu_groupnorm_bwd_ws,
    .groupnorm_bwd_ws_bytes = cpu_groupnorm_bwd_ws_bytes,
    .ctx_set_budget = cpu_ctx_set_budget,
    .mem_high_water = cpu_mem_high_water,
    .convert = cpu_convert,
    .ctx_set_workspace = cpu_ctx_set_workspace,
    .half_kernels = cpu_half_kernels,
    .linear_ws_bytes = cpu_linear_ws_bytes,
};

const struct backend *backend_cpu(void) { return &cpu_backend; }
