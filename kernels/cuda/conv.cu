/* conv.cu - 2-D convolution through cuDNN 9's convolution API: forward, backward data and
 * backward filter. Descriptors and algorithms are chosen once per (device, shape, mode) and kept
 * in a process-wide cache. conv2d_ws_bytes ranks the algorithms with cuDNN's heuristics (no
 * device memory needed) and sizes the workspace for the best few allowed ones; the first call of
 * each direction then times them with the *Ex finders over that workspace, taken from the plan,
 * and keeps the fastest that fits it, with the math type it was timed with (never inside a
 * graph capture: a captured call runs the choice made before, or the heuristics' first).
 * Parity mode: CUDNN_FMA_MATH for fp32, no Winograd or FFT, deterministic algorithms only. Fast
 * mode (set_parity(0)): fp32 on tensor cores (TF32, CUDNN_TENSOR_OP_MATH) and any algorithm,
 * non-deterministic ones (atomics) included.
 * cuDNN's descriptors only pad symmetrically: a conv with pad_t != pad_b or pad_l != pad_r
 * (diffusers' downsample pads right and bottom) runs unpadded over a zero-padded copy of its
 * input in the workspace, and its data gradient comes back through a cropped copy.
 * Layout: images NHWC (CUDNN_TENSOR_NHWC, the backend's `nhwc`), filters in cuDNN's NHWC filter
 * layout KRSC (O,Kh,Kw,I), which its tensor-core NHWC kernels take: the plan keeps OIHW weights,
 * so the forward and the data gradient read a KRSC copy made in the workspace per call (the
 * weights are small next to the activations), and the filter gradient is computed as a KRSC
 * filter in the workspace and added to the OIHW fp32 dw. The bias gradient is the column sums
 * of dy seen as (N*Ho*Wo, Co).
 * 16-bit (s->dtype f16 or bf16): x, w, y and their gradients in cuDNN's HALF / BFLOAT16 with fp32
 * accumulation (compute type FLOAT) on tensor cores (CUDNN_TENSOR_OP_MATH, in parity mode too:
 * products of 16-bit values are exact in fp32; parity still refuses Winograd, FFT and
 * non-deterministic algorithms). cuDNN's filter gradient has x's type (rounded once before it is
 * added to the fp32 dw, as PyTorch's autocast does: the gradient of the 16-bit weight copy).
 */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend.h"

enum { DIR_FWD = 0, DIR_BWD_DATA = 1, DIR_BWD_FILTER = 2, DIR_N = 3 };
#define CONV_CAND 3          /* allowed heuristic candidates the workspace is sized for */
#define CONV_ALIGN 256
#define CONV_PERF_N 32

struct conv_entry {
    struct conv_entry *next;
    int device, parity, dtype;
    struct bk_conv2d s;
    int asym;                  /* 1: cuDNN sees the zero-padded copy (hp, wp) with pad 0 */
    int hp, wp;
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    /* a direction's own descriptor when its measured algorithm was timed with another math type
     * than cd's (fast mode), else NULL: cd */
    cudnnConvolutionDescriptor_t dcd[DIR_N];
    int ncand[DIR_N];
    int cand[DIR_N][CONV_CAND];
    size_t pad_bytes, dw_bytes, lib_bytes, ws_bytes;
    int tuned[DIR_N];
    int algo[DIR_N];
};

static struct conv_entry *g_conv; /* under cu_query_lock */

static size_t align_up(size_t x) { return (x + CONV_ALIGN - 1) / CONV_ALIGN * CONV_ALIGN; }

static size_t env_size_mb(const char *name, size_t def_mb)
{
    const char *v = getenv(name);
    if (!v || !*v) return def_mb << 20;
    char *end;
    unsigned long long x = strtoull(v, &end, 10);
    return *end ? def_mb << 20 : (size_t)x << 20;
}

static int conv_check(const struct bk_conv2d *s)
{
    if (!s || s->n < 1 || s->ci < 1 || s->h < 1 || s->w < 1 || s->co < 1) return BK_ERR_INVALID;
    if (s->pad_t < 0 || s->pad_l < 0 || s->pad_b < 0 || s->pad_r < 0) return BK_ERR_INVALID;
    if (!cu_dtype_ok(s->dtype)) return BK_ERR_INVALID;
    struct bk_conv2d t = *s;
    if (bk_conv2d_init(&t) != BK_OK || t.ho != s->ho || t.wo != s->wo) return BK_ERR_INVALID;
    /* cuDNN's 4-d descriptors take int dimensions and strides */
    long long hp = (long long)s->h + s->pad_t + s->pad_b,
              wp = (long long)s->w + s->pad_l + s->pad_r;
    if ((long long)s->n * s->ci * hp * wp > INT_MAX ||
        (long long)s->n * s->co * s->ho * s->wo > INT_MAX)
        return BK_ERR_INVALID;
    return BK_OK;
}

