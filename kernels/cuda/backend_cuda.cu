/* backend_cuda.cu - the CUDA backend's table, devices and memory. A device is warmed up once per
 * process (context, one job slot of stream and library handles, this module's kernels loaded, one
 * tiny convolution and GEMM run) and then measured. Modules load lazily (CUDA_MODULE_LOADING=LAZY,
 * CUDA's default: a kernel is loaded at its first use, and loading takes device memory), so what
 * the process holds there grows with the kernels it has used: device_mem reports it live, the
 * device's used bytes less the job reservations this process holds (mem_alloc). Before a job's
 * reservation, mem_alloc runs the library calls its plan will make - each planned convolution's
 * algorithm search and directions, each planned linear's GEMMs - on scratch it frees again, so that
 * the kernels cuDNN and cuBLAS load (or compile) for them are loaded before the job's first step:
 * inside a step the job allocates nothing. A job's context borrows a slot of the pool, which grows
 * when every slot is taken. The device and parity mode are the calling thread's selection
 * (device_select, set_parity), captured by each context at ctx_init: no process-wide mode one job
 * could change under another.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"
#ifndef DDPMD_CUDA_EMU
#include <cuda.h> /* the driver API's types only: its entries come from cudaGetDriverEntryPoint */
#endif

int cu_sync_checks = 0;
static int g_parity_env = 1; /* DDPMD_CUDA_PARITY, read once at the table's init */

struct cu_slot {
    struct cu_slot *next;
    int used;
    cudaStream_t stream;
    cudnnHandle_t cudnn;
    cublasHandle_t cublas;
    cudaStream_t copy;
    cudaEvent_t computed, copied;
    double *scratch;
    double *host;
};

struct cu_dev {
    int state;                /* 0: not tried, 1: ready, -1: failed (err says why) */
    volatile int poisoned;
    char err[256];
    size_t total, process;    /* process: at the warm-up (device_mem measures it again) */
    size_t held;              /* this process's job reservations (mem_alloc), each rounded up to
                               * the driver's 2 MiB page as cudaMalloc takes it */
    int cc_major, cc_minor;
    char name[96];
    int nslots;
    struct cu_slot *slots;    /* the pool, a list: grows, never shrinks */
    cudnnHandle_t qcudnn;     /* job-less queries (conv2d_ws_bytes) under g_qlock */
};

static struct cu_dev g_dev[CU_MAX_DEVICES];
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;  /* g_dev states and slots */
static pthread_mutex_t g_qlock = PTHREAD_MUTEX_INITIALIZER; /* query handles, conv cache */
static __thread int tl_device = -1;  /* the device this thread made current */
static __thread int tl_select = 0;   /* this thread's device_select */
static __thread int tl_parity = -1;  /* this thread's set_parity; -1: DDPMD_CUDA_PARITY */

int cu_default_device(void) { return tl_select; }
int cu_thread_parity(void) { return tl_parity >= 0 ? tl_parity : g_parity_env; }
void cu_query_lock(void) { pthread_mutex_lock(&g_qlock); }
void cu_query_unlock(void) { pthread_mutex_unlock(&g_qlock); }
cudnnHandle_t cu_query_cudnn(int device) { return g_dev[device].qcudnn; }

/* errors after which the context is unusable: every later call returns them again */
static int cu_sticky(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorContextIsDestroyed:
        return 1;
    default:
        return 0;
    }
}

static void cu_poison(int dev, cudaError_t e)
{
    if (dev < 0 || dev >= CU_MAX_DEVICES) return;
    if (!g_dev[dev].poisoned)
        fprintf(stderr, "ddpmd cuda: device %d poisoned by %s: restart the process\n", dev,
                cudaGetErrorName(e));
    g_dev[dev].poisoned = 1;
}

int cu_fail_cuda(cudaError_t e, const char *what, const char *file, int line)
{
    fprintf(stderr, "ddpmd cuda: %s:%d: %s: %s (%s)\n", file, line, what, cudaGetErrorName(e),
            cudaGetErrorString(e));
    if (cu_sticky(e))
        cu_poison(tl_device, e);
    else
        (void)cudaGetLastError(); /* clear it: the next call must not see it again */
    return e == cudaErrorMemoryAllocation ? BK_ERR_NOMEM : BK_ERR_DEVICE;
}

/* a library error may hide a CUDA error (a kernel of the library faulted) */
static void cu_check_after_library(void)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) {
        fprintf(stderr, "ddpmd cuda: and CUDA reports %s\n", cudaGetErrorName(e));
        if (cu_sticky(e)) cu_poison(tl_device, e);
    }
}

int cu_fail_cudnn(cudnnStatus_t s, const char *what, const char *file, int line)
{
    fprintf(stderr, "ddpmd cuda: %s:%d: %s: %s\n", file, line, what, cudnnGetErrorString(s));
    cu_check_after_library();
    return s == CUDNN_STATUS_ALLOC_FAILED ? BK_ERR_NOMEM : BK_ERR_DEVICE;
}

int cu_fail_cublas(cublasStatus_t s, const char *what, const char *file, int line)
{
    fprintf(stderr, "ddpmd cuda: %s:%d: %s: %s\n", file, line, what, cublasGetStatusString(s));
    cu_check_after_library();
    return s == CUBLAS_STATUS_ALLOC_FAILED ? BK_ERR_NOMEM : BK_ERR_DEVICE;
}

static int cu_set_device(int dev)
{
    if (tl_device == dev) return BK_OK;
    cudaError_t e = cudaSetDevice(dev);
    if (e != cudaSuccess) return cu_fail_cuda(e, "cudaSetDevice", __FILE__, __LINE__);
    tl_device = dev;
    return BK_OK;
}

int cu_enter(bk_ctx *ctx)
{
    if (g_dev[ctx->device].poisoned) return BK_ERR_DEVICE;
    return cu_set_device(ctx->device);
}

int cu_launched(bk_ctx *ctx, const char *file, int line)
{
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return cu_fail_cuda(e, "kernel launch", file, line);
    if (cu_sync_checks && !ctx->capturing) { /* a capture runs nothing: nothing to wait for */
        e = cudaStreamSynchronize(ctx->stream);
        if (e != cudaSuccess) return cu_fail_cuda(e, "kernel execution", file, line);
    }
    return BK_OK;
}

/* ---- device warm-up ---- */

static int env_int(const char *name, int def, int lo, int hi)
{
    const char *v = getenv(name);
    if (!v || !*v) return def;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > hi) return def;
    return (int)x;
}

#define WARM_CUDA(call)                                                                        \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess) {                                                               \
            snprintf(d->err, sizeof d->err, "%s: %s", #call, cudaGetErrorString(e_));          \
            goto fail;                                                                         \
        }                                                                                      \
    } while (0)
