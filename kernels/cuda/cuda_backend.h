/* cuda_backend.h - the CUDA backend's internals (CUDA C++, compiled by nvcc only): the job context,
 * the per-device pool of library handles, the check macros and every kernel entry. The backend
 * is the shared module libddpmd_cuda.so; its one export is ddpmd_backend_cuda() (backend_cuda.cu).
 */
#ifndef DDPMD_CUDA_BACKEND_H
#define DDPMD_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include "backend.h"
#include "half.h"

/* every launch goes through CU_LAUNCH(kernel, grid, block, smem, stream)(args...) and dynamic
 * shared memory through CU_EXTERN_SHARED: tests/gpu/emu (a host SIMT emulator that runs these
 * same sources on the CPU) defines its own */
#ifndef CU_LAUNCH
#define CU_LAUNCH(kernel, grid, block, smem, stream) kernel<<<(grid), (block), (smem), (stream)>>>
#endif
#ifndef CU_EXTERN_SHARED
#define CU_EXTERN_SHARED(type, name) extern __shared__ type name[]
#endif
/* the emulator's stream-order check takes a kernel's pointer argument for the object starting
 * there; CU_TOUCHES(p, bytes) right before a launch names the bytes it touches from p */
#ifndef CU_TOUCHES
#define CU_TOUCHES(p, bytes) ((void)0)
#endif
/* CU_WARMING(1) ... CU_WARMING(0) around the backend's own warm-up launches (cu_mem_alloc's run of
 * a plan's library calls): the emulator's planted faults (EMU_FAULT_AT_LAUNCH) count a job's
 * launches without them */
#ifndef CU_WARMING
#define CU_WARMING(on) ((void)0)
#endif

#define CU_MAX_DEVICES 16
#define CU_MAX_SLOTS 16 /* made at the warm-up at most (DDPMD_CUDA_SLOTS); more on demand */
#define CU_THREADS 256
#define CU_SCRATCH_DOUBLES 4096 /* per slot: partial sums of the two-stage reductions */
#define CU_REDUCE_CHUNKS 256    /* at most this many partials (<= CU_SCRATCH_DOUBLES - 8) */

struct cu_slot;
/* a job's context: one stream and library handles borrowed from the device's pool (created and
 * measured at the warm-up, so a job allocates nothing but its one reservation); its device and
 * parity mode are fixed at ctx_init */
struct bk_ctx {
    int device;
    int parity;           /* fp32-only, deterministic algorithms (set_parity of the thread) */
    struct cu_slot *slot; /* the pool's, returned at ctx_free */
    cudaStream_t stream;
    cudnnHandle_t cudnn;
    cublasHandle_t cublas;
    double *scratch;    /* device, CU_SCRATCH_DOUBLES */
    double *host;       /* pinned host, 8 doubles */
    void *ws;           /* the plan's workspace (ctx_set_workspace), for cuBLAS */
    size_t ws_bytes;
    /* offload's copies: a stream of the slot's, and two events ordering it against `stream`
     * (computed: the compute work a download follows; copied: the copies a fence waits for) */
    cudaStream_t copy;
    cudaEvent_t computed, copied;
    int copies;         /* copies enqueued since the last copy_fence / copy_sync */
    /* the budget (ctx_set_budget; 0: none) and what mem_alloc holds: at most CU_CTX_BLOCKS
     * device allocations at once (a job makes one, its reservation) */
    size_t budget, held, high_water;
    int n_blocks;
    struct {
        void *p;
        size_t bytes;
    } blocks[8];
    int capturing;      /* between graph_begin and graph_end: nothing may make the host wait */
    unsigned long long steps_read; /* the step log's records step_read has given */
};
#define CU_CTX_BLOCKS 8

/* ---- status and checks (backend_cuda.cu) ---- */
extern int cu_sync_checks;   /* DDPMD_CUDA_SYNC=1: synchronize after every launch */
/* the calling thread's device_select (default 0) and parity mode (set_parity, default
 * DDPMD_CUDA_PARITY or on): what its ctx_init and *_ws_bytes queries use */
int cu_default_device(void);
int cu_thread_parity(void);
/* the device is warmed up (context, pool, handles); BK_ERR_DEVICE with a logged reason */
int cu_device_ready(int device);
/* the typed kernels (enum bk_half) that take 16-bit dtype natively on the device, and its
 * compute capability (major * 10 + minor); warmed up first, 0 where it is not usable */
unsigned cu_device_half(int device, int dtype);
int cu_device_cc(int device);
/* the shared cuDNN handle of a device for queries that have no job (conv2d_ws_bytes); callers
 * hold cu_query_lock() while they use it */
cudnnHandle_t cu_query_cudnn(int device);
void cu_query_lock(void);
void cu_query_unlock(void);