static int same_shape(const struct bk_conv2d *a, const struct bk_conv2d *b)
{
    return a->dtype == b->dtype && a->n == b->n && a->ci == b->ci && a->h == b->h && a->w == b->w && a->co == b->co &&
           a->kh == b->kh && a->kw == b->kw && a->stride == b->stride && a->pad_t == b->pad_t &&
           a->pad_l == b->pad_l && a->pad_b == b->pad_b && a->pad_r == b->pad_r;
}

/* algorithms a parity run may use: no Winograd, no FFT; and never a non-deterministic one (also
 * refused by row_ok, whatever a row says: the atomics below) */
static int fwd_allowed(int a, int parity)
{
    if (!parity) return 1;
    return a != CUDNN_CONVOLUTION_FWD_ALGO_FFT && a != CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING &&
           a != CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD &&
           a != CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED;
}
static int bwd_data_allowed(int a, int parity)
{
    if (!parity) return 1;
    if (a == CUDNN_CONVOLUTION_BWD_DATA_ALGO_0) return 0; /* atomics */
    return a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT &&
           a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING &&
           a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD &&
           a != CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED;
}
static int bwd_filter_allowed(int a, int parity)
{
    if (!parity) return 1;
    if (a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 || a == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3)
        return 0; /* atomics */
    return a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT &&
           a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING &&
           a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD &&
           a != CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED;
}
static int dir_allowed(int dir, int a, int parity)
{
    return dir == DIR_FWD        ? fwd_allowed(a, parity)
           : dir == DIR_BWD_DATA ? bwd_data_allowed(a, parity)
                                 : bwd_filter_allowed(a, parity);
}
/* parity: fp32 data never on tensor cores (TF32); 16-bit data anything but down-conversion;
 * fast mode: fp32 data on tensor cores too (TF32), never down-converted to 16 bits */
static int math_allowed(cudnnMathType_t m, int parity, int dtype)
{
    if (dtype != BK_DTYPE_F32 || !parity) return m != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
    return m == CUDNN_FMA_MATH || m == CUDNN_DEFAULT_MATH;
}

/* the math type a convolution descriptor of the entry starts with */
static cudnnMathType_t entry_math(int dtype, int parity)
{
    return dtype != BK_DTYPE_F32 || !parity ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
}

static cudnnDataType_t dnn_type(int dtype)
{
    return dtype == BK_DTYPE_F16    ? CUDNN_DATA_HALF
           : dtype == BK_DTYPE_BF16 ? CUDNN_DATA_BFLOAT16
                                    : CUDNN_DATA_FLOAT;
}

/* one perf row, whatever the direction */
struct perf_row {
    int algo;
    cudnnStatus_t status;
    size_t memory;
    cudnnDeterminism_t det;
    cudnnMathType_t math;
};

template <typename P> static void perf_rows(struct perf_row *r, const P *p, int n)
{
    for (int i = 0; i < n; i++) {
        r[i].algo = (int)p[i].algo;
        r[i].status = p[i].status;
        r[i].memory = p[i].memory;
        r[i].det = p[i].determinism;
        r[i].math = p[i].mathType;
    }
}

static int row_ok(const struct perf_row *r, int dir, int parity, int dtype, size_t max_mem)
{
    return r->status == CUDNN_STATUS_SUCCESS && (!parity || r->det == CUDNN_DETERMINISTIC) &&
           dir_allowed(dir, r->algo, parity) && math_allowed(r->math, parity, dtype) &&
           r->memory <= max_mem;
}

static void entry_destroy(struct conv_entry *e)
{
    if (!e) return;
    if (e->xd) cudnnDestroyTensorDescriptor(e->xd);
    if (e->yd) cudnnDestroyTensorDescriptor(e->yd);
    if (e->wd) cudnnDestroyFilterDescriptor(e->wd);
    if (e->cd) cudnnDestroyConvolutionDescriptor(e->cd);
    for (int d = 0; d < DIR_N; d++)
        if (e->dcd[d]) cudnnDestroyConvolutionDescriptor(e->dcd[d]);
    free(e);
}

