/* graph.cpp - stream capture and CUDA graphs in the CUDA emulator (tests/gpu/emu): between
 * cudaStreamBeginCapture and cudaStreamEndCapture a stream records what it is given instead of
 * running it; cudaGraphInstantiate keeps the record and cudaGraphLaunch runs it, in order, on the
 * launch's stream, through emu.cpp's calls and so through their checks (pointer tags, stream
 * order, faults). The public names of the calls a capture records or refuses are defined here;
 * emu.cpp runs them (emu_now_*, emu_internal.h). Contract: cuda_runtime.h's "stream capture".
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <map>
#include <memory>
#include <set>
#include <vector>

#include "cublas_v2.h"
#include "cuda_runtime.h"
#include "cudnn.h"
#include "emu_graph.h"
#include "emu_internal.h"

/* one recorded operation: run on the launch's stream, the CU_TOUCHES of a kernel named again */
struct emu_node {
    std::function<cudaError_t(cudaStream_t)> run;
    const char *what;
    int ntouch;
    emu_touch touch[EMU_TOUCHES];
};
struct emu_graph {
    std::vector<emu_node> nodes;
};
struct emu_graph_exec {
    std::vector<emu_node> nodes;
};
/* a stream's capture in progress */
struct emu_capture {
    emu_graph *g;
    int mode;
    pthread_t thread;
    int invalid;          /* a refused call: EndCapture fails */
    char why[160];
};

static pthread_mutex_t g_cap_lock = PTHREAD_MUTEX_INITIALIZER; /* everything below */
static std::map<cudaStream_t, emu_capture> g_caps;
static std::set<cudaEvent_t> g_cap_events;  /* recorded in a capture in progress */
static emu_graph_stats g_gstats;
static thread_local int tl_unsafe;          /* this thread's captures that are not relaxed */
static thread_local int tl_replaying;       /* inside cudaGraphLaunch */

/* s's capture (lock held), NULL if none */
static emu_capture *cap_of(cudaStream_t s)
{
    if (!s) return NULL;
    auto it = g_caps.find(s);
    return it == g_caps.end() ? NULL : &it->second;
}

/* a refused call invalidates the capture (lock held) */
static void cap_invalidate(emu_capture *c, const char *what)
{
    if (!c->invalid) {
        c->invalid = 1;
        snprintf(c->why, sizeof c->why, "%s", what);
        g_gstats.refused++;
    }
    fprintf(stderr, "emu graph: %s during a stream capture: refused, the capture is invalidated "
                    "(as CUDA's)\n", what);
}

int emu_capture_refuses(const char *what)
{
    if (!tl_unsafe) return 0;
    pthread_mutex_lock(&g_cap_lock);
    const pthread_t me = pthread_self();
    for (auto &kv : g_caps)
        if (kv.second.mode != cudaStreamCaptureModeRelaxed && pthread_equal(kv.second.thread, me))
            cap_invalidate(&kv.second, what);
    pthread_mutex_unlock(&g_cap_lock);
    return 1;
}

/* records node on s when s captures: 1 (the call returns what rc_record says), else 0 (run it
 * now). An invalidated capture records nothing more: the call fails with
 * cudaErrorStreamCaptureInvalidated (*err) */
static int cap_record(cudaStream_t s, emu_node &&node, cudaError_t *err)
{
    pthread_mutex_lock(&g_cap_lock);
    emu_capture *c = cap_of(s);
    if (!c) {
        pthread_mutex_unlock(&g_cap_lock);
        return 0;
    }
    *err = cudaSuccess;
    if (c->invalid)
        *err = cudaErrorStreamCaptureInvalidated;
    else
        c->g->nodes.push_back(std::move(node));
    pthread_mutex_unlock(&g_cap_lock);
    return 1;
}

static int capturing(cudaStream_t s)
{
    pthread_mutex_lock(&g_cap_lock);
    const int on = cap_of(s) != NULL;
    pthread_mutex_unlock(&g_cap_lock);
    return on;
}

/* refuses `what` on capturing stream s (invalidating the capture): 1, else 0 */
static int cap_refuse(cudaStream_t s, const char *what)
{
    pthread_mutex_lock(&g_cap_lock);
    emu_capture *c = cap_of(s);
    if (c) cap_invalidate(c, what);
    pthread_mutex_unlock(&g_cap_lock);
    return c != NULL;
}

/* ---- kernels ---- */

