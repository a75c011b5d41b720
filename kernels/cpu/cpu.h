/* cpu.h - the CPU backend's kernels (OpenMP + oneDNN), gathered into a `struct backend` by
 * backend_cpu.c: cpu_<fn> for each entry of kernels/ops.def (signatures and contracts there;
 * the entries it has no kernel for stay declared and undefined), and the backend's own helpers.
 */
#ifndef DDPMD_CPU_H
#define DDPMD_CPU_H

#include "backend.h"

struct onednn_cache;

struct bk_ctx {
    int threads;                 /* fixed per job: results are bit-identical at a given count */
    int fast;                    /* made in fast mode (set_parity(0)): Winograd convolutions */
    struct onednn_cache *conv;   /* oneDNN primitives by shape (conv.c), created on first use */
    struct onednn_cache *mm;     /* oneDNN matmuls by shape (gemm.c), likewise */
    void *ws;                    /* the plan's workspace (cpu_ctx_set_workspace): the scratchpad */
    size_t ws_bytes;             /* of the kernels without a ws argument (the linears) */
    size_t budget;               /* the "device" budget (cpu_ctx_set_budget); 0: none */
    size_t held, high_water;     /* bytes cpu_mem_alloc holds now, and the most at once */
    struct cpu_block { void *p; size_t bytes; } *blocks; /* what cpu_mem_alloc handed out */
    int n_blocks, cap_blocks;
    void *tables;                /* host tables of the kernels that need some (cpu_tables) */
    size_t tables_bytes;
};

/* every entry of ops.def as cpu_<fn>. Where they are: backend_cpu.c (context, memory, budget,
 * workspace), conv.c, linear.c, norm.c, attention.c, eltwise.c, layout.c, resample.c, embed.c,
 * loss.c (losses, dropout), optim.c, convert.c, onednn.c (half_kernels: for bf16,
 * BK_HALF_CONV | BK_HALF_LINEAR | BK_HALF_ATTN | BK_HALF_NORM | BK_HALF_ELTWISE where oneDNN
 * runs bf16 on the CPU's AVX512-BF16 instructions or AMX tiles and attn_bf16.c's tiles run
 * (cpu_isa), else 0). Not filled: the devices, Philox fills, offload's copies, the step
 * on the device and graphs. */
#define BK_OP(ret, fn, args, half) ret cpu_##fn args;
#include "ops.def"
/* every entry of struct bk_typed as cpu_t_<fn> (typed.c, on norm.c's, eltwise.c's, layout.c's,
 * resample.c's and loss.c's kernel bodies): fp32 gives the fp32 entry's bits, bf16 and f16
 * operands are read and written in their type with fp32 arithmetic inside */
#define BK_TYPED_OP(ret, fn, args, half) ret cpu_t_##fn args;
#include "ops.def"
extern const struct bk_typed cpu_typed;

/* at least `bytes` of the context's host tables (per-call bookkeeping such as optim.c's chunk
 * lists): grown on the first call that needs more and kept, so a step's calls after the first
 * allocate nothing; NULL when out of memory */
void *cpu_tables(bk_ctx *ctx, size_t bytes);

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
/* onednn.c: the instruction set of the backend's own vector kernels (the attention's tiles, the
 * bf16 GEMM micro-kernel): what oneDNN reports it may use, so DNNL_MAX_CPU_ISA=AVX2 caps both
 * (an AVX2-only CPU measured on an AVX-512 one). Decided once per process; cpu_isa_cap lowers
 * it (tests run each path on one machine; -1: the machine's again). */
enum cpu_isa { CPU_ISA_AVX2 = 0, CPU_ISA_AVX512 = 1, CPU_ISA_AVX512_BF16 = 2 };
int cpu_isa(void);
void cpu_isa_cap(int max);

/* gemm.c: C (M,N) = op(A) op(B) (+ bias), or C += op(A) op(B) (accum), row-major with row
 * strides lda, ldb, ldc; op(A) = A^T when ta (A is then (K,M)), likewise B. A and B of dtype (f32
 * or bf16), C of c_dtype (dtype or f32), the bias (N) f32; accumulated in fp32, an accumulating
 * 16-bit C rounded once from C + result. Every field is part of the primitive cache's key. */
struct cpu_gemm_shape {
    int ta, tb, m, n, k, lda, ldb, ldc;
    int dtype, c_dtype, bias, accum;
    int batch;              /* > 1: that many products at once (no bias), the b-th one's A, B, C */
    long long sa, sb, sc;   /* b * sa, b * sb, b * sc elements from a, b, c (0, 1: one) */
};
/* scratchpad bytes of shape s at the machine's cores (at most what fewer threads take) */
size_t cpu_gemm_ws_bytes(const struct cpu_gemm_shape *s);
/* on ctx's threads; the scratchpad in ws (ws_bytes of it; too small: BK_ERR_INVALID) */
int cpu_gemm(const struct cpu_gemm_shape *s, void *c, const void *a, const void *b,
             const float *bias, void *ws, size_t ws_bytes, bk_ctx *ctx);
