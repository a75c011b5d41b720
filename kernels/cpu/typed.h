/* typed.h - element access by dtype for the CPU backend's kernels that take fp32, bf16 or f16
 * operands (struct bk_typed, typed.c): one kernel body per idea, written against these helpers
 * and inlined once per dtype (a constant dt folds the branches away, so the fp32 copy is the
 * fp32 kernel's code). 16-bit values load exactly and store rounded once to nearest even, as
 * kernels/half.h.
 */
#ifndef DDPMD_CPU_TYPED_H
#define DDPMD_CPU_TYPED_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cpu.h"
#include "half.h"

#define TY_INLINE static inline __attribute__((always_inline))

/* bf16 h as fp32: half_bf16_to_f32 bit for bit (a NaN quieted), without its branch, so that a
 * loop loading through it vectorizes (the conversion then happens in registers) */
TY_INLINE float ty_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    u |= (uint32_t)0x00400000u & ((uint32_t)0 - (uint32_t)((u & 0x7fffffffu) > 0x7f800000u));
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* v rounded to bf16: half_f32_to_bf16 bit for bit (nearest even; a NaN quieted, sign kept),
 * without its branch */
TY_INLINE uint16_t ty_f32_to_bf16(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    const uint32_t nan = (uint32_t)0 - (uint32_t)((u & 0x7fffffffu) > 0x7f800000u);
    return (uint16_t)((((u + 0x7fffu + ((u >> 16) & 1u)) & ~nan) | ((u | 0x00400000u) & nan)) >>
                      16);
}

/* element i of p (dtype dt) as fp32, exact */
TY_INLINE float ty_ld(const void *p, size_t i, int dt)
{
    if (dt == BK_DTYPE_F32) return ((const float *)p)[i];
    if (dt == BK_DTYPE_BF16) return ty_bf16_to_f32(((const uint16_t *)p)[i]);
    return half_f16_to_f32(((const uint16_t *)p)[i]);
}

/* element i of p (dtype dt) = v rounded to dt */
TY_INLINE void ty_st(void *p, size_t i, float v, int dt)
{
    if (dt == BK_DTYPE_F32) ((float *)p)[i] = v;
    else if (dt == BK_DTYPE_BF16) ((uint16_t *)p)[i] = ty_f32_to_bf16(v);
    else ((uint16_t *)p)[i] = half_f32_to_f16(v);
}

/* v rounded to bf16, as fp32: half_bf16_to_f32(half_f32_to_bf16(v)) bit for bit (nearest
 * even; a NaN quieted, its low 16 bits dropped), in integer operations without a branch, so
 * that a loop rounding through it vectorizes (half.h's NaN test is a branch that keeps the
 * group norm's fused loops scalar) */
TY_INLINE float ty_round_bf16(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    const uint32_t nan = (uint32_t)0 - (uint32_t)((u & 0x7fffffffu) > 0x7f800000u);
    const uint32_t r = ((u + 0x7fffu + ((u >> 16) & 1u)) & ~nan) | ((u | 0x00400000u) & nan);
    const uint32_t b = r & 0xffff0000u;
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* v rounded to dt, as fp32 (what a store and a load give) */
TY_INLINE float ty_round(float v, int dt)
{
    if (dt == BK_DTYPE_F32) return v;
    if (dt == BK_DTYPE_BF16) return ty_round_bf16(v);
    return half_f16_to_f32(half_f32_to_f16(v));
}

/* the address of element i of p (dtype dt) */
TY_INLINE void *ty_at(const void *p, size_t i, int dt)
{
    return (char *)(uintptr_t)p + i * bk_dtype_size(dt);
}

/* elements per row segment the typed kernels convert on the stack */
#define TY_ROW 1024

/* n elements of p from element i as fp32: p itself for fp32, else converted into buf (n
 * floats; cpu_convert_run's vector conversions) */
TY_INLINE const float *ty_row(const void *p, size_t i, size_t n, int dt, float *buf)
{
    if (dt == BK_DTYPE_F32) return (const float *)p + i;
    cpu_convert_run(buf, BK_DTYPE_F32, ty_at(p, i, dt), dt, n);
    return buf;
}

/* the destination of n fp32 results for p from element i: p itself for fp32, else buf, which
 * ty_put then rounds into p */
TY_INLINE float *ty_out(void *p, size_t i, int dt, float *buf)
{
    return dt == BK_DTYPE_F32 ? (float *)p + i : buf;
}
TY_INLINE void ty_put(void *p, size_t i, size_t n, int dt, const float *buf)
{
    if (dt != BK_DTYPE_F32) cpu_convert_run(ty_at(p, i, dt), dt, buf, BK_DTYPE_F32, n);
}

/* Rows a loop converts in registers. A loop over fp32 or bf16 elements loads them with
 * ty_ld(p, k, TY_LDT(dt)) and stores with ty_st (a bf16 conversion is integer operations that
 * vectorize in the loop, as wide as the loop), so its rows are the operand itself: no pass
 * through a buffer and an out-of-line AVX2 conversion per row. f16's conversions (half.h) keep
 * a loop scalar, so its rows go through fp32 buffers as ty_row / ty_out / ty_put's, and the
 * loop takes them as fp32. Either way the same values: the loads are exact and the stores round
 * once to nearest even, as cpu_convert_run's. */
#define TY_LDT(dt) ((dt) == BK_DTYPE_F16 ? BK_DTYPE_F32 : (dt))
TY_INLINE const void *ty_rowl(const void *p, size_t i, size_t n, int dt, float *buf)
{
    if (dt == BK_DTYPE_F16) return ty_row(p, i, n, dt, buf);
    return ty_at(p, i, dt);
}
TY_INLINE void *ty_outl(void *p, size_t i, int dt, float *buf)
{
    return dt == BK_DTYPE_F16 ? (void *)buf : ty_at(p, i, dt);
}
TY_INLINE void ty_putl(void *p, size_t i, size_t n, int dt, const float *buf)
{
    if (dt == BK_DTYPE_F16) ty_put(p, i, n, dt, buf);
}

/* whether dt is a dtype the typed kernels take */
TY_INLINE int ty_valid(int dt)
{
    return dt == BK_DTYPE_F32 || dt == BK_DTYPE_BF16 || dt == BK_DTYPE_F16;
}

/* calls body(args..., dt) with dt a constant, one inlined copy per dtype (BK_ERR_INVALID for
 * another); a body with an OpenMP region in it keeps dt constant only up to the region:
 * TY_DISPATCH_IN below */
#define TY_DISPATCH(dt, body, ...)                                                                 \
    ((dt) == BK_DTYPE_F32    ? body(__VA_ARGS__, BK_DTYPE_F32)                                     \
     : (dt) == BK_DTYPE_BF16 ? body(__VA_ARGS__, BK_DTYPE_BF16)                                    \
     : (dt) == BK_DTYPE_F16  ? body(__VA_ARGS__, BK_DTYPE_F16)                                     \
                             : BK_ERR_INVALID)

/* TY_DISPATCH as a statement for the body of an OpenMP region. GCC outlines a parallel region
 * before it inlines, so a dt that is a constant where a TY_DISPATCH above the region inlined
 * the kernel is a variable again inside it: every ty_ helper in the region then branches on
 * it per element, and the loops that round (ty_round) or convert stay scalar in every dtype.
 * Dispatching inside the region gives each dtype its own copy there. */
#define TY_DISPATCH_IN(dt, body, ...) ((void)TY_DISPATCH(dt, body, __VA_ARGS__))

#endif