int emu_capture_launch(cudaStream_t s, std::function<cudaError_t(cudaStream_t)> run)
{
    if (!capturing(s)) {
        if (!tl_replaying) __atomic_fetch_add(&g_gstats.eager_launches, 1, __ATOMIC_RELAXED);
        return 0;
    }
    emu_node n;
    n.run = std::move(run);
    n.what = "kernel launch";
    n.ntouch = emu_touches_take(n.touch);
    cudaError_t err;
    if (cap_record(s, std::move(n), &err) && err != cudaSuccess) emu_error(err);
    return 1;
}

/* ---- the runtime ---- */

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    if (!s) {
        fprintf(stderr, "emu graph: capture of the NULL stream\n");
        return emu_error(cudaErrorStreamCaptureUnsupported);
    }
    pthread_mutex_lock(&g_cap_lock);
    if (cap_of(s)) {
        pthread_mutex_unlock(&g_cap_lock);
        fprintf(stderr, "emu graph: cudaStreamBeginCapture of a stream already capturing\n");
        return emu_error(cudaErrorInvalidValue);
    }
    emu_capture c;
    c.g = new emu_graph();
    c.mode = mode;
    c.thread = pthread_self();
    c.invalid = 0;
    c.why[0] = 0;
    g_caps[s] = c;
    g_gstats.captures++;
    pthread_mutex_unlock(&g_cap_lock);
    if (mode != cudaStreamCaptureModeRelaxed) tl_unsafe++;
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *g)
{
    pthread_mutex_lock(&g_cap_lock);
    emu_capture *c = cap_of(s);
    if (!c) {
        pthread_mutex_unlock(&g_cap_lock);
        fprintf(stderr, "emu graph: cudaStreamEndCapture of a stream not capturing\n");
        return emu_error(cudaErrorStreamCaptureUnmatched);
    }
    if (c->mode != cudaStreamCaptureModeRelaxed && !pthread_equal(c->thread, pthread_self())) {
        pthread_mutex_unlock(&g_cap_lock);
        return emu_error(cudaErrorStreamCaptureWrongThread);
    }
    emu_capture done = *c;
    g_caps.erase(s);
    g_cap_events.clear(); /* one capture at a time in practice: its events leave with it */
    if (done.invalid) g_gstats.invalidated++;
    pthread_mutex_unlock(&g_cap_lock);
    if (done.mode != cudaStreamCaptureModeRelaxed) tl_unsafe--;
    if (done.invalid) {
        fprintf(stderr, "emu graph: cudaStreamEndCapture: the capture was invalidated by %s\n",
                done.why);
        delete done.g;
        if (g) *g = NULL;
        return emu_error(cudaErrorStreamCaptureInvalidated);
    }
    if (!g) {
        delete done.g;
        return emu_error(cudaErrorInvalidValue);
    }
    *g = done.g;
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *st)
{
    pthread_mutex_lock(&g_cap_lock);
    emu_capture *c = cap_of(s);
    *st = !c ? cudaStreamCaptureStatusNone
             : c->invalid ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    pthread_mutex_unlock(&g_cap_lock);
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *e, cudaGraph_t g, unsigned long long flags)
{
    (void)flags;
    if (!e || !g) return emu_error(cudaErrorInvalidValue);
    emu_graph_exec *x = new emu_graph_exec();
    x->nodes = g->nodes;
    *e = x;
    pthread_mutex_lock(&g_cap_lock);
    g_gstats.instantiated++;
    g_gstats.nodes += (long)g->nodes.size();
    pthread_mutex_unlock(&g_cap_lock);
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t e, cudaStream_t s)
{
    if (!e) return emu_error(cudaErrorInvalidValue);
    if (capturing(s)) {
        cap_refuse(s, "cudaGraphLaunch into a capturing stream (not emulated)");
        return emu_error(cudaErrorStreamCaptureUnsupported);
    }
    pthread_mutex_lock(&g_cap_lock);
    g_gstats.launches++;
    pthread_mutex_unlock(&g_cap_lock);
    tl_replaying++;
    cudaError_t rc = cudaSuccess;
    for (const emu_node &n : e->nodes) {
        for (int i = 0; i < n.ntouch; i++) emu_touches(n.touch[i].p, n.touch[i].bytes);
        rc = n.run(s);
        __atomic_fetch_add(&g_gstats.replayed, 1, __ATOMIC_RELAXED);
        if (rc != cudaSuccess) {
            fprintf(stderr, "emu graph: a replayed %s failed: %s\n", n.what, cudaGetErrorName(rc));
            break;
        }
    }
    tl_replaying--;
    return rc == cudaSuccess ? cudaSuccess : emu_error(rc);
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t e)
{
    delete e;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    delete g;
    return cudaSuccess;
}