/* the workspace of the always-available fallback of a direction */
static int fallback_ws(struct conv_entry *e, cudnnHandle_t h, int dir, size_t *bytes)
{
    if (dir == DIR_FWD)
        CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(
            h, e->xd, e->wd, e->cd, e->yd, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, bytes));
    else if (dir == DIR_BWD_DATA)
        CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(
            h, e->wd, e->yd, e->cd, e->xd, CUDNN_CONVOLUTION_BWD_DATA_ALGO_1, bytes));
    else
        CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(
            h, e->xd, e->yd, e->cd, e->wd, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1, bytes));
    return BK_OK;
}

static int fallback_algo(int dir)
{
    return dir == DIR_FWD        ? (int)CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM
           : dir == DIR_BWD_DATA ? (int)CUDNN_CONVOLUTION_BWD_DATA_ALGO_1
                                 : (int)CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
}

/* a convolution descriptor of the entry's geometry with math type m */
static int conv_desc_make(const struct conv_entry *e, cudnnMathType_t m,
                          cudnnConvolutionDescriptor_t *out)
{
    const struct bk_conv2d *s = &e->s;
    const int ph = e->asym ? 0 : s->pad_t, pw = e->asym ? 0 : s->pad_l;
    CUDNN_CHECK(cudnnCreateConvolutionDescriptor(out));
    CUDNN_CHECK(cudnnSetConvolution2dDescriptor(*out, ph, pw, s->stride, s->stride, 1, 1,
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    CUDNN_CHECK(cudnnSetConvolutionMathType(*out, m));
    return BK_OK;
}

/* descriptors, heuristic candidates and workspace of a new entry (device current, query lock
 * held) */
static int entry_build(struct conv_entry *e)
{
    const struct bk_conv2d *s = &e->s;
    cudnnHandle_t h = cu_query_cudnn(e->device);
    e->asym = s->pad_t != s->pad_b || s->pad_l != s->pad_r;
    e->hp = e->asym ? s->h + s->pad_t + s->pad_b : s->h;
    e->wp = e->asym ? s->w + s->pad_l + s->pad_r : s->w;
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&e->xd));
    CUDNN_CHECK(cudnnCreateTensorDescriptor(&e->yd));
    CUDNN_CHECK(cudnnCreateFilterDescriptor(&e->wd));
    const cudnnDataType_t dt = dnn_type(e->dtype);
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(e->xd, CUDNN_TENSOR_NHWC, dt, s->n, s->ci, e->hp,
                                           e->wp));
    CUDNN_CHECK(cudnnSetTensor4dDescriptor(e->yd, CUDNN_TENSOR_NHWC, dt, s->n, s->co, s->ho,
                                           s->wo));
    CUDNN_CHECK(cudnnSetFilter4dDescriptor(e->wd, dt, CUDNN_TENSOR_NHWC, s->co, s->ci, s->kh,
                                           s->kw));
    int rc = conv_desc_make(e, entry_math(e->dtype, e->parity), &e->cd);
    if (rc) return rc;
    /* cuDNN's idea of the output must be ours */
    int on, oc, oh, ow;
    CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(e->cd, e->xd, e->wd, &on, &oc, &oh, &ow));
    if (on != s->n || oc != s->co || oh != s->ho || ow != s->wo) {
        fprintf(stderr, "ddpmd cuda: conv output %dx%dx%dx%d, cuDNN says %dx%dx%dx%d\n", s->n,
                s->co, s->ho, s->wo, on, oc, oh, ow);
        return BK_ERR_INVALID;
    }
    const size_t max_mem = env_size_mb("DDPMD_CUDA_CONV_WS_MAX_MB", 256);
    size_t lib = 0;
    for (int dir = 0; dir < DIR_N; dir++) {
        struct perf_row rows[CONV_PERF_N];
        int got = 0;
        if (dir == DIR_FWD) {
            cudnnConvolutionFwdAlgoPerf_t p[CONV_PERF_N];
            CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, e->xd, e->wd, e->cd, e->yd,
                                                               CONV_PERF_N, &got, p));
            perf_rows(rows, p, got);
        } else if (dir == DIR_BWD_DATA) {
            cudnnConvolutionBwdDataAlgoPerf_t p[CONV_PERF_N];
            CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, e->wd, e->yd, e->cd, e->xd,
                                                                    CONV_PERF_N, &got, p));
            perf_rows(rows, p, got);
        } else {
            cudnnConvolutionBwdFilterAlgoPerf_t p[CONV_PERF_N];
            CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, e->xd, e->yd, e->cd,
                                                                      e->wd, CONV_PERF_N, &got,
                                                                      p));
            perf_rows(rows, p, got);
        }
        e->ncand[dir] = 0;
        for (int i = 0; i < got && e->ncand[dir] < CONV_CAND; i++) {
            if (!row_ok(&rows[i], dir, e->parity, e->dtype, max_mem)) continue;
            int dup = 0;
            for (int j = 0; j < e->ncand[dir]; j++) dup |= e->cand[dir][j] == rows[i].algo;
            if (dup) continue;
            e->cand[dir][e->ncand[dir]++] = rows[i].algo;
            if (rows[i].memory > lib) lib = rows[i].memory;
        }
        if (e->ncand[dir] == 0) {
            size_t b = 0;
            int frc = fallback_ws(e, h, dir, &b);
            if (frc) return frc;
            e->cand[dir][e->ncand[dir]++] = fallback_algo(dir);
            if (b > lib) lib = b;
        }
        e->algo[dir] = e->cand[dir][0];
    }
    const size_t es = bk_dtype_size(e->dtype);
    e->pad_bytes = e->asym ? align_up((size_t)s->n * s->ci * e->hp * e->wp * es) : 0;
    e->dw_bytes = align_up((size_t)s->co * s->ci * s->kh * s->kw * es);
    e->lib_bytes = align_up(lib);
    /* + alignment slack: the plan's workspace is 64-byte aligned, cuDNN's wants more */
    e->ws_bytes = CONV_ALIGN + e->pad_bytes + e->dw_bytes + e->lib_bytes;
    return BK_OK;
}

