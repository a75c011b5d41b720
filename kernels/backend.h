/* backend.h - the one interface between the engine and the compute kernels.
 * A backend (kernels/cpu, kernels/cuda) fills a `struct backend` table of forward and backward
 * kernels. All pointers are device pointers of that backend; all tensors are dense, row-major.
 * Images - activations (N,C,H,W) and their gradients - are stored NCHW, or NHWC (channels
 * last: (N,H,W,C) in memory) where the backend sets `nhwc`; the (n, c, h, w / hw) arguments of
 * the image kernels (conv, group norm, broadcast add, concat, resampling) always name the
 * logical dimensions. Weights are always in their stated layouts (OIHW for convolutions).
 */
#ifndef DDPMD_BACKEND_H
#define DDPMD_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Conventions for every kernel:
 * - arguments: outputs, then inputs, then saved statistics, then sizes, then the context;
 * - `accum` on an output gradient: 0 writes it (=), 1 adds to it (+=). Parameter gradients
 *   (dw, db, dgamma, dbeta) always accumulate (+=); the executor zeroes them per step;
 * - a NULL optional pointer (bias, output gradient not needed) means "absent / skip";
 * - kernels never allocate: scratch comes from `ws` whose size the matching *_ws_bytes returns.
 */

typedef struct bk_ctx bk_ctx; /* per-job: thread count, stream, library handles */
typedef struct bk_graph bk_graph; /* a captured piece of work (graph_end), replayed by graph_launch */

/* element types of device buffers (graph.h's tensor dtypes are these values). Every kernel
 * computes in fp32 on fp32 buffers unless its entry says otherwise. The typed kernels
 * (convolution, linear, attention) take the dtype of their GEMM operands (x, w, y and their
 * gradients; the entries say which) in their descriptor or argument; the bias, the parameter
 * gradients (dw, db, which accumulate), lse and the softmax stay fp32, and they accumulate in
 * fp32. A kernel refuses a dtype it does not implement with BK_ERR_INVALID; half_kernels says
 * which it implements. Other 16-bit tensors reach the kernels through `convert` into planned
 * scratch of the kernel's dtype (engine/exec.c). An accumulating 16-bit output of a typed
 * kernel (accum = 1: conv2d_bwd_data's and linear_bwd's dx) is round(y + round(r)): the result r
 * rounded to the type as the `=` call stores it, added to y in fp32, rounded again. That is what
 * cuBLAS's and cuDNN's tensor-core epilogues do with beta = 1 (an H200 with CUDA 13.0 and cuDNN
 * 9.14: round(y + r) differs from it in 21-32% of the elements) and what PyTorch's autocast does
 * when it sums two 16-bit gradients. An fp32 output that accumulates, and a 16-bit tensor that
 * reaches an fp32 kernel through convert, sum in fp32: round(y + r), as do the memory-bound
 * kernels' typed versions (struct bk_typed, optional: backend.typed). */
enum bk_dtype { BK_DTYPE_F32 = 0, BK_DTYPE_F16 = 1, BK_DTYPE_BF16 = 2 };

/* half_kernels' bits: the typed kernels that take 16-bit operands natively */
enum bk_half {
    BK_HALF_CONV = 1u << 0,       /* conv2d_fwd, conv2d_bwd_data, conv2d_bwd_filter */
    BK_HALF_LINEAR = 1u << 1,     /* linear_fwd, linear_bwd */
    BK_HALF_ATTN = 1u << 2,       /* attn_fwd, attn_bwd (tiled) */
    BK_HALF_ATTN_PLAIN = 1u << 3, /* attn_plain_fwd, attn_plain_bwd */
    BK_HALF_NORM = 1u << 4,       /* typed: group norm (its fusions too), layer norm */
    BK_HALF_ELTWISE = 1u << 5,    /* typed: element-wise, layout, resampling and dropout kernels */
};

/* bytes of one element of dtype */
static inline size_t bk_dtype_size(int dtype) { return dtype == BK_DTYPE_F32 ? 4 : 2; }

enum bk_status {
    BK_OK = 0,
    BK_ERR_INVALID = 1,
    BK_ERR_DEVICE = 2,
    BK_ERR_NOMEM = 3,
};

/* 2-D convolution, images in the backend's layout, OIHW weights, square stride, explicit padding per side
 * (diffusers' downsample_padding=0 pads right/bottom only). */
struct bk_conv2d {
    int n, ci, h, w;        /* input  (N,Ci,H,W) */
    int co, kh, kw;         /* weight (Co,Ci,Kh,Kw) */
    int stride;
    int pad_t, pad_l, pad_b, pad_r;
    int ho, wo;             /* output (N,Co,Ho,Wo), filled by bk_conv2d_init */
    int dtype;              /* enum bk_dtype of x, w, y (fwd), dy, w, dx (bwd data), dy, x (bwd
                             * filter); 0 = f32. Workspace sizes depend on it. */
};