/* copies: device <-> device or page-locked memory are recorded; pageable host memory makes the
 * copy synchronous (a host read or write of device memory mid-capture): refused */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind k,
                            cudaStream_t s)
{
    if (!capturing(s)) return emu_now_cudaMemcpyAsync(dst, src, bytes, k, s);
    cudaPointerAttributes ad, as;
    const int ok = cudaPointerGetAttributes(&ad, dst) == cudaSuccess &&
                   cudaPointerGetAttributes(&as, src) == cudaSuccess;
    if (!ok || ad.type == cudaMemoryTypeUnregistered || as.type == cudaMemoryTypeUnregistered) {
        cap_refuse(s, "cudaMemcpyAsync with pageable host memory");
        return emu_error(cudaErrorStreamCaptureUnsupported);
    }
    emu_node n = {};
    n.run = [=](cudaStream_t st) { return emu_now_cudaMemcpyAsync(dst, src, bytes, k, st); };
    n.what = "cudaMemcpyAsync";
    cudaError_t err;
    cap_record(s, std::move(n), &err);
    return err == cudaSuccess ? err : emu_error(err);
}

cudaError_t cudaMemsetAsync(void *dst, int v, size_t bytes, cudaStream_t s)
{
    if (!capturing(s)) return emu_now_cudaMemsetAsync(dst, v, bytes, s);
    emu_node n = {};
    n.run = [=](cudaStream_t st) { return emu_now_cudaMemsetAsync(dst, v, bytes, st); };
    n.what = "cudaMemsetAsync";
    cudaError_t err;
    cap_record(s, std::move(n), &err);
    return err == cudaSuccess ? err : emu_error(err);
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    if (cap_refuse(s, "cudaStreamSynchronize of the capturing stream"))
        return emu_error(cudaErrorStreamCaptureUnsupported);
    if (emu_capture_refuses("cudaStreamSynchronize"))
        return emu_error(cudaErrorStreamCaptureUnsupported);
    return emu_now_cudaStreamSynchronize(s);
}

cudaError_t cudaDeviceSynchronize(void)
{
    if (emu_capture_refuses("cudaDeviceSynchronize"))
        return emu_error(cudaErrorStreamCaptureUnsupported);
    return emu_now_cudaDeviceSynchronize();
}

/* an event recorded in a capture orders the capture's own work only: recorded again at the
 * replay (the emulator's stream-order bookkeeping), and no host may wait for it */
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    if (!capturing(s)) {
        pthread_mutex_lock(&g_cap_lock);
        g_cap_events.erase(e);
        pthread_mutex_unlock(&g_cap_lock);
        return emu_now_cudaEventRecord(e, s);
    }
    emu_node n = {};
    n.run = [=](cudaStream_t st) { return emu_now_cudaEventRecord(e, st); };
    n.what = "cudaEventRecord";
    cudaError_t err;
    cap_record(s, std::move(n), &err);
    pthread_mutex_lock(&g_cap_lock);
    g_cap_events.insert(e);
    pthread_mutex_unlock(&g_cap_lock);
    return err == cudaSuccess ? err : emu_error(err);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    pthread_mutex_lock(&g_cap_lock);
    const int captured = g_cap_events.count(e) != 0;
    pthread_mutex_unlock(&g_cap_lock);
    if (!capturing(s)) {
        if (captured) {
            fprintf(stderr, "emu graph: a stream waits on an event of a capture (it would join "
                            "the capture: not emulated)\n");
            emu_capture_refuses("cudaStreamWaitEvent joining a capture");
            return emu_error(cudaErrorStreamCaptureUnsupported);
        }
        return emu_now_cudaStreamWaitEvent(s, e, flags);
    }
    if (!captured) {
        cap_refuse(s, "cudaStreamWaitEvent on an event recorded outside the capture");
        return emu_error(cudaErrorStreamCaptureIsolation);
    }
    emu_node n = {};
    n.run = [=](cudaStream_t st) { return emu_now_cudaStreamWaitEvent(st, e, flags); };
    n.what = "cudaStreamWaitEvent";
    cudaError_t err;
    cap_record(s, std::move(n), &err);
    return err == cudaSuccess ? err : emu_error(err);
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    pthread_mutex_lock(&g_cap_lock);
    const int captured = g_cap_events.count(e) != 0;
    pthread_mutex_unlock(&g_cap_lock);
    if (captured) {
        fprintf(stderr, "emu graph: cudaEventSynchronize of an event recorded in a capture\n");
        return emu_error(cudaErrorCapturedEvent);
    }
    if (emu_capture_refuses("cudaEventSynchronize"))
        return emu_error(cudaErrorStreamCaptureUnsupported);
    return emu_now_cudaEventSynchronize(e);
}

