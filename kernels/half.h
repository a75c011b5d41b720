/* half.h - scalar conversions between fp32 and the two 16-bit storage types, for host code (the
 * executor's uploads and downloads, the CPU kernels' reference, tests). bf16: the top half of an
 * fp32 rounded to nearest even; f16: IEEE 754 binary16 rounded to nearest even, overflow to inf,
 * subnormals kept. NaN stays NaN (quiet, sign kept) both ways; 16 -> 32 is exact. The CUDA
 * backend's conversion kernels (kernels/cuda/convert.cu) use these same functions on the device,
 * so every backend stores the same bits.
 */
#ifndef DDPMD_HALF_H
#define DDPMD_HALF_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define HALF_FN static inline __host__ __device__
#else
#define HALF_FN static inline
#endif

HALF_FN uint32_t half_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

HALF_FN float half_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

HALF_FN uint16_t half_f32_to_bf16(float f)
{
    uint32_t u = half_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

HALF_FN float half_bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x00400000u;
    return half_bits_f32(u);
}

HALF_FN uint16_t half_f32_to_f16(float f)
{
    uint32_t u = half_f32_bits(f), sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* 65520 and up round to inf */
    if (a >= 0x38800000u) {                                   /* a normal half */
        uint32_t r = a - 0x38000000u;                         /* exponent rebiased 127 -> 15 */
        return (uint16_t)(sign | ((r + 0x0fffu + ((r >> 13) & 1u)) >> 13));
    }
    if (a < 0x33000000u) return (uint16_t)sign; /* below 2^-25 (a tie at it goes to even 0) */
    /* a subnormal half: units of 2^-24, from the 24-bit significand */
    uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
    uint32_t r = m >> shift, rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1u))) r++;
    return (uint16_t)(sign | r);
}

HALF_FN float half_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
    if (e == 0x1f) {
        u = sign | 0x7f800000u | (m << 13) | (m ? 0x00400000u : 0u);
    } else if (e == 0) {
        if (!m) {
            u = sign;
        } else { /* subnormal: normalised */
            e = 113;
            while (!(m & 0x400u)) {
                m <<= 1;
                e--;
            }
            u = sign | (e << 23) | ((m & 0x3ffu) << 13);
        }
    } else {
        u = sign | ((e + 112) << 23) | (m << 13);
    }
    return half_bits_f32(u);
}

#endif