#define WARM_CUDNN(call)                                                                       \
    do {                                                                                       \
        cudnnStatus_t s_ = (call);                                                             \
        if (s_ != CUDNN_STATUS_SUCCESS) {                                                      \
            snprintf(d->err, sizeof d->err, "%s: %s", #call, cudnnGetErrorString(s_));         \
            goto fail;                                                                         \
        }                                                                                      \
    } while (0)
#define WARM_CUBLAS(call)                                                                      \
    do {                                                                                       \
        cublasStatus_t s_ = (call);                                                            \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                     \
            snprintf(d->err, sizeof d->err, "%s: %s", #call, cublasGetStatusString(s_));       \
            goto fail;                                                                         \
        }                                                                                      \
    } while (0)

/* the typed kernels worth running in a 16-bit dtype on a device of compute capability cc (major
 * * 10 + minor): cuDNN's and cuBLAS's tensor cores take f16 from sm_70 and bf16 from sm_80; the
 * attention kernels read either type on any device (half the bytes, no conversion around them;
 * their forward on tensor cores where the device has them) */
static unsigned half_native(int cc, int dtype)
{
    const unsigned attn = BK_HALF_ATTN | BK_HALF_ATTN_PLAIN, lib = BK_HALF_CONV | BK_HALF_LINEAR;
    const unsigned mem = BK_HALF_NORM | BK_HALF_ELTWISE; /* integer loads and stores: anywhere */
    if (dtype == BK_DTYPE_F16) return attn | mem | (cc >= 70 ? lib : 0u);
    if (dtype == BK_DTYPE_BF16) return attn | mem | (cc >= 80 ? lib : 0u);
    return 0;
}

/* one small convolution in every direction through every algorithm the finders try, and a
 * GEMM, in fp32 and each 16-bit type the device runs natively: the libraries load what they
 * load lazily (sub-libraries, heuristics, kernels) now */
static int warm_libraries(struct cu_dev *d, struct cu_slot *sl, int parity)
{
    const int n = 2, c = 8, hw = 16, k = 3;
    const size_t ws_bytes = 16u << 20;
    float *x = NULL, *w = NULL, *y = NULL;
    void *ws = NULL;
    cudnnTensorDescriptor_t xd = NULL, yd = NULL;
    cudnnFilterDescriptor_t wd = NULL;
    cudnnConvolutionDescriptor_t cd = NULL;
    cudnnConvolutionFwdAlgoPerf_t fp[2 * CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    cudnnConvolutionBwdDataAlgoPerf_t dp[2 * CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    cudnnConvolutionBwdFilterAlgoPerf_t wp[2 * CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int got = 0, ok = 0;
    const float one = 1.0f, zero = 0.0f;
    WARM_CUDA(cudaMalloc(&x, sizeof(float) * n * c * hw * hw));
    WARM_CUDA(cudaMalloc(&y, sizeof(float) * n * c * hw * hw));
    WARM_CUDA(cudaMalloc(&w, sizeof(float) * c * c * k * k));
    WARM_CUDA(cudaMalloc(&ws, ws_bytes));
    WARM_CUDA(cudaMemsetAsync(x, 0, sizeof(float) * n * c * hw * hw, sl->stream));
    WARM_CUDA(cudaMemsetAsync(w, 0, sizeof(float) * c * c * k * k, sl->stream));
    WARM_CUDNN(cudnnCreateTensorDescriptor(&xd));
    WARM_CUDNN(cudnnCreateTensorDescriptor(&yd));
    WARM_CUDNN(cudnnCreateFilterDescriptor(&wd));
    WARM_CUDNN(cudnnCreateConvolutionDescriptor(&cd));
    for (int dt = BK_DTYPE_F32; dt <= BK_DTYPE_BF16; dt++) {
        if (dt != BK_DTYPE_F32 && !(half_native(d->cc_major * 10 + d->cc_minor, dt) &
                                    BK_HALF_CONV))
            continue;
        const cudnnDataType_t t = dt == BK_DTYPE_F16    ? CUDNN_DATA_HALF
                                  : dt == BK_DTYPE_BF16 ? CUDNN_DATA_BFLOAT16
                                                        : CUDNN_DATA_FLOAT;
        WARM_CUDNN(cudnnSetTensor4dDescriptor(xd, CUDNN_TENSOR_NHWC, t, n, c, hw, hw));
        WARM_CUDNN(cudnnSetTensor4dDescriptor(yd, CUDNN_TENSOR_NHWC, t, n, c, hw, hw));
        WARM_CUDNN(cudnnSetFilter4dDescriptor(wd, t, CUDNN_TENSOR_NHWC, c, c, k, k));
        WARM_CUDNN(cudnnSetConvolution2dDescriptor(cd, 1, 1, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION,
                                                   CUDNN_DATA_FLOAT));
        WARM_CUDNN(cudnnSetConvolutionMathType(cd, dt != BK_DTYPE_F32 ? CUDNN_TENSOR_OP_MATH
                                                   : parity           ? CUDNN_FMA_MATH
                                                                      : CUDNN_DEFAULT_MATH));
        WARM_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7(sl->cudnn, xd, wd, cd, yd,
                                                          2 * CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                          &got, fp));
        WARM_CUDNN(cudnnFindConvolutionForwardAlgorithmEx(sl->cudnn, xd, x, wd, w, cd, yd, y,
                                                          2 * CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                          &got, fp, ws, ws_bytes));
        WARM_CUDNN(cudnnFindConvolutionBackwardDataAlgorithmEx(
            sl->cudnn, wd, w, yd, y, cd, xd, x, 2 * CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got,
            dp, ws, ws_bytes));
        WARM_CUDNN(cudnnFindConvolutionBackwardFilterAlgorithmEx(
            sl->cudnn, xd, x, yd, y, cd, wd, w, 2 * CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got,
            wp, ws, ws_bytes));
        WARM_CUDNN(cudnnAddTensor(sl->cudnn, &one, yd, y, &zero, yd, y));
        if (dt == BK_DTYPE_F32) {
            WARM_CUBLAS(cublasSgemm(sl->cublas, CUBLAS_OP_T, CUBLAS_OP_N, 16, 16, 16, &one, x, 16,
                                    x, 16, &zero, y, 16));
        } else {
            const cudaDataType bt = dt == BK_DTYPE_F16 ? CUDA_R_16F : CUDA_R_16BF;
            WARM_CUBLAS(cublasSetMathMode(sl->cublas, CUBLAS_DEFAULT_MATH));
            WARM_CUBLAS(cublasGemmEx(sl->cublas, CUBLAS_OP_T, CUBLAS_OP_N, 16, 16, 16, &one, x,
                                     bt, 16, x, bt, 16, &zero, y, bt, 16, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT));
            WARM_CUBLAS(cublasGemmEx(sl->cublas, CUBLAS_OP_N, CUBLAS_OP_T, 16, 16, 16, &one, x,
                                     bt, 16, x, bt, 16, &one, y, CUDA_R_32F, 16,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
    }
    {
        /* a graph captured, instantiated and launched once: the driver's graph machinery is
         * set up now and measured with the process, not at a job's first captured step. Where
         * it fails, jobs run their steps without graphs (exec.c falls back): not fatal here */
        cudaGraph_t g = NULL;
        cudaGraphExec_t gx = NULL;
        cudaError_t ce = cudaStreamBeginCapture(sl->stream, cudaStreamCaptureModeThreadLocal);
        if (ce == cudaSuccess) {
            const cudaError_t me =
                cudaMemsetAsync(x, 0, sizeof(float) * n * c * hw * hw, sl->stream);
            ce = cudaStreamEndCapture(sl->stream, &g);
            if (ce == cudaSuccess) ce = me;
        }
        if (ce == cudaSuccess) ce = cudaGraphInstantiate(&gx, g, 0);
        if (ce == cudaSuccess) ce = cudaGraphLaunch(gx, sl->stream);
        if (ce == cudaSuccess) ce = cudaStreamSynchronize(sl->stream);
        if (gx) (void)cudaGraphExecDestroy(gx);
        if (g) (void)cudaGraphDestroy(g);
        if (ce != cudaSuccess) {
            fprintf(stderr, "ddpmd cuda: device %s: a CUDA graph failed at the warm-up (%s); "
                            "a job's captures may fail too (its steps then run as they "
                            "come)\n", d->name, cudaGetErrorName(ce));
            (void)cudaGetLastError();
        }
    }
    WARM_CUDA(cudaStreamSynchronize(sl->stream));
    ok = 1;
fail:
    if (xd) cudnnDestroyTensorDescriptor(xd);
    if (yd) cudnnDestroyTensorDescriptor(yd);
    if (wd) cudnnDestroyFilterDescriptor(wd);
    if (cd) cudnnDestroyConvolutionDescriptor(cd);
    cudaFree(x);
    cudaFree(y);
    cudaFree(w);
    cudaFree(ws);
    return ok ? 0 : -1;
}

/* a new slot of device d's pool: stream and handles (device current, g_lock held) */
static int slot_make(struct cu_dev *d, struct cu_slot **out)
{
    struct cu_slot *sl = (struct cu_slot *)calloc(1, sizeof *sl);
    if (!sl) {
        snprintf(d->err, sizeof d->err, "out of host memory for a job slot");
        return -1;
    }
    WARM_CUDA(cudaStreamCreateWithFlags(&sl->stream, cudaStreamNonBlocking));
    WARM_CUDNN(cudnnCreate(&sl->cudnn));
    WARM_CUDNN(cudnnSetStream(sl->cudnn, sl->stream));
    WARM_CUBLAS(cublasCreate(&sl->cublas));
    WARM_CUBLAS(cublasSetStream(sl->cublas, sl->stream));
    /* no workspace of cuBLAS's own: the plan's (ctx_set_workspace) or none */
    WARM_CUBLAS(cublasSetWorkspace(sl->cublas, NULL, 0));
    WARM_CUDA(cudaStreamCreateWithFlags(&sl->copy, cudaStreamNonBlocking));
    WARM_CUDA(cudaEventCreateWithFlags(&sl->computed, cudaEventDisableTiming));
    WARM_CUDA(cudaEventCreateWithFlags(&sl->copied, cudaEventDisableTiming));
    WARM_CUDA(cudaMalloc(&sl->scratch, CU_SCRATCH_DOUBLES * sizeof(double)));
    WARM_CUDA(cudaMallocHost(&sl->host, 8 * sizeof(double)));
    sl->next = d->slots;
    d->slots = sl;
    d->nslots++;
    *out = sl;
    return 0;
fail:
    /* what was made stays unreachable until the process ends: a failed slot is rare */
    (void)cudaGetLastError();
    free(sl);
    return -1;
}

__global__ void k_fill_f32(float *dst, float value, size_t count);

/* Lazy loading loads each kernel of this module at its first launch, and a load takes device
 * memory: a job's first step would allocate outside its plan. So every kernel of the module is
 * loaded now (cuFuncLoad over cuModuleEnumerateFunctions, CUDA 12.4 drivers on). Returns the
 * kernels loaded; 0 where the driver lacks those entries (then they load at first launch) */
static int preload_own_kernels(struct cu_dev *d)
{
#ifdef DDPMD_CUDA_EMU
    (void)d;
    return 0;
#else
    typedef CUresult (*get_module_fn)(CUmodule *, CUfunction);
    typedef CUresult (*count_fn)(unsigned *, CUmodule);
    typedef CUresult (*enumerate_fn)(CUfunction *, unsigned, CUmodule);
    typedef CUresult (*load_fn)(CUfunction);
    void *p[4] = {NULL, NULL, NULL, NULL};
    const char *names[4] = {"cuFuncGetModule", "cuModuleGetFunctionCount",
                            "cuModuleEnumerateFunctions", "cuFuncLoad"};
    for (int i = 0; i < 4; i++) {
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion(names[i], &p[i], 12040, cudaEnableDefault, &q) !=
                cudaSuccess ||
            q != cudaDriverEntryPointSuccess || !p[i]) {
            (void)cudaGetLastError();
            return 0;
        }
    }
    cudaFunction_t f = NULL;
    CUmodule mod = NULL;
    unsigned n = 0;
    if (cudaGetFuncBySymbol(&f, (const void *)k_fill_f32) != cudaSuccess ||
        ((get_module_fn)p[0])(&mod, (CUfunction)f) != CUDA_SUCCESS ||
        ((count_fn)p[1])(&n, mod) != CUDA_SUCCESS || !n) {
        (void)cudaGetLastError();
        return 0;
    }
    CUfunction *fs = (CUfunction *)calloc(n, sizeof *fs);
    int loaded = 0;
    if (fs && ((enumerate_fn)p[2])(fs, n, mod) == CUDA_SUCCESS)
        for (unsigned i = 0; i < n; i++) loaded += ((load_fn)p[3])(fs[i]) == CUDA_SUCCESS;
    free(fs);
    if (loaded < (int)n)
        snprintf(d->err, sizeof d->err, "%d of %u kernels of the module preloaded", loaded, n);
    return loaded;
#endif
}

/* called with g_lock held */
static int dev_warm_up(int dev)
{
    int preloaded = 0;
    struct cu_dev *d = &g_dev[dev];
    size_t free_b = 0, total_b = 0;
    cudaDeviceProp prop;
    WARM_CUDA(cudaSetDevice(dev));
    tl_device = dev;
    WARM_CUDA(cudaFree(0)); /* the primary context */
    WARM_CUDA(cudaGetDeviceProperties(&prop, dev));
    {
        const size_t len = strnlen(prop.name, sizeof d->name - 1);
        memcpy(d->name, prop.name, len);
        d->name[len] = '\0';
    }
    d->cc_major = prop.major;
    d->cc_minor = prop.minor;
    /* cuDNN 9 loads its sub-libraries on first use: load them now */
    WARM_CUDNN(cudnnGraphVersionCheck());
    WARM_CUDNN(cudnnOpsVersionCheck());
    WARM_CUDNN(cudnnCnnVersionCheck());
    preloaded = preload_own_kernels(d);
    {
        /* the slots made at the warm-up (measured with the rest); more are made on demand, each
         * measured and counted as the process's own */
        const int first = env_int("DDPMD_CUDA_SLOTS", 1, 1, CU_MAX_SLOTS);
        struct cu_slot *sl = NULL;
        for (int i = 0; i < first; i++)
            if (slot_make(d, &sl)) goto fail;
    }
    WARM_CUDNN(cudnnCreate(&d->qcudnn));
    if (warm_libraries(d, d->slots, cu_thread_parity())) goto fail;
    WARM_CUDA(cudaDeviceSynchronize());
    WARM_CUDA(cudaMemGetInfo(&free_b, &total_b));
    d->total = total_b;
    d->process = total_b - free_b;
    d->state = 1;
    if (getenv("DDPMD_CUDA_VERBOSE"))
        fprintf(stderr,
                "ddpmd cuda: device %d (%s, sm_%d%d): %zu MiB, the process holds %zu MiB after "
                "the warm-up (%d job slot%s, module loading %s, %d kernels of this module "
                "preloaded)\n",
                dev, d->name, d->cc_major, d->cc_minor, total_b >> 20, d->process >> 20,
                d->nslots, d->nslots == 1 ? "" : "s",
                getenv("CUDA_MODULE_LOADING") ? getenv("CUDA_MODULE_LOADING") : "?", preloaded);
    return BK_OK;
fail:
    (void)cudaGetLastError();
    d->state = -1;
    fprintf(stderr, "ddpmd cuda: device %d: warm-up failed: %s\n", dev, d->err);
    return BK_ERR_DEVICE;
}

static int device_count_quiet(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return n;
}

int cu_device_ready(int dev)
{
    if (dev < 0 || dev >= CU_MAX_DEVICES) return BK_ERR_INVALID;
    pthread_mutex_lock(&g_lock);
    int rc;
    if (g_dev[dev].state == 1) {
        rc = BK_OK;
    } else if (g_dev[dev].state < 0) {
        rc = BK_ERR_DEVICE;
    } else if (dev >= device_count_quiet()) {
        g_dev[dev].state = -1;
        snprintf(g_dev[dev].err, sizeof g_dev[dev].err, "no CUDA device %d", dev);
        rc = BK_ERR_DEVICE;
    } else {
        rc = dev_warm_up(dev);
    }
    pthread_mutex_unlock(&g_lock);
    if (rc == BK_OK && g_dev[dev].poisoned) rc = BK_ERR_DEVICE;
    if (rc == BK_OK) rc = cu_set_device(dev);
    return rc;
}

/* ---- optional table entries: devices ---- */

int cu_device_count(char *err, size_t errlen)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (err && errlen)
            snprintf(err, errlen, "no CUDA device: %s (%s)", cudaGetErrorString(e),
                     cudaGetErrorName(e));
        return 0;
    }
    if (n == 0 && err && errlen) snprintf(err, errlen, "no CUDA device");
    return n;
}

int cu_device_select(int device, char *err, size_t errlen)
{
    int n = cu_device_count(err, errlen);
    if (device < 0 || device >= n || device >= CU_MAX_DEVICES) {
        if (err && errlen && n > 0)
            snprintf(err, errlen, "no CUDA device %d (this machine has %d)", device, n);
        return BK_ERR_INVALID;
    }
    int rc = cu_device_ready(device);
    if (rc) {
        if (err && errlen)
            snprintf(err, errlen, "CUDA device %d: %s", device,
                     g_dev[device].poisoned ? "poisoned" : g_dev[device].err);
        return rc;
    }
    tl_select = device;
    return BK_OK;
}

int cu_device_mem(int device, struct bk_device_mem *out)
{
    if (!out) return BK_ERR_INVALID;
    int rc = cu_device_ready(device);
    if (rc) return rc;
    size_t free_b = 0, total_b = 0;
    CU_CHECK(cudaMemGetInfo(&free_b, &total_b));
    memset(out, 0, sizeof *out);
    out->total = total_b;
    out->free = free_b;
    /* the process's own, now: everything used less the job reservations it holds (kernels
     * loaded since the warm-up included; another process on the device would count too) */
    pthread_mutex_lock(&g_lock);
    const size_t held = g_dev[device].held;
    pthread_mutex_unlock(&g_lock);
    const size_t used = total_b - free_b;
    out->process = used > held ? used - held : 0;
    out->cc_major = g_dev[device].cc_major;
    out->cc_minor = g_dev[device].cc_minor;
    snprintf(out->name, sizeof out->name, "%s", g_dev[device].name);
    return BK_OK;
}

int cu_device_cc(int device)
{
    if (cu_device_ready(device) != BK_OK) return 0;
    return g_dev[device].cc_major * 10 + g_dev[device].cc_minor;
}

unsigned cu_device_half(int device, int dtype)
{
    const int cc = cu_device_cc(device);
    return cc ? half_native(cc, dtype) : 0u;
}

/* half_kernels: what the thread's selected device runs natively */
unsigned cu_half_kernels(int dtype) { return cu_device_half(tl_select, dtype); }

int cu_device_poisoned(int device)
{
    if (device < 0 || device >= CU_MAX_DEVICES) return 0;
    return g_dev[device].poisoned;
}

/* this thread's parity mode: for its later ctx_init and *_ws_bytes calls */
int cu_set_parity(int on)
{
    tl_parity = on ? 1 : 0;
    return BK_OK;
}

/* ---- context ---- */

int cu_ctx_init(bk_ctx **out, int threads)
{
    (void)threads;
    if (!out) return BK_ERR_INVALID;
    int dev = tl_select;
    int rc = cu_device_ready(dev);
    if (rc) return rc;
    bk_ctx *c = (bk_ctx *)calloc(1, sizeof *c);
    if (!c) return BK_ERR_NOMEM;
    struct cu_dev *d = &g_dev[dev];
    pthread_mutex_lock(&g_lock);
    struct cu_slot *sl = d->slots;
    while (sl && sl->used) sl = sl->next;
    if (!sl) {
        /* every slot taken: one more, measured and counted as the process's own */
        size_t f0 = 0, f1 = 0, t = 0;
        const int measured = cudaMemGetInfo(&f0, &t) == cudaSuccess;
        if (slot_make(d, &sl)) {
            pthread_mutex_unlock(&g_lock);
            fprintf(stderr, "ddpmd cuda: device %d: cannot add a job slot (%d made): %s\n", dev,
                    d->nslots, d->err);
            free(c);
            return BK_ERR_NOMEM;
        }
        if (measured && cudaMemGetInfo(&f1, &t) == cudaSuccess && f0 > f1)
            d->process += f0 - f1;
        if (getenv("DDPMD_CUDA_VERBOSE"))
            fprintf(stderr, "ddpmd cuda: device %d: job slot %d added (%zu KiB)\n", dev,
                    d->nslots, f0 > f1 ? (f0 - f1) >> 10 : 0);
    }
    sl->used = 1;
    pthread_mutex_unlock(&g_lock);
    c->device = dev;
    c->parity = cu_thread_parity();
    c->slot = sl;
    c->stream = sl->stream;
    c->cudnn = sl->cudnn;
    c->cublas = sl->cublas;
    c->scratch = sl->scratch;
    c->host = sl->host;
    c->copy = sl->copy;
    c->computed = sl->computed;
    c->copied = sl->copied;
    /* fast mode: fp32 GEMMs on TF32 tensor cores */
    cublasStatus_t bs = cublasSetMathMode(c->cublas, c->parity ? CUBLAS_PEDANTIC_MATH
                                                                : CUBLAS_TF32_TENSOR_OP_MATH);
    if (bs == CUBLAS_STATUS_SUCCESS) bs = cublasSetWorkspace(c->cublas, NULL, 0);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        cu_fail_cublas(bs, "cublasSetMathMode/cublasSetWorkspace", __FILE__, __LINE__);
        cu_ctx_free(c);
        return BK_ERR_DEVICE;
    }
    *out = c;
    return BK_OK;
}

void cu_ctx_free(bk_ctx *ctx)
{
    if (!ctx) return;
    if (!g_dev[ctx->device].poisoned && cu_set_device(ctx->device) == BK_OK) {
        (void)cudaStreamSynchronize(ctx->copy);
        (void)cudaStreamSynchronize(ctx->stream);
        (void)cublasSetWorkspace(ctx->cublas, NULL, 0);
        (void)cudaGetLastError();
    }
    pthread_mutex_lock(&g_lock);
    if (ctx->slot) ctx->slot->used = 0;
    pthread_mutex_unlock(&g_lock);
    free(ctx);
}

int cu_ctx_set_workspace(bk_ctx *ctx, void *ws, size_t bytes)
{
    CU_ENTER(ctx);
    /* cuBLAS wants 256-byte alignment; the plan's workspace is 64-byte aligned */
    uintptr_t a = ((uintptr_t)ws + 255) & ~(uintptr_t)255;
    size_t lost = (size_t)(a - (uintptr_t)ws);
    if (!ws || bytes <= lost + 256) {
        ctx->ws = NULL;
        ctx->ws_bytes = 0;
    } else {
        ctx->ws = (void *)a;
        ctx->ws_bytes = (bytes - lost) & ~(size_t)255;
    }
    CUBLAS_CHECK(cublasSetWorkspace(ctx->cublas, ctx->ws, ctx->ws_bytes));
    return BK_OK;
}

/* ---- memory ---- */

int cu_ctx_set_budget(bk_ctx *ctx, size_t bytes)
{
    if (!ctx) return BK_ERR_INVALID;
    ctx->budget = bytes;
    return BK_OK;
}

size_t cu_mem_high_water(const bk_ctx *ctx) { return ctx ? ctx->high_water : 0; }

/* the device bytes a cudaMalloc of `bytes` takes: whole 2 MiB pages */
static size_t cu_pages(size_t bytes)
{
    const size_t page = (size_t)2 << 20;
    return (bytes + page - 1) / page * page;
}

/* scratch of the warm-up below: cudaMalloc'd, freed by warm_free (NULL when it did not fit) */
static void *warm_alloc(size_t bytes, int *failed)
{
    void *p = NULL;
    if (*failed) return NULL;
    if (cudaMalloc(&p, bytes ? bytes : 256) != cudaSuccess) {
        (void)cudaGetLastError();
        *failed = 1;
        return NULL;
    }
    return p;
}

/* The library calls ctx's next plan makes, run once now on zeroed scratch that is freed again:
 * each planned convolution's directions (the first call of each runs cuDNN's algorithm search,
 * whose engines load or compile their kernels), each planned linear's GEMMs (cuBLAS loads
 * its kernels lazily) and each planned attention's forward and backward (cuBLAS's batched
 * GEMMs, cuDNN's fused attention), in the job's parity mode. Their results are garbage and unused. Scratch
 * that does not fit leaves the rest to load at first use, in the step (DDPMD_CUDA_VERBOSE says
 * so). Returns the device bytes the process gained (kernels loaded). DDPMD_CUDA_WARM=0 skips it
 * (tests show what it prevents). */
static size_t warm_plan(bk_ctx *ctx)
{
    size_t f0 = 0, f1 = 0, t = 0;
    if (cudaMemGetInfo(&f0, &t) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    enum { MAXW = 64 };
    struct bk_conv2d cs[MAXW];
    size_t cws[MAXW], ws_most = 0;
    struct cu_gemm_shape ls[MAXW];
    int failed = 0, nconv = 0, nlin = 0, natt = 0, ran = 0;
    for (;;) { /* entries done leave the list; a failed one stops it */
        const int n = failed ? 0 : cu_conv_untuned(ctx->device, ctx->parity, cs, cws, MAXW);
        if (!n) break;
        for (int i = 0; i < n && !failed; i++) {
            const struct bk_conv2d *s = &cs[i];
            const size_t es = bk_dtype_size(s->dtype);
            const size_t nx = (size_t)s->n * s->ci * s->h * s->w,
                         ny = (size_t)s->n * s->co * s->ho * s->wo,
                         nw = (size_t)s->co * s->ci * s->kh * s->kw;
            void *x = warm_alloc(nx * es, &failed), *y = warm_alloc(ny * es, &failed),
                 *w = warm_alloc(nw * es, &failed), *ws = warm_alloc(cws[i], &failed);
            float *dw = (float *)warm_alloc(nw * 4, &failed);
            if (cws[i] > ws_most) ws_most = cws[i];
            if (!failed && (cudaMemsetAsync(x, 0, nx * es, ctx->stream) != cudaSuccess ||
                            cudaMemsetAsync(y, 0, ny * es, ctx->stream) != cudaSuccess ||
                            cudaMemsetAsync(w, 0, nw * es, ctx->stream) != cudaSuccess ||
                            cudaMemsetAsync(dw, 0, nw * 4, ctx->stream) != cudaSuccess))
                failed = 1;
            /* the finders run in the = calls; then the += form (another epilogue) */
            if (!failed && (cu_conv2d_fwd(y, x, w, NULL, ws, s, ctx) ||
                            cu_conv2d_bwd_data(x, y, w, 0, ws, s, ctx) ||
                            cu_conv2d_bwd_data(x, y, w, 1, ws, s, ctx) ||
                            cu_conv2d_bwd_filter(dw, NULL, y, x, ws, s, ctx) ||
                            cudaStreamSynchronize(ctx->stream) != cudaSuccess))
                failed = 1;
            nconv += !failed;
            cudaFree(x), cudaFree(y), cudaFree(w), cudaFree(ws), cudaFree(dw);
        }
        if (++ran > 64) break; /* a shape that never counts as tuned */
    }
    /* cuBLAS in a workspace near the plan's (the largest convolution's here): its choice of
     * kernel depends on the workspace it has */
    void *bws = ws_most >= 512 ? warm_alloc(ws_most, &failed) : NULL;
    const uintptr_t ba = ((uintptr_t)bws + 255) & ~(uintptr_t)255;
    if (bws && cublasSetWorkspace(ctx->cublas, (void *)ba,
                                  (ws_most - (size_t)(ba - (uintptr_t)bws)) & ~(size_t)255) !=
                   CUBLAS_STATUS_SUCCESS)
        failed = 1;
    int n;
    while (!failed && (n = cu_linear_unwarmed(ctx->device, ctx->parity, ls, MAXW)) > 0)
        for (int i = 0; i < n && !failed; i++) {
            const struct cu_gemm_shape *g = &ls[i];
            const size_t es = bk_dtype_size(g->dtype), nx = (size_t)g->m * g->k,
                         nw = (size_t)g->n * g->k, ny = (size_t)g->m * g->n;
            void *x = warm_alloc(nx * es, &failed), *w = warm_alloc(nw * es, &failed),
                 *y = warm_alloc(ny * es, &failed);
            float *dw = (float *)warm_alloc(nw * 4, &failed),
                  *b = (float *)warm_alloc((size_t)g->n * 4, &failed);
            if (!failed && (cudaMemsetAsync(x, 0, nx * es, ctx->stream) != cudaSuccess ||
                            cudaMemsetAsync(w, 0, nw * es, ctx->stream) != cudaSuccess ||
                            cudaMemsetAsync(y, 0, ny * es, ctx->stream) != cudaSuccess ||
                            cudaMemsetAsync(dw, 0, nw * 4, ctx->stream) != cudaSuccess ||
                            cudaMemsetAsync(b, 0, (size_t)g->n * 4, ctx->stream) != cudaSuccess))
                failed = 1;
            /* a dtype the device does not run natively is refused (BK_ERR_INVALID): the
             * executor runs that linear in fp32, a shape of its own */
            if (!failed) {
                for (int bias = 0; bias < 2; bias++)
                    (void)cu_linear_fwd(y, x, w, bias ? b : NULL, g->m, g->k, g->n, g->dtype, ctx);
                for (int accum = 0; accum < 2; accum++)
                    (void)cu_linear_bwd(x, dw, b, y, x, w, accum, g->m, g->k, g->n, g->dtype, ctx);
                if (cudaStreamSynchronize(ctx->stream) != cudaSuccess) failed = 1;
            }
            nlin += !failed;
            cudaFree(x), cudaFree(w), cudaFree(y), cudaFree(dw), cudaFree(b);
        }
    /* each planned attention's forward and backward in its form (the plain one's batched GEMMs,
     * the tiled one's cuDNN graphs where they run it) on scratch of its shape and workspace */
    struct cu_attn_shape as[MAXW];
    void *const plan_ws = ctx->ws; /* a last plan's, maybe freed: cuBLAS on bws or none */
    const size_t plan_ws_bytes = ctx->ws_bytes;
    ctx->ws = NULL, ctx->ws_bytes = 0;
    if (!bws && cublasSetWorkspace(ctx->cublas, NULL, 0) != CUBLAS_STATUS_SUCCESS) failed = 1;
    while (!failed && (n = cu_attn_unwarmed(ctx->device, ctx->parity, as, MAXW)) > 0)
        for (int i = 0; i < n && !failed; i++) {
            const struct bk_attn *a = &as[i].s;
            const size_t es = bk_dtype_size(a->dtype), rows = (size_t)a->n * a->l,
                         nx = (rows + 1) * a->ld * es, no = (rows + 1) * a->heads * a->d * es,
                         nh = (size_t)a->n * a->heads * a->l,
                         nr = (as[i].tiled ? nh : nh * a->l) * 4;
            void *x = warm_alloc(nx, &failed), *dx = warm_alloc(nx, &failed),
                 *o = warm_alloc(no, &failed), *ws = warm_alloc(as[i].ws, &failed);
            float *r = (float *)warm_alloc(nr, &failed); /* lse (tiled) or p (plain) */
            if (!failed && (cudaMemsetAsync(x, 0, nx, ctx->stream) != cudaSuccess ||
                            cudaMemsetAsync(dx, 0, nx, ctx->stream) != cudaSuccess ||
                            cudaMemsetAsync(o, 0, no, ctx->stream) != cudaSuccess ||
                            cudaMemsetAsync(r, 0, nr, ctx->stream) != cudaSuccess))
                failed = 1;
            /* q, k, v the same zeros, dq, dk, dv the same garbage, dout is o (each a row more:
             * a GEMM's operand at a head's offset spans its rows' whole stride) */
            if (!failed && (as[i].tiled
                                ? cu_attn_fwd(o, r, x, x, x, ws, a, ctx) ||
                                      cu_attn_bwd(dx, dx, dx, o, x, x, x, o, r, ws, a, ctx)
                                : cu_attn_plain_fwd(o, r, x, x, x, ws, a, ctx) ||
                                      cu_attn_plain_bwd(dx, dx, dx, o, x, x, x, r, ws, a, ctx)))
                failed = 1;
            if (!failed && cudaStreamSynchronize(ctx->stream) != cudaSuccess) failed = 1;
            natt += !failed;
            cudaFree(x), cudaFree(dx), cudaFree(o), cudaFree(ws), cudaFree(r);
        }
    ctx->ws = plan_ws, ctx->ws_bytes = plan_ws_bytes;
    (void)cublasSetWorkspace(ctx->cublas, ctx->ws, ctx->ws_bytes);
    cudaFree(bws);
    (void)cudaGetLastError();
    if (cudaMemGetInfo(&f1, &t) != cudaSuccess) (void)cudaGetLastError();
    const size_t gained = f0 > f1 ? f0 - f1 : 0;
    if (getenv("DDPMD_CUDA_VERBOSE") && (nconv || nlin || natt || failed))
        fprintf(stderr, "ddpmd cuda: device %d: the plan's library calls run before its "
                        "reservation: %d convolutions, %d linears, %d attentions; the process "
                        "gained %zu KiB%s\n",
                ctx->device, nconv, nlin, natt, gained >> 10,
                failed ? " (scratch did not fit: the rest load in the first step)" : "");
    return gained;
}

int cu_mem_alloc(void **out, size_t bytes, bk_ctx *ctx)
{
    if (!out) return BK_ERR_INVALID;
    CU_ENTER(ctx);
    if (ctx->budget && (bytes > ctx->budget || ctx->held > ctx->budget - bytes)) {
        fprintf(stderr,
                "ddpmd cuda: device %d: %zu bytes (%.1f MiB) more would hold %zu, over the "
                "job's budget of %zu bytes\n",
                ctx->device, bytes, (double)bytes / 1048576.0, ctx->held + bytes, ctx->budget);
        return BK_ERR_NOMEM;
    }
    if (ctx->n_blocks == CU_CTX_BLOCKS) {
        fprintf(stderr, "ddpmd cuda: device %d: more than %d device allocations on one job\n",
                ctx->device, CU_CTX_BLOCKS);
        return BK_ERR_INVALID;
    }
    {
        /* not for a reservation that cannot fit anyway (its scratch would not either) */
        size_t free_b = 0, total_b = 0;
        if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
        if (bytes <= free_b && env_int("DDPMD_CUDA_WARM", 1, 0, 1)) {
            CU_WARMING(1);
            (void)warm_plan(ctx);
            CU_WARMING(0);
        }
    }
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        size_t free_b = 0, total_b = 0;
        (void)cudaMemGetInfo(&free_b, &total_b);
        fprintf(stderr,
                "ddpmd cuda: device %d: cannot reserve %zu bytes (%.1f MiB): %zu MiB free of "
                "%zu MiB\n",
                ctx->device, bytes, (double)bytes / 1048576.0, free_b >> 20, total_b >> 20);
        return BK_ERR_NOMEM;
    }
    if (e != cudaSuccess) return cu_fail_cuda(e, "cudaMalloc", __FILE__, __LINE__);
    ctx->blocks[ctx->n_blocks].p = p;
    ctx->blocks[ctx->n_blocks++].bytes = bytes;
    ctx->held += bytes;
    pthread_mutex_lock(&g_lock);
    g_dev[ctx->device].held += cu_pages(bytes);
    pthread_mutex_unlock(&g_lock);
    if (ctx->held > ctx->high_water) ctx->high_water = ctx->held;
    *out = p;
    return BK_OK;
}

void cu_mem_free(void *p, bk_ctx *ctx)
{
    if (!p || !ctx) return;
    for (int i = 0; i < ctx->n_blocks; i++)
        if (ctx->blocks[i].p == p) {
            ctx->held -= ctx->blocks[i].bytes;
            pthread_mutex_lock(&g_lock);
            g_dev[ctx->device].held -= cu_pages(ctx->blocks[i].bytes);
            pthread_mutex_unlock(&g_lock);
            ctx->blocks[i] = ctx->blocks[--ctx->n_blocks];
            break;
        }
    if (cu_set_device(ctx->device) != BK_OK) return;
    cudaError_t e = cudaFree(p);
    if (e != cudaSuccess) cu_fail_cuda(e, "cudaFree", __FILE__, __LINE__);
}

int cu_mem_upload(void *dst, const void *src_host, size_t bytes, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!bytes) return BK_OK;
    if (!dst || !src_host) return BK_ERR_INVALID;
    CU_CHECK(cudaMemcpyAsync(dst, src_host, bytes, cudaMemcpyHostToDevice, ctx->stream));
    CU_CHECK(cudaStreamSynchronize(ctx->stream));
    return BK_OK;
}

int cu_mem_download(void *dst_host, const void *src, size_t bytes, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!bytes) return BK_OK;
    if (!dst_host || !src) return BK_ERR_INVALID;
    CU_CHECK(cudaMemcpyAsync(dst_host, src, bytes, cudaMemcpyDeviceToHost, ctx->stream));
    CU_CHECK(cudaStreamSynchronize(ctx->stream));
    return BK_OK;
}