/* Multi-head self-attention over tokens. q, k, v are (N, L, ld) row-major with the H*D
 * features of the token at [0, H*D) of each row (row stride ld, so a packed qkv (N,L,3C)
 * is passed as three pointers with ld = 3C). Output o is (N, L, H*D) dense. lse (N,H,L)
 * is the log-sum-exp of each scaled score row, saved by the forward for the backward.
 * Dropout-free. scale is usually 1/sqrt(D). */
struct bk_attn {
    int n, l, heads, d;
    int ld;                 /* row stride of q, k, v and of dq, dk, dv */
    float scale;
    int dtype;              /* enum bk_dtype of q, k, v, o, dout, dq, dk, dv; 0 = f32. lse and
                             * the plain form's p are fp32. Workspace sizes depend on it. */
};

struct bk_adamw {
    float lr, beta1, beta2, eps, weight_decay;
    float bias_c1;          /* 1 - beta1^t */
    float bias_c2_sqrt;     /* sqrt(1 - beta2^t) */
};

/* ---- the step on the device (the optional step_* entries at the end of struct backend) ---- */

/* the host's values of one forward/backward (seed .. first) or optimizer step (lr, t), which the
 * step_* kernels read on the device when they run (step_set) */
struct bk_step {
    uint64_t seed, step;    /* dropout's Philox coordinates (dropout_fwd's) */
    int sample_base;        /* dropout's: the micro-batch's first sample in the effective batch */
    int first;              /* the step's first micro-batch: its loss starts the step's sum */
    float dloss_scale;      /* the loss gradient's factor (mse_bwd's) before the loss scale; also
                             * the micro-batch loss's weight in the step's loss */
    float lr;               /* the optimizer step's learning rate */
    int64_t t;              /* its 1-based step count, skipped steps included */
    int reset;              /* the context's step log starts empty, the step's loss at 0 */
};

/* the optimizer step's constants (optim_step): PyTorch's AdamW, clipping, EMA and f16's dynamic
 * loss scaling (struct strategy_loss_scale's fields) */
struct bk_optim {
    float beta1, beta2, eps, weight_decay;
    float clip;             /* max global gradient norm; 0: none */
    float ema_decay;        /* 0: no EMA */
    int scaling;            /* dynamic loss scaling: an inf/NaN gradient skips the step */
    float growth, backoff;
    int growth_interval;
};

/* the dynamic loss scale's state (exec.h's struct loss_scaler) */
struct bk_scaler {
    float scale;
    int good_steps;
    int64_t skipped;
};

/* one optimizer step as the device recorded it (step_read) */
struct bk_step_rec {
    float loss;             /* the step's loss: its micro-batches' dloss_scale * loss, summed */
    float grad_norm;        /* the global gradient norm before clipping, unscaled */
    float scale;            /* the loss scale after the step's update */
    int applied;            /* 0: skipped (inf/NaN gradients under loss scaling) */
};

/* a device's memory (device_mem), bytes */
struct bk_device_mem {
    size_t total;          /* the device's memory */
    size_t free;           /* free now (cudaMemGetInfo) */
    size_t process;        /* held by this process itself (context, library handles, modules),
                            * measured once after the warm-up; subtract it from the budget */
    int cc_major, cc_minor;
    char name[96];
};

/* a group norm over images in the backend's layout (N,C,HW; G groups of C/G channels) and the
 * broadcast adds the executor fuses into it (bk_typed's groupnorm_fwd, groupnorm_bwd) */
struct bk_groupnorm {
    int n, c, hw, groups;
    float eps;
    int silu;               /* y = silu(group norm(x)) */
    int dtype;              /* enum bk_dtype of the images and (N,C) terms: x, xo, xb, y, yb,
                             * yr (forward), dy, dx, db (backward) */
};

/* The memory-bound kernels on elements of a given dtype (enum bk_dtype, fp32 included), for the
 * backends that store 16-bit activations without converting them around fp32 kernels (the
 * executor uses them for every op they cover where backend.typed is set; half_kernels'
 * BK_HALF_NORM and BK_HALF_ELTWISE say which 16-bit types it may plan on them). Each entry has
 * the contract of the fp32 entry of the same name with its image, token and vector operands
 * (x, y, a, b, dx, dy, da, db, and the (N,C) broadcast term) of `dtype`; statistics (mean,
 * rstd), parameters (gamma, beta) and their gradients stay fp32 (dgamma, dbeta accumulate),
 * arithmetic is fp32 (statistics and reductions at least as precise as the fp32 entries'), and
 * each 16-bit value stored is rounded once to nearest even as kernels/half.h (an accumulating
 * output: round(y + result), the sum in fp32), so a typed kernel gives what its fp32 entry
 * gives on converted operands up to the fp32 rounding of its arithmetic. A dtype a kernel lacks:
 * BK_ERR_INVALID. */
