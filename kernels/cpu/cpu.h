/* cpu.h - the CPU backend's kernels (OpenMP + oneDNN), gathered into a `struct backend` by
 * backend_cpu.c. Signatures are those of kernels/backend.h; see there for the contracts.
 */
#ifndef DDPMD_CPU_H
#define DDPMD_CPU_H

#include "backend.h"

struct onednn_cache;

struct bk_ctx {
    int threads;                 /* fixed per job: results are bit-identical at a given count */
    struct onednn_cache *conv;   /* oneDNN primitives by shape (conv.c), created on first use */
    struct onednn_cache *mm;     /* oneDNN matmuls by shape (gemm.c), likewise */
    void *ws;                    /* the plan's workspace (cpu_ctx_set_workspace): the scratchpad */
    size_t ws_bytes;             /* of the kernels without a ws argument (the linears) */
    size_t budget;               /* the "device" budget (cpu_ctx_set_budget); 0: none */
    size_t held, high_water;     /* bytes cpu_mem_alloc holds now, and the most at once */
    struct cpu_block { void *p; size_t bytes; } *blocks; /* what cpu_mem_alloc handed out */
    int n_blocks, cap_blocks;
};

int cpu_ctx_init(bk_ctx **out, int threads);
/* threads of the job's oneDNN calls and of kernels with per-thread scratch: ctx->threads capped
 * at the machine's cores, for which such workspaces are planned; with ctx NULL, the cores */
int cpu_threads(const bk_ctx *ctx);
/* How the process's OpenMP threads wait between parallel regions, for programs that run jobs
 * (ddpmd, bench/): when the environment names no OMP_WAIT_POLICY, PASSIVE (threads that spin
 * until the next region starve each other and their neighbours on shared cores: libgomp's
 * default spin took a loaded 2-core machine from 15 to 2.5 images/s) with a short spin of
 * GOMP_SPINCOUNT 3000 unless given (~0.1 ms: a worker that sleeps at once pays a wake-up per
 * region, 35 us on a VM whose other core is idle, and fmnist-tiny's steps of micro-batch 1
 * took 3.6x as long; see bench/RESULTS.md). libgomp reads these when it loads, so the process
 * starts argv again with them (execv of /proc/self/exe); returns when nothing needed setting
 * or the exec failed (the process then runs with libgomp's defaults). */
void cpu_omp_wait_policy(char **argv);
void cpu_ctx_free(bk_ctx *ctx);
int cpu_ctx_set_budget(bk_ctx *ctx, size_t bytes);
int cpu_ctx_set_workspace(bk_ctx *ctx, void *ws, size_t bytes);
/* onednn.c: the instruction set of the backend's own vector kernels (the attention's tiles, the
 * bf16 GEMM micro-kernel): what oneDNN reports it may use, so DNNL_MAX_CPU_ISA=AVX2 caps both
 * (an AVX2-only CPU measured on an AVX-512 one). Decided once per process; cpu_isa_cap lowers
 * it (tests run each path on one machine; -1: the machine's again). */
enum cpu_isa { CPU_ISA_AVX2 = 0, CPU_ISA_AVX512 = 1, CPU_ISA_AVX512_BF16 = 2 };
int cpu_isa(void);
void cpu_isa_cap(int max);
/* onednn.c: for bf16, BK_HALF_CONV | BK_HALF_LINEAR where oneDNN runs bf16 on the CPU's
 * AVX512-BF16 instructions or AMX tiles (cpu_isa), else 0 (backend.h half_kernels) */
unsigned cpu_half_kernels(int dtype);
size_t cpu_mem_high_water(const bk_ctx *ctx);
int cpu_mem_alloc(void **out, size_t bytes, bk_ctx *ctx);
void cpu_mem_free(void *p, bk_ctx *ctx);
int cpu_mem_upload(void *dst, const void *src_host, size_t bytes, bk_ctx *ctx);
int cpu_mem_download(void *dst_host, const void *src, size_t bytes, bk_ctx *ctx);
int cpu_mem_set_f32(float *dst, float value, size_t count, bk_ctx *ctx);
int cpu_sync(bk_ctx *ctx);

/* gemm.c: C (M,N) = op(A) op(B) (+ bias), or C += op(A) op(B) (accum), row-major with row
 * strides lda, ldb, ldc; op(A) = A^T when ta (A is then (K,M)), likewise B. A and B of dtype (f32
 * or bf16), C of c_dtype (dtype or f32), the bias (N) f32; accumulated in fp32, an accumulating
 * 16-bit C rounded once from C + result. Every field is part of the primitive cache's key. */