/* ---- offload: page-locked host memory and the copy stream ---- */

int cu_host_alloc(void **out, size_t bytes, bk_ctx *ctx)
{
    if (!out) return BK_ERR_INVALID;
    CU_ENTER(ctx);
    void *p = NULL;
    cudaError_t e = cudaMallocHost(&p, bytes ? bytes : 64);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        fprintf(stderr, "ddpmd cuda: cannot lock %zu bytes (%.1f MiB) of host memory\n", bytes,
                (double)bytes / 1048576.0);
        return BK_ERR_NOMEM;
    }
    if (e != cudaSuccess) return cu_fail_cuda(e, "cudaMallocHost", __FILE__, __LINE__);
    *out = p;
    return BK_OK;
}

void cu_host_free(void *p, bk_ctx *ctx)
{
    if (!p) return;
    cudaError_t e = cudaFreeHost(p);
    if (e != cudaSuccess) cu_fail_cuda(e, "cudaFreeHost", __FILE__, __LINE__);
}

/* host memory cudaMallocHost made: a copy from or to anything else is not asynchronous (the
 * driver stages pageable memory and the call returns only when it is done) */
static int cu_pinned(const void *p)
{
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeHost;
}

/* dst <- src (kind: a download or an upload, the host side host_alloc's) on the copy stream,
 * after the compute work enqueued so far: it made a download's source, and may still read an
 * upload's destination */
