/* eltwise_blocks.h - the bodies of the element-wise blocks (SiLU, exact GELU and their
 * gradients over at most ELTWISE_BLK elements on the calling thread), included once per
 * instruction set: eltwise.c (x86-64-v3, AVX2) names them <fn>_avx2, eltwise512.c (under an
 * AVX-512 target pragma) <fn>_avx512. The math is vmath.h's, correctly rounded operations only
 * (no contraction: -std=c11), so every vector width gives the same bits lane for lane.
 */
#ifndef ELT_SUFFIX
#error "define ELT_SUFFIX (_avx2 or _avx512) before including eltwise_blocks.h"
#endif

#include <math.h>
#include <stddef.h>

#include "vmath.h"

#define ELT_CAT2(a, b) a##b
#define ELT_CAT(a, b) ELT_CAT2(a, b)
#define ELT_NAME(fn) ELT_CAT(fn, ELT_SUFFIX)

/* the standard normal CDF Phi(x) and density phi(x): Phi(x) = 1 - Q(|x|) for x >= 0 and Q(|x|)
 * for x < 0 with the upper tail Q(u) = phi(u) R(u) (R the Mills ratio), so that Phi keeps its
 * relative accuracy for negative x (1 + erf(x/sqrt2) is 0 in float from x = -5.9 on) */
#define GELU_RSQRT2PI 0.39894228040143267794f /* 1/sqrt(2*pi) */
VM_INLINE float ELT_NAME(gelu_cdf_pdf)(float v, float *pdf)
{
    float u = vm_min_pos(fabsf(v), 20.0f); /* Q(20) is 0 in float; NaN -> 20, x is NaN anyway */
    float d = vm_gaussf(u) * GELU_RSQRT2PI;
    float q = d * vm_millsf(u);
    *pdf = d;
    return fmaf(vm_sel_neg(v, 1.0f, -1.0f), q, vm_sel_neg(v, 0.0f, 1.0f)); /* q or 1 - q */
}

void ELT_NAME(cpu_silu_block)(float *y, const float *x, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) y[i] = vm_silu(x[i]);
}

void ELT_NAME(cpu_silu_bwd_block)(float *dx, const float *dy, const float *x, int accum, size_t n)
{
    if (accum) {
#pragma omp simd
        for (size_t i = 0; i < n; i++) dx[i] += dy[i] * vm_silu_grad(x[i]);
    } else {
#pragma omp simd
        for (size_t i = 0; i < n; i++) dx[i] = dy[i] * vm_silu_grad(x[i]);
    }
}

void ELT_NAME(cpu_gelu_block)(float *y, const float *x, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++) {
        float v = x[i], pdf;
        y[i] = vm_clamp_neg_inf(v) * ELT_NAME(gelu_cdf_pdf)(v, &pdf);
    }
}

/* Phi(x) + x phi(x), the exact (erf) GELU's derivative */
void ELT_NAME(cpu_gelu_bwd_block)(float *dx, const float *dy, const float *x, int accum, size_t n)
{
    if (accum) {
#pragma omp simd
        for (size_t i = 0; i < n; i++) {
            float v = x[i], pdf, cdf = ELT_NAME(gelu_cdf_pdf)(v, &pdf);
            dx[i] += dy[i] * fmaf(vm_clamp_inf(v), pdf, cdf);
        }
    } else {
#pragma omp simd
        for (size_t i = 0; i < n; i++) {
            float v = x[i], pdf, cdf = ELT_NAME(gelu_cdf_pdf)(v, &pdf);
            dx[i] = dy[i] * fmaf(vm_clamp_inf(v), pdf, cdf);
        }
    }
}

#undef ELT_NAME
#undef ELT_CAT
#undef ELT_CAT2
