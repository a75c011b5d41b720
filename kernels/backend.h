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
    int w_f32;              /* w (fwd, bwd data) is fp32 whatever dtype: the kernel rounds it
                             * to dtype itself (backends with conv_w_f32 only; set on all three
                             * calls of a shape, as backend_conv_w_f32 says) */
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

/* one parameter tensor's gradient for the multi-tensor optimizer entries (sumsq_segs,
 * adamw_segs): `count` floats at g, whose weights, moments and EMA are at word `rel` of the
 * flat parameter buffers */
struct bk_seg {
    const float *g;
    size_t rel, count;
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
#define BK_TYPED_OP(ret, fn, args, half) ret(*fn) args;
#include "ops.def"
};

struct backend {
    const char *name;
    /* images stored NHWC (channels last) rather than NCHW; see the top of this file */
    int nhwc;
    /* the 16-bit convolutions take fp32 weights (bk_conv2d.w_f32): they round them to 16 bits
     * inside the copy into their own weight layout, so a plan converts no weight for them */
    int conv_w_f32;
    /* optional (NULL: none; the executor then converts 16-bit operands around the fp32
     * entries): the memory-bound kernels on elements of any dtype, fused group norms included */
    const struct bk_typed *typed;
    /* the entries (ops.def) */
#define BK_OP(ret, fn, args, half) ret(*fn) args;
#include "ops.def"
};

/* every entry as a number, ggml-style: BK_OP_<fn> for struct backend's, BK_OP_TYPED_<fn> for
 * struct bk_typed's */
enum bk_op {
#define BK_OP(ret, fn, args, half) BK_OP_##fn,
#define BK_TYPED_OP(ret, fn, args, half) BK_OP_TYPED_##fn,
#include "ops.def"
    BK_OP_COUNT
};

/* whether bk has entry op for operands of dtype (enum bk_dtype), as the engine asks before it
 * plans or calls one: the entry is filled (a typed one: bk->typed too), and for a 16-bit dtype
 * the entry's half class in ops.def is one half_kernels(dtype) names (conv2d_*, linear_*,
 * attn_* and their *_ws_bytes; the bk_typed ones under BK_HALF_NORM or BK_HALF_ELTWISE; dropout_step_*) or
 * convert. Every other entry takes fp32 only (ask with BK_DTYPE_F32: context, memory and
 * step entries have no dtype). bk NULL or op out of range: 0. */
int backend_supports(const struct backend *bk, enum bk_op op, int dtype);
/* the entry's name as ops.def spells it ("conv2d_fwd", "typed.silu_fwd"); "?" out of range */
const char *backend_op_name(enum bk_op op);

/* the CPU backend, always present */
const struct backend *backend_cpu(void);

/* bk_conv2d.w_f32 of a convolution of kernel dtype `dtype` on bk: whether its weight operand is
 * fp32 (the one rule the planner's conversions, its workspace sizes and the executor share) */
static inline int backend_conv_w_f32(const struct backend *bk, int dtype)
{
    return bk && bk->conv_w_f32 && dtype != BK_DTYPE_F32;
}

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
