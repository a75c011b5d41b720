/* vmath.h - branch-free float math for element-wise kernels: exp, the Gaussian exp(-x^2/2) and
 * the normal distribution's Mills ratio. Pure arithmetic (fmaf, selects, integer bit
 * manipulation of the exponent), no libm calls, so that loops calling them vectorize under
 * `#pragma omp simd` (AVX2 + FMA with -march=x86-64-v3) without -ffast-math. Every operation
 * is correctly rounded IEEE arithmetic, so the vector and scalar code of a loop give the same
 * bits. Accuracy is checked in tests/unit/test_ops_misc.c (test_eltwise_sweep).
 */
#ifndef DDPMD_VMATH_H
#define DDPMD_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define VM_INLINE static inline __attribute__((always_inline))

VM_INLINE float vm_bits_to_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
VM_INLINE uint32_t vm_f_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* Selects and clamps by integer operations on the bit patterns. A float ?: whose result feeds
 * further float arithmetic gets partly turned into branches by GCC (constants folded along one
 * arm, the rest computed on the other), and arithmetic inside a branch may trap under
 * -ftrapping-math, so the loop is then not if-converted and does not vectorize. Integer ops
 * never trap and integer MIN/MAX are single operations. */

/* a if v's sign bit is set (v < 0, -0, -NaN), else b */
VM_INLINE float vm_sel_neg(float v, float a, float b)
{
    uint32_t m = (uint32_t)((int32_t)vm_f_to_bits(v) >> 31);
    return vm_bits_to_f((vm_f_to_bits(a) & m) | (vm_f_to_bits(b) & ~m));
}

/* min(u, c) for u >= +0 or +NaN (NaN gives c) and c >= 0: non-negative floats order as their
 * bit patterns */
VM_INLINE float vm_min_pos(float u, float c)
{
    uint32_t ub = vm_f_to_bits(u), cb = vm_f_to_bits(c);
    return vm_bits_to_f(ub < cb ? ub : cb);
}

/* +-inf -> +-FLT_MAX, anything else unchanged: for products with a factor that is 0 at inf */
VM_INLINE float vm_clamp_inf(float v)
{
    uint32_t b = vm_f_to_bits(v);
    return vm_bits_to_f(b - (uint32_t)((b & 0x7fffffffu) == 0x7f800000u));
}

/* exp(x) for x in [-110, 89] (not NaN), <= 1.01 ulp: 0 below about -103.97 (through the
 * subnormals), +inf above about 88.72. exp(x) = 2^n exp(r), n = rint(x log2 e),
 * r = x - n ln2 (ln2 in two parts; the first has 9 bits, so its fmaf step is exact),
 * exp(r) by the Cephes degree-5 polynomial; 2^n as two factors 2^n1 2^n2 that are both normal,
 * so that the final product rounds once into the subnormals or to +inf. */