struct bk_typed {
    /* scratch bytes of groupnorm_fwd (backward 0) or groupnorm_bwd (1) for s */
    size_t (*groupnorm_ws_bytes)(const struct bk_groupnorm *s, int backward);
    /* y = act(group norm(x')), act = silu or identity; x' = x + xb (N,C) broadcast over HW when
     * xb (stored, rounded to the dtype, into xo: xo may be x; the statistics are those of the
     * stored values), else x (xo unused); then y += yb (N,C) broadcast when yb, and y += yr
     * (N,C,HW, a residual) when yr. Rounding points are the unfused ops': add_bcast's sum, the
     * norm's output, the sum after it. mean, rstd (N,G) fp32 saved; gamma, beta (C) fp32 or
     * NULL */
    int (*groupnorm_fwd)(void *y, float *mean, float *rstd, void *xo, const void *x,
                         const void *xb, const void *yb, const void *yr, const float *gamma,
                         const float *beta, void *ws, const struct bk_groupnorm *s,
                         bk_ctx *ctx);
    /* dx (=/+= accum, may be NULL) of y = act(group norm(x)) from dy, recomputing act's input
     * from x, mean, rstd, gamma, beta (beta read only with silu); dgamma, dbeta += (fp32, may be
     * NULL); db (N,C) (=/+= db_accum, may be NULL): the sum over HW of dx as stored (db_of_dx 1:
     * the gradient of a broadcast add before the norm) or of dy (0: of one after it) */
    int (*groupnorm_bwd)(void *dx, float *dgamma, float *dbeta, void *db, const void *dy,
                         const void *x, const float *gamma, const float *beta, const float *mean,
                         const float *rstd, int accum, int db_accum, int db_of_dx, void *ws,
                         const struct bk_groupnorm *s, bk_ctx *ctx);
    /* x, y, dy, dx (M,D) of dtype */
    int (*layernorm_fwd)(void *y, float *mean, float *rstd, const void *x, const float *gamma,
                         const float *beta, int m, int d, float eps, int dtype, bk_ctx *ctx);
    int (*layernorm_bwd)(void *dx, float *dgamma, float *dbeta, const void *dy, const void *x,
                         const float *gamma, const float *mean, const float *rstd, int accum,
                         int m, int d, int dtype, bk_ctx *ctx);
    int (*silu_fwd)(void *y, const void *x, size_t count, int dtype, bk_ctx *ctx);
    int (*silu_bwd)(void *dx, const void *dy, const void *x, int accum, size_t count, int dtype,
                    bk_ctx *ctx);
    int (*gelu_fwd)(void *y, const void *x, size_t count, int dtype, bk_ctx *ctx);
    int (*gelu_bwd)(void *dx, const void *dy, const void *x, int accum, size_t count, int dtype,
                    bk_ctx *ctx);
    int (*add_fwd)(void *y, const void *a, const void *b, size_t count, int dtype, bk_ctx *ctx);
    int (*copy_grad)(void *dx, const void *dy, int accum, size_t count, int dtype, bk_ctx *ctx);
    int (*scale_fwd)(void *y, const void *x, float s, size_t count, int dtype, bk_ctx *ctx);
    /* b, db (N,C) of dtype */
    int (*add_bcast_fwd)(void *y, const void *x, const void *b, int n, int c, int hw, int dtype,
                         bk_ctx *ctx);
    int (*add_bcast_bwd)(void *db, const void *dy, int accum, int n, int c, int hw, int dtype,
                         bk_ctx *ctx);
    int (*concat_fwd)(void *y, const void *a, const void *b, int n, int c1, int c2, int hw,
                      int dtype, bk_ctx *ctx);
    int (*concat_bwd)(void *da, void *db, const void *dy, int accum_a, int accum_b, int n, int c1,
                      int c2, int hw, int dtype, bk_ctx *ctx);
    int (*transpose_fwd)(void *y, const void *x, int accum, int n, int c, int hw, int dtype,
                         bk_ctx *ctx);
    int (*upsample_nearest2x_fwd)(void *y, const void *x, int n, int c, int h, int w, int dtype,
                                  bk_ctx *ctx);
    int (*upsample_nearest2x_bwd)(void *dx, const void *dy, int accum, int n, int c, int h, int w,
                                  int dtype, bk_ctx *ctx);
    int (*upsample_bilinear2x_fwd)(void *y, const void *x, int align_corners, int n, int c, int h,
                                   int w, int dtype, bk_ctx *ctx);
    int (*upsample_bilinear2x_bwd)(void *dx, const void *dy, int align_corners, int accum, int n,
                                   int c, int h, int w, int dtype, bk_ctx *ctx);
    int (*maxpool2x2_fwd)(void *y, const void *x, int n, int c, int h, int w, int dtype,
                          bk_ctx *ctx);
    int (*maxpool2x2_bwd)(void *dx, const void *dy, const void *x, int accum, int n, int c, int h,
                          int w, int dtype, bk_ctx *ctx);
    int (*dropout_fwd)(void *y, const void *x, float p, uint64_t seed, uint64_t step, uint32_t op,
                       int sample_base, int n, size_t per_sample, int channels, int dtype,
                       bk_ctx *ctx);
    int (*dropout_bwd)(void *dx, const void *dy, float p, uint64_t seed, uint64_t step,
                       uint32_t op, int sample_base, int accum, int n, size_t per_sample,
                       int channels, int dtype, bk_ctx *ctx);
};

