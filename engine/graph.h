/* graph.h - the static computation graph: tensors (shapes, kinds, stable parameter names) and
 * ops appended in execution order by builders, with reverse-mode autodiff (graph_backward).
 * No memory here: places are decided by the memory plan (memplan.h), pointers by the executor.
 */
#ifndef DDPMD_GRAPH_H
#define DDPMD_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

enum graph_status {
    GRAPH_OK = 0,
    GRAPH_ERR_NOMEM = 1,
    GRAPH_ERR_SHAPE = 2,
    GRAPH_ERR_ARG = 3,
};

enum tensor_kind {
    TENSOR_ACT = 0,  /* activation, saved statistic or activation gradient: lives in the arena */
    TENSOR_PARAM,    /* trainable weight: persistent */
    TENSOR_GRAD,     /* gradient of a parameter: persistent, accumulated (+=) */
    TENSOR_INPUT,    /* data fed each step (x_t, t, target): persistent */
};

enum tensor_dtype { DTYPE_F32 = BK_DTYPE_F32, DTYPE_F16 = BK_DTYPE_F16, DTYPE_BF16 = BK_DTYPE_BF16 };

/* how a parameter starts when no checkpoint gives it (PyTorch's defaults for the layer) */
enum param_init {
    INIT_FAN_IN_UNIFORM = 0, /* U(-1/sqrt(fan_in), 1/sqrt(fan_in)): conv and linear */
    INIT_XAVIER_UNIFORM,     /* U(+-sqrt(6/(fan_in+fan_out))): attention in-projection */
    INIT_ONES,               /* norm scales */
    INIT_ZEROS,              /* norm shifts, attention biases */
};

struct tensor {
    enum tensor_kind kind;
    enum tensor_dtype dtype;
    int rank;           /* 1..4; dims beyond rank are 1 */
    int d[4];           /* images (N,C,H,W); tokens (N,L,C); vectors (N,D); scalars (1) */
    size_t numel;
    char *name;         /* parameters and inputs: stable name; NULL otherwise */
    int requires_grad;  /* parameters, and everything computed from them */
    int grad;           /* tensor id of this tensor's gradient, -1 if none */
    int param_index;    /* parameters: 0.. in creation order; -1 otherwise */
    enum param_init init;
    int fan_in, fan_out;
    int image;          /* an (N,C,H,W) image (rank-4 activation or input, gradients too):
                         * stored in the backend's image layout (NCHW, or NHWC where
                         * backend.nhwc); exec_upload / exec_download convert */
};

enum op_type {
    OP_CONV2D = 0,      /* in: x, w, [b]        out: y */
    OP_CONV2D_BWD_DATA, /* in: dy, w            out: dx */
    OP_CONV2D_BWD_FILTER, /* in: dy, x          out: dw, [db] */
    OP_LINEAR,          /* in: x, w, [b]        out: y */
    OP_LINEAR_BWD,      /* in: dy, x, w         out: [dx], dw, [db] */
    OP_GROUPNORM,       /* in: x, gamma, beta   out: y, mean, rstd (a.gn.silu: y = silu(gn)) */
    OP_GROUPNORM_BWD,   /* in: dy, x, gamma, mean, rstd, [beta (silu)]  out: dx, dgamma, dbeta */
    OP_LAYERNORM,
    OP_LAYERNORM_BWD,
    OP_SILU,            /* in: x  out: y */
    OP_SILU_BWD,        /* in: dy, x  out: dx */
    OP_GELU,
    OP_GELU_BWD,
    OP_ADD,             /* in: a, b  out: y */
    OP_ADD_BWD,         /* in: dy  out: [da], [db] */
    OP_ADD_BCAST,       /* in: x (N,C,H,W), b (N,C)  out: y */
    OP_ADD_BCAST_BWD,   /* in: dy  out: [dx], [db] */
    OP_CONCAT,          /* in: a, b  out: y */
    OP_CONCAT_BWD,      /* in: dy  out: [da], [db] */
    OP_TO_TOKENS,       /* in: x (N,C,H,W)  out: y (N,HW,C) */
    OP_TO_IMAGE,        /* in: x (N,HW,C)   out: y (N,C,H,W) */
    OP_UPSAMPLE_NEAREST,
    OP_UPSAMPLE_NEAREST_BWD,
    OP_UPSAMPLE_BILINEAR,
    OP_UPSAMPLE_BILINEAR_BWD,
    OP_MAXPOOL,         /* in: x  out: y */
    OP_MAXPOOL_BWD,     /* in: dy, x  out: dx */
    OP_TIMESTEP_EMBED,  /* in: t (N)  out: y (N,D) */
    OP_ATTENTION,       /* in: q, k, v (or packed qkv)  out: o, lse|p */
    OP_ATTENTION_BWD,   /* in: do, q, k, v, o, lse|p  out: dq, dk, dv (or packed dqkv) */
    OP_MSE,             /* in: pred, target  out: loss (1) */
    OP_MSE_BWD,         /* in: pred, target  out: dpred */
    OP_DROPOUT,
    OP_DROPOUT_BWD,
    OP_XENT,            /* in: logits (N,K), target (N,K)  out: loss (1), prob (N,K) */
    OP_XENT_BWD,        /* in: prob, target  out: dlogits */
    OP_RESHAPE,         /* in: x  out: y, the same elements in another shape (a copy) */
    OP_RESHAPE_BWD,     /* in: dy  out: dx */
    OP_COUNT
};

