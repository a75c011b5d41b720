/* test_convert: the CPU backend's fp32 <-> bf16 / f16 conversions (backend.h `convert`, SIMD and
 * scalar tail) and kernels/half.h's scalar ones, against references that share no code with
 * them: every one of the 65536 bit patterns of each 16-bit type to fp32 (exact, NaN quiet with
 * its sign), and fp32 to 16 bits at every representable value, at every exact tie between two
 * neighbours, one fp32 ulp either side of each tie, around the overflow and subnormal edges,
 * fp32 subnormals, infinities, NaNs and random values: f16 against GCC's _Float16 conversion,
 * bf16 against the nearer of the two neighbouring bf16 values computed in double. And the
 * typed kernels' accumulating 16-bit store (cpu_accum16, backend.h's y = round(y + round(r)))
 * against those references at the same values, y running through every 16-bit pattern.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "cpu/cpu.h"
#include "cpu/typed.h"
#include "half.h"
#include "test_util.h"

static uint32_t fbits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bitsf(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* reference bf16 -> f32: the pattern in the top half; a NaN must come out quiet */
static int bf16_ok(uint16_t h, float got)
{
    uint32_t want = (uint32_t)h << 16, g = fbits(got);
    if (isnan(bitsf(want)))
        return isnan(got) && (g & 0x80000000u) == (want & 0x80000000u) && (g & 0x00400000u);
    return g == want;
}

static int f16_ok(uint16_t h, float got)
{
    _Float16 x;
    memcpy(&x, &h, 2);
    float want = (float)x;
    if (isnan(want))
        return isnan(got) && signbit(got) == signbit(want) && (fbits(got) & 0x00400000u);
    return fbits(got) == fbits(want);
}

/* value of a bf16 pattern for rounding distances: inf counts as 2^128, the next step up */
static double bf16_value(uint32_t h)
{
    if ((h & 0x7fffu) == 0x7f80u) return (h & 0x8000u) ? -ldexp(1.0, 128) : ldexp(1.0, 128);
    return (double)bitsf(h << 16);
}

/* reference f32 -> bf16: of the two bf16 neighbours of x, the nearer, a tie to the even one */
static uint16_t ref_bf16(float x)
{
    uint32_t u = fbits(x);
    if (isnan(x)) return 0; /* not used: NaNs are checked by class */
    if (isinf(x)) return (uint16_t)(u >> 16);
    uint32_t lo = u >> 16, hi = lo + 1; /* towards larger magnitude */
    if ((u & 0xffffu) == 0) return (uint16_t)lo;
    double dl = fabs((double)x - bf16_value(lo)), dh = fabs((double)x - bf16_value(hi));
    if (dl < dh) return (uint16_t)lo;
    if (dh < dl) return (uint16_t)hi;
    return (uint16_t)((lo & 1u) ? hi : lo);
}

static uint16_t ref_f16(float x)
{
    _Float16 h = (_Float16)x;
    uint16_t b;
    memcpy(&b, &h, 2);
    return b;
}

/* an f16 pattern's value, by GCC's _Float16 */
static float ref_f16_value(uint16_t b)
{
    _Float16 h;
    memcpy(&h, &b, 2);
    return (float)h;
}

static int nan16(uint16_t h, int bf16)
{
    return bf16 ? (h & 0x7fffu) > 0x7f80u : (h & 0x7fffu) > 0x7c00u;
}

static int same16(uint16_t got, uint16_t want, int bf16)
{
    int gn = bf16 ? (got & 0x7fffu) > 0x7f80u : (got & 0x7fffu) > 0x7c00u;
    int wn = bf16 ? (want & 0x7fffu) > 0x7f80u : (want & 0x7fffu) > 0x7c00u;
    if (gn || wn) /* NaN: NaN, quiet, same sign */
        return gn && wn && (got & 0x8000u) == (want & 0x8000u) &&
               (got & (bf16 ? 0x0040u : 0x0200u));
    return got == want;
}

static const struct backend *bk;
static bk_ctx *ctx;

/* all 65536 patterns of a 16-bit type to f32, through the backend (counts not a multiple of the
 * SIMD width: the tail too) and through half.h */