/* the cache entry of (device, shape, parity), made on first sight; query lock held */
static int entry_get_locked(int device, int parity, const struct bk_conv2d *s,
                            struct conv_entry **out)
{
    for (struct conv_entry *e = g_conv; e; e = e->next)
        if (e->device == device && e->parity == parity && same_shape(&e->s, s)) {
            *out = e;
            return BK_OK;
        }
    int rc = cu_device_ready(device);
    if (rc) return rc;
    if (s->dtype != BK_DTYPE_F32 && !(cu_device_half(device, s->dtype) & BK_HALF_CONV))
        return BK_ERR_INVALID; /* the device's cuDNN has no tensor cores for the type */
    struct conv_entry *e = (struct conv_entry *)calloc(1, sizeof *e);
    if (!e) return BK_ERR_NOMEM;
    e->device = device;
    e->parity = parity;
    e->dtype = s->dtype;
    e->s = *s;
    rc = entry_build(e);
    if (rc) {
        entry_destroy(e);
        return rc;
    }
    e->next = g_conv;
    g_conv = e;
    *out = e;
    return BK_OK;
}

int cu_conv_untuned(int device, int parity, struct bk_conv2d *shapes, size_t *ws_bytes, int max)
{
    int n = 0;
    cu_query_lock();
    for (struct conv_entry *e = g_conv; e && n < max; e = e->next)
        if (e->device == device && e->parity == parity &&
            !(e->tuned[DIR_FWD] && e->tuned[DIR_BWD_DATA] && e->tuned[DIR_BWD_FILTER])) {
            shapes[n] = e->s;
            ws_bytes[n++] = e->ws_bytes;
        }
    cu_query_unlock();
    return n;
}

void cu_conv_forget(int device)
{
    cu_query_lock();
    struct conv_entry **pp = &g_conv;
    while (*pp) {
        struct conv_entry *e = *pp;
        if (e->device == device) {
            *pp = e->next;
            entry_destroy(e);
        } else {
            pp = &e->next;
        }
    }
    cu_query_unlock();
}

size_t cu_conv2d_ws_bytes(const struct bk_conv2d *s)
{
    if (conv_check(s) != BK_OK) return 0;
    struct conv_entry *e = NULL;
    cu_query_lock();
    int rc = entry_get_locked(cu_default_device(), cu_thread_parity(), s, &e);
    cu_query_unlock();
    if (rc) {
        fprintf(stderr, "ddpmd cuda: no convolution plan for this shape (error %d)\n", rc);
        return 0;
    }
    return e->ws_bytes;
}

