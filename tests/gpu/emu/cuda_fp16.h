/* cuda_fp16.h / cuda_bf16.h (emulator) - the 16-bit storage types for kernels that keep
 * tensors in half or bfloat16 and compute in fp32: __half and __nv_bfloat16 with the
 * round-to-nearest-even conversions of CUDA's __float2half / __float2bfloat16 (NaN kept quiet,
 * overflow to infinity, half subnormals exact). See cuda_runtime.h here. */
#ifndef DDPMD_EMU_CUDA_FP16_H
#define DDPMD_EMU_CUDA_FP16_H

#include <stdint.h>
#include <string.h>

struct __half {
    uint16_t x;
};
struct __nv_bfloat16 {
    uint16_t x;
};

static inline uint32_t emu_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float emu_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline __nv_bfloat16 __float2bfloat16(float f)
{
    uint32_t u = emu_f32_bits(f);
    __nv_bfloat16 r;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        r.x = (uint16_t)((u >> 16) | 0x0040u); /* a quiet NaN */
        return r;
    }
    u += 0x7fffu + ((u >> 16) & 1u); /* nearest, ties to even */
    r.x = (uint16_t)(u >> 16);
    return r;
}
static inline float __bfloat162float(__nv_bfloat16 h) { return emu_bits_f32((uint32_t)h.x << 16); }

static inline __half __float2half(float f)
{
    const uint32_t u = emu_f32_bits(f), sign = (u >> 16) & 0x8000u;
    const uint32_t a = u & 0x7fffffffu;
    __half r;
    if (a > 0x7f800000u) { /* NaN */
        r.x = (uint16_t)(sign | 0x7e00u);
        return r;
    }
    if (a >= 0x477ff000u) { /* rounds to 65520 or more: infinity */
        r.x = (uint16_t)(sign | 0x7c00u);
        return r;
    }
    if (a < 0x38800000u) { /* below 2^-14: a subnormal half (or zero), nearest even */
        const float v = emu_bits_f32(a) * 16777216.0f; /* in units of 2^-24 */
        uint32_t q = (uint32_t)v;
        const float rem = v - (float)q;
        if (rem > 0.5f || (rem == 0.5f && (q & 1u))) q++;
        r.x = (uint16_t)(sign | q);
        return r;
    }
    uint32_t m = a - 0x38000000u; /* rebias the exponent 127 -> 15 */
    m += 0xfffu + ((m >> 13) & 1u);
    r.x = (uint16_t)(sign | (m >> 13));
    return r;
}
static inline float __half2float(__half h)
{
    const uint32_t sign = (uint32_t)(h.x & 0x8000u) << 16, e = (h.x >> 10) & 0x1fu,
                   m = h.x & 0x3ffu;
    if (e == 0) {
        const float v = (float)m / 16777216.0f;
        return sign ? -v : v;
    }
    if (e == 31) return emu_bits_f32(sign | 0x7f800000u | (m << 13));
    return emu_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

#endif
