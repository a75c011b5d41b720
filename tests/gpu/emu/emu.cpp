/* emu.cpp - the emulator behind tests/gpu/emu's headers: a coroutine per CUDA thread
 * (ucontext), blocks run one after another, barriers and warp exchanges between a block's
 * coroutines; the runtime's memory with the device's size accounted; a naive column-major SGEMM;
 * naive direct convolutions behind cuDNN's legacy API. Deadlocks (a barrier some threads of a
 * warp or block never reach) abort with a message: they would hang a GPU.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <unordered_map>
#include <vector>

#include "cublas_v2.h"
#include "cuda_runtime.h"
#include "cudnn.h"

/* ---- the SIMT scheduler ---- */

#define EMU_STACK (256 * 1024)
#define EMU_MAX_THREADS 1024

enum { T_RUN = 0, T_WAIT = 1, T_DONE = 2 };
enum { W_BLOCK = 0, W_WARP = 1 };

/* a coroutine starts through makecontext/swapcontext and then switches with _setjmp/_longjmp,
 * which unlike swapcontext make no system call (the signal mask is left alone) */
struct emu_thread {
    ucontext_t ctx;
    jmp_buf jb;
    uint3 tid;
    int lin, state, wait, started;
    unsigned exchanges; /* this lane's count: picks the slot buffer */
};

uint3 emu_blockIdx;
dim3 emu_blockDim, emu_gridDim;

static emu_thread g_threads[EMU_MAX_THREADS];
static char *g_stacks[EMU_MAX_THREADS];
static ucontext_t g_sched;
static jmp_buf g_sched_jb;
static int g_cur = -1, g_nthreads;
static const emu_kernel_call *g_call;
static std::vector<unsigned char> g_smem;
static uint64_t g_slots[2][EMU_MAX_THREADS];
static pthread_mutex_t g_launch_lock = PTHREAD_MUTEX_INITIALIZER;

const uint3 &emu_threadIdx() { return g_threads[g_cur].tid; }
int emu_lane() { return g_threads[g_cur].lin & 31; }
void *emu_dyn_smem() { return g_smem.data(); }

static void emu_wait(int kind)
{
    emu_thread *t = &g_threads[g_cur];
    t->state = T_WAIT;
    t->wait = kind;
    if (!_setjmp(t->jb)) _longjmp(g_sched_jb, 1);
}

void __syncthreads() { emu_wait(W_BLOCK); }
void emu_syncwarp() { emu_wait(W_WARP); }

/* two slot buffers used in turn: a lane writes buffer b again only after the barrier of the
 * next exchange, which every lane reaches after reading buffer b - one barrier per exchange */
uint64_t emu_exchange(uint64_t mine, int src_lane)
{
    emu_thread *t = &g_threads[g_cur];
    const int lin = t->lin, base = lin & ~31;
    uint64_t *slots = g_slots[t->exchanges++ & 1];
    slots[lin] = mine;
    emu_wait(W_WARP);
    return base + src_lane < g_nthreads ? slots[base + src_lane] : mine;
}

/* a coroutine lives across blocks and launches: it runs the kernel, reports done, and waits
 * there to run it again for the next block (no context is made twice) */
static void emu_entry()
{
    for (;;) {
        g_call->run(g_call->arg);
        emu_thread *t = &g_threads[g_cur];
        t->state = T_DONE;
        if (!_setjmp(t->jb)) _longjmp(g_sched_jb, 1);
    }
}

/* thread i's coroutine, started by its first emu_resume */
__attribute__((noinline)) static void emu_make(int i)
{
    emu_thread *t = &g_threads[i];
    getcontext(&t->ctx);
    t->ctx.uc_stack.ss_sp = g_stacks[i];
    t->ctx.uc_stack.ss_size = EMU_STACK;
    t->ctx.uc_link = &g_sched;
    makecontext(&t->ctx, emu_entry, 0);
}