/* no tensor has more elements (4 TiB of f32): bounds every size computed from a shape */
#define GRAPH_MAX_NUMEL ((size_t)1 << 40)

#define OP_MAX_IN 6
#define OP_MAX_OUT 3

struct op {
    enum op_type type;
    int n_in, n_out;
    int in[OP_MAX_IN];      /* tensor ids, -1 for an absent optional input */
    int out[OP_MAX_OUT];    /* tensor ids, -1 for an absent optional output */
    int accum[OP_MAX_OUT];  /* 1: out[i] is added to (+=), 0: written */
    int fwd;                /* backward ops: the forward op they differentiate; else -1 */
    union {
        struct bk_conv2d conv;
        struct { int m, k, n; } lin;
        struct { int n, c, hw, groups, silu; float eps; } gn; /* silu: SiLU fused after */
        struct { int m, d; float eps; } ln;
        struct { int n, c, hw; } bc;      /* add_bcast, to_tokens, to_image */
        struct { int n, c1, c2, hw; } cat;
        struct { int n, c, h, w, align_corners; } rs;
        struct { int n, dim, flip; float shift, max_period; } te;
        struct { struct bk_attn s; int packed, tiled; } at;
        struct { int n; size_t per_sample; float p; } dr;
    } a;
};

/* a segment of the forward pass that recomputation may re-run before its backward instead of
 * keeping its activations: a block the builder marked (graph_mark_segment) */
enum graph_segment_kind {
    GRAPH_SEG_ATTENTION = 1, /* an attention block */
    GRAPH_SEG_RESBLOCK = 2,  /* a residual block (ddpm ResnetBlock2D, seed DoubleConv) */
    GRAPH_SEG_LEVEL = 3,     /* a contiguous run of blocks at one resolution (a down level with
                              * its downsampler, the middle, an up level with its upsampler) */
};

struct graph_segment {
    int first, end;          /* forward ops [first, end) */
    int kind;                /* enum graph_segment_kind */
};

struct graph {
    /* one allocation per tensor: a tensor's address never changes while the graph grows, so a
     * `const struct tensor *` (or its dims) may be held across builder calls that append */
    struct tensor **tensors;
    int n_tensors, cap_tensors;
    struct op *ops;
    int n_ops, cap_ops;
    int n_fwd_ops;          /* ops [0, n_fwd_ops) are the forward pass */
    int n_params;
    size_t param_numel;     /* sum of parameter sizes */
    int *param_slot;        /* named parameters' tensor ids by a hash of the name (open
                             * addressing, -1 empty; param_cap a power of two, at most half
                             * full): graph_find_param without a scan */
    int param_cap;
    int precision;          /* enum strategy_precision set by graph_set_precision (0: f32) */
    /* segments the builder marked, in op order; those of one kind never overlap (a level
     * contains blocks) */
    struct graph_segment *segs;
    int n_segs, cap_segs;
    int status;             /* sticky: first builder error (GRAPH_ERR_*) */
    char err[256];
};

int graph_init(struct graph *g);
void graph_free(struct graph *g);

/* tensors */
int graph_tensor(struct graph *g, enum tensor_kind kind, const char *name, int rank,
                 const int *dims);