struct backend {
    const char *name;

    /* ---- context ---- */
    int (*ctx_init)(bk_ctx **out, int threads);
    void (*ctx_free)(bk_ctx *ctx);
    /* memory: the one allocation a job makes on the device, and copies to/from the host */
    int (*mem_alloc)(void **out, size_t bytes, bk_ctx *ctx);
    void (*mem_free)(void *p, bk_ctx *ctx);
    int (*mem_upload)(void *dst, const void *src_host, size_t bytes, bk_ctx *ctx);
    int (*mem_download)(void *dst_host, const void *src, size_t bytes, bk_ctx *ctx);
    int (*mem_set_f32)(float *dst, float value, size_t count, bk_ctx *ctx);
    int (*sync)(bk_ctx *ctx);

    /* ---- convolution ---- */
    /* workspace bytes the three conv kernels need for this shape (the max of the three) */
    size_t (*conv2d_ws_bytes)(const struct bk_conv2d *s);
    /* y, x, w of s->dtype; b (Co) fp32 */
    int (*conv2d_fwd)(void *y, const void *x, const void *w, const float *b,
                      void *ws, const struct bk_conv2d *s, bk_ctx *ctx);
    /* dx (N,Ci,H,W) from dy (N,Co,Ho,Wo); dx, dy, w of s->dtype */
    int (*conv2d_bwd_data)(void *dx, const void *dy, const void *w, int accum,
                           void *ws, const struct bk_conv2d *s, bk_ctx *ctx);
    /* dw (Co,Ci,Kh,Kw) += ..., db (Co) += ... (db may be NULL), both fp32; dy, x of s->dtype */
    int (*conv2d_bwd_filter)(float *dw, float *db, const void *dy, const void *x,
                             void *ws, const struct bk_conv2d *s, bk_ctx *ctx);

    /* ---- linear: y (M,N) = x (M,K) @ w(N,K)^T + b(N); y, x, w of dtype, b fp32 ---- */
    int (*linear_fwd)(void *y, const void *x, const void *w, const float *b,
                      int m, int k, int n, int dtype, bk_ctx *ctx);
    /* dx (M,K) (=/+= per accum, may be NULL), dw (N,K) +=, db (N) += (may be NULL); dx, dy, x,
     * w of dtype, dw and db fp32 */
    int (*linear_bwd)(void *dx, float *dw, float *db, const void *dy, const void *x,
                      const void *w, int accum, int m, int k, int n, int dtype, bk_ctx *ctx);

    /* ---- normalisation (fp32 statistics) ---- */
    /* group norm over x (N,C,HW), G groups; mean, rstd (N,G) saved; gamma, beta (C) */
    int (*groupnorm_fwd)(float *y, float *mean, float *rstd, const float *x,
                         const float *gamma, const float *beta, int n, int c, int hw, int groups,
                         float eps, bk_ctx *ctx);
    int (*groupnorm_bwd)(float *dx, float *dgamma, float *dbeta, const float *dy,
                         const float *x, const float *gamma, const float *mean, const float *rstd,
                         int accum, int n, int c, int hw, int groups, bk_ctx *ctx);
    /* layer norm over the last dim: x (M,D); mean, rstd (M) saved; gamma, beta (D) */
    int (*layernorm_fwd)(float *y, float *mean, float *rstd, const float *x,
                         const float *gamma, const float *beta, int m, int d, float eps,
                         bk_ctx *ctx);
    int (*layernorm_bwd)(float *dx, float *dgamma, float *dbeta, const float *dy,
                         const float *x, const float *gamma, const float *mean,
                         const float *rstd, int accum, int m, int d, bk_ctx *ctx);