/* run thread i until it waits or ends */
__attribute__((noinline)) static void emu_resume(int i)
{
    emu_thread *t = &g_threads[i];
    g_cur = i;
    if (_setjmp(g_sched_jb)) return;
    if (!t->started) {
        t->started = 1;
        swapcontext(&g_sched, &t->ctx);
        abort(); /* unreachable: threads come back through g_sched_jb */
    }
    _longjmp(t->jb, 1);
}

void emu_run_grid(dim3 grid, dim3 block, size_t smem, const emu_kernel_call &k)
{
    pthread_mutex_lock(&g_launch_lock);
    const int nt = (int)(block.x * block.y * block.z);
    if (nt < 1 || nt > EMU_MAX_THREADS || grid.x < 1 || grid.y < 1 || grid.z < 1 ||
        grid.y > 65535 || grid.z > 65535) {
        fprintf(stderr, "emu: bad launch configuration (%u,%u,%u) x (%u,%u,%u)\n", grid.x, grid.y,
                grid.z, block.x, block.y, block.z);
        abort();
    }
    if (smem > 48 * 1024) {
        fprintf(stderr, "emu: %zu bytes of dynamic shared memory (over 48 KiB without opt-in)\n",
                smem);
        abort();
    }
    g_call = &k;
    g_nthreads = nt;
    emu_blockDim = block;
    emu_gridDim = grid;
    g_smem.assign(smem ? smem : 16, 0xFF); /* garbage (NaN floats), as on a GPU */
    for (int i = 0; i < nt; i++)
        if (!g_stacks[i]) g_stacks[i] = (char *)malloc(EMU_STACK);
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                emu_blockIdx = uint3{bx, by, bz};
                for (int i = 0; i < nt; i++) {
                    emu_thread *t = &g_threads[i];
                    t->lin = i;
                    t->tid = uint3{(unsigned)i % block.x, ((unsigned)i / block.x) % block.y,
                                   (unsigned)i / (block.x * block.y)};
                    t->state = T_RUN;
                    t->exchanges = 0;
                    if (!t->started) emu_make(i);
                }
                for (;;) {
                    /* each warp runs on through its warp barriers until its lanes wait at
                     * the block barrier or are done */
                    for (int w = 0; w < nt; w += 32) {
                        const int we = w + 32 < nt ? w + 32 : nt;
                        for (;;) {
                            for (int i = w; i < we; i++)
                                if (g_threads[i].state == T_RUN) emu_resume(i);
                            int n = 0, at = 0;
                            for (int i = w; i < we; i++)
                                if (g_threads[i].state != T_DONE) {
                                    n++;
                                    at += g_threads[i].wait == W_WARP;
                                }
                            if (n && at == n) {
                                for (int i = w; i < we; i++)
                                    if (g_threads[i].state == T_WAIT) g_threads[i].state = T_RUN;
                                continue;
                            }
                            if (at) {
                                fprintf(stderr, "emu: deadlock in block (%u,%u,%u), warp %d: "
                                                "lanes wait at a warp barrier others never "
                                                "reach\n", bx, by, bz, w / 32);
                                abort();
                            }
                            break;
                        }
                    }
                    int live = 0;
                    for (int i = 0; i < nt; i++)
                        if (g_threads[i].state != T_DONE) {
                            live++;
                            g_threads[i].state = T_RUN; /* all wait at the block barrier */
                        }
                    if (!live) break;
                }
            }
    g_cur = -1;
    pthread_mutex_unlock(&g_launch_lock);
}

/* ---- the runtime ---- */

static pthread_mutex_t g_mem_lock = PTHREAD_MUTEX_INITIALIZER;
static std::unordered_map<void *, size_t> g_allocs;
static size_t g_used;