/* the parts of the workspace */
struct conv_ws {
    void *pad;    /* asym: the zero-padded input (forward, filter) or data gradient */
    void *dw;     /* a KRSC filter of the data's type: the weights (forward, data gradient), or
                   * the filter gradient before it is added to dw (and the finder's output) */
    void *lib;    /* cuDNN's workspace, e->lib_bytes */
};

static int conv_ws_split(struct conv_ws *w, void *ws, const struct conv_entry *e)
{
    if (!ws) return BK_ERR_INVALID;
    char *b = (char *)(((uintptr_t)ws + CONV_ALIGN - 1) & ~(uintptr_t)(CONV_ALIGN - 1));
    w->pad = e->asym ? (void *)b : NULL;
    w->dw = b + e->pad_bytes;
    w->lib = b + e->pad_bytes + e->dw_bytes;
    return BK_OK;
}

static int conv_find_enabled(void)
{
    const char *v = getenv("DDPMD_CUDA_CONV_FIND");
    return !(v && v[0] == '0');
}

/* The finder's rows of direction dir: the fastest that is allowed and fits the workspace becomes
 * the direction's algorithm, with the math type it was timed with (fast mode; parity keeps cd's,
 * FMA for fp32). None: the heuristics' choice stays. Query lock held. */
static int adopt_found(struct conv_entry *e, int dir, const struct perf_row *r, int n)
{
    int i = 0;
    while (i < n && !row_ok(&r[i], dir, e->parity, e->dtype, e->lib_bytes)) i++;
    if (i == n) return BK_OK;
    e->algo[dir] = r[i].algo;
    if (e->parity || r[i].math == entry_math(e->dtype, e->parity)) return BK_OK;
    if (!e->dcd[dir]) return conv_desc_make(e, r[i].math, &e->dcd[dir]);
    CUDNN_CHECK(cudnnSetConvolutionMathType(e->dcd[dir], r[i].math));
    return BK_OK;
}

/* direction dir's descriptor: its own where its algorithm wants another math type */
static cudnnConvolutionDescriptor_t dir_desc(const struct conv_entry *e, int dir)
{
    return e->dcd[dir] ? e->dcd[dir] : e->cd;
}

/* whether direction dir may be timed now: not yet, the finders allowed, and not inside a graph
 * capture (the finders make the host wait; a captured call runs the choice made so far) */
static int may_tune(const struct conv_entry *e, int dir, const bk_ctx *ctx)
{
    return !e->tuned[dir] && !ctx->capturing && conv_find_enabled();
}

static int conv_pad(void *xp, const void *x, const struct conv_entry *e, bk_ctx *ctx)
{
    const struct bk_conv2d *s = &e->s;
    return cu_pad2d(xp, x, e->dtype, s->n, s->ci, s->h, s->w, s->pad_t, s->pad_l, s->pad_b,
                    s->pad_r, ctx);
}

/* the KRSC copy of the OIHW weights w in the workspace, the filter cuDNN reads */
static int conv_filter(const struct conv_ws *cw, const void *w, const struct conv_entry *e,
                       bk_ctx *ctx)
{
    const struct bk_conv2d *s = &e->s;
    return cu_filter_to_krsc(cw->dw, w, e->dtype, s->co, s->ci, s->kh, s->kw, ctx);
}

/* y (N,Ho,Wo,Co) += b (Co), the sum in fp32 and rounded once to T */
template <typename T> __global__ void k_conv_bias(T *y, const float *b, int co, size_t total)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = cu_to<T>(cu_ld(y[i]) + b[i % co]);
}

