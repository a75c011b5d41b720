/* typed.c - the CPU backend's struct bk_typed: the memory-bound kernels on fp32, bf16 or f16
 * operands (backend.h). fp32 runs the fp32 kernels (their bits); 16-bit operands are read and
 * written in their type with fp32 arithmetic inside: the element-wise ones here, the fp32
 * kernels' code on blocks converted on the stack, the rest on norm.c's, eltwise.c's, layout.c's,
 * resample.c's and loss.c's bodies (typed.h).
 */
#include "cpu.h"
#include "typed.h"

/* the fp32 kernels' own blocks (eltwise.c's ELTWISE_BLK and ELTWISE_PAR_MIN): a block converted
 * here is one of theirs, so an element meets the same vector or scalar code as in fp32 */
#define TY_BLK 4096
#define TY_PAR_MIN 16384

enum ty_elt { TY_SILU, TY_SILU_BWD, TY_GELU, TY_GELU_BWD, TY_ADD, TY_COPY, TY_SCALE };

/* ty_eltwise's one-line ops (add, copy, scale) on bf16: converted in registers inside one
 * vector loop (typed.h's branch-free conversions), no buffers; the same fp32 arithmetic and
 * one rounding, so the same bits. Memory-bound: the whole range split over the threads. */
static int ty_eltwise_bf16(enum ty_elt op, void *y, const void *a, const void *b, float s,
                           int accum, size_t count, bk_ctx *ctx)
{
    const int dt = BK_DTYPE_BF16;
    long nblk = (long)((count + TY_BLK - 1) / TY_BLK);
#pragma omp parallel for num_threads(ctx->threads) if (count >= TY_PAR_MIN) schedule(static)
    for (long k = 0; k < nblk; k++) {
        const size_t i = (size_t)k * TY_BLK, e = count - i < TY_BLK ? count : i + TY_BLK;
        if (op == TY_ADD) {
#pragma omp simd
            for (size_t j = i; j < e; j++) ty_st(y, j, ty_ld(a, j, dt) + ty_ld(b, j, dt), dt);
        } else if (op == TY_SCALE) {
#pragma omp simd
            for (size_t j = i; j < e; j++) ty_st(y, j, ty_ld(a, j, dt) * s, dt);
        } else if (accum) {
#pragma omp simd
            for (size_t j = i; j < e; j++) ty_st(y, j, ty_ld(y, j, dt) + ty_ld(a, j, dt), dt);
        } else {
#pragma omp simd
            for (size_t j = i; j < e; j++) ty_st(y, j, ty_ld(a, j, dt), dt);
        }
    }
    return BK_OK;
}

/* y (=, or += where accum: round(y + r), the sum in fp32) = op(a[, b]) over count elements
 * of dtype dt (16-bit): each TY_BLK block converted to fp32 on the stack, the fp32 kernels'
 * block code (eltwise.c) or their one-line loops run on it on this thread, the result rounded
 * once into y */