static size_t emu_total(void)
{
    const char *v = getenv("EMU_DEVICE_MB");
    size_t mb = v && *v ? strtoull(v, NULL, 10) : 16384;
    return mb << 20;
}

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    default: return "cudaErrorEmulated";
    }
}
const char *cudaGetErrorString(cudaError_t e)
{
    return e == cudaErrorMemoryAllocation ? "out of memory" : cudaGetErrorName(e);
}
cudaError_t cudaGetLastError(void) { return cudaSuccess; }
cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }
cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int d)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "ddpmd SIMT emulator (host)");
    p->major = 0;
    p->minor = 0;
    return d == 0 ? cudaSuccess : cudaErrorInvalidValue;
}
cudaError_t cudaMalloc(void **p, size_t bytes)
{
    /* the driver's granularity: 2 MiB */
    size_t rounded = (bytes + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
    pthread_mutex_lock(&g_mem_lock);
    if (g_used + rounded > emu_total()) {
        pthread_mutex_unlock(&g_mem_lock);
        *p = NULL;
        return cudaErrorMemoryAllocation;
    }
    void *q = aligned_alloc(256, (bytes + 255) & ~(size_t)255);
    if (!q) {
        pthread_mutex_unlock(&g_mem_lock);
        return cudaErrorMemoryAllocation;
    }
    memset(q, 0xFF, bytes); /* not zeroed, as on a GPU */
    g_allocs[q] = rounded;
    g_used += rounded;
    pthread_mutex_unlock(&g_mem_lock);
    *p = q;
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t bytes)
{
    *p = malloc(bytes);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFree(void *p)
{
    if (!p) return cudaSuccess;
    pthread_mutex_lock(&g_mem_lock);
    auto it = g_allocs.find(p);
    if (it == g_allocs.end()) {
        pthread_mutex_unlock(&g_mem_lock);
        fprintf(stderr, "emu: cudaFree of %p, not a device allocation\n", p);
        return cudaErrorInvalidValue;
    }
    g_used -= it->second;
    g_allocs.erase(it);
    pthread_mutex_unlock(&g_mem_lock);
    free(p);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k,
                            cudaStream_t s)
{
    (void)k;
    (void)s;
    memmove(dst, src, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *dst, int v, size_t bytes, cudaStream_t s)
{
    (void)s;
    memset(dst, v, bytes);
    return cudaSuccess;
}
cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total_b)
{
    pthread_mutex_lock(&g_mem_lock);
    *total_b = emu_total();
    *free_b = *total_b - g_used;
    pthread_mutex_unlock(&g_mem_lock);
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    (void)flags;
    static int dummy[64];
    static int next;
    *s = (cudaStream_t)&dummy[next++ & 63];
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    (void)s;
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }

/* ---- cuBLAS ---- */

struct emu_cublas {
    int math;
};
cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = new emu_cublas();
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetWorkspace(cublasHandle_t, void *ws, size_t bytes)
{
    if (ws && ((uintptr_t)ws & 255)) return CUBLAS_STATUS_INVALID_VALUE;
    if (!ws && bytes) return CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetMathMode(cublasHandle_t h, cublasMath_t m)
{
    h->math = m;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s)
{
    return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_(emulated error)";
}
cublasStatus_t cublasSgemm(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *a, int lda,
                           const float *b, int ldb, const float *beta, float *c, int ldc)
{
    if (m < 0 || n < 0 || k < 0 || ldc < (m > 1 ? m : 1)) return CUBLAS_STATUS_INVALID_VALUE;
    if (lda < (ta == CUBLAS_OP_N ? (m > 1 ? m : 1) : (k > 1 ? k : 1)))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (ldb < (tb == CUBLAS_OP_N ? (k > 1 ? k : 1) : (n > 1 ? n : 1)))
        return CUBLAS_STATUS_INVALID_VALUE;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0.0;
            for (int l = 0; l < k; l++) {
                float av = ta == CUBLAS_OP_N ? a[i + (size_t)l * lda] : a[l + (size_t)i * lda];
                float bv = tb == CUBLAS_OP_N ? b[l + (size_t)j * ldb] : b[j + (size_t)l * ldb];
                s += (double)av * bv;
            }
            float *cv = &c[i + (size_t)j * ldc];
            float r = (float)(*alpha * s);
            *cv = *beta == 0.0f ? r : r + *beta * *cv;
        }
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- cuDNN ---- */

struct emu_cudnn {
    int dummy;
};
struct emu_tensor_desc {
    int n, c, h, w;
};
struct emu_filter_desc {
    int k, c, h, w;
};
struct emu_conv_desc {
    int ph, pw, u, v, dh, dw, math;
};

cudnnStatus_t cudnnCreate(cudnnHandle_t *h)
{
    *h = new emu_cudnn();
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetStream(cudnnHandle_t, cudaStream_t) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnGraphVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnOpsVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
cudnnStatus_t cudnnCnnVersionCheck(void) { return CUDNN_STATUS_SUCCESS; }
const char *cudnnGetErrorString(cudnnStatus_t s)
{
    return s == CUDNN_STATUS_SUCCESS ? "CUDNN_STATUS_SUCCESS" : "CUDNN_STATUS_(emulated error)";
}
cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t *d)
{
    *d = new emu_tensor_desc();
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t *d)
{
    *d = new emu_filter_desc();
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t *d)
{
    *d = new emu_conv_desc();
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t d)
{
    delete d;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t d)
{
    delete d;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t d)
{
    delete d;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t d, cudnnTensorFormat_t,
                                         cudnnDataType_t, int n, int c, int h, int w)
{
    if (n < 1 || c < 1 || h < 1 || w < 1) return CUDNN_STATUS_BAD_PARAM;
    *d = emu_tensor_desc{n, c, h, w};
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t d, cudnnDataType_t,
                                         cudnnTensorFormat_t, int k, int c, int h, int w)
{
    if (k < 1 || c < 1 || h < 1 || w < 1) return CUDNN_STATUS_BAD_PARAM;
    *d = emu_filter_desc{k, c, h, w};
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t d, int ph, int pw,
                                              int u, int v, int dh, int dw,
                                              cudnnConvolutionMode_t m, cudnnDataType_t)
{
    if (ph < 0 || pw < 0 || u < 1 || v < 1 || dh < 1 || dw < 1 || m != CUDNN_CROSS_CORRELATION)
        return CUDNN_STATUS_BAD_PARAM;
    *d = emu_conv_desc{ph, pw, u, v, dh, dw, 0};
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t d, cudnnMathType_t m)
{
    d->math = m;
    return CUDNN_STATUS_SUCCESS;
}
static int out_dim(int in, int pad, int k, int stride, int dil)
{
    return (in + 2 * pad - ((k - 1) * dil + 1)) / stride + 1;
}
cudnnStatus_t cudnnGetConvolution2dForwardOutputDim(cudnnConvolutionDescriptor_t c,
                                                    cudnnTensorDescriptor_t x,
                                                    cudnnFilterDescriptor_t w, int *n, int *ch,
                                                    int *h, int *wd)
{
    if (x->c != w->c) return CUDNN_STATUS_BAD_PARAM;
    *n = x->n;
    *ch = w->k;
    *h = out_dim(x->h, c->ph, w->h, c->u, c->dh);
    *wd = out_dim(x->w, c->pw, w->w, c->v, c->dw);
    return CUDNN_STATUS_SUCCESS;
}

static cudnnStatus_t check_shapes(cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                                  cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t y)
{
    int n, ch, h, wd;
    cudnnGetConvolution2dForwardOutputDim(c, x, w, &n, &ch, &h, &wd);
    if (y->n != n || y->c != ch || y->h != h || y->w != wd) {
        fprintf(stderr, "emu cudnn: output descriptor %dx%dx%dx%d, the conv gives %dx%dx%dx%d\n",
                y->n, y->c, y->h, y->w, n, ch, h, wd);
        return CUDNN_STATUS_BAD_PARAM;
    }
    return CUDNN_STATUS_SUCCESS;
}

/* the algorithms offered, each with its workspace: the first ones must be refused in parity
 * mode (FFT, Winograd), non-deterministic ones always, one needs more workspace than the backend
 * allows (DDPMD_CUDA_CONV_WS_MAX_MB, 256 MiB by default) */
struct offer {
    int algo;
    size_t memory;
    cudnnDeterminism_t det;
    float time;
};
static const offer FWD[] = {
    {CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD, 4096, CUDNN_DETERMINISTIC, 0.1f},
    {CUDNN_CONVOLUTION_FWD_ALGO_FFT, 8192, CUDNN_DETERMINISTIC, 0.2f},
    {CUDNN_CONVOLUTION_FWD_ALGO_GEMM, (size_t)1 << 40, CUDNN_DETERMINISTIC, 0.25f},
    {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, 65536, CUDNN_DETERMINISTIC, 0.3f},
    {CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, 0, CUDNN_DETERMINISTIC, 0.4f},
};
static const offer BWD_DATA[] = {
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, 0, CUDNN_NON_DETERMINISTIC, 0.1f},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED, 1024, CUDNN_DETERMINISTIC, 0.15f},
    {CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, 32768, CUDNN_DETERMINISTIC, 0.2f},
};
static const offer BWD_FILTER[] = {
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3, 0, CUDNN_NON_DETERMINISTIC, 0.05f},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, 0, CUDNN_NON_DETERMINISTIC, 0.1f},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING, 2048, CUDNN_DETERMINISTIC, 0.15f},
    {CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, 16384, CUDNN_DETERMINISTIC, 0.2f},
};