void cpu_gemm_cache_free(bk_ctx *ctx);

/* linear.c: db (N) += the column sums of dy (M,N) of dtype (fp32 or bf16), each column's rows
 * summed in order in double (thread-count independent): the bias gradients of the linears and
 * of the convolutions (dy as (pixels, Co)) */
void cpu_col_sums(float *db, const void *dy, int dtype, int m, int n, bk_ctx *ctx);

/* wino.c: the fast mode's 3x3 stride-1 convolutions padded by 1 (Winograd F(4x4, 3x3)), fp32,
 * channels multiples of 8 and at least WINO_MIN_CH; conv.c calls them in a fast-mode context
 * (set_parity(0)) where cpu_wino_applies, with cpu_wino_ws_bytes of ws */
#define WINO_MIN_CH 32
/* the most bytes of a chunk's transformed input and output: 8 MiB (tests set it lower to run
 * many chunks; set before sizing a workspace and kept while it is used) */
extern size_t cpu_wino_chunk_bytes;
int cpu_wino_applies(const struct bk_conv2d *s);
size_t cpu_wino_ws_bytes(const struct bk_conv2d *s);
int cpu_wino_fwd(void *y, const void *x, const void *w, const float *b, void *ws,
                 const struct bk_conv2d *s, bk_ctx *ctx);
int cpu_wino_bwd_data(void *dx, const void *dy, const void *w, int accum, void *ws,
                      const struct bk_conv2d *s, bk_ctx *ctx);
int cpu_wino_bwd_filter(float *dw, float *db, const void *dy, const void *x, void *ws,
                        const struct bk_conv2d *s, bk_ctx *ctx);
/* backend_cpu.c: the calling thread's mode (set_parity; on by default), and whether ctx was
 * made in fast mode */
int cpu_parity_now(void);

/* conv.c: its oneDNN primitives of ctx */
void cpu_conv_cache_free(bk_ctx *ctx);
/* wgrad_bf16.c (AVX512-BF16 only): a stride-1 bf16 filter gradient's output rows row0 .. row1 - 1
 * (of N*Ho, Wo pixels each; Co a multiple of 16), input channels c0 .. c1 - 1, added into acc
 * (Kh, Kw, Ci, Co) fp32, in blocks of at most rb rows of one image on the calling thread; db
 * (Co fp32, may be NULL) += dy summed over the rows, pixel by pixel in order;
 * scratch: cpu_wgrad_bf16_bytes(s, rb, c1 - c0) */
size_t cpu_wgrad_bf16_bytes(const struct bk_conv2d *s, int rb, int nc);
void cpu_wgrad_bf16_rows(float *acc, float *db, const uint16_t *dy, const uint16_t *x, int row0,
                         int row1, int c0, int c1, int rb, const struct bk_conv2d *s,
                         void *scratch);
/* NULL in the service; a test sets it to see the scratch conv.c hands each call of
 * cpu_wgrad_bf16_rows (the omp thread t, the range p .. p + bytes - 1 it claims): threads
 * sharing a scratch race only where their calls overlap in time, and a range short of its claim
 * can still lie inside the planned workspace, where neither a run nor ASan sees it */
extern void (*cpu_wgrad_bf16_scratch)(int t, const void *p, size_t bytes);
/* backend.h's rule for an accumulating 16-bit output of a typed kernel: y (count elements of
 * dtype, bf16 or f16) = round(y + round(r)), r the kernel's fp32 result: r rounded to the type
 * (what the `=` call stores), added to y in fp32, rounded again. */
void cpu_accum16(void *y, const float *r, int dtype, size_t count, bk_ctx *ctx);
/* eltwise.c: one block (at most 4096 elements) of the SiLU and GELU entries on the calling
 * thread, which those entries and typed.c run block by block */
void cpu_silu_block(float *y, const float *x, size_t n);
void cpu_silu_bwd_block(float *dx, const float *dy, const float *x, int accum, size_t n);
void cpu_gelu_block(float *y, const float *x, size_t n);
void cpu_gelu_bwd_block(float *dx, const float *dy, const float *x, int accum, size_t n);
/* eltwise512.c: the same blocks in AVX-512, which the four above call where cpu_isa() says */
void cpu_silu_block_avx512(float *y, const float *x, size_t n);
void cpu_silu_bwd_block_avx512(float *dx, const float *dy, const float *x, int accum, size_t n);
void cpu_gelu_block_avx512(float *y, const float *x, size_t n);
void cpu_gelu_bwd_block_avx512(float *dx, const float *dy, const float *x, int accum, size_t n);
/* convert.c: count elements src -> dst (fp32 <-> bf16 / f16) on the calling thread, as
 * cpu_convert: the typed kernels' blocks */
void cpu_convert_run(void *dst, int dst_dtype, const void *src, int src_dtype, size_t count);

#endif