/* each logs "file:line: what: reason", clears a non-sticky error and marks the device poisoned
 * on a sticky one; returns BK_ERR_NOMEM for out-of-memory, BK_ERR_DEVICE otherwise */
int cu_fail_cuda(cudaError_t e, const char *what, const char *file, int line);
int cu_fail_cudnn(cudnnStatus_t s, const char *what, const char *file, int line);
int cu_fail_cublas(cublasStatus_t s, const char *what, const char *file, int line);
/* every entry point: BK_ERR_DEVICE on a poisoned device, else makes ctx's device current */
int cu_enter(bk_ctx *ctx);
/* after every launch: the launch error, and with cu_sync_checks the execution error */
int cu_launched(bk_ctx *ctx, const char *file, int line);

#define CU_CHECK(call)                                                                         \
    do {                                                                                       \
        cudaError_t cu_e_ = (call);                                                            \
        if (cu_e_ != cudaSuccess) return cu_fail_cuda(cu_e_, #call, __FILE__, __LINE__);       \
    } while (0)
#define CUDNN_CHECK(call)                                                                      \
    do {                                                                                       \
        cudnnStatus_t cu_s_ = (call);                                                          \
        if (cu_s_ != CUDNN_STATUS_SUCCESS)                                                     \
            return cu_fail_cudnn(cu_s_, #call, __FILE__, __LINE__);                            \
    } while (0)
#define CUBLAS_CHECK(call)                                                                     \
    do {                                                                                       \
        cublasStatus_t cu_s_ = (call);                                                         \
        if (cu_s_ != CUBLAS_STATUS_SUCCESS)                                                    \
            return cu_fail_cublas(cu_s_, #call, __FILE__, __LINE__);                           \
    } while (0)
#define CU_ENTER(ctx)                                                                          \
    do {                                                                                       \
        if (!(ctx)) return BK_ERR_INVALID;                                                     \
        int cu_rc_ = cu_enter(ctx);                                                            \
        if (cu_rc_) return cu_rc_;                                                             \
    } while (0)
#define CU_LAUNCHED(ctx)                                                                       \
    do {                                                                                       \
        int cu_rc_ = cu_launched((ctx), __FILE__, __LINE__);                                   \
        if (cu_rc_) return cu_rc_;                                                             \
    } while (0)

/* grid size of a grid-stride loop over n items */
static inline unsigned cu_blocks(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    if (b > 1048576) b = 1048576;
    return b ? (unsigned)b : 1u;
}

#ifdef __CUDACC__
/* sum of v over the block, in a fixed order (shuffle tree per warp, then the warps' sums by
 * warp 0): deterministic for a given blockDim. Every thread gets the result. sh: 33 slots.
 * blockDim.x must be a multiple of 32. */
template <typename T> __device__ __forceinline__ T cu_block_sum(T v, T *sh)
{
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        T t = lane < nw ? sh[lane] : T(0);
        for (int o = 16; o > 0; o >>= 1) t += __shfl_down_sync(0xffffffffu, t, o);
        if (lane == 0) sh[32] = t;
    }
    __syncthreads();
    T r = sh[32];
    __syncthreads(); /* sh may be reused right after */
    return r;
}

template <typename T> __device__ __forceinline__ T cu_warp_sum(T v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float cu_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
#endif

/* 16-bit storage in kernels: enum bk_dtype's element types as distinct types, so a kernel
 * template instantiated for float, cu_f16 and cu_bf16 reads and writes any of them. Loads are
 * exact; stores round to nearest even with kernels/half.h's integer rounding, the bits of
 * `convert` and of the CPU backend. CU_TYPED(dtype, fn, args) calls fn<T>(args) for dtype's T. */
struct cu_f16 {
    uint16_t bits;
};
struct cu_bf16 {
    uint16_t bits;
};
static inline int cu_dtype_ok(int dtype)
{
    return dtype == BK_DTYPE_F32 || dtype == BK_DTYPE_F16 || dtype == BK_DTYPE_BF16;
}
#define CU_TYPED(dtype, fn, ...)                                                               \
    ((dtype) == BK_DTYPE_F16    ? fn<cu_f16>(__VA_ARGS__)                                      \
     : (dtype) == BK_DTYPE_BF16 ? fn<cu_bf16>(__VA_ARGS__)                                     \
                                : fn<float>(__VA_ARGS__))
#ifdef __CUDACC__
__device__ __forceinline__ float cu_ld(float v) { return v; }
__device__ __forceinline__ float cu_ld(cu_f16 v) { return half_f16_to_f32(v.bits); }
__device__ __forceinline__ float cu_ld(cu_bf16 v) { return half_bf16_to_f32(v.bits); }
template <typename T> __device__ __forceinline__ T cu_to(float v);
template <> __device__ __forceinline__ float cu_to<float>(float v) { return v; }
template <> __device__ __forceinline__ cu_f16 cu_to<cu_f16>(float v)
{
    cu_f16 r;
    r.bits = half_f32_to_f16(v);
    return r;
}
template <> __device__ __forceinline__ cu_bf16 cu_to<cu_bf16>(float v)
{
    cu_bf16 r;
    r.bits = half_f32_to_bf16(v);
    return r;
}
/* v as stored in T: rounded to T and widened back (the value a later kernel reads) */
template <typename T> __device__ __forceinline__ float cu_round(float v)
{
    return cu_ld(cu_to<T>(v));
}

/* 16-byte accesses: W elements of T at p, widened to fp32 (cu_ldv) or rounded from it (cu_stv).
 * W * sizeof(T) == 16 is one 128-bit load or store (p 16-byte aligned: the caller checks, see
 * cu_al16); W = 1 is the scalar fallback of an unaligned or odd-sized operand. */
struct alignas(16) cu_v16 {
    uint32_t u[4];
};
template <typename T, int W> __device__ __forceinline__ void cu_ldv(float *f, const T *p)
{
    if constexpr (W * sizeof(T) == 16) {
        const cu_v16 v = *(const cu_v16 *)p;
        T t[W];
        memcpy(t, &v, 16);
        for (int i = 0; i < W; i++) f[i] = cu_ld(t[i]);
    } else {
        for (int i = 0; i < W; i++) f[i] = cu_ld(p[i]);
    }
}
template <typename T, int W> __device__ __forceinline__ void cu_stv(T *p, const float *f)
{
    if constexpr (W * sizeof(T) == 16) {
        T t[W];
        for (int i = 0; i < W; i++) t[i] = cu_to<T>(f[i]);
        cu_v16 v;
        memcpy(&v, t, 16);
        *(cu_v16 *)p = v;
    } else {
        for (int i = 0; i < W; i++) p[i] = cu_to<T>(f[i]);
    }
}

/* SiLU and its derivative, the formulas of every CUDA kernel that applies them */
__device__ __forceinline__ float cu_silu(float v) { return v / (1.0f + expf(-v)); }
__device__ __forceinline__ float cu_silu_grad(float v)
{
    const float s = 1.0f / (1.0f + expf(-v));
    return s * (1.0f + v * (1.0f - s));
}
#endif

/* the vector width of T's 16-byte accesses; COMMA: a template argument list's comma inside
 * a macro argument (CU_LAUNCH(k<T COMMA CU_VW(T)>, ...)) */
#define CU_VW(T) ((int)(16 / sizeof(T)))
#define COMMA ,
/* p may take 16-byte accesses (NULL: no operand, no constraint) */
static inline int cu_al16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* ---- the entries: cu_<fn> and cu_t_<fn> (struct bk_typed's) for each of kernels/ops.def, with
 * its signature and contract (C linkage: a definition whose signature drifts from its entry is a
 * C++ overload, which leaves the entry undefined, and the modules link with -z defs: the build
 * fails). Where they are: backend_cuda.cu (context, memory,
 * devices, parity, budget, offload's copies, half_kernels), conv.cu, linear.cu, norm.cu (the fp32
 * and typed norms), eltwise.cu (element-wise, layout, resampling and dropout over NHWC images,
 * typed: the fp32 entries are the typed ones on fp32; the time embedding; dropout_step_*),
 * attention.cu, convert.cu, loss.cu (losses, Philox fills, mse_step_bwd, loss_step_add),
 * optim.cu (sumsq, AdamW, EMA, step_set, optim_step, scaler_set, step_read), graph.cu. ---- */
extern "C" {
#define BK_OP(ret, fn, args, half) ret cu_##fn args;
#define BK_TYPED_OP(ret, fn, args, half) ret cu_t_##fn args;
#include "ops.def"
}

/* the conv cache's entries of a device (device reset / module unload) */
void cu_conv_forget(int device);
/* up to max shapes (and their workspace bytes) planned on (device, parity) whose algorithms are
 * not all chosen yet: the first call of each direction still runs cuDNN's finders, which load
 * (or compile) the engines' kernels. cu_mem_alloc runs them before a job's reservation */
int cu_conv_untuned(int device, int parity, struct bk_conv2d *shapes, size_t *ws_bytes, int max);

/* linear.cu: cu_linear_ws_bytes is 0 (cuBLAS works in the context's workspace) and keeps the
 * shape, so that cu_mem_alloc can run its GEMMs once before a job's reservation */
struct cu_gemm_shape {
    int m, k, n, dtype;
};
/* up to max linear shapes planned on (device, parity) not yet run by cu_mem_alloc's warm-up; they
 * count as run once returned */
int cu_linear_unwarmed(int device, int parity, struct cu_gemm_shape *shapes, int max);
/* db (N) += column sums of dy (M,N, elements of dtype) in double (linear's bias gradient) */
int cu_colsum_add(float *db, const void *dy, int dtype, int m, int n, bk_ctx *ctx);
/* db (C) += sum over N and HW of dy (N,C,HW, elements of dtype), in double (conv's) */
int cu_chansum_add(float *db, const void *dy, int dtype, int n, int c, int hw, bk_ctx *ctx);

/* conv.cu's helpers on NHWC images of dtype: a zero-padded copy and the cropped copy back; the
 * filter OIHW <-> KRSC (O,Kh,Kw,I: cuDNN's NHWC filter) */
int cu_pad2d(void *xp, const void *x, int dtype, int n, int c, int h, int w, int pt, int pl,
             int pb, int pr, bk_ctx *ctx);
int cu_crop2d(void *x, const void *xp, int dtype, int n, int c, int h, int w, int pt, int pl,
              int pb, int pr, bk_ctx *ctx);
/* w_krsc (O,Kh,Kw,I) = w (O,I,Kh,Kw), elements of dtype */
int cu_filter_to_krsc(void *w_krsc, const void *w, int dtype, int o, int i, int kh, int kw,
                      bk_ctx *ctx);
/* dw (O,I,Kh,Kw, fp32) += g (O,Kh,Kw,I, elements of dtype) */
int cu_filter_add_krsc(float *dw, const void *g, int dtype, int o, int i, int kh, int kw,
                       bk_ctx *ctx);

/* attention.cu: cu_attn_ws_bytes keeps the shape, so that cu_mem_alloc can run its library
 * calls once before a job's reservation */
struct cu_attn_shape {
    struct bk_attn s;
    int tiled;  /* the tiled form (lse), else the plain one (p) */
    size_t ws;  /* its workspace bytes */
};
/* up to max attention shapes planned on (device, parity) not yet run by cu_mem_alloc's warm-up;
 * they count as run once returned */
int cu_attn_unwarmed(int device, int parity, struct cu_attn_shape *shapes, int max);

/* the step on the device (backend.h's step_* entries): its scalars live in the job slot's
 * scratch, from CU_STEP_OFF doubles on */
#define CU_STEP_OFF 1024
#define CU_STEP_LOG 256 /* optimizer steps the log keeps */

/* the context's step scalars (CU_STEP_OFF doubles into the slot's scratch): optim.cu's, and
 * loss.cu's loss weight, loss scale and step loss */
struct cu_step {
    struct bk_step in;            /* step_set's */
    struct bk_scaler scaler;      /* the loss scale (scaler_set's, then the device's) */
    double loss;                  /* the step's loss so far (loss_step_add) */
    /* the optimizer step's decisions, for the AdamW kernel */
    float gscale, decay, step_size, c2;
    int skip;
    struct bk_step_rec last;      /* the last optimizer step */
    unsigned long long nrec;      /* optimizer steps logged since the reset */
    struct bk_step_rec log[CU_STEP_LOG]; /* step k at log[k % CU_STEP_LOG] */
};

static_assert(CU_STEP_OFF * sizeof(double) + sizeof(struct cu_step) <=
                  (CU_SCRATCH_DOUBLES - 1) * sizeof(double),
              "the step scalars fit the slot's scratch (its last double is cu_sumsq's)");
static_assert(CU_STEP_OFF >= CU_REDUCE_CHUNKS, "the step scalars lie past the partial sums");

static inline struct cu_step *cu_step_of(bk_ctx *ctx)
{
    return (struct cu_step *)(ctx->scratch + CU_STEP_OFF);
}

/* the device's copy of step_set's values (for kernels that read them when they run) */
const struct bk_step *cu_step_in(bk_ctx *ctx);

/* loss.cu's two-stage reductions (mse_fwd; optim.cu's sumsq and optim_step) */
#define CU_RED_CHUNK_MIN 16384
/* chunk count of a reduction over count elements: a function of count alone */
static inline int cu_red_chunks(size_t count)
{
    size_t nch = (count + CU_RED_CHUNK_MIN - 1) / CU_RED_CHUNK_MIN;
    if (nch > CU_REDUCE_CHUNKS) nch = CU_REDUCE_CHUNKS;
    return nch ? (int)nch : 1;
}
/* the context's scratch[ch] = sum over chunk ch of nch (cu_red_chunks(count)) of (a - b)^2
 * (b NULL: a^2), in double; enqueued on its stream */
int cu_sq_partials(const float *a, const float *b, size_t count, int nch, bk_ctx *ctx);

#endif