struct cpu_gemm_shape {
    int ta, tb, m, n, k, lda, ldb, ldc;
    int dtype, c_dtype, bias, accum;
};
/* scratchpad bytes of shape s at the machine's cores (at most what fewer threads take) */
size_t cpu_gemm_ws_bytes(const struct cpu_gemm_shape *s);
/* on ctx's threads; the scratchpad in ws (ws_bytes of it; too small: BK_ERR_INVALID) */
int cpu_gemm(const struct cpu_gemm_shape *s, void *c, const void *a, const void *b,
             const float *bias, void *ws, size_t ws_bytes, bk_ctx *ctx);
void cpu_gemm_cache_free(bk_ctx *ctx);

/* conv.c */
size_t cpu_conv2d_ws_bytes(const struct bk_conv2d *s);
void cpu_conv_cache_free(bk_ctx *ctx);
int cpu_conv2d_fwd(void *y, const void *x, const void *w, const float *b, void *ws,
                   const struct bk_conv2d *s, bk_ctx *ctx);
int cpu_conv2d_bwd_data(void *dx, const void *dy, const void *w, int accum, void *ws,
                        const struct bk_conv2d *s, bk_ctx *ctx);
int cpu_conv2d_bwd_filter(float *dw, float *db, const void *dy, const void *x, void *ws,
                          const struct bk_conv2d *s, bk_ctx *ctx);
/* linear.c */
size_t cpu_linear_ws_bytes(int m, int k, int n, int dtype);
int cpu_linear_fwd(void *y, const void *x, const void *w, const float *b, int m, int k, int n,
                   int dtype, bk_ctx *ctx);
int cpu_linear_bwd(void *dx, float *dw, float *db, const void *dy, const void *x,
                   const void *w, int accum, int m, int k, int n, int dtype, bk_ctx *ctx);
/* norm.c */
int cpu_groupnorm_fwd(float *y, float *mean, float *rstd, const float *x, const float *gamma,
                      const float *beta, int n, int c, int hw, int groups, float eps,
                      bk_ctx *ctx);
int cpu_groupnorm_bwd(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                      const float *gamma, const float *mean, const float *rstd, int accum, int n,
                      int c, int hw, int groups, bk_ctx *ctx);
int cpu_groupnorm_silu_fwd(float *y, float *mean, float *rstd, const float *x,
                           const float *gamma, const float *beta, int n, int c, int hw,
                           int groups, float eps, bk_ctx *ctx);
int cpu_groupnorm_bwd_ws(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                         const float *gamma, const float *beta, const float *mean,
                         const float *rstd, int accum, int n, int c, int hw, int groups, int silu,
                         void *ws, bk_ctx *ctx);
size_t cpu_groupnorm_bwd_ws_bytes(int n, int c, int hw, int groups, int silu);
int cpu_layernorm_fwd(float *y, float *mean, float *rstd, const float *x, const float *gamma,
                      const float *beta, int m, int d, float eps, bk_ctx *ctx);
int cpu_layernorm_bwd(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                      const float *gamma, const float *mean, const float *rstd, int accum, int m,
                      int d, bk_ctx *ctx);
/* attention.c */
size_t cpu_attn_ws_bytes(const struct bk_attn *s, int tiled);
int cpu_attn_fwd(void *o, float *lse, const void *q, const void *k, const void *v, void *ws,
                 const struct bk_attn *s, bk_ctx *ctx);
int cpu_attn_bwd(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                 const void *v, const void *o, const float *lse, void *ws,
                 const struct bk_attn *s, bk_ctx *ctx);
int cpu_attn_plain_fwd(void *o, float *p, const void *q, const void *k, const void *v,
                       void *ws, const struct bk_attn *s, bk_ctx *ctx);
int cpu_attn_plain_bwd(void *dq, void *dk, void *dv, const void *dout, const void *q,
                       const void *k, const void *v, const float *p, void *ws,
                       const struct bk_attn *s, bk_ctx *ctx);
/* eltwise.c */
int cpu_silu_fwd(float *y, const float *x, size_t count, bk_ctx *ctx);
int cpu_silu_bwd(float *dx, const float *dy, const float *x, int accum, size_t count,
                 bk_ctx *ctx);