static const offer *find_offer(const offer *o, int n, int algo)
{
    for (int i = 0; i < n; i++)
        if (o[i].algo == algo) return &o[i];
    return NULL;
}

/* heuristics: ranked as listed; finders: fastest first, and those needing more than ws_bytes
 * fail with ALLOC_FAILED */
template <typename P>
static void fill_perf(P *p, int req, int *got, const offer *o, int n, int find, size_t ws_bytes)
{
    int k = 0;
    for (int i = 0; i < n && k < req; i++, k++) {
        memset(&p[k], 0, sizeof p[k]);
        p[k].algo = (decltype(p[k].algo))o[i].algo;
        p[k].memory = o[i].memory;
        p[k].determinism = o[i].det;
        p[k].mathType = CUDNN_FMA_MATH;
        p[k].time = o[i].time;
        p[k].status = find && o[i].memory > ws_bytes ? CUDNN_STATUS_ALLOC_FAILED
                                                     : CUDNN_STATUS_SUCCESS;
    }
    *got = k;
}

/* an algorithm uses all the workspace it claims: scribble over it */
static cudnnStatus_t use_workspace(const offer *o, void *ws, size_t ws_bytes)
{
    if (!o) return CUDNN_STATUS_BAD_PARAM;
    if (o->memory > ws_bytes || (o->memory && !ws)) {
        fprintf(stderr, "emu cudnn: algorithm %d needs %zu workspace bytes, given %zu\n", o->algo,
                o->memory, ws_bytes);
        return CUDNN_STATUS_BAD_PARAM;
    }
    if (o->memory) memset(ws, 0x5A, o->memory);
    return CUDNN_STATUS_SUCCESS;
}

