/* test_util.h - the tiny test harness shared by tests/unit: CHECK counts, a closing line
 * "N passed, N failed" that CI reads, and random / comparison helpers.
 */
#ifndef DDPMD_TEST_UTIL_H
#define DDPMD_TEST_UTIL_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int tu_passed, tu_failed;

#define CHECK(cond, ...)                                                                      \
    do {                                                                                      \
        if (cond) {                                                                           \
            tu_passed++;                                                                      \
        } else {                                                                              \
            tu_failed++;                                                                      \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                              \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fprintf(stderr, "\n");                                                            \
        }                                                                                     \
    } while (0)

static inline int tu_finish(const char *name)
{
    printf("%s: %d passed, %d failed\n", name, tu_passed, tu_failed);
    return tu_failed ? 1 : 0;
}

/* deterministic test randomness (xorshift64*), uniform in [-1, 1) */
static uint64_t tu_rng_state = 0x9E3779B97F4A7C15ull;
static inline void tu_seed(uint64_t s) { tu_rng_state = s ? s : 1; }
static inline double tu_rand(void)
{
    tu_rng_state ^= tu_rng_state >> 12;
    tu_rng_state ^= tu_rng_state << 25;
    tu_rng_state ^= tu_rng_state >> 27;
    uint64_t r = tu_rng_state * 0x2545F4914F6CDD1Dull;
    return (double)(r >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}
static inline void tu_fill(float *x, size_t n, double scale)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)(tu_rand() * scale);
}

/* norm-wise relative error ||a - ref|| / max(||ref||, tiny) */
static inline double tu_rel_err(const float *a, const double *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += ref[i] * ref[i];
    }
    return sqrt(num) / (den > 1e-300 ? sqrt(den) : 1e-300);
}
static inline double tu_rel_err_f(const float *a, const float *ref, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    return sqrt(num) / (den > 1e-300 ? sqrt(den) : 1e-300);
}

/* a whole file into a malloc'd buffer (*n bytes, one spare byte after them); NULL if unreadable */
static inline unsigned char *tu_slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    unsigned char *b = NULL;
    long sz;
    *n = 0;
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (sz = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        b = malloc((size_t)sz + 1);
        if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) {
            free(b);
            b = NULL;
        }
        *n = (size_t)sz;
    }
    fclose(f);
    return b;
}

#endif