int graph_param(struct graph *g, const char *name, int rank, const int *dims);
int graph_input(struct graph *g, const char *name, int rank, const int *dims);
/* the parameter with this name, or -1 */
int graph_find_param(const struct graph *g, const char *name);
/* owner[t] (g->n_tensors entries): the first tensor whose gradient t is, or -1 */
void graph_grad_owners(const struct graph *g, int *owner);
size_t tensor_bytes(const struct tensor *t);
/* records the first builder error (sticky) and returns -1, as builders do */
int graph_fail(struct graph *g, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* forward builders: return the output tensor id (errors are sticky in g->status, and a
 * failed builder returns -1, which every builder accepts and propagates) */
int graph_conv2d(struct graph *g, int x, int w, int b, int stride, int pad_t, int pad_l,
                 int pad_b, int pad_r);
int graph_linear(struct graph *g, int x, int w, int b);
int graph_groupnorm(struct graph *g, int x, int gamma, int beta, int groups, float eps);
/* silu(groupnorm(x)) as one op: the normalised values are recomputed in the backward instead
 * of being kept, and the data is read and written once */
int graph_groupnorm_silu(struct graph *g, int x, int gamma, int beta, int groups, float eps);
int graph_layernorm(struct graph *g, int x, int gamma, int beta, float eps);
int graph_silu(struct graph *g, int x);
int graph_gelu(struct graph *g, int x);
int graph_add(struct graph *g, int a, int b);
int graph_add_bcast(struct graph *g, int x, int b);
int graph_concat(struct graph *g, int a, int b);
int graph_to_tokens(struct graph *g, int x);
int graph_to_image(struct graph *g, int x, int h, int w);
int graph_upsample_nearest(struct graph *g, int x);
int graph_upsample_bilinear(struct graph *g, int x, int align_corners);
int graph_maxpool(struct graph *g, int x);
int graph_timestep_embed(struct graph *g, int t, int dim, int flip_sin_to_cos, float freq_shift,
                         float max_period);
/* self-attention over tokens: q, k, v (N,L,C) each, or packed = one (N,L,3C) tensor in q
 * (k = v = -1). Returns o (N,L,C). tiled selects the FlashAttention-style kernel. */
int graph_attention(struct graph *g, int q, int k, int v, int heads, int tiled);
int graph_mse(struct graph *g, int pred, int target);
int graph_dropout(struct graph *g, int x, float p);
/* softmax cross-entropy of logits (N,K) against target distributions (N,K): a loss like mse */
int graph_xent(struct graph *g, int logits, int target);
/* the same elements as x in the shape dims (e.g. flattening (N,C,H,W) to (N,C*H*W)) */
int graph_reshape(struct graph *g, int x, int rank, const int *dims);

/* marks the forward ops [first, g->n_ops) appended since `first = g->n_ops` as a segment of
 * kind (enum graph_segment_kind); an empty range or a failed graph marks nothing. Returns
 * g->status. */
int graph_mark_segment(struct graph *g, int first, int kind);

/* Appends the backward of every forward op reaching `loss` (an OP_MSE or OP_XENT output). Parameter
 * gradients become TENSOR_GRAD tensors (tensor.grad). */
int graph_backward(struct graph *g, int loss);

/* The precision policy, the one place that decides dtypes (enum strategy_precision: F32, BF16
 * or F16; AUTO is resolved by the planner before). Under BF16/F16 every activation an op of the
 * forward writes as its first output is stored in the 16-bit type - the inputs of convolutions
 * and GEMMs and the activations kept for the backward - and so is the gradient of each of them;
 * the loss, norm statistics, attention's softmax (log-sum-exp or probabilities), cross-entropy
 * probabilities, the data inputs, the parameters (the fp32 master weights) and their gradients
 * stay fp32. Convolution and linear weights are read rounded to 16 bits (graph_input_dtype):
 * converted from the master per op for a 16-bit kernel, or from the plan's working copy for an
 * fp32 one (memplan.c's working_copy_marks). The typed kernels (convolution, linear,
 * attention, and the memory-bound norm, element-wise, layout, resampling and dropout kernels of
 * backend.typed) take their typed operands (graph_typed_operand) in the 16-bit type where the
 * backend says it has them (backend.half_kernels); every other kernel computes in fp32, and the
 * executor converts operands of another dtype than the kernel's into planned scratch around
 * it. Call after graph_backward
 * (gradients exist); calling again re-decides every dtype (the planner's search). GRAPH_ERR_ARG
 * for another value. */
int graph_set_precision(struct graph *g, int precision);
/* the 16-bit type of g's precision, or DTYPE_F32 under F32 */
enum tensor_dtype graph_low_dtype(const struct graph *g);
/* the dtype op o reads its input `slot` in: the tensor's own, or for a convolution's or linear's
 * weight under 16-bit precision the working copy's */
enum tensor_dtype graph_input_dtype(const struct graph *g, const struct op *o, int slot);
/* the enum bk_half bit of the typed kernel op o runs on (BK_HALF_NORM, BK_HALF_ELTWISE: the
 * memory-bound ops of backend.typed); 0 for an op of the fp32 kernels only */
unsigned graph_half_kernel(const struct op *o);
/* whether operand j of o (its inputs, then its outputs: j = n_in + i is out[i]) is an operand
 * the typed kernel takes in its dtype (kernels/backend.h): x, w, y and their gradients, not a
 * bias, a parameter's gradient, lse or attention's probabilities */
int graph_typed_operand(const struct op *o, int j);

const char *op_name(enum op_type t);

#endif