static void conv_fwd(float alpha, const emu_tensor_desc *xd, const float *x,
                     const emu_filter_desc *wd, const float *w, const emu_conv_desc *c,
                     float beta, const emu_tensor_desc *yd, float *y)
{
    for (int n = 0; n < yd->n; n++)
        for (int o = 0; o < yd->c; o++)
            for (int oh = 0; oh < yd->h; oh++)
                for (int ow = 0; ow < yd->w; ow++) {
                    double s = 0.0;
                    for (int ci = 0; ci < xd->c; ci++)
                        for (int kh = 0; kh < wd->h; kh++) {
                            int ih = oh * c->u - c->ph + kh * c->dh;
                            if (ih < 0 || ih >= xd->h) continue;
                            for (int kw = 0; kw < wd->w; kw++) {
                                int iw = ow * c->v - c->pw + kw * c->dw;
                                if (iw < 0 || iw >= xd->w) continue;
                                s += (double)
                                         x[(((size_t)n * xd->c + ci) * xd->h + ih) * xd->w + iw] *
                                     w[(((size_t)o * wd->c + ci) * wd->h + kh) * wd->w + kw];
                            }
                        }
                    float *yv = &y[(((size_t)n * yd->c + o) * yd->h + oh) * yd->w + ow];
                    float r = (float)(alpha * s);
                    *yv = beta == 0.0f ? r : r + beta * *yv;
                }
}