static int cu_copy_async(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                         bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!bytes) return BK_OK;
    if (!dst || !src) return BK_ERR_INVALID;
    const void *host = kind == cudaMemcpyDeviceToHost ? dst : src;
    if (!cu_pinned(host)) {
        fprintf(stderr, "ddpmd cuda: an asynchronous %s pageable host memory (%p): host_alloc's "
                        "memory only\n", kind == cudaMemcpyDeviceToHost ? "download into"
                                                                          : "upload from", host);
        return BK_ERR_INVALID;
    }
    CU_CHECK(cudaEventRecord(ctx->computed, ctx->stream));
    CU_CHECK(cudaStreamWaitEvent(ctx->copy, ctx->computed, 0));
    CU_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, ctx->copy));
    ctx->copies++;
    return BK_OK;
}

int cu_mem_download_async(void *dst_host, const void *src, size_t bytes, bk_ctx *ctx)
{
    return cu_copy_async(dst_host, src, bytes, cudaMemcpyDeviceToHost, ctx);
}

int cu_mem_upload_async(void *dst, const void *src_host, size_t bytes, bk_ctx *ctx)
{
    return cu_copy_async(dst, src_host, bytes, cudaMemcpyHostToDevice, ctx);
}

int cu_copy_fence(bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!ctx->copies) return BK_OK;
    CU_CHECK(cudaEventRecord(ctx->copied, ctx->copy));
    CU_CHECK(cudaStreamWaitEvent(ctx->stream, ctx->copied, 0));
    ctx->copies = 0;
    return BK_OK;
}