int cpu_gelu_fwd(float *y, const float *x, size_t count, bk_ctx *ctx);
int cpu_gelu_bwd(float *dx, const float *dy, const float *x, int accum, size_t count,
                 bk_ctx *ctx);
int cpu_add_fwd(float *y, const float *a, const float *b, size_t count, bk_ctx *ctx);
int cpu_copy_grad(float *dx, const float *dy, int accum, size_t count, bk_ctx *ctx);
int cpu_add_bcast_fwd(float *y, const float *x, const float *b, int n, int c, int hw,
                      bk_ctx *ctx);
int cpu_add_bcast_bwd(float *db, const float *dy, int accum, int n, int c, int hw, bk_ctx *ctx);
int cpu_scale_fwd(float *y, const float *x, float s, size_t count, bk_ctx *ctx);
/* layout.c */
int cpu_concat_fwd(float *y, const float *a, const float *b, int n, int c1, int c2, int hw,
                   bk_ctx *ctx);
int cpu_concat_bwd(float *da, float *db, const float *dy, int accum_a, int accum_b, int n,
                   int c1, int c2, int hw, bk_ctx *ctx);
int cpu_transpose_fwd(float *y, const float *x, int accum, int n, int c, int hw, bk_ctx *ctx);
/* resample.c */
int cpu_upsample_nearest2x_fwd(float *y, const float *x, int n, int c, int h, int w,
                               bk_ctx *ctx);
int cpu_upsample_nearest2x_bwd(float *dx, const float *dy, int accum, int n, int c, int h,
                               int w, bk_ctx *ctx);
int cpu_upsample_bilinear2x_fwd(float *y, const float *x, int align_corners, int n, int c,
                                int h, int w, bk_ctx *ctx);
int cpu_upsample_bilinear2x_bwd(float *dx, const float *dy, int align_corners, int accum,
                                int n, int c, int h, int w, bk_ctx *ctx);
int cpu_maxpool2x2_fwd(float *y, const float *x, int n, int c, int h, int w, bk_ctx *ctx);
int cpu_maxpool2x2_bwd(float *dx, const float *dy, const float *x, int accum, int n, int c,
                       int h, int w, bk_ctx *ctx);
/* embed.c */
int cpu_timestep_embed_fwd(float *y, const float *t, int n, int dim, int flip_sin_to_cos,
                           float freq_shift, float max_period, bk_ctx *ctx);
/* loss.c */
int cpu_mse_fwd(float *loss, const float *pred, const float *target, size_t count,
                bk_ctx *ctx);
int cpu_mse_bwd(float *dpred, const float *pred, const float *target, float dloss_scale,
                int accum, size_t count, bk_ctx *ctx);
int cpu_xent_fwd(float *loss, float *prob, const float *logits, const float *target, int n, int k,
                 bk_ctx *ctx);
int cpu_xent_bwd(float *dlogits, const float *prob, const float *target, float dloss_scale,
                 int accum, int n, int k, bk_ctx *ctx);
int cpu_dropout_fwd(float *y, const float *x, float p, uint64_t seed, uint64_t step,
                    uint32_t op, int sample_base, int n, size_t per_sample, int channels,
                    bk_ctx *ctx);
int cpu_dropout_bwd(float *dx, const float *dy, float p, uint64_t seed, uint64_t step,
                    uint32_t op, int sample_base, int accum, int n, size_t per_sample,
                    int channels, bk_ctx *ctx);
/* optim.c */
int cpu_sumsq(double *out_host, const float *x, size_t count, bk_ctx *ctx);
int cpu_adamw_step(float *w, float *m, float *v, const float *g, float gscale,
                   const struct bk_adamw *h, size_t count, bk_ctx *ctx);
int cpu_adamw_ema_step(float *w, float *m, float *v, float *ema, const float *g, float gscale,
                       const struct bk_adamw *h, float ema_decay, size_t count, bk_ctx *ctx);
int cpu_ema_update(float *ema, const float *w, float decay, size_t count, bk_ctx *ctx);
/* convert.c */
int cpu_convert(void *dst, int dst_dtype, const void *src, int src_dtype, size_t count,
                bk_ctx *ctx);
/* backend.h's rule for an accumulating 16-bit output of a typed kernel: y (count elements of
 * dtype, bf16 or f16) = round(y + round(r)), r the kernel's fp32 result: r rounded to the type
 * (what the `=` call stores), added to y in fp32, rounded again. r is overwritten (rounded). */
void cpu_accum16(void *y, float *r, int dtype, size_t count, bk_ctx *ctx);

#endif