/* ---- cuBLAS: the handle's math mode and workspace as they were at the capture ---- */

static cudaStream_t emu_cublas_stream_of(cublasHandle_t h)
{
    cudaStream_t s;
    int math;
    void *ws;
    size_t b;
    emu_cublas_get(h, &s, &math, &ws, &b);
    return s;
}

template <typename F> static cublasStatus_t blas_record(cublasHandle_t h, const char *what, F call)
{
    cudaStream_t s;
    int math;
    void *ws;
    size_t wsb;
    emu_cublas_get(h, &s, &math, &ws, &wsb);
    if (!capturing(s)) return call();
    emu_node n = {};
    n.run = [=](cudaStream_t st) {
        cudaStream_t s0;
        int m0;
        void *w0;
        size_t b0;
        emu_cublas_get(h, &s0, &m0, &w0, &b0);
        emu_cublas_set(h, st, math, ws, wsb);
        const cublasStatus_t rc = call();
        emu_cublas_set(h, s0, m0, w0, b0);
        return rc == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorLaunchFailure;
    };
    n.what = what;
    cudaError_t err;
    cap_record(s, std::move(n), &err);
    return err == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

int emu_capture_blas(cublasHandle_t h, const char *what, std::function<cublasStatus_t()> call,
                     cublasStatus_t *rc)
{
    if (!capturing(emu_cublas_stream_of(h))) return 0;
    *rc = blas_record(h, what, std::move(call));
    return 1;
}

int emu_capture_call(cudaStream_t s, const char *what,
                     std::function<cudaError_t(cudaStream_t)> run, cudaError_t *err)
{
    emu_node n = {};
    n.run = std::move(run);
    n.what = what;
    return cap_record(s, std::move(n), err);
}

cublasStatus_t cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                           int n, int k, const float *alpha, const float *a, int lda,
                           const float *b, int ldb, const float *beta, float *c, int ldc)
{
    /* alpha and beta are read at the call (host pointer mode): their values are captured */
    const float al = alpha && m > 0 && n > 0 ? *alpha : 0.0f;
    const float be = beta && m > 0 && n > 0 ? *beta : 0.0f;
    if (!capturing(emu_cublas_stream_of(h)))
        return emu_now_cublasSgemm(h, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return blas_record(h, "cublasSgemm", [=]() {
        return emu_now_cublasSgemm(h, ta, tb, m, n, k, &al, a, lda, b, ldb, &be, c, ldc);
    });
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m,
                            int n, int k, const void *alpha, const void *a, cudaDataType at,
                            int lda, const void *b, cudaDataType bt, int ldb, const void *beta,
                            void *c, cudaDataType ct, int ldc, cublasComputeType_t compute,
                            cublasGemmAlgo_t algo)
{
    if (!capturing(emu_cublas_stream_of(h)))
        return emu_now_cublasGemmEx(h, ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c,
                                    ct, ldc, compute, algo);
    const float al = alpha && m > 0 && n > 0 ? *(const float *)alpha : 0.0f;
    const float be = beta && m > 0 && n > 0 ? *(const float *)beta : 0.0f;
    return blas_record(h, "cublasGemmEx", [=]() {
        return emu_now_cublasGemmEx(h, ta, tb, m, n, k, &al, a, at, lda, b, bt, ldb, &be, c, ct,
                                    ldc, compute, algo);
    });
}

/* ---- cuDNN: the descriptors and scalars as they were at the capture ---- */

/* descriptors a recorded call owns (copies), freed with its graph's last node copy */
struct dnn_descs {
    cudnnTensorDescriptor_t t1 = NULL, t2 = NULL;
    cudnnFilterDescriptor_t f = NULL;
    cudnnConvolutionDescriptor_t c = NULL;
    ~dnn_descs()
    {
        if (t1) cudnnDestroyTensorDescriptor(t1);
        if (t2) cudnnDestroyTensorDescriptor(t2);
        if (f) cudnnDestroyFilterDescriptor(f);
        if (c) cudnnDestroyConvolutionDescriptor(c);
    }
};

template <typename F> static cudnnStatus_t dnn_record(cudnnHandle_t h, const char *what, F call)
{
    emu_node n = {};
    n.run = [=](cudaStream_t st) {
        const cudaStream_t s0 = emu_cudnn_stream(h);
        cudnnSetStream(h, st);
        const cudnnStatus_t rc = call();
        cudnnSetStream(h, s0);
        return rc == CUDNN_STATUS_SUCCESS ? cudaSuccess : cudaErrorLaunchFailure;
    };
    n.what = what;
    cudaError_t err;
    cap_record(emu_cudnn_stream(h), std::move(n), &err);
    return err == cudaSuccess ? CUDNN_STATUS_SUCCESS : CUDNN_STATUS_EXECUTION_FAILED;
}

/* A cuDNN engine loaded for the first time inside a capture: its module's memory would be taken
 * there, outside any plan (and a driver before CUDA 12.3 refuses a load during a capture), so a
 * capture refuses it - stricter than a newer driver: each library call must have run once before
 * the capture that records it. xd: the convolution's data (x, or dx for the data gradient) */
static int dnn_engine_refused(cudnnTensorDescriptor_t xd, cudnnConvolutionDescriptor_t c)
{
    return emu_dnn_engine_new(xd, c) &&
           emu_capture_refuses("a cuDNN engine module loaded for the first time (its call never "
                               "ran before the capture)");
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t h, const void *alpha,
                                      cudnnTensorDescriptor_t xd, const void *x,
                                      cudnnFilterDescriptor_t wd, const void *w,
                                      cudnnConvolutionDescriptor_t c, cudnnConvolutionFwdAlgo_t a,
                                      void *ws, size_t ws_bytes, const void *beta,
                                      cudnnTensorDescriptor_t yd, void *y)
{
    if (!capturing(emu_cudnn_stream(h)))
        return emu_now_cudnnConvolutionForward(h, alpha, xd, x, wd, w, c, a, ws, ws_bytes, beta,
                                               yd, y);
    if (dnn_engine_refused(xd, c)) return CUDNN_STATUS_EXECUTION_FAILED;
    auto d = std::make_shared<dnn_descs>();
    d->t1 = emu_dup_tensor_desc(xd);
    d->t2 = emu_dup_tensor_desc(yd);
    d->f = emu_dup_filter_desc(wd);
    d->c = emu_dup_conv_desc(c);
    const float al = *(const float *)alpha, be = *(const float *)beta;
    return dnn_record(h, "cudnnConvolutionForward", [=]() {
        return emu_now_cudnnConvolutionForward(h, &al, d->t1, x, d->f, w, d->c, a, ws, ws_bytes,
                                               &be, d->t2, y);
    });
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t h, const void *alpha,
                                           cudnnFilterDescriptor_t wd, const void *w,
                                           cudnnTensorDescriptor_t dyd, const void *dy,
                                           cudnnConvolutionDescriptor_t c,
                                           cudnnConvolutionBwdDataAlgo_t a, void *ws,
                                           size_t ws_bytes, const void *beta,
                                           cudnnTensorDescriptor_t dxd, void *dx)
{
    if (!capturing(emu_cudnn_stream(h)))
        return emu_now_cudnnConvolutionBackwardData(h, alpha, wd, w, dyd, dy, c, a, ws, ws_bytes,
                                                    beta, dxd, dx);
    if (dnn_engine_refused(dxd, c)) return CUDNN_STATUS_EXECUTION_FAILED;
    auto d = std::make_shared<dnn_descs>();
    d->t1 = emu_dup_tensor_desc(dyd);
    d->t2 = emu_dup_tensor_desc(dxd);
    d->f = emu_dup_filter_desc(wd);
    d->c = emu_dup_conv_desc(c);
    const float al = *(const float *)alpha, be = *(const float *)beta;
    return dnn_record(h, "cudnnConvolutionBackwardData", [=]() {
        return emu_now_cudnnConvolutionBackwardData(h, &al, d->f, w, d->t1, dy, d->c, a, ws,
                                                    ws_bytes, &be, d->t2, dx);
    });
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t h, const void *alpha,
                                             cudnnTensorDescriptor_t xd, const void *x,
                                             cudnnTensorDescriptor_t dyd, const void *dy,
                                             cudnnConvolutionDescriptor_t c,
                                             cudnnConvolutionBwdFilterAlgo_t a, void *ws,
                                             size_t ws_bytes, const void *beta,
                                             cudnnFilterDescriptor_t dwd, void *dw)
{
    if (!capturing(emu_cudnn_stream(h)))
        return emu_now_cudnnConvolutionBackwardFilter(h, alpha, xd, x, dyd, dy, c, a, ws,
                                                      ws_bytes, beta, dwd, dw);
    if (dnn_engine_refused(xd, c)) return CUDNN_STATUS_EXECUTION_FAILED;
    auto d = std::make_shared<dnn_descs>();
    d->t1 = emu_dup_tensor_desc(xd);
    d->t2 = emu_dup_tensor_desc(dyd);
    d->f = emu_dup_filter_desc(dwd);
    d->c = emu_dup_conv_desc(c);
    const float al = *(const float *)alpha, be = *(const float *)beta;
    return dnn_record(h, "cudnnConvolutionBackwardFilter", [=]() {
        return emu_now_cudnnConvolutionBackwardFilter(h, &al, d->t1, x, d->t2, dy, d->c, a, ws,
                                                      ws_bytes, &be, d->f, dw);
    });
}

cudnnStatus_t cudnnAddTensor(cudnnHandle_t h, const void *alpha, cudnnTensorDescriptor_t ad,
                             const void *a, const void *beta, cudnnTensorDescriptor_t cd, void *c)
{
    if (!capturing(emu_cudnn_stream(h)))
        return emu_now_cudnnAddTensor(h, alpha, ad, a, beta, cd, c);
    auto d = std::make_shared<dnn_descs>();
    d->t1 = emu_dup_tensor_desc(ad);
    d->t2 = emu_dup_tensor_desc(cd);
    const float al = *(const float *)alpha, be = *(const float *)beta;
    return dnn_record(h, "cudnnAddTensor", [=]() {
        return emu_now_cudnnAddTensor(h, &al, d->t1, a, &be, d->t2, c);
    });
}

/* the finders time the algorithms (host waits): never in a capture. Counted: a convolution's
 * algorithm is measured once per shape and mode (the backend's cache) */
static int finder(cudnnHandle_t h, const char *what)
{
    __atomic_fetch_add(&g_gstats.finds, 1, __ATOMIC_RELAXED);
    if (cap_refuse(emu_cudnn_stream(h), what)) return 1;
    return emu_capture_refuses(what);
}

cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(
    cudnnHandle_t h, cudnnTensorDescriptor_t xd, const void *x, cudnnFilterDescriptor_t wd,
    const void *w, cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t yd, void *y, int req,
    int *got, cudnnConvolutionFwdAlgoPerf_t *p, void *ws, size_t ws_bytes)
{
    if (finder(h, "cudnnFindConvolutionForwardAlgorithmEx")) return CUDNN_STATUS_NOT_SUPPORTED;
    return emu_now_cudnnFindConvolutionForwardAlgorithmEx(h, xd, x, wd, w, c, yd, y, req, got, p,
                                                          ws, ws_bytes);
}

cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(
    cudnnHandle_t h, cudnnFilterDescriptor_t wd, const void *w, cudnnTensorDescriptor_t dyd,
    const void *dy, cudnnConvolutionDescriptor_t c, cudnnTensorDescriptor_t dxd, void *dx,
    int req, int *got, cudnnConvolutionBwdDataAlgoPerf_t *p, void *ws, size_t ws_bytes)
{
    if (finder(h, "cudnnFindConvolutionBackwardDataAlgorithmEx"))
        return CUDNN_STATUS_NOT_SUPPORTED;
    return emu_now_cudnnFindConvolutionBackwardDataAlgorithmEx(h, wd, w, dyd, dy, c, dxd, dx, req,
                                                               got, p, ws, ws_bytes);
}

cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(
    cudnnHandle_t h, cudnnTensorDescriptor_t xd, const void *x, cudnnTensorDescriptor_t dyd,
    const void *dy, cudnnConvolutionDescriptor_t c, cudnnFilterDescriptor_t dwd, void *dw,
    int req, int *got, cudnnConvolutionBwdFilterAlgoPerf_t *p, void *ws, size_t ws_bytes)
{
    if (finder(h, "cudnnFindConvolutionBackwardFilterAlgorithmEx"))
        return CUDNN_STATUS_NOT_SUPPORTED;
    return emu_now_cudnnFindConvolutionBackwardFilterAlgorithmEx(h, xd, x, dyd, dy, c, dwd, dw,
                                                                 req, got, p, ws, ws_bytes);
}

/* ---- test hooks ---- */

extern "C" void ddpmd_emu_clear_fault(void);

extern "C" __attribute__((visibility("default"))) void
ddpmd_emu_graph_stats(struct emu_graph_stats *out)
{
    pthread_mutex_lock(&g_cap_lock);
    *out = g_gstats;
    out->eager_launches = __atomic_load_n(&g_gstats.eager_launches, __ATOMIC_RELAXED);
    out->replayed = __atomic_load_n(&g_gstats.replayed, __ATOMIC_RELAXED);
    out->finds = __atomic_load_n(&g_gstats.finds, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&g_cap_lock);
}

__global__ void emu_k_axpy(float *y, const float *x, float a, int n)
{
    for (int i = threadIdx.x; i < n; i += blockDim.x) y[i] = a * x[i] + y[i];
}

#define SELF(cond, ...)                                                                        \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            missed++;                                                                          \
            fprintf(stderr, "emu graph self-check: not caught: " __VA_ARGS__);                 \
            fputc('\n', stderr);                                                               \
        }                                                                                      \
    } while (0)