int cu_copy_sync(bk_ctx *ctx)
{
    CU_ENTER(ctx);
    CU_CHECK(cudaStreamSynchronize(ctx->copy));
    ctx->copies = 0;
    return BK_OK;
}

__global__ void k_fill_f32(float *dst, float value, size_t count)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < count;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = value;
}

int cu_mem_set_f32(float *dst, float value, size_t count, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!count) return BK_OK;
    if (!dst) return BK_ERR_INVALID;
    CU_TOUCHES(dst, count * sizeof(float));
    CU_LAUNCH(k_fill_f32, cu_blocks(count, CU_THREADS), CU_THREADS, 0, ctx->stream)(
        dst, value, count);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

int cu_sync(bk_ctx *ctx)
{
    CU_ENTER(ctx);
    CU_CHECK(cudaStreamSynchronize(ctx->stream));
    return BK_OK;
}

/* ---- the table ---- */

static struct backend cu_backend;

/* the memory-bound kernels on any dtype (norm.cu, eltwise.cu) */
static struct bk_typed cu_typed;

static void cu_typed_init(struct bk_typed *y)
{
    y->groupnorm_ws_bytes = cu_t_groupnorm_ws_bytes;
    y->groupnorm_fwd = cu_t_groupnorm_fwd;
    y->groupnorm_bwd = cu_t_groupnorm_bwd;
    y->layernorm_fwd = cu_t_layernorm_fwd;
    y->layernorm_bwd = cu_t_layernorm_bwd;
    y->silu_fwd = cu_t_silu_fwd;
    y->silu_bwd = cu_t_silu_bwd;
    y->gelu_fwd = cu_t_gelu_fwd;
    y->gelu_bwd = cu_t_gelu_bwd;
    y->add_fwd = cu_t_add_fwd;
    y->copy_grad = cu_t_copy_grad;
    y->scale_fwd = cu_t_scale_fwd;
    y->add_bcast_fwd = cu_t_add_bcast_fwd;
    y->add_bcast_bwd = cu_t_add_bcast_bwd;
    y->concat_fwd = cu_t_concat_fwd;
    y->concat_bwd = cu_t_concat_bwd;
    y->transpose_fwd = cu_t_transpose_fwd;
    y->upsample_nearest2x_fwd = cu_t_upsample_nearest2x_fwd;
    y->upsample_nearest2x_bwd = cu_t_upsample_nearest2x_bwd;
    y->upsample_bilinear2x_fwd = cu_t_upsample_bilinear2x_fwd;
    y->upsample_bilinear2x_bwd = cu_t_upsample_bilinear2x_bwd;
    y->maxpool2x2_fwd = cu_t_maxpool2x2_fwd;
    y->maxpool2x2_bwd = cu_t_maxpool2x2_bwd;
    y->dropout_fwd = cu_t_dropout_fwd;
    y->dropout_bwd = cu_t_dropout_bwd;
}
static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static void cu_table_init(void)
{
    /* lazy loading (CUDA's default since 12.2, set here unless the environment chose): only the
     * kernels a process uses are loaded. EAGER loaded every module of cuBLAS and cuDNN at the
     * warm-up: 1,608 MiB on an H200 with four job slots, against PyTorch's 703 MiB. The kernels
     * a job uses are loaded before its reservation instead (preload_own_kernels, warm_plan) */
    setenv("CUDA_MODULE_LOADING", "LAZY", 0);
    cu_sync_checks = env_int("DDPMD_CUDA_SYNC", 0, 0, 1);
    g_parity_env = env_int("DDPMD_CUDA_PARITY", 1, 0, 1);
    struct backend *t = &cu_backend;
    t->name = "cuda";
    t->ctx_init = cu_ctx_init;
    t->ctx_free = cu_ctx_free;
    t->mem_alloc = cu_mem_alloc;
    t->mem_free = cu_mem_free;
    t->mem_upload = cu_mem_upload;
    t->mem_download = cu_mem_download;
    t->mem_set_f32 = cu_mem_set_f32;
    t->sync = cu_sync;
    t->conv2d_ws_bytes = cu_conv2d_ws_bytes;
    t->conv2d_fwd = cu_conv2d_fwd;
    t->conv2d_bwd_data = cu_conv2d_bwd_data;
    t->conv2d_bwd_filter = cu_conv2d_bwd_filter;
    t->linear_fwd = cu_linear_fwd;
    t->linear_bwd = cu_linear_bwd;
    t->groupnorm_fwd = cu_groupnorm_fwd;
    t->groupnorm_bwd = cu_groupnorm_bwd;
    t->layernorm_fwd = cu_layernorm_fwd;
    t->layernorm_bwd = cu_layernorm_bwd;
    t->silu_fwd = cu_silu_fwd;
    t->silu_bwd = cu_silu_bwd;
    t->gelu_fwd = cu_gelu_fwd;
    t->gelu_bwd = cu_gelu_bwd;
    t->add_fwd = cu_add_fwd;
    t->copy_grad = cu_copy_grad;
    t->add_bcast_fwd = cu_add_bcast_fwd;
    t->add_bcast_bwd = cu_add_bcast_bwd;
    t->scale_fwd = cu_scale_fwd;
    t->concat_fwd = cu_concat_fwd;
    t->concat_bwd = cu_concat_bwd;
    t->transpose_fwd = cu_transpose_fwd;
    t->upsample_nearest2x_fwd = cu_upsample_nearest2x_fwd;
    t->upsample_nearest2x_bwd = cu_upsample_nearest2x_bwd;
    t->upsample_bilinear2x_fwd = cu_upsample_bilinear2x_fwd;
    t->upsample_bilinear2x_bwd = cu_upsample_bilinear2x_bwd;
    t->maxpool2x2_fwd = cu_maxpool2x2_fwd;
    t->maxpool2x2_bwd = cu_maxpool2x2_bwd;
    t->timestep_embed_fwd = cu_timestep_embed_fwd;
    t->attn_ws_bytes = cu_attn_ws_bytes;
    t->attn_fwd = cu_attn_fwd;
    t->attn_bwd = cu_attn_bwd;
    t->attn_plain_fwd = cu_attn_plain_fwd;
    t->attn_plain_bwd = cu_attn_plain_bwd;
    t->mse_fwd = cu_mse_fwd;
    t->mse_bwd = cu_mse_bwd;
    t->xent_fwd = cu_xent_fwd;
    t->xent_bwd = cu_xent_bwd;
    t->dropout_fwd = cu_dropout_fwd;
    t->dropout_bwd = cu_dropout_bwd;
    t->sumsq = cu_sumsq;
    t->adamw_step = cu_adamw_step;
    t->ema_update = cu_ema_update;
    t->device_count = cu_device_count;
    t->device_select = cu_device_select;
    t->device_mem = cu_device_mem;
    t->device_poisoned = cu_device_poisoned;
    t->ctx_set_workspace = cu_ctx_set_workspace;
    t->set_parity = cu_set_parity;
    t->philox_normal_fill = cu_philox_normal_fill;
    t->philox_u32_fill = cu_philox_u32_fill;
    t->convert = cu_convert;
    t->ctx_set_budget = cu_ctx_set_budget;
    t->mem_high_water = cu_mem_high_water;
    t->host_alloc = cu_host_alloc;
    t->host_free = cu_host_free;
    t->mem_download_async = cu_mem_download_async;
    t->mem_upload_async = cu_mem_upload_async;
    t->copy_fence = cu_copy_fence;
    t->copy_sync = cu_copy_sync;
    t->half_kernels = cu_half_kernels;
    t->linear_ws_bytes = cu_linear_ws_bytes;
    t->nhwc = 1;
    t->groupnorm_silu_fwd = cu_groupnorm_silu_fwd;
    t->groupnorm_bwd_ws = cu_groupnorm_bwd_ws;
    t->groupnorm_bwd_ws_bytes = cu_groupnorm_bwd_ws_bytes;
    cu_typed_init(&cu_typed);
    t->typed = &cu_typed;
    t->step_set = cu_step_set;
    t->dropout_step_fwd = cu_dropout_step_fwd;
    t->dropout_step_bwd = cu_dropout_step_bwd;
    t->mse_step_bwd = cu_mse_step_bwd;
    t->loss_step_add = cu_loss_step_add;
    t->optim_step = cu_optim_step;
    t->scaler_set = cu_scaler_set;
    t->step_read = cu_step_read;
    /* DDPMD_CUDA_GRAPHS=0: every step runs as it comes, no capture */
    if (env_int("DDPMD_CUDA_GRAPHS", 1, 0, 1)) {
        t->graph_begin = cu_graph_begin;
        t->graph_end = cu_graph_end;
        t->graph_launch = cu_graph_launch;
        t->graph_free = cu_graph_free;
    }
}

/* the module's one export (kernels/backend_load.c looks it up with dlsym). Touches no CUDA API:
 * loading the module on a machine without a GPU or driver is harmless. */
extern "C" __attribute__((visibility("default"))) const struct backend *ddpmd_backend_cuda(void)
{
    pthread_once(&cu_once, cu_table_init);
    return &cu_backend;
}
