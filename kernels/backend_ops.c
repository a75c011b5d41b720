/* backend_ops.c - what a backend's table holds, ggml-style (supports_op): backend_supports, the
 * entries' names and their half classes, generated from kernels/ops.def, so that the engine asks
 * one function instead of testing table pointers itself.
 */
#include <stddef.h>

#include "backend.h"

static const char *const op_names[BK_OP_COUNT] = {
#define BK_OP(ret, fn, args, half) [BK_OP_##fn] = #fn,
#define BK_TYPED_OP(ret, fn, args, half) [BK_OP_TYPED_##fn] = "typed." #fn,
#include "ops.def"
};

/* each entry's half class (ops.def): the half_kernels bits (enum bk_half) under which it takes
 * 16-bit operands; 0: fp32 only */
static const unsigned op_half[BK_OP_COUNT] = {
#define BK_OP(ret, fn, args, half) [BK_OP_##fn] = (half),
#define BK_TYPED_OP(ret, fn, args, half) [BK_OP_TYPED_##fn] = (half),
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
#define BK_OP(ret, fn, args, half)                                                                 \
    case BK_OP_##fn:                                                                               \
        return bk->fn != NULL;
#define BK_TYPED_OP(ret, fn, args, half)                                                           \
    case BK_OP_TYPED_##fn:                                                                         \
        return t && t->fn != NULL;
#include "ops.def"
    default:
        return 0;
    }
}

int backend_supports(const struct backend *bk, enum bk_op op, int dtype)
{
    if (!bk || (unsigned)op >= BK_OP_COUNT || !op_present(bk, op)) return 0;
    if (dtype == BK_DTYPE_F32 || op == BK_OP_convert) return 1;
    if (dtype != BK_DTYPE_F16 && dtype != BK_DTYPE_BF16) return 0;
    const unsigned bits = op_half[op];
    return bits && bk->half_kernels && (bk->half_kernels(dtype) & bits) != 0;
}
