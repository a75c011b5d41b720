/* backend_ops.c - what a backend's table holds, ggml-style (supports_op): backend_supports and
 * the entries' names, generated from kernels/ops.def, so that the engine asks one function
 * instead of testing table pointers itself.
 */
#include <stddef.h>

#include "backend.h"

static const char *const op_names[BK_OP_COUNT] = {
#define BK_OP(ret, fn, args) [BK_OP_##fn] = #fn,
#define BK_TYPED_OP(ret, fn, args) [BK_OP_TYPED_##fn] = "typed." #fn,
#include "ops.def"
};

const char *backend_op_name(enum bk_op op)
{
    return (unsigned)op < BK_OP_COUNT ? op_names[op] : "?";
}

/* the entry is filled in bk's tables */
static int op_present(const struct backend *bk, enum bk_op op)
{
    const struct bk_typed *t = bk->typed;
    switch (op) {
#define BK_OP(ret, fn, args)                                                                       \
    case BK_OP_##fn:                                                                               \
        return bk->fn != NULL;
#define BK_TYPED_OP(ret, fn, args)                                                                 \
    case BK_OP_TYPED_##fn:                                                                         \
        return t && t->fn != NULL;
#include "ops.def"
    default:
        return 0;
    }
}

/* a struct bk_typed entry */
static int op_typed(enum bk_op op)
{
    switch (op) {
#define BK_TYPED_OP(ret, fn, args)                                                                 \
    case BK_OP_TYPED_##fn:                                                                         \
        return 1;
#include "ops.def"
    default:
        return 0;
    }
}

/* the half_kernels bits (enum bk_half) under which the entry takes 16-bit operands; 0: fp32
 * only */
static unsigned op_half_bits(enum bk_op op)
{
    switch (op) {
    case BK_OP_conv2d_ws_bytes:
    case BK_OP_conv2d_fwd:
    case BK_OP_conv2d_bwd_data:
    case BK_OP_conv2d_bwd_filter:
        return BK_HALF_CONV;
    case BK_OP_linear_ws_bytes:
    case BK_OP_linear_fwd:
    case BK_OP_linear_bwd:
        return BK_HALF_LINEAR;
    case BK_OP_attn_ws_bytes: /* of either form */
        return BK_HALF_ATTN | BK_HALF_ATTN_PLAIN;
    case BK_OP_attn_fwd:
    case BK_OP_attn_bwd:
        return BK_HALF_ATTN;
    case BK_OP_attn_plain_fwd:
    case BK_OP_attn_plain_bwd:
        return BK_HALF_ATTN_PLAIN;
    case BK_OP_TYPED_groupnorm_ws_bytes:
    case BK_OP_TYPED_groupnorm_fwd:
    case BK_OP_TYPED_groupnorm_bwd:
    case BK_OP_TYPED_layernorm_fwd:
    case BK_OP_TYPED_layernorm_bwd:
        return BK_HALF_NORM;
    case BK_OP_dropout_step_fwd:
    case BK_OP_dropout_step_bwd:
        return BK_HALF_ELTWISE;
    default:
        return op_typed(op) ? BK_HALF_ELTWISE : 0; /* the memory-bound ones */
    }
}

int backend_supports(const struct backend *bk, enum bk_op op, int dtype)
{
    if (!bk || (unsigned)op >= BK_OP_COUNT || !op_present(bk, op)) return 0;
    if (dtype == BK_DTYPE_F32 || op == BK_OP_convert) return 1;
    if (dtype != BK_DTYPE_F16 && dtype != BK_DTYPE_BF16) return 0;
    unsigned bits = op_half_bits(op);
    return bits && bk->half_kernels && (bk->half_kernels(dtype) & bits) != 0;
}
