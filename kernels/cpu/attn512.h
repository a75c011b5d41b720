/* attn512.h - the AVX-512 vector helpers the attention's tiles share (attn512.c, attn_bf16.c):
 * lane masks and the exponential in 16 lanes. Include only after a target pragma that enables
 * AVX-512 (the rest of the backend is built for x86-64-v3).
 */
#ifndef DDPMD_CPU_ATTN512_H
#define DDPMD_CPU_ATTN512_H

#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

/* a mask of the first n (< 16) lanes, or all 16 */
AI __mmask16 lanes(int n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u); }

/* vm_expf (vmath.h) on 16 lanes, the same bits: x clamped to [-110, 89] (NaN kept: max and min
 * return their second operand when one is NaN), the same reduction and polynomial, and 2^n
 * applied by one vscalefps, which rounds once into the subnormals as vm_expf's two normal
 * factors do */
AI __m512 exp512(__m512 x)
{
    x = _mm512_min_ps(_mm512_set1_ps(89.0f), _mm512_max_ps(_mm512_set1_ps(-110.0f), x));
    const __m512 shifter = _mm512_set1_ps(0x1.8p23f);
    __m512 k = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), shifter), shifter);
    __m512 r = _mm512_fmadd_ps(k, _mm512_set1_ps(-0.693359375f), x);
    r = _mm512_fmadd_ps(k, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k);
}

/* 2^x on 16 lanes for the bf16 attention (attn_bf16.c), whose scores come in base 2 (the
 * product's scale times log2 e) and are never above their row's max (x <= 0): x clamped below at
 * -150 (NaN kept), k = rint(x) and r = x - k in [-1/2, 1/2] both exact, 2^r by SLEEF's degree-6
 * polynomial (within 2 ulp), 2^k by vscalefps (rounding once into the subnormals). Six FMAs
 * where exp512's reduction and polynomial take ten; no upper clamp (x > 128 would give +inf) */
AI __m512 exp2x512(__m512 x)
{
    x = _mm512_max_ps(_mm512_set1_ps(-150.0f), x);
    const __m512 k = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 r = _mm512_sub_ps(x, k);
    __m512 p = _mm512_set1_ps(1.535920892e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.339262701e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(9.618384764e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.550347269e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(2.402264476e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(6.931471825e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, k);
}

/* a W X tile's R x NV vectors of fp32 sums (acc) stored into Y's rows (stride ldy), the last
 * vector masked by m, added to what Y holds when acc_y (attn512.c and attn_bf16.c's wx_tile) */
#define wx_tile_store(Y, ldy, acc, R, NV, m, acc_y)                                           \
    do {                                                                                      \
        _Pragma("GCC unroll 16") for (int j_ = 0; j_ < (R); j_++)                             \
            _Pragma("GCC unroll 4") for (int u_ = 0; u_ < (NV); u_++) {                       \
                float *y_ = (Y) + (size_t)j_ * (ldy) + 16 * u_;                               \
                const __mmask16 mu_ = u_ == (NV) - 1 ? (m) : (__mmask16)0xffff;               \
                __m512 v_ = (acc)[j_][u_];                                                    \
                if (acc_y) v_ = _mm512_add_ps(_mm512_maskz_loadu_ps(mu_, y_), v_);            \
                _mm512_mask_storeu_ps(y_, mu_, v_);                                           \
            }                                                                                 \
    } while (0)

/* the rows of a column chunk in tiles of R rows, then 4, then 1 (wx_tile: each file's own, fp32
 * or bf16 pairs; the names are the callers' locals) */
#define WX_ROWS(R, NV, CSW)                                                                   \
    do {                                                                                      \
        int j = 0;                                                                            \
        for (; j + R <= ny; j += R)                                                           \
            wx_tile(Yc + (size_t)j * ldy, ldy, W + (size_t)j * sw, sw, st, Xc, ldx, nt, acc_y, \
                    m, R, NV, CSW);                                                           \
        for (; j + 4 <= ny; j += 4)                                                           \
            wx_tile(Yc + (size_t)j * ldy, ldy, W + (size_t)j * sw, sw, st, Xc, ldx, nt, acc_y, \
                    m, 4, NV, CSW);                                                           \
        for (; j < ny; j++)                                                                   \
            wx_tile(Yc + (size_t)j * ldy, ldy, W + (size_t)j * sw, sw, st, Xc, ldx, nt, acc_y, \
                    m, 1, NV, CSW);                                                           \
    } while (0)

#endif