static void all_patterns(int dtype)
{
    int bf16 = dtype == BK_DTYPE_BF16;
    const char *name = bf16 ? "bf16" : "f16";
    uint16_t *h = malloc(65536 * 2);
    float *y = malloc(65536 * 4);
    for (uint32_t i = 0; i < 65536; i++) h[i] = (uint16_t)i;
    CHECK(bk->convert(y, BK_DTYPE_F32, h, dtype, 65536, ctx) == BK_OK, "%s -> f32", name);
    long bad = 0, bad_scalar = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        int ok = bf16 ? bf16_ok(h[i], y[i]) : f16_ok(h[i], y[i]);
        if (!ok && bad++ < 5)
            fprintf(stderr, "%s 0x%04x -> f32 0x%08x (backend)\n", name, i, fbits(y[i]));
        float s = bf16 ? half_bf16_to_f32(h[i]) : half_f16_to_f32(h[i]);
        ok = bf16 ? bf16_ok(h[i], s) : f16_ok(h[i], s);
        if (!ok && bad_scalar++ < 5)
            fprintf(stderr, "%s 0x%04x -> f32 0x%08x (half.h)\n", name, i, fbits(s));
    }
    /* the typed kernels' branch-free bf16 load (typed.h): half.h's bits */
    long typed = 0;
    for (uint32_t i = 0; bf16 && i < 65536; i++)
        typed += fbits(ty_bf16_to_f32(h[i])) != fbits(half_bf16_to_f32(h[i]));
    CHECK(typed == 0, "bf16 -> f32: typed.h and half.h differ on %ld patterns", typed);
    CHECK(bad == 0, "%s -> f32: %ld of 65536 patterns wrong (backend)", name, bad);
    CHECK(bad_scalar == 0, "%s -> f32: %ld of 65536 patterns wrong (half.h)", name, bad_scalar);
    /* the tail path alone: 7 elements starting at an odd offset */
    float t[7];
    CHECK(bk->convert(t, BK_DTYPE_F32, h + 0x3c01, dtype, 7, ctx) == BK_OK, "%s tail", name);
    CHECK(memcmp(t, y + 0x3c01, sizeof t) == 0, "%s -> f32: the tail differs from the SIMD path",
          name);
    free(h);
    free(y);
}

/* the f32 values to round: every value of the type, each tie between neighbours, an f32 ulp
 * either side of it, and specials */
static size_t round_cases(int bf16, float *x)
{
    size_t n = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float v = bf16 ? bitsf((uint32_t)h << 16) : half_f16_to_f32(h);
        if (isnan(v) || isinf(v)) continue;
        x[n++] = v;
        /* the next pattern in magnitude (inf after the largest finite) */
        uint16_t up = (uint16_t)(h + 1);
        double vu = (bf16 ? (up & 0x7fffu) == 0x7f80u : (up & 0x7fffu) == 0x7c00u)
                        ? (double)v + (double)v - (double)(bf16 ? bitsf((uint32_t)(h - 1) << 16)
                                                                : half_f16_to_f32((uint16_t)(h - 1)))
                        : (double)(bf16 ? bitsf((uint32_t)up << 16) : half_f16_to_f32(up));
        float mid = (float)(((double)v + vu) / 2); /* exact: one bit more than the 16-bit type */
        x[n++] = mid;
        x[n++] = nextafterf(mid, 0.0f);
        x[n++] = nextafterf(mid, mid > 0 ? INFINITY : -INFINITY);
    }
    const float sp[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, bitsf(0x7f800001u),
                        bitsf(0xff800001u), bitsf(0x7fbfffffu), bitsf(0x00000001u),
                        bitsf(0x807fffffu), 65504.0f, 65519.99f, 65520.0f, 65536.0f, -65520.0f,
                        3.0e38f, -3.4028235e38f, 5.9604645e-8f, 2.9802322e-8f, 2.9802326e-8f,
                        6.1035156e-5f, 6.1035152e-5f};
    for (size_t i = 0; i < sizeof sp / sizeof sp[0]; i++) x[n++] = sp[i];
    tu_seed(bf16 ? 17 : 23);
    for (int i = 0; i < 100000; i++) {
        double r = tu_rand();
        x[n++] = (float)(r * ldexp(1.0, (int)(tu_rand() * 40)));
        x[n++] = bitsf((uint32_t)((tu_rand() + 1.0) * 2147483647.0)); /* any pattern */
    }
    return n;
}

static void rounding(int dtype)
{
    int bf16 = dtype == BK_DTYPE_BF16;
    const char *name = bf16 ? "bf16" : "f16";
    float *x = malloc((4 * 65536 + 64 + 200000) * sizeof *x);
    size_t n = round_cases(bf16, x);
    uint16_t *y = malloc(n * 2);
    CHECK(bk->convert(y, dtype, x, BK_DTYPE_F32, n, ctx) == BK_OK, "f32 -> %s", name);
    long bad = 0, bad_scalar = 0;
    for (size_t i = 0; i < n; i++) {
        uint16_t want = isnan(x[i]) ? (uint16_t)((fbits(x[i]) >> 16 & 0x8000u) |
                                                 (bf16 ? 0x7fc0u : 0x7e00u))
                                    : bf16 ? ref_bf16(x[i]) : ref_f16(x[i]);
        if (!same16(y[i], want, bf16) && bad++ < 5)
            fprintf(stderr, "f32 %.9g (0x%08x) -> %s 0x%04x, want 0x%04x (backend)\n", x[i],
                    fbits(x[i]), name, y[i], want);
        uint16_t s = bf16 ? half_f32_to_bf16(x[i]) : half_f32_to_f16(x[i]);
        if (!same16(s, want, bf16) && bad_scalar++ < 5)
            fprintf(stderr, "f32 %.9g (0x%08x) -> %s 0x%04x, want 0x%04x (half.h)\n", x[i],
                    fbits(x[i]), name, s, want);
    }
    CHECK(bad == 0, "f32 -> %s: %ld of %zu values wrong (backend)", name, bad, n);
    CHECK(bad_scalar == 0, "f32 -> %s: %ld of %zu values wrong (half.h)", name, bad_scalar, n);
    /* SIMD and scalar tail agree bit for bit on every value (NaN payloads included) */
    long diff = 0;
    for (size_t i = 0; i < n; i++)
        diff += y[i] != (bf16 ? half_f32_to_bf16(x[i]) : half_f32_to_f16(x[i]));
    CHECK(diff == 0, "f32 -> %s: the backend and half.h differ on %ld values", name, diff);
    long typed = 0; /* the typed kernels' branch-free bf16 store (typed.h) */
    for (size_t i = 0; bf16 && i < n; i++) typed += ty_f32_to_bf16(x[i]) != half_f32_to_bf16(x[i]);
    CHECK(typed == 0, "f32 -> bf16: typed.h and half.h differ on %ld values", typed);
    if (!bad && !bad_scalar && !diff)
        printf("f32 -> %s: %zu values (ties, neighbours, specials, random) rounded correctly\n",
               name, n);
    free(x);
    free(y);
}