    /* ---- element-wise (count elements) ---- */
    int (*silu_fwd)(float *y, const float *x, size_t count, bk_ctx *ctx);
    int (*silu_bwd)(float *dx, const float *dy, const float *x, int accum, size_t count,
                    bk_ctx *ctx);
    /* exact GELU: 0.5 x (1 + erf(x / sqrt 2)) */
    int (*gelu_fwd)(float *y, const float *x, size_t count, bk_ctx *ctx);
    int (*gelu_bwd)(float *dx, const float *dy, const float *x, int accum, size_t count,
                    bk_ctx *ctx);
    /* y = a + b */
    int (*add_fwd)(float *y, const float *a, const float *b, size_t count, bk_ctx *ctx);
    /* dx (=/+=) dy; the backward of add and of identity-like ops */
    int (*copy_grad)(float *dx, const float *dy, int accum, size_t count, bk_ctx *ctx);
    /* y (N,C,HW) = x (N,C,HW) + b (N,C) broadcast over HW (the time term) */
    int (*add_bcast_fwd)(float *y, const float *x, const float *b, int n, int c, int hw,
                         bk_ctx *ctx);
    /* db (N,C) (=/+= per accum) = sum over HW of dy */
    int (*add_bcast_bwd)(float *db, const float *dy, int accum, int n, int c, int hw,
                         bk_ctx *ctx);
    /* y = x * s (a scalar), used for output scale factors and loss scaling */
    int (*scale_fwd)(float *y, const float *x, float s, size_t count, bk_ctx *ctx);

    /* ---- layout ---- */
    /* channel concat: y (N,C1+C2,HW) = [a (N,C1,HW), b (N,C2,HW)] */
    int (*concat_fwd)(float *y, const float *a, const float *b, int n, int c1, int c2, int hw,
                      bk_ctx *ctx);
    int (*concat_bwd)(float *da, float *db, const float *dy, int accum_a, int accum_b, int n,
                      int c1, int c2, int hw, bk_ctx *ctx);
    /* y (N,HW,C) = transpose of x (N,C,HW); the same kernel with (hw, c) swapped inverts it.
     * Backward of a transpose is the inverse transpose with accum. */
    int (*transpose_fwd)(float *y, const float *x, int accum, int n, int c, int hw, bk_ctx *ctx);

    /* ---- resampling ---- */
    /* x (N,C,H,W) -> y (N,C,2H,2W) */
    int (*upsample_nearest2x_fwd)(float *y, const float *x, int n, int c, int h, int w,
                                  bk_ctx *ctx);
    int (*upsample_nearest2x_bwd)(float *dx, const float *dy, int accum, int n, int c, int h,
                                  int w, bk_ctx *ctx);
    int (*upsample_bilinear2x_fwd)(float *y, const float *x, int align_corners, int n, int c,
                                   int h, int w, bk_ctx *ctx);
    int (*upsample_bilinear2x_bwd)(float *dx, const float *dy, int align_corners, int accum,
                                   int n, int c, int h, int w, bk_ctx *ctx);
    /* 2x2 max pool, stride 2: x (N,C,H,W) -> y (N,C,H/2,W/2) (floor); backward recomputes
     * the argmax from x (first maximum in row-major window order, as PyTorch) */
    int (*maxpool2x2_fwd)(float *y, const float *x, int n, int c, int h, int w, bk_ctx *ctx);
    int (*maxpool2x2_bwd)(float *dx, const float *dy, const float *x, int accum, int n, int c,
                          int h, int w, bk_ctx *ctx);

    /* ---- time embedding ---- */
    /* y (N,dim) from timesteps t (N): half = dim/2, freq_i = exp(-ln(max_period) * i /
     * (half - freq_shift)), arg = t * freq_i, y = [sin(arg), cos(arg)] or [cos, sin] when
     * flip_sin_to_cos. No backward (t is data). */
    int (*timestep_embed_fwd)(float *y, const float *t, int n, int dim, int flip_sin_to_cos,
                              float freq_shift, float max_period, bk_ctx *ctx);

    /* ---- attention ---- */
    /* tiled (FlashAttention-style): no L x L tensor kept; ws from attn_ws_bytes(tiled=1) */
    size_t (*attn_ws_bytes)(const struct bk_attn *s, int tiled);
    /* o, q, k, v, dout, dq, dk, dv of s->dtype; lse and p fp32 */
    int (*attn_fwd)(void *o, float *lse, const void *q, const void *k, const void *v,
                    void *ws, const struct bk_attn *s, bk_ctx *ctx);
    /* dq, dk, dv written (=), row stride ld; recomputes scores from q, k and lse */
    int (*attn_bwd)(void *dq, void *dk, void *dv, const void *dout, const void *q,
                    const void *k, const void *v, const void *o, const float *lse, void *ws,
                    const struct bk_attn *s, bk_ctx *ctx);
    /* plain form: probabilities p (N,H,L,L) saved by the forward, used by the backward */
    int (*attn_plain_fwd)(void *o, float *p, const void *q, const void *k, const void *v,
                          void *ws, const struct bk_attn *s, bk_ctx *ctx);
    int (*attn_plain_bwd)(void *dq, void *dk, void *dv, const void *dout, const void *q,
                          const void *k, const void *v, const float *p, void *ws,
                          const struct bk_attn *s, bk_ctx *ctx);

    /* ---- loss ---- */
    /* loss[0] = mean((pred - target)^2) over count elements */
    int (*mse_fwd)(float *loss, const float *pred, const float *target, size_t count,
                   bk_ctx *ctx);
    /* dpred (=/+=) = dloss_scale * 2 (pred - target) / count */
    int (*mse_bwd)(float *dpred, const float *pred, const float *target, float dloss_scale,
                   int accum, size_t count, bk_ctx *ctx);

