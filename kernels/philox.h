/* philox.h - counter-based Philox4x32-10 shared by the CPU and CUDA backends and the engine.
 * A draw is a pure function of (seed, tag, step, sample, op, element): micro-batching, resume
 * and CPU-vs-GPU runs see identical u32 streams. Plain C; compiles as CUDA device code too.
 */
#ifndef DDPMD_PHILOX_H
#define DDPMD_PHILOX_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define PHILOX_FN static __host__ __device__ __forceinline__
#else
#define PHILOX_FN static inline
#endif

/* stream tags: which use a draw belongs to */
enum philox_tag {
    PHILOX_TAG_NOISE = 1,    /* forward-diffusion noise eps, per image element */
    PHILOX_TAG_TIMESTEP = 2, /* training timestep t, per sample */
    PHILOX_TAG_FLIP = 3,     /* horizontal flip, per sample */
    PHILOX_TAG_DROPOUT = 4,  /* dropout mask, per (op, sample, element) */
    PHILOX_TAG_SHUFFLE = 5,  /* dataset order, per epoch */
    PHILOX_TAG_SAMPLER = 6,  /* sampling noise, per (sampler step, image, element) */
    PHILOX_TAG_INIT = 7,     /* weight initialisation, per (parameter, element) */
};

struct philox_u4 {
    uint32_t v[4];
};

PHILOX_FN uint32_t philox_mulhilo(uint32_t a, uint32_t b, uint32_t *hi)
{
    uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    return (uint32_t)p;
}

/* Philox4x32 with 10 rounds (Salmon et al., SC'11), the Random123 constants. */
PHILOX_FN struct philox_u4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                          uint32_t k0, uint32_t k1)
{
    for (int r = 0; r < 10; r++) {
        uint32_t hi0, hi1;
        uint32_t lo0 = philox_mulhilo(0xD2511F53u, c0, &hi0);
        uint32_t lo1 = philox_mulhilo(0xCD9E8D57u, c2, &hi1);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0; c1 = n1; c2 = n2; c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    struct philox_u4 r;
    r.v[0] = c0; r.v[1] = c1; r.v[2] = c2; r.v[3] = c3;
    return r;
}

/* Four u32 draws for element block `block` (elements 4*block .. 4*block+3) of the stream
 * (seed, tag, step, sample, op). step is 40 bits, sample and op 16 bits each, block 32 bits. */
PHILOX_FN struct philox_u4 philox_block(uint64_t seed, uint32_t tag, uint64_t step,
                                        uint32_t sample, uint32_t op, uint32_t block)
{
    return philox4x32_10(block, (sample & 0xFFFFu) | (op << 16), (uint32_t)step,
                         ((uint32_t)(step >> 32) & 0xFFFFFFu) | (tag << 24), (uint32_t)seed,
                         (uint32_t)(seed >> 32));
}

/* u32 -> uniform in (0, 1): 23 random bits, the exact centre of their cell, never 0 or 1
 * (24 bits would round the top cell to 1.0f) */
PHILOX_FN float philox_uniform(uint32_t u)
{
    return (float)(u >> 9) * 1.1920928955078125e-07f + 5.9604644775390625e-08f;
}

/* Two standard normals from two u32 by Box-Muller; fmaf keeps CPU and CUDA rounding equal. */
PHILOX_FN void philox_gauss2(uint32_t a, uint32_t b, float *z0, float *z1)
{
    float u1 = philox_uniform(a), u2 = philox_uniform(b);
    float r = sqrtf(-2.0f * logf(u1));
    float th = fmaf(6.2831853071795864769f, u2, 0.0f);
    *z0 = r * cosf(th);
    *z1 = r * sinf(th);
}

/* Standard normal for element e of the stream. */
PHILOX_FN float philox_normal(uint64_t seed, uint32_t tag, uint64_t step, uint32_t sample,
                              uint32_t op, uint32_t e)
{
    struct philox_u4 r = philox_block(seed, tag, step, sample, op, e >> 2);
    float z0, z1;
    uint32_t pair = (e >> 1) & 1u;
    philox_gauss2(r.v[2 * pair], r.v[2 * pair + 1], &z0, &z1);
    return (e & 1u) ? z1 : z0;
}

/* Uniform (0,1) for element e of the stream. */
PHILOX_FN float philox_uniform_at(uint64_t seed, uint32_t tag, uint64_t step, uint32_t sample,
                                  uint32_t op, uint32_t e)
{
    struct philox_u4 r = philox_block(seed, tag, step, sample, op, e >> 2);
    return philox_uniform(r.v[e & 3u]);
}

/* u32 for element e of the stream. */
PHILOX_FN uint32_t philox_u32_at(uint64_t seed, uint32_t tag, uint64_t step, uint32_t sample,
                                 uint32_t op, uint32_t e)
{
    struct philox_u4 r = philox_block(seed, tag, step, sample, op, e >> 2);
    return r.v[e & 3u];
}

#endif