static void conv_bwd_data(float alpha, const emu_filter_desc *wd, const float *w,
                          const emu_tensor_desc *yd, const float *dy, const emu_conv_desc *c,
                          float beta, const emu_tensor_desc *xd, float *dx)
{
    size_t nx = (size_t)xd->n * xd->c * xd->h * xd->w;
    std::vector<double> acc(nx, 0.0);
    for (int n = 0; n < yd->n; n++)
        for (int o = 0; o < yd->c; o++)
            for (int oh = 0; oh < yd->h; oh++)
                for (int ow = 0; ow < yd->w; ow++) {
                    double g = dy[(((size_t)n * yd->c + o) * yd->h + oh) * yd->w + ow];
                    for (int ci = 0; ci < xd->c; ci++)
                        for (int kh = 0; kh < wd->h; kh++) {
                            int ih = oh * c->u - c->ph + kh * c->dh;
                            if (ih < 0 || ih >= xd->h) continue;
                            for (int kw = 0; kw < wd->w; kw++) {
                                int iw = ow * c->v - c->pw + kw * c->dw;
                                if (iw < 0 || iw >= xd->w) continue;
                                acc[(((size_t)n * xd->c + ci) * xd->h + ih) * xd->w + iw] +=
                                    g * w[(((size_t)o * wd->c + ci) * wd->h + kh) * wd->w + kw];
                            }
                        }
                }
    for (size_t i = 0; i < nx; i++) {
        float r = (float)(alpha * acc[i]);
        dx[i] = beta == 0.0f ? r : r + beta * dx[i];
    }
}

static void conv_bwd_filter(float alpha, const emu_tensor_desc *xd, const float *x,
                            const emu_tensor_desc *yd, const float *dy, const emu_conv_desc *c,
                            float beta, const emu_filter_desc *wd, float *dw)
{
    for (int o = 0; o < wd->k; o++)
        for (int ci = 0; ci < wd->c; ci++)
            for (int kh = 0; kh < wd->h; kh++)
                for (int kw = 0; kw < wd->w; kw++) {
                    double s = 0.0;
                    for (int n = 0; n < yd->n; n++)
                        for (int oh = 0; oh < yd->h; oh++) {
                            int ih = oh * c->u - c->ph + kh * c->dh;
                            if (ih < 0 || ih >= xd->h) continue;
                            for (int ow = 0; ow < yd->w; ow++) {
                                int iw = ow * c->v - c->pw + kw * c->dw;
                                if (iw < 0 || iw >= xd->w) continue;
                                s += (double)
                                         dy[(((size_t)n * yd->c + o) * yd->h + oh) * yd->w + ow] *
                                     x[(((size_t)n * xd->c + ci) * xd->h + ih) * xd->w + iw];
                            }
                        }
                    float *v = &dw[(((size_t)o * wd->c + ci) * wd->h + kh) * wd->w + kw];
                    float r = (float)(alpha * s);
                    *v = beta == 0.0f ? r : r + beta * *v;
                }
}