/* cpu_accum16 on the rounding cases as r and every 16-bit pattern as y, against round(y +
 * round(r)) with each rounding and the fp32 sum done by the references: at once (an odd count
 * over several parallel chunks: the vector loop and a tail), then in calls of 7 (the scalar
 * tail alone on every value) */
static void accum16(int dtype)
{
    int bf16 = dtype == BK_DTYPE_BF16;
    const char *name = bf16 ? "bf16" : "f16";
    const uint16_t qnan = bf16 ? 0x7fc0u : 0x7e00u;
    float *r = malloc((4 * 65536 + 64 + 200000) * sizeof *r);
    size_t n = round_cases(bf16, r);
    n -= n % 8 ? 0 : 1;
    uint16_t *y = malloc(n * 2), *y7 = malloc(n * 2), *want = malloc(n * 2);
    for (size_t i = 0; i < n; i++) {
        y[i] = (uint16_t)(i * 40503u); /* odd: every pattern once per 65536 */
        float yf = bf16 ? bitsf((uint32_t)y[i] << 16) : ref_f16_value(y[i]);
        uint16_t rr = isnan(r[i]) ? qnan : bf16 ? ref_bf16(r[i]) : ref_f16(r[i]);
        float s = yf + (bf16 ? bitsf((uint32_t)rr << 16) : ref_f16_value(rr));
        want[i] = isnan(s) ? qnan : bf16 ? ref_bf16(s) : ref_f16(s);
    }
    memcpy(y7, y, n * 2);
    cpu_accum16(y, r, dtype, n, ctx);
    for (size_t i = 0; i < n; i += 7)
        cpu_accum16(y7 + i, r + i, dtype, n - i < 7 ? n - i : 7, ctx);
    long bad = 0, bad7 = 0;
    for (size_t i = 0; i < n; i++) {
        /* a NaN as a NaN: which operand's payload a sum of two keeps is the compiler's choice */
        bad7 += nan16(y7[i], bf16) ? !nan16(y[i], bf16) : y7[i] != y[i];
        int ok = nan16(want[i], bf16) ? nan16(y[i], bf16) : y[i] == want[i];
        if (!ok && bad++ < 5)
            fprintf(stderr, "%s accum16: r %.9g -> 0x%04x, want 0x%04x (element %zu)\n", name,
                    r[i], y[i], want[i], i);
    }
    CHECK(bad == 0, "%s accum16: %ld of %zu values wrong", name, bad, n);
    CHECK(bad7 == 0, "%s accum16: the scalar tail differs from the vector loop on %ld values",
          name, bad7);
    free(r);
    free(y);
    free(y7);
    free(want);
}

static void invalid(void)
{
    uint16_t a[4] = {0}, b[4] = {0};
    CHECK(bk->convert(a, BK_DTYPE_BF16, b, BK_DTYPE_F16, 4, ctx) == BK_ERR_INVALID,
          "bf16 <- f16 directly is refused (through f32 only)");
    CHECK(bk->convert(a, 7, b, BK_DTYPE_F32, 2, ctx) == BK_ERR_INVALID, "an unknown dtype");
    CHECK(bk->convert(a, BK_DTYPE_F16, b, BK_DTYPE_F16, 4, ctx) == BK_OK, "a copy");
}

int main(void)
{
    bk = backend_cpu();
    CHECK(bk->convert != NULL, "the CPU backend converts");
    if (!bk->convert) return tu_finish("test_convert");
    CHECK(bk->ctx_init(&ctx, 2) == BK_OK, "ctx");
    all_patterns(BK_DTYPE_BF16);
    all_patterns(BK_DTYPE_F16);
    rounding(BK_DTYPE_BF16);
    rounding(BK_DTYPE_F16);
    accum16(BK_DTYPE_BF16);
    accum16(BK_DTYPE_F16);
    invalid();
    bk->ctx_free(ctx);
    return tu_finish("test_convert");
}