    /* softmax cross-entropy over rows: logits, target, prob (N,K); target rows are class
     * distributions (one-hot for labels). loss[0] = mean over rows of -sum target log softmax;
     * prob (saved) = softmax(logits). */
    int (*xent_fwd)(float *loss, float *prob, const float *logits, const float *target, int n,
                    int k, bk_ctx *ctx);
    /* dlogits (=/+=) = dloss_scale * (prob - target) / n */
    int (*xent_bwd)(float *dlogits, const float *prob, const float *target, float dloss_scale,
                    int accum, int n, int k, bk_ctx *ctx);

    /* ---- dropout: mask from Philox(seed, PHILOX_TAG_DROPOUT, step, sample, op, element) ---- */
    /* x is (N, per_sample) elements; p in [0,1); sample_base offsets the sample index (micro-
     * batches). y = keep ? x / (1-p) : 0. The backward recomputes the same mask. `channels`:
     * an NHWC backend's image has this many channels, and element e is the logical (NCHW)
     * index, so every backend draws the same mask; 0 for tensors that are not images. */
    int (*dropout_fwd)(float *y, const float *x, float p, uint64_t seed, uint64_t step,
                       uint32_t op, int sample_base, int n, size_t per_sample, int channels,
                       bk_ctx *ctx);
    int (*dropout_bwd)(float *dx, const float *dy, float p, uint64_t seed, uint64_t step,
                       uint32_t op, int sample_base, int accum, int n, size_t per_sample,
                       int channels, bk_ctx *ctx);

    /* ---- optimizer (flat over all parameters) ---- */
    /* out[0] = sum of squares of x (count), accumulated in double on the CPU */
    int (*sumsq)(double *out_host, const float *x, size_t count, bk_ctx *ctx);
    /* PyTorch AdamW (decoupled weight decay, bias correction) with gradient scale gscale
     * applied to g first (clipping and loss-scale undo) */
    int (*adamw_step)(float *w, float *m, float *v, const float *g, float gscale,
                      const struct bk_adamw *h, size_t count, bk_ctx *ctx);
    /* ema = decay * ema + (1 - decay) * w */
    int (*ema_update)(float *ema, const float *w, float decay, size_t count, bk_ctx *ctx);

    /* ---- optional: devices, library workspaces, parity (NULL where a backend has none, e.g.
     * the CPU's; callers test the pointer). Appended last so older tables stay valid. ---- */
    /* usable devices; 0 with the reason in err (no driver, no GPU, library missing) */
    int (*device_count)(char *err, size_t errlen);
    /* the device later ctx_init and *_ws_bytes calls of this process use (default 0). Warms the
     * device up on first use - context, library handles, loaded modules - and then measures what
     * the process itself holds there (bk_device_mem.process). BK_ERR_DEVICE with a message. */
    int (*device_select)(int device, char *err, size_t errlen);
    /* a device's memory in bytes (warms it up like device_select) */
    int (*device_mem)(int device, struct bk_device_mem *out);
    /* nonzero once a sticky error (illegal address, launch failure) poisoned the process's
     * context on `device`: every later call there fails; only a new process recovers */
    int (*device_poisoned)(int device);
    /* gives libraries that keep a workspace per handle (cuBLAS), and kernels without a `ws`
     * argument that need scratch (the CPU's linears: linear_ws_bytes), the plan's workspace
     * (ws_off, ws_bytes), shared with the kernels that take `ws` (same stream, never at once).
     * Without this call they run with no workspace at all, never with one of their own (a kernel
     * that cannot: BK_ERR_INVALID). */
    int (*ctx_set_workspace)(bk_ctx *ctx, void *ws, size_t bytes);
    /* parity mode of the calling thread's later ctx_init and *_ws_bytes calls (a context keeps
     * the mode it was made in), default on (the CUDA backend: DDPMD_CUDA_PARITY): fp32
     * arithmetic only (no TF32, no Winograd or FFT convolutions), deterministic algorithms, the
     * same bits every run. Off is fast mode: TF32 tensor cores for fp32 operands, the fastest
     * measured convolution algorithm whether deterministic or not. Set before planning:
     * workspace sizes depend on it. A backend without it (the CPU's) is deterministic anyway. */
    int (*set_parity)(int on);
    /* Philox draws on the device, equal to philox.h's on the host: y (N, per_sample) element e
     * of sample s = philox_normal / philox_u32_at(seed, tag, step, sample_base + s, op, e) */
    int (*philox_normal_fill)(float *y, uint64_t seed, uint32_t tag, uint64_t step, uint32_t op,
                              int sample_base, int n, size_t per_sample, bk_ctx *ctx);
    int (*philox_u32_fill)(uint32_t *y, uint64_t seed, uint32_t tag, uint64_t step, uint32_t op,
                           int sample_base, int n, size_t per_sample, bk_ctx *ctx);