/* a capture that is refused: it ends invalidated (and the error is not sticky) */
static int refused_capture(cudaStream_t s, const char *what, int (*misuse)(cudaStream_t s))
{
    int missed = 0;
    cudaGraph_t g = NULL;
    SELF(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "(begin)");
    SELF(misuse(s) != 0, "%s inside a capture was taken", what);
    SELF(cudaStreamEndCapture(s, &g) == cudaErrorStreamCaptureInvalidated && !g,
         "a capture with %s was not invalidated", what);
    (void)cudaGetLastError();
    return missed;
}

static void *g_sc_dev, *g_sc_pin;
static float g_sc_host[16];
static int mis_sync(cudaStream_t s) { return cudaStreamSynchronize(s) != cudaSuccess; }
static int mis_devsync(cudaStream_t) { return cudaDeviceSynchronize() != cudaSuccess; }
static int mis_malloc(cudaStream_t)
{
    void *p = NULL;
    const int refused = cudaMalloc(&p, 64) != cudaSuccess;
    if (p) (void)cudaFree(p);
    return refused;
}
static int mis_host_read(cudaStream_t s)
{
    return cudaMemcpyAsync(g_sc_host, g_sc_dev, 16, cudaMemcpyDeviceToHost, s) != cudaSuccess;
}
static int mis_outside_event(cudaStream_t s)
{
    static cudaEvent_t ev;
    if (!ev) cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    return cudaStreamWaitEvent(s, ev, 0) != cudaSuccess;
}
/* an f16 convolution of stride 7 (no model has one): its engine module was never loaded */
static cudnnHandle_t g_sc_dnn;
static cudnnTensorDescriptor_t g_sc_xd, g_sc_yd;
static cudnnFilterDescriptor_t g_sc_wd;
static cudnnConvolutionDescriptor_t g_sc_cd;
static int mis_new_engine(cudaStream_t)
{
    const float one = 1.0f, zero = 0.0f;
    char *b = (char *)g_sc_dev;
    return cudnnConvolutionForward(g_sc_dnn, &one, g_sc_xd, b, g_sc_wd, b + 128, g_sc_cd,
                                   CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, NULL, 0, &zero,
                                   g_sc_yd, b + 256) != CUDNN_STATUS_SUCCESS;
}