static int ty_eltwise(enum ty_elt op, void *y, const void *a, const void *b, float s, int accum,
                      size_t count, int dt, bk_ctx *ctx)
{
    if (dt != BK_DTYPE_BF16 && dt != BK_DTYPE_F16) return BK_ERR_INVALID;
    if (dt == BK_DTYPE_BF16 && (op == TY_ADD || op == TY_COPY || op == TY_SCALE))
        return ty_eltwise_bf16(op, y, a, b, s, accum, count, ctx);
    long nblk = (long)((count + TY_BLK - 1) / TY_BLK);
#pragma omp parallel for num_threads(ctx->threads) if (count >= TY_PAR_MIN) schedule(static)
    for (long k = 0; k < nblk; k++) {
        const size_t i = (size_t)k * TY_BLK, m = count - i < TY_BLK ? count - i : TY_BLK;
        float fa[TY_BLK], fb[TY_BLK], fy[TY_BLK];
        cpu_convert_run(fa, BK_DTYPE_F32, ty_at(a, i, dt), dt, m);
        if (b) cpu_convert_run(fb, BK_DTYPE_F32, ty_at(b, i, dt), dt, m);
        if (accum) cpu_convert_run(fy, BK_DTYPE_F32, ty_at(y, i, dt), dt, m);
        switch (op) {
        case TY_SILU: cpu_silu_block(fy, fa, m); break;
        case TY_SILU_BWD: cpu_silu_bwd_block(fy, fa, fb, accum, m); break;
        case TY_GELU: cpu_gelu_block(fy, fa, m); break;
        case TY_GELU_BWD: cpu_gelu_bwd_block(fy, fa, fb, accum, m); break;
        case TY_ADD: /* cpu_add_fwd's, cpu_copy_grad's, cpu_scale_fwd's element */
            for (size_t j = 0; j < m; j++) fy[j] = fa[j] + fb[j];
            break;
        case TY_COPY:
            for (size_t j = 0; j < m; j++) fy[j] = accum ? fy[j] + fa[j] : fa[j];
            break;
        case TY_SCALE:
            for (size_t j = 0; j < m; j++) fy[j] = fa[j] * s;
            break;
        }
        cpu_convert_run(ty_at(y, i, dt), dt, fy, BK_DTYPE_F32, m);
    }
    return BK_OK;
}

int cpu_t_silu_fwd(void *y, const void *x, size_t count, int dtype, bk_ctx *ctx)
{
    if (dtype == BK_DTYPE_F32) return cpu_silu_fwd(y, x, count, ctx);
    return ty_eltwise(TY_SILU, y, x, NULL, 0.0f, 0, count, dtype, ctx);
}

int cpu_t_silu_bwd(void *dx, const void *dy, const void *x, int accum, size_t count, int dtype,
                   bk_ctx *ctx)
{
    if (dtype == BK_DTYPE_F32) return cpu_silu_bwd(dx, dy, x, accum, count, ctx);
    return ty_eltwise(TY_SILU_BWD, dx, dy, x, 0.0f, accum, count, dtype, ctx);
}

int cpu_t_gelu_fwd(void *y, const void *x, size_t count, int dtype, bk_ctx *ctx)
{
    if (dtype == BK_DTYPE_F32) return cpu_gelu_fwd(y, x, count, ctx);
    return ty_eltwise(TY_GELU, y, x, NULL, 0.0f, 0, count, dtype, ctx);
}

int cpu_t_gelu_bwd(void *dx, const void *dy, const void *x, int accum, size_t count, int dtype,
                   bk_ctx *ctx)
{
    if (dtype == BK_DTYPE_F32) return cpu_gelu_bwd(dx, dy, x, accum, count, ctx);
    return ty_eltwise(TY_GELU_BWD, dx, dy, x, 0.0f, accum, count, dtype, ctx);
}

int cpu_t_add_fwd(void *y, const void *a, const void *b, size_t count, int dtype, bk_ctx *ctx)
{
    if (dtype == BK_DTYPE_F32) return cpu_add_fwd(y, a, b, count, ctx);
    return ty_eltwise(TY_ADD, y, a, b, 0.0f, 0, count, dtype, ctx);
}

int cpu_t_copy_grad(void *dx, const void *dy, int accum, size_t count, int dtype, bk_ctx *ctx)
{
    if (dtype == BK_DTYPE_F32) return cpu_copy_grad(dx, dy, accum, count, ctx);
    if (!accum && ty_valid(dtype)) return cpu_convert(dx, dtype, dy, dtype, count, ctx); /* bits */
    return ty_eltwise(TY_COPY, dx, dy, NULL, 0.0f, accum, count, dtype, ctx);
}

int cpu_t_scale_fwd(void *y, const void *x, float s, size_t count, int dtype, bk_ctx *ctx)
{
    if (dtype == BK_DTYPE_F32) return cpu_scale_fwd(y, x, s, count, ctx);
    return ty_eltwise(TY_SCALE, y, x, NULL, s, 0, count, dtype, ctx);
}

const struct bk_typed cpu_typed = {
#define BK_TYPED_OP(ret, fn, args, half) .fn = cpu_t_##fn,
#include "ops.def"
};
