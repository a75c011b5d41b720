/* test_philox.c - the shared Philox4x32-10 (kernels/philox.h): Random123 known-answer vectors,
 * the (0,1) uniform range, Gaussian moments, and that a draw depends only on its coordinates.
 */
#include <string.h>

#include "philox.h"
#include "test_util.h"

static int u4_eq(struct philox_u4 r, uint32_t a, uint32_t b, uint32_t c, uint32_t d)
{
    return r.v[0] == a && r.v[1] == b && r.v[2] == c && r.v[3] == d;
}

/* Random123 kat_vectors, "philox4x32 10 ctr[4] key[2] -> out[4]" */
static void test_kat(void)
{
    struct philox_u4 r = philox4x32_10(0, 0, 0, 0, 0, 0);
    CHECK(u4_eq(r, 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u),
          "kat zero: %08x %08x %08x %08x", r.v[0], r.v[1], r.v[2], r.v[3]);
    r = philox4x32_10(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu,
                      0xffffffffu);
    CHECK(u4_eq(r, 0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu),
          "kat ones: %08x %08x %08x %08x", r.v[0], r.v[1], r.v[2], r.v[3]);
    r = philox4x32_10(0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u, 0xa4093822u,
                      0x299f31d0u);
    CHECK(u4_eq(r, 0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u),
          "kat pi: %08x %08x %08x %08x", r.v[0], r.v[1], r.v[2], r.v[3]);
}

/* the counter/key layout of a stream coordinate, as documented in philox.h (the CUDA backend
 * must pack identically) */
static void test_block_layout(void)
{
    uint64_t seed = 0x0123456789ABCDEFull, step = 0xAB12345678ull;
    struct philox_u4 a = philox_block(seed, PHILOX_TAG_NOISE, step, 0x1234, 0x0042, 77);
    struct philox_u4 b = philox4x32_10(77, 0x1234u | (0x42u << 16), 0x12345678u,
                                       0xABu | ((uint32_t)PHILOX_TAG_NOISE << 24), 0x89ABCDEFu,
                                       0x01234567u);
    CHECK(memcmp(&a, &b, sizeof a) == 0, "philox_block packs (seed,tag,step,sample,op,block)");
    /* element e is word e&3 of block e>>2 */
    int ok = 1;
    for (uint32_t e = 0; e < 64; e++) {
        struct philox_u4 r = philox_block(seed, PHILOX_TAG_DROPOUT, step, 5, 9, e >> 2);
        uint32_t u = philox_u32_at(seed, PHILOX_TAG_DROPOUT, step, 5, 9, e);
        float f = philox_uniform_at(seed, PHILOX_TAG_DROPOUT, step, 5, 9, e);
        ok &= u == r.v[e & 3] && f == philox_uniform(u);
    }
    CHECK(ok, "u32_at / uniform_at read word e&3 of block e>>2");
}

static void test_uniform(void)
{
    const uint32_t n = 1000000;
    int in_range = 1;
    double sum = 0;
    for (uint32_t e = 0; e < n; e++) {
        float u = philox_uniform_at(42, PHILOX_TAG_TIMESTEP, 3, 1, 0, e);
        in_range &= u > 0.0f && u < 1.0f;
        sum += u;
    }
    CHECK(in_range, "1e6 uniforms in (0,1)");
    CHECK(fabs(sum / n - 0.5) < 0.002, "uniform mean %.5f", sum / n);
    /* the extremes of the u32 range, which random draws reach once in 2^24 */
    float lo = philox_uniform(0u), hi = philox_uniform(0xFFFFFFFFu);
    CHECK(lo > 0.0f, "philox_uniform(0) = %.9g must be > 0", lo);
    CHECK(hi < 1.0f, "philox_uniform(0xFFFFFFFF) = %.9g must be < 1 (24 bits + half a cell "
                     "round to 1.0f; see the report)", hi);
}

static void test_gauss(void)
{
    const uint32_t n = 1000000;
    double s1 = 0, s2 = 0, s3 = 0, s4 = 0;
    int finite = 1;
    for (uint32_t e = 0; e < n; e++) {
        double z = philox_normal(7, PHILOX_TAG_NOISE, 11, 2, 0, e);
        finite &= isfinite(z);
        s1 += z;
        s2 += z * z;
        s3 += z * z * z;
        s4 += z * z * z * z;
    }
    double mean = s1 / n, var = s2 / n - mean * mean;
    double skew = s3 / n, kurt = s4 / n;
    CHECK(finite, "normals finite");
    CHECK(fabs(mean) < 0.005, "normal mean %.5f", mean);
    CHECK(fabs(var - 1.0) < 0.01, "normal variance %.5f", var);
    CHECK(fabs(skew) < 0.02, "normal third moment %.5f", skew);
    CHECK(fabs(kurt - 3.0) < 0.05, "normal fourth moment %.5f", kurt);
    printf("philox: gauss mean %.2e var-1 %.2e\n", mean, var - 1.0);
}

struct coord {
    uint64_t seed;
    uint32_t tag;
    uint64_t step;
    uint32_t sample, op, e;
};

/* how many of 64 consecutive u32 of two streams agree */
static int stream_agree(struct coord a, struct coord b)
{
    int same = 0;
    for (uint32_t i = 0; i < 64; i++)
        same += philox_u32_at(a.seed, a.tag, a.step, a.sample, a.op, a.e + i) ==
                philox_u32_at(b.seed, b.tag, b.step, b.sample, b.op, b.e + i);
    return same;
}

static void test_coordinates(void)
{
    struct coord base = {0x0123456789ABCDEFull, PHILOX_TAG_NOISE, 0x3412345678ull, 7, 3, 13};
    /* a pure function: the same coordinates give the same draws, in any order */
    float z0 = philox_normal(base.seed, base.tag, base.step, base.sample, base.op, base.e);
    (void)philox_normal(base.seed, base.tag, base.step + 1, base.sample, base.op, base.e);
    float z1 = philox_normal(base.seed, base.tag, base.step, base.sample, base.op, base.e);
    CHECK(memcmp(&z0, &z1, sizeof z0) == 0, "same coordinates, same normal");
    CHECK(stream_agree(base, base) == 64, "same coordinates, same stream");

    struct {
        const char *what;
        struct coord c;
    } var[] = {
        {"seed low bit", base},   {"seed high bit", base}, {"tag", base},
        {"step low bit", base},   {"step bit 35", base},   {"sample", base},
        {"op", base},             {"element offset", base},
    };
    var[0].c.seed ^= 1;
    var[1].c.seed ^= 1ull << 40;
    var[2].c.tag = PHILOX_TAG_DROPOUT;
    var[3].c.step ^= 1;
    var[4].c.step ^= 1ull << 35;
    var[5].c.sample += 1;
    var[6].c.op += 1;
    var[7].c.e += 64;
    for (size_t i = 0; i < sizeof var / sizeof var[0]; i++) {
        int same = stream_agree(base, var[i].c);
        CHECK(same <= 1, "changing %s gives a different stream (%d/64 equal)", var[i].what, same);
    }
    /* the noise and sampler streams of the same coordinates are unrelated */
    int same = 0;
    for (uint32_t e = 0; e < 64; e++)
        same += philox_normal(1, PHILOX_TAG_NOISE, 5, 0, 0, e) ==
                philox_normal(1, PHILOX_TAG_SAMPLER, 5, 0, 0, e);
    CHECK(same <= 1, "noise and sampler tags differ (%d/64 equal)", same);
}

int main(void)
{
    test_kat();
    test_block_layout();
    test_uniform();
    test_gauss();
    test_coordinates();
    return tu_finish("test_philox");
}