/* planted misuses of capture, and a replay against the same work run directly; returns how many
 * went unnoticed (0: all caught). Leaves nothing behind. */
extern "C" __attribute__((visibility("default"))) int ddpmd_emu_capture_selfcheck(void)
{
    int missed = 0;
    cudaStream_t s = NULL;
    float *d = NULL, *pin = NULL;
    (void)cudaGetLastError();
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) ||
        cudaMalloc(&d, 256 * sizeof(float)) || cudaMallocHost(&pin, 64 * sizeof(float))) {
        fprintf(stderr, "emu graph self-check: setup failed\n");
        return 1000;
    }
    g_sc_dev = d;
    g_sc_pin = pin;
    for (int i = 0; i < 64; i++) pin[i] = (float)i;
    /* record: nothing runs until the launch; each launch runs it all again, in order */
    SELF(cudaMemsetAsync(d, 0, 256 * sizeof(float), s) == cudaSuccess &&
             cudaStreamSynchronize(s) == cudaSuccess,
         "(memset)");
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    SELF(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "(begin)");
    SELF(cudaMemcpyAsync(d + 64, pin, 64 * sizeof(float), cudaMemcpyHostToDevice, s) ==
             cudaSuccess,
         "a page-locked upload in a capture was refused");
    CU_LAUNCH(emu_k_axpy, 1, 32, 0, s)(d, d + 64, 2.0f, 64);
    SELF(cudaGetLastError() == cudaSuccess, "a kernel launch in a capture failed");
    SELF(cudaMemcpyAsync(pin + 32, d + 1, sizeof(float), cudaMemcpyDeviceToHost, s) == cudaSuccess,
         "a page-locked download in a capture was refused");
    SELF(d[1] == 0.0f && pin[32] == 32.0f, "the captured work ran at the capture");
    SELF(cudaStreamEndCapture(s, &g) == cudaSuccess && g, "(end)");
    SELF(g && cudaGraphInstantiate(&x, g, 0) == cudaSuccess && x, "(instantiate)");
    if (g) cudaGraphDestroy(g);
    for (int r = 1; x && r <= 3; r++) {
        SELF(cudaGraphLaunch(x, s) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess,
             "(launch %d)", r);
        SELF(d[1] == 2.0f * r && pin[32] == 2.0f * r,
             "replay %d: d[1] %g, its download %g, want %g", r, d[1], pin[32], 2.0f * r);
    }
    if (x) cudaGraphExecDestroy(x);
    /* what a capture refuses */
    missed += refused_capture(s, "cudaStreamSynchronize", mis_sync);
    missed += refused_capture(s, "cudaDeviceSynchronize", mis_devsync);
    missed += refused_capture(s, "cudaMalloc", mis_malloc);
    missed += refused_capture(s, "a download into pageable memory (a host read)", mis_host_read);
    missed += refused_capture(s, "a wait on an event recorded outside the capture",
                              mis_outside_event);
    if (cudnnCreate(&g_sc_dnn) == CUDNN_STATUS_SUCCESS) {
        cudnnSetStream(g_sc_dnn, s);
        cudnnCreateTensorDescriptor(&g_sc_xd);
        cudnnCreateTensorDescriptor(&g_sc_yd);
        cudnnCreateFilterDescriptor(&g_sc_wd);
        cudnnCreateConvolutionDescriptor(&g_sc_cd);
        cudnnSetTensor4dDescriptor(g_sc_xd, CUDNN_TENSOR_NCHW, CUDNN_DATA_HALF, 1, 1, 7, 7);
        cudnnSetTensor4dDescriptor(g_sc_yd, CUDNN_TENSOR_NCHW, CUDNN_DATA_HALF, 1, 1, 1, 1);
        cudnnSetFilter4dDescriptor(g_sc_wd, CUDNN_DATA_HALF, CUDNN_TENSOR_NCHW, 1, 1, 1, 1);
        cudnnSetConvolution2dDescriptor(g_sc_cd, 0, 0, 7, 7, 1, 1, CUDNN_CROSS_CORRELATION,
                                        CUDNN_DATA_FLOAT);
        missed += refused_capture(s, "a cuDNN engine module loaded for the first time",
                                  mis_new_engine);
        cudnnDestroyConvolutionDescriptor(g_sc_cd);
        cudnnDestroyFilterDescriptor(g_sc_wd);
        cudnnDestroyTensorDescriptor(g_sc_yd);
        cudnnDestroyTensorDescriptor(g_sc_xd);
        cudnnDestroy(g_sc_dnn);
    } else {
        SELF(0, "(cudnnCreate)");
    }
    /* a replay goes through the checks: a planted host pointer faults at the launch */
    SELF(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess, "(begin)");
    CU_LAUNCH(emu_k_axpy, 1, 32, 0, s)(g_sc_host, (const float *)d, 1.0f, 4);
    g = NULL;
    x = NULL;
    SELF(cudaStreamEndCapture(s, &g) == cudaSuccess && g &&
             cudaGraphInstantiate(&x, g, 0) == cudaSuccess,
         "(a capture with a bad pointer: the capture does not check it, as CUDA's)");
    SELF(x && cudaGraphLaunch(x, s) == cudaErrorIllegalAddress,
         "a replayed kernel with a host pointer did not fault");
    if (x) cudaGraphExecDestroy(x);
    if (g) cudaGraphDestroy(g);
    ddpmd_emu_clear_fault();
    (void)cudaDeviceSynchronize();
    cudaFree(d);
    cudaFreeHost(pin);
    cudaStreamDestroy(s);
    (void)cudaGetLastError();
    return missed;
}