VM_INLINE float vm_exp_core(float x)
{
    const float shifter = 0x1.8p23f; /* adding it rounds to an integer, kept in the low bits */
    float k = fmaf(x, 0x1.715476p+0f, shifter);
    int32_t n = (int32_t)vm_f_to_bits(k) - (int32_t)0x4b400000; /* rint(x log2 e), -159..128 */
    k -= shifter;
    float r = fmaf(k, -0.693359375f, x);
    r = fmaf(k, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    p = fmaf(p, r * r, r) + 1.0f;
    int32_t n1 = n >> 1, n2 = n - n1; /* each in -80..64 (>> arithmetic, as vm_sel_neg's) */
    float s1 = vm_bits_to_f((uint32_t)(n1 + 127) << 23);
    float s2 = vm_bits_to_f((uint32_t)(n2 + 127) << 23);
    return p * s1 * s2;
}

/* expf over the whole float range, vm_exp_core's accuracy; NaN for NaN */
VM_INLINE float vm_expf(float x)
{
    /* x clamped to [-110, 89] (|x| to a sign-dependent limit, vm_min_pos), NaN kept aside */
    uint32_t bx = vm_f_to_bits(x), ax = bx & 0x7fffffffu;
    uint32_t nan = (uint32_t)0 - (uint32_t)(ax > 0x7f800000u); /* all ones for NaN */
    x = vm_bits_to_f(vm_f_to_bits(vm_min_pos(vm_bits_to_f(ax), vm_sel_neg(x, 110.0f, 89.0f))) |
                     (bx & 0x80000000u));
    return vm_bits_to_f(vm_f_to_bits(vm_exp_core(x)) | (nan & 0x7fc00000u));
}

/* exp(-|x|), vm_expf(-fabsf(x))'s bits for x not NaN (any value for NaN): the SiLU's e^-|x|
 * without vm_expf's upper clamp and NaN lanes (its callers' results are NaN from x itself),
 * which took ~10% of the bf16 group norm with SiLU fused, forward and backward */
VM_INLINE float vm_exp_negabs(float x)
{
    return vm_exp_core(-vm_min_pos(fabsf(x), 110.0f));
}

/* exp(-x^2/2) to ~1.5 ulp for any x (0 for |x| >= ~14.4 and for +-inf). x^2 = s + lo exactly
 * (lo by fmaf), exp(-(s + lo)/2) = exp(-s/2) (1 - lo/2): rounding x^2 first would cost
 * |x^2/2| ulp, 4e-6 relative at |x| = 12. */
VM_INLINE float vm_gaussf(float x)
{
    float a = vm_min_pos(fabsf(x), 20.0f); /* exp(-200) is 0 in float; keeps lo finite at inf */
    float s = a * a;
    float lo = fmaf(a, a, -s);
    float e = vm_expf(-0.5f * s);
    return fmaf(e, -0.5f * lo, e);
}

/* The Mills ratio R(u) = Q(u) / phi(u) of the standard normal distribution, for u in [0, 20]
 * (Q(u) = 1 - Phi(u) = erfc(u/sqrt2)/2, phi the density), to ~4 ulp: (1 + u) R(u) as a degree-11
 * polynomial in q = (u - 3)/(u + 3), which maps [0, inf) onto [-1, 1); fitted by Chebyshev
 * interpolation (mpmath), error of the float coefficients 6.4e-8 relative. Q(u) = phi(u) R(u)
 * then has relative accuracy all the way into the tail, which 1 - erf cannot have. */
VM_INLINE float vm_millsf(float u)
{
    float q = (u - 3.0f) / (u + 3.0f);
    float p = 3.713162187e-06f;
    p = fmaf(p, q, 1.493921445e-04f);
    p = fmaf(p, q, 7.942173397e-05f);
    p = fmaf(p, q, -1.187403919e-03f);
    p = fmaf(p, q, -9.055960109e-04f);
    p = fmaf(p, q, 7.485878188e-03f);
    p = fmaf(p, q, 2.913310425e-03f);
    p = fmaf(p, q, -5.696151406e-02f);
    p = fmaf(p, q, 1.132087782e-01f);
    p = fmaf(p, q, -4.119047895e-02f);
    p = fmaf(p, q, -2.419566959e-01f);
    p = fmaf(p, q, 1.218361259e+00f);
    return p / (1.0f + u);
}

/* -inf -> -FLT_MAX, anything else unchanged: x f(x) with f(-inf) = 0 is then -0, not NaN */
VM_INLINE float vm_clamp_neg_inf(float v)
{
    return vm_sel_neg(v, vm_clamp_inf(v), v);
}

/* x sigmoid(x) = x / (1 + e^-x); with t = e^-|x| in (0, 1] nothing overflows: x / (1 + t) for
 * x >= 0, x t / (1 + t) for x < 0 (-0 at -inf, x at +inf) */
VM_INLINE float vm_silu(float v)
{
    float t = vm_exp_negabs(v);
    return vm_clamp_neg_inf(v) * vm_sel_neg(v, t, 1.0f) / (1.0f + t);
}

/* d/dx x s(x) = s (1 + x (1 - s)), s and 1 - s both from t = e^-|x| without cancellation */
VM_INLINE float vm_silu_grad(float v)
{
    float t = vm_exp_negabs(v);
    float r = 1.0f / (1.0f + t), tr = t * r;
    float s = vm_sel_neg(v, tr, r), oms = vm_sel_neg(v, r, tr);
    return s * fmaf(vm_clamp_inf(v), oms, 1.0f);
}

#endif