    /* images stored NHWC (channels last) rather than NCHW; see the top of this file */
    int nhwc;
    /* optional: adamw_step then ema_update (ema = lerp(ema, w, 1 - ema_decay)) in one pass */
    int (*adamw_ema_step)(float *w, float *m, float *v, float *ema, const float *g, float gscale,
                          const struct bk_adamw *h, float ema_decay, size_t count, bk_ctx *ctx);
    /* optional: y = silu(group norm(x)). Without it the executor runs groupnorm_fwd, silu_fwd */
    int (*groupnorm_silu_fwd)(float *y, float *mean, float *rstd, const float *x,
                              const float *gamma, const float *beta, int n, int c, int hw,
                              int groups, float eps, bk_ctx *ctx);
    /* optional: the group-norm backward with a workspace (groupnorm_bwd_ws_bytes), of plain
     * group norm or (silu) of silu(group norm), which recomputes the normalised values from x,
     * mean, rstd, gamma and beta (beta unused without silu). Without it the executor runs
     * groupnorm_bwd, and for silu first recomputes silu's input into the workspace. */
    int (*groupnorm_bwd_ws)(float *dx, float *dgamma, float *dbeta, const float *dy,
                            const float *x, const float *gamma, const float *beta,
                            const float *mean, const float *rstd, int accum, int n, int c, int hw,
                            int groups, int silu, void *ws, bk_ctx *ctx);
    size_t (*groupnorm_bwd_ws_bytes)(int n, int c, int hw, int groups, int silu);

    /* ---- 16-bit storage (optional: NULL where a backend has none; a plan with 16-bit tensors
     * then cannot run there) ---- */
    /* dst (dst_dtype) = src (src_dtype), count elements, enum bk_dtype. To bf16: round to
     * nearest even; to f16: IEEE binary16, round to nearest even, overflow to inf, subnormals
     * kept; NaN stays NaN (quiet, sign kept); to f32: exact. Equal dtypes: a copy. dst and src
     * do not overlap. Bit-identical to kernels/half.h on every backend. */
    int (*convert)(void *dst, int dst_dtype, const void *src, int src_dtype, size_t count,
                   bk_ctx *ctx);

    /* ---- the device budget (optional: NULL where a backend cannot enforce one) ---- */
    /* the most bytes mem_alloc may hold at once on ctx (0: no limit): a request beyond it fails
     * with BK_ERR_NOMEM, as on a full device */
    int (*ctx_set_budget)(bk_ctx *ctx, size_t bytes);
    /* the most bytes mem_alloc held at once on ctx since ctx_init (the measured high-water mark) */
    size_t (*mem_high_water)(const bk_ctx *ctx);

    /* optional (NULL: none): the typed kernels (enum bk_half bits) the executor should run on
     * operands of the 16-bit dtype on the selected device, in this process: those the backend
     * implements there and that beat converting around its fp32 ones (a GPU below the compute
     * capability of the type: 0; the CPU: see cpu_half_kernels). A kernel may implement a dtype
     * this leaves out (tests call it). The executor runs the others in fp32 on converted
     * scratch, so a plan is correct whatever this says. Plan with the same answer as you run
     * with: workspace sizes depend on it. */
    unsigned (*half_kernels)(int dtype);
    /* optional (NULL: none): the workspace bytes linear_fwd and linear_bwd of this shape and
     * dtype take from the context's workspace (ctx_set_workspace), where a library needs one */
    size_t (*linear_ws_bytes)(int m, int k, int n, int dtype);

    /* ---- offload's host memory and copy stream (optional: NULL where a backend has none, e.g.
     * the CPU's: the executor then takes malloc'd memory and the synchronous mem_download /
     * mem_upload, the same code path) ---- */
    /* page-locked host memory (cudaMallocHost), the only host memory the *_async copies take;
     * not the device's: no budget counts it. BK_ERR_NOMEM when the host has none to lock. */
    int (*host_alloc)(void **out, size_t bytes, bk_ctx *ctx);
    void (*host_free)(void *p, bk_ctx *ctx);
    /* dst_host (host_alloc's: BK_ERR_INVALID for pageable memory, whose copy would not overlap)
     * <- src (device) on the context's copy stream, ordered after everything its stream has
     * enqueued so far; returns at once. dst_host is complete after copy_sync; src must not be
     * written by work enqueued before a copy_fence (or copy_sync) that follows this call. */
    int (*mem_download_async)(void *dst_host, const void *src, size_t bytes, bk_ctx *ctx);
    /* dst (device) <- src_host (host_alloc's) on the copy stream; returns at once. Work the
     * context's stream enqueues after a copy_fence sees dst; src_host stays unchanged until
     * copy_sync. */
    int (*mem_upload_async)(void *dst, const void *src_host, size_t bytes, bk_ctx *ctx);
    /* the context's stream waits, on the device (the host goes on), for every copy enqueued so
     * far */
    int (*copy_fence)(bk_ctx *ctx);
    /* the host waits for every copy enqueued so far */
    int (*copy_sync)(bk_ctx *ctx);