#define N_OF(a) ((int)(sizeof a / sizeof *a))

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t, cudnnTensorDescriptor_t x,
                                                     cudnnFilterDescriptor_t w,
                                                     cudnnConvolutionDescriptor_t c,
                                                     cudnnTensorDescriptor_t y, int req, int *got,
                                                     cudnnConvolutionFwdAlgoPerf_t *p)
{
    cudnnStatus_t s = check_shapes(x, w, c, y);
    if (s) return s;
    fill_perf(p, req, got, FWD, N_OF(FWD), 0, 0);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(
    cudnnHandle_t, cudnnFilterDescriptor_t w, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t dx, int req, int *got,
    cudnnConvolutionBwdDataAlgoPerf_t *p)
{
    cudnnStatus_t s = check_shapes(dx, w, c, dy);
    if (s) return s;
    fill_perf(p, req, got, BWD_DATA, N_OF(BWD_DATA), 0, 0);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(
    cudnnHandle_t, cudnnTensorDescriptor_t x, cudnnTensorDescriptor_t dy,
    cudnnConvolutionDescriptor_t c, cudnnFilterDescriptor_t dw, int req, int *got,
    cudnnConvolutionBwdFilterAlgoPerf_t *p)
{
    cudnnStatus_t s = check_shapes(x, dw, c, dy);
    if (s) return s;
    fill_perf(p, req, got, BWD_FILTER, N_OF(BWD_FILTER), 0, 0);
    return CUDNN_STATUS_SUCCESS;
}

/* the finders run the conv and leave garbage in the output, as cuDNN's may */
static void scribble(float *p, size_t n)
{
    for (size_t i = 0; i < n; i++) p[i] = 1234.5f;
}

cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t, cudnnTensorDescriptor_t xd, const void *, cudnnFilterDescriptor_t wd,
    const void *, cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t yd, void *y, int req,
    int *got, cudnnConvolutionFwdAlgoPerf_t *p, void *ws, size_t ws_bytes)
{
    cudnnStatus_t s = check_shapes(xd, wd, c, yd);
    if (s) return s;
    if (ws_bytes) memset(ws, 0x5A, ws_bytes);
    scribble((float *)y, (size_t)yd->n * yd->c * yd->h * yd->w);
    fill_perf(p, req, got, FWD, N_OF(FWD), 1, ws_bytes);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t, cudnnFilterDescriptor_t wd, const void *, cudnnTensorDescriptor_t dyd,
    const void *, cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t dxd, void *dx, int req,
    int *got, cudnnConvolutionBwdDataAlgoPerf_t *p, void *ws, size_t ws_bytes)
{
    cudnnStatus_t s = check_shapes(dxd, wd, c, dyd);
    if (s) return s;
    if (ws_bytes) memset(ws, 0x5A, ws_bytes);
    scribble((float *)dx, (size_t)dxd->n * dxd->c * dxd->h * dxd->w);
    fill_perf(p, req, got, BWD_DATA, N_OF(BWD_DATA), 1, ws_bytes);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t, cudnnTensorDescriptor_t xd, const void *, cudnnTensorDescriptor_t dyd,
    const void *, cudnnConvolutionDescriptor_t c, cudnnFilterDescriptor_t dwd, void *dw, int req,
    int *got, cudnnConvolutionBwdFilterAlgoPerf_t *p, void *ws, size_t ws_bytes)
{
    cudnnStatus_t s = check_shapes(xd, dwd, c, dyd);
    if (s) return s;
    if (ws_bytes) memset(ws, 0x5A, ws_bytes);
    scribble((float *)dw, (size_t)dwd->k * dwd->c * dwd->h * dwd->w);
    fill_perf(p, req, got, BWD_FILTER, N_OF(BWD_FILTER), 1, ws_bytes);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t, cudnnTensorDescriptor_t,
                                                      cudnnFilterDescriptor_t,
                                                      cudnnConvolutionDescriptor_t,
                                                      cudnnTensorDescriptor_t,
                                                      cudnnConvolutionFwdAlgo_t a, size_t *b)
{
    const offer *o = find_offer(FWD, N_OF(FWD), a);
    *b = o ? o->memory : 0;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(
    cudnnHandle_t, cudnnFilterDescriptor_t, cudnnTensorDescriptor_t,
    cudnnConvolutionDescriptor_t, cudnnTensorDescriptor_t, cudnnConvolutionBwdDataAlgo_t a,
    size_t *b)
{
    const offer *o = find_offer(BWD_DATA, N_OF(BWD_DATA), a);
    *b = o ? o->memory : 0;
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(
    cudnnHandle_t, cudnnTensorDescriptor_t, cudnnTensorDescriptor_t,
    cudnnConvolutionDescriptor_t, cudnnFilterDescriptor_t, cudnnConvolutionBwdFilterAlgo_t a,
    size_t *b)
{
    const offer *o = find_offer(BWD_FILTER, N_OF(BWD_FILTER), a);
    *b = o ? o->memory : 0;
    return CUDNN_STATUS_SUCCESS;
}

/* the backend's parity mode must never run these */
static int parity_violation(const emu_conv_desc *c, int refused)
{
    if (c->math != CUDNN_FMA_MATH || refused) {
        fprintf(stderr, "emu cudnn: a refused algorithm or math type ran (math %d)\n", c->math);
        return 1;
    }
    return 0;
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t, const void *alpha,
                                      cudnnTensorDescriptor_t xd, const void *x,
                                      cudnnFilterDescriptor_t wd, const void *w,
                                      cudnnConvolutionDescriptor_t c, cudnnConvolutionFwdAlgo_t a,
                                      void *ws, size_t ws_bytes, const void *beta,
                                      cudnnTensorDescriptor_t yd, void *y)
{
    cudnnStatus_t s = check_shapes(xd, wd, c, yd);
    if (s) return s;
    if (parity_violation(c, a >= CUDNN_CONVOLUTION_FWD_ALGO_FFT)) return CUDNN_STATUS_BAD_PARAM;
    if ((s = use_workspace(find_offer(FWD, N_OF(FWD), a), ws, ws_bytes))) return s;
    conv_fwd(*(const float *)alpha, xd, (const float *)x, wd, (const float *)w, c,
             *(const float *)beta, yd, (float *)y);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t, const void *alpha,
                                           cudnnFilterDescriptor_t wd, const void *w,
                                           cudnnTensorDescriptor_t dyd, const void *dy,
                                           cudnnConvolutionDescriptor_t c,
                                           cudnnConvolutionBwdDataAlgo_t a, void *ws,
                                           size_t ws_bytes, const void *beta,
                                           cudnnTensorDescriptor_t dxd, void *dx)
{
    cudnnStatus_t s = check_shapes(dxd, wd, c, dyd);
    if (s) return s;
    if (parity_violation(c, a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_1)) return CUDNN_STATUS_BAD_PARAM;
    if ((s = use_workspace(find_offer(BWD_DATA, N_OF(BWD_DATA), a), ws, ws_bytes))) return s;
    conv_bwd_data(*(const float *)alpha, wd, (const float *)w, dyd, (const float *)dy, c,
                  *(const float *)beta, dxd, (float *)dx);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t, const void *alpha,
                                             cudnnTensorDescriptor_t xd, const void *x,
                                             cudnnTensorDescriptor_t dyd, const void *dy,
                                             cudnnConvolutionDescriptor_t c,
                                             cudnnConvolutionBwdFilterAlgo_t a, void *ws,
                                             size_t ws_bytes, const void *beta,
                                             cudnnFilterDescriptor_t dwd, void *dw)
{
    cudnnStatus_t s = check_shapes(xd, dwd, c, dyd);
    if (s) return s;
    if (parity_violation(c, a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1))
        return CUDNN_STATUS_BAD_PARAM;
    if ((s = use_workspace(find_offer(BWD_FILTER, N_OF(BWD_FILTER), a), ws, ws_bytes))) return s;
    conv_bwd_filter(*(const float *)alpha, xd, (const float *)x, dyd, (const float *)dy, c,
                    *(const float *)beta, dwd, (float *)dw);
    return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnAddTensor(cudnnHandle_t, const void *alpha, cudnnTensorDescriptor_t ad,
                             const void *a, const void *beta, cudnnTensorDescriptor_t cd, void *c)
{
    if (ad->n != cd->n || ad->c != cd->c || ad->h != cd->h || ad->w != cd->w)
        return CUDNN_STATUS_NOT_SUPPORTED;
    size_t n = (size_t)cd->n * cd->c * cd->h * cd->w;
    const float al = *(const float *)alpha, be = *(const float *)beta;
    for (size_t i = 0; i < n; i++) {
        float r = al * ((const float *)a)[i];
        ((float *)c)[i] = be == 0.0f ? r : r + be * ((float *)c)[i];
    }
    return CUDNN_STATUS_SUCCESS;
}