template <typename T> static int conv_bias(void *y, const float *b, const struct bk_conv2d *s,
                                           bk_ctx *ctx)
{
    const size_t total = (size_t)s->n * s->co * s->ho * s->wo;
    CU_LAUNCH(k_conv_bias<T>, cu_blocks(total, CU_THREADS), CU_THREADS, 0, ctx->stream)(
        (T *)y, b, s->co, total);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

int cu_conv2d_fwd(void *y, const void *x, const void *w, const float *b, void *ws,
                  const struct bk_conv2d *s, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (conv_check(s) != BK_OK || !y || !x || !w) return BK_ERR_INVALID;
    struct conv_entry *e = NULL;
    struct conv_ws cw;
    cu_query_lock();
    int rc = entry_get_locked(ctx->device, ctx->parity, s, &e);
    cu_query_unlock();
    if (rc) return rc;
    if ((rc = conv_ws_split(&cw, ws, e))) return rc;
    const void *xin = x;
    if (e->asym) {
        if ((rc = conv_pad(cw.pad, x, e, ctx))) return rc;
        xin = cw.pad;
    }
    if ((rc = conv_filter(&cw, w, e, ctx))) return rc;
    w = cw.dw;
    const float one = 1.0f, zero = 0.0f;
    cu_query_lock();
    if (may_tune(e, DIR_FWD, ctx)) {
        cudnnConvolutionFwdAlgoPerf_t p[CONV_PERF_N];
        struct perf_row r[CONV_PERF_N];
        int got = 0;
        cudnnStatus_t st = cudnnFindConvolutionForwardAlgorithmEx(
            ctx->cudnn, e->xd, xin, e->wd, w, e->cd, e->yd, y, CONV_PERF_N, &got, p, cw.lib,
            e->lib_bytes);
        if (st != CUDNN_STATUS_SUCCESS) {
            cu_query_unlock();
            return cu_fail_cudnn(st, "cudnnFindConvolutionForwardAlgorithmEx", __FILE__, __LINE__);
        }
        perf_rows(r, p, got);
        rc = adopt_found(e, DIR_FWD, r, got);
        if (rc) {
            cu_query_unlock();
            return rc;
        }
    }
    if (!ctx->capturing) e->tuned[DIR_FWD] = 1;
    const cudnnConvolutionFwdAlgo_t algo = (cudnnConvolutionFwdAlgo_t)e->algo[DIR_FWD];
    const cudnnConvolutionDescriptor_t cd = dir_desc(e, DIR_FWD);
    cu_query_unlock();
    CUDNN_CHECK(cudnnConvolutionForward(ctx->cudnn, &one, e->xd, xin, e->wd, w, cd, algo,
                                        cw.lib, e->lib_bytes, &zero, e->yd, y));
    if (b && (rc = CU_TYPED(s->dtype, conv_bias, y, b, s, ctx))) return rc;
    if (cu_sync_checks) CU_LAUNCHED(ctx);
    return BK_OK;
}

int cu_conv2d_bwd_data(void *dx, const void *dy, const void *w, int accum, void *ws,
                       const struct bk_conv2d *s, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (conv_check(s) != BK_OK || !dx || !dy || !w) return BK_ERR_INVALID;
    struct conv_entry *e = NULL;
    struct conv_ws cw;
    cu_query_lock();
    int rc = entry_get_locked(ctx->device, ctx->parity, s, &e);
    cu_query_unlock();
    if (rc) return rc;
    if ((rc = conv_ws_split(&cw, ws, e))) return rc;
    /* asym: the gradient of the padded copy, then its interior copied into dx; accumulating,
     * the padded copy starts as dx zero-padded and cuDNN's beta 1 blends into it: in 16 bits
     * round(dx + round(r)), as backend.h says (the epilogue rounds r to the type first) */
    void *out = e->asym ? cw.pad : dx;
    const float one = 1.0f, zero = 0.0f;
    const float beta = accum ? 1.0f : 0.0f;
    if (e->asym && accum && (rc = conv_pad(cw.pad, dx, e, ctx))) return rc;
    if ((rc = conv_filter(&cw, w, e, ctx))) return rc;
    w = cw.dw;
    cu_query_lock();
    /* the finder overwrites its output: only where that output is written (=) anyway */
    const int may_find = !accum;
    if (may_find && !e->tuned[DIR_BWD_DATA] && !ctx->capturing) {
        if (may_tune(e, DIR_BWD_DATA, ctx)) {
            cudnnConvolutionBwdDataAlgoPerf_t p[CONV_PERF_N];
            struct perf_row r[CONV_PERF_N];
            int got = 0;
            cudnnStatus_t st = cudnnFindConvolutionBackwardDataAlgorithmEx(
                ctx->cudnn, e->wd, w, e->yd, dy, e->cd, e->xd, out, CONV_PERF_N, &got, p, cw.lib,
                e->lib_bytes);
            if (st != CUDNN_STATUS_SUCCESS) {
                cu_query_unlock();
                return cu_fail_cudnn(st, "cudnnFindConvolutionBackwardDataAlgorithmEx", __FILE__,
                                     __LINE__);
            }
            perf_rows(r, p, got);
            rc = adopt_found(e, DIR_BWD_DATA, r, got);
            if (rc) {
                cu_query_unlock();
                return rc;
            }
        }
        e->tuned[DIR_BWD_DATA] = 1;
    }
    /* not yet tuned (the first calls accumulate): the heuristics' first choice */
    const cudnnConvolutionBwdDataAlgo_t algo =
        (cudnnConvolutionBwdDataAlgo_t)(e->tuned[DIR_BWD_DATA] ? e->algo[DIR_BWD_DATA]
                                                               : e->cand[DIR_BWD_DATA][0]);
    const cudnnConvolutionDescriptor_t cd = e->tuned[DIR_BWD_DATA] ? dir_desc(e, DIR_BWD_DATA)
                                                                   : e->cd;
    cu_query_unlock();
    CUDNN_CHECK(cudnnConvolutionBackwardData(ctx->cudnn, &one, e->wd, w, e->yd, dy, cd, algo,
                                             cw.lib, e->lib_bytes, &beta, e->xd, out));
    (void)zero;
    if (e->asym) {
        rc = cu_crop2d(dx, cw.pad, e->dtype, s->n, s->ci, s->h, s->w, s->pad_t, s->pad_l,
                       s->pad_b, s->pad_r, ctx);
        if (rc) return rc;
    }
    if (cu_sync_checks) CU_LAUNCHED(ctx);
    return BK_OK;
}

int cu_conv2d_bwd_filter(float *dw, float *db, const void *dy, const void *x, void *ws,
                         const struct bk_conv2d *s, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (conv_check(s) != BK_OK || !dw || !dy || !x) return BK_ERR_INVALID;
    struct conv_entry *e = NULL;
    struct conv_ws cw;
    cu_query_lock();
    int rc = entry_get_locked(ctx->device, ctx->parity, s, &e);
    cu_query_unlock();
    if (rc) return rc;
    if ((rc = conv_ws_split(&cw, ws, e))) return rc;
    const void *xin = x;
    if (e->asym) {
        if ((rc = conv_pad(cw.pad, x, e, ctx))) return rc;
        xin = cw.pad;
    }
    const float one = 1.0f, zero = 0.0f;
    cu_query_lock();
    if (may_tune(e, DIR_BWD_FILTER, ctx)) {
        /* dw accumulates: the finder writes a scratch filter in the workspace instead */
        cudnnConvolutionBwdFilterAlgoPerf_t p[CONV_PERF_N];
        struct perf_row r[CONV_PERF_N];
        int got = 0;
        cudnnStatus_t st = cudnnFindConvolutionBackwardFilterAlgorithmEx(
            ctx->cudnn, e->xd, xin, e->yd, dy, e->cd, e->wd, cw.dw, CONV_PERF_N, &got, p, cw.lib,
            e->lib_bytes);
        if (st != CUDNN_STATUS_SUCCESS) {
            cu_query_unlock();
            return cu_fail_cudnn(st, "cudnnFindConvolutionBackwardFilterAlgorithmEx", __FILE__,
                                 __LINE__);
        }
        perf_rows(r, p, got);
        rc = adopt_found(e, DIR_BWD_FILTER, r, got);
        if (rc) {
            cu_query_unlock();
            return rc;
        }
    }
    if (!ctx->capturing) e->tuned[DIR_BWD_FILTER] = 1;
    const cudnnConvolutionBwdFilterAlgo_t algo =
        (cudnnConvolutionBwdFilterAlgo_t)e->algo[DIR_BWD_FILTER];
    const cudnnConvolutionDescriptor_t cd = dir_desc(e, DIR_BWD_FILTER);
    cu_query_unlock();
    /* cuDNN's KRSC filter gradient (of the data's type), then dw (OIHW fp32) += it */
    CUDNN_CHECK(cudnnConvolutionBackwardFilter(ctx->cudnn, &one, e->xd, xin, e->yd, dy, cd,
                                               algo, cw.lib, e->lib_bytes, &zero, e->wd, cw.dw));
    if ((rc = cu_filter_add_krsc(dw, cw.dw, e->dtype, s->co, s->ci, s->kh, s->kw, ctx)))
        return rc;
    if (db) {
        rc = cu_colsum_add(db, dy, e->dtype, s->n * s->ho * s->wo, s->co, ctx);
        if (rc) return rc;
    }
    if (cu_sync_checks) CU_LAUNCHED(ctx);
    return BK_OK;
}