    /* optional (NULL: none, the CPU's: the executor converts 16-bit operands around the fp32
     * entries): the memory-bound kernels on elements of any dtype, fused group norms included */
    const struct bk_typed *typed;

    /* ---- the step on the device (optional: NULL where a backend has none, e.g. the CPU's,
     * whose executor keeps these values on the host). A context holds a few device scalars of
     * its own (the backend's, measured with the process like its handles, not the plan's): the
     * values step_set enqueued, the loss scale, the step's loss and a log of the optimizer
     * steps. The step_* kernels read them when they run, not when they are enqueued, so that a
     * step captured once (graph_*) replays with each step's values, and the host never waits
     * inside a step: clipping's norm and the loss scale's inf/NaN test, skip and update are
     * decided on the device; the host reads the results when it logs them (step_read). ---- */
    /* s's values to the context's device scalars, in stream order (s may change on return) */
    int (*step_set)(const struct bk_step *s, bk_ctx *ctx);
    /* the typed dropout_fwd / dropout_bwd (elements of dtype) with seed, step and sample_base
     * from step_set */
    int (*dropout_step_fwd)(void *y, const void *x, float p, uint32_t op, int n,
                            size_t per_sample, int channels, int dtype, bk_ctx *ctx);
    int (*dropout_step_bwd)(void *dx, const void *dy, float p, uint32_t op, int accum, int n,
                            size_t per_sample, int channels, int dtype, bk_ctx *ctx);
    /* mse_bwd with dloss_scale = step_set's dloss_scale times the device's loss scale (both
     * fp32: their float product, as the host's) */
    int (*mse_step_bwd)(float *dpred, const float *pred, const float *target, int accum,
                        size_t count, bk_ctx *ctx);
    /* the step's loss (device, double) = (first ? 0 : it) + dloss_scale * loss[0] */
    int (*loss_step_add)(const float *loss, bk_ctx *ctx);
    /* the whole optimizer step over the flat parameters (count floats; ema NULL without EMA):
     * the gradients' sum of squares (sumsq's chunks and order), the norm unscaled by the loss
     * scale, under scaling an inf/NaN skipping everything else, torch's clip coefficient, AdamW
     * (adamw_step's arithmetic; bias corrections of t minus the skipped steps), the EMA of the
     * new weights, the loss scale's update, and a record in the step log. lr, t: step_set's */
    int (*optim_step)(float *w, float *m, float *v, float *ema, const float *g, size_t count,
                      const struct bk_optim *o, bk_ctx *ctx);
    /* the device's loss scale state <- s, in stream order */
    int (*scaler_set)(const struct bk_scaler *s, bk_ctx *ctx);
    /* waits for the context's stream, then: the last optimizer step's record (*last), the loss
     * scale state (*scaler), and the records of the optimizer steps since the last step_read
     * (oldest first: *n of them, at most max; older ones than the log holds, 256, are lost: *n
     * counts only those given). Any pointer may be NULL. */
    int (*step_read)(struct bk_step_rec *last, struct bk_scaler *scaler, struct bk_step_rec *recs,
                     int max, int *n, bk_ctx *ctx);

    /* ---- CUDA graphs (optional: NULL where a backend has none; the executor then runs every
     * step as it comes). Between graph_begin and graph_end nothing the context is given runs:
     * it is recorded, and graph_launch runs the record again, with the addresses and values
     * it was given then (step_* kernels read theirs at the launch). Inside a capture a kernel
     * may not make the host wait (a download, a synchronization) nor allocate. ---- */
    int (*graph_begin)(bk_ctx *ctx);
    /* the capture's record, ready to launch; fails (nothing made) when the capture was refused
     * (a synchronization or an allocation inside it) */
    int (*graph_end)(bk_graph **out, bk_ctx *ctx);
    int (*graph_launch)(bk_graph *g, bk_ctx *ctx);
    void (*graph_free)(bk_graph *g, bk_ctx *ctx);
};

/* the CPU backend, always present */
const struct backend *backend_cpu(void);

/* conv2d output size from the input size and padding; returns BK_ERR_INVALID when empty */
static inline int bk_conv2d_init(struct bk_conv2d *s)
{
    if (s->stride < 1 || s->kh < 1 || s->kw < 1) return BK_ERR_INVALID;
    int hp = s->h + s->pad_t + s->pad_b - s->kh, wp = s->w + s->pad_l + s->pad_r - s->kw;
    if (hp < 0 || wp < 0) return BK_ERR_INVALID;
    s->ho = hp / s->stride + 1;
    s->wo = wp / s->stride + 1;
    return BK_OK;
}

#ifdef __cplusplus
}
#endif
#endif
