/* wgrad_bf16.c - a stride-1 bf16 convolution's filter gradient over a range of output rows on
 * AVX512-BF16's vdpbf16ps, without im2col or a GEMM library (conv.c's sliced route: small dw,
 * one thread per slice). vdpbf16ps sums two bf16 products per fp32 lane, and here the summed
 * index is the output pixel, so both operands are taken in pairs of horizontally adjacent output
 * pixels (2m, 2m+1) of a row: dy as (pair, Co) with the two pixels' values in one 32-bit element
 * (16 output channels per vector), and x, per kernel column kx, as (input row, pair, Ci) with
 * the two pixels' inputs x[iy][2m + kx - pad_l] and x[iy][2m + 1 + kx - pad_l] in one 32-bit
 * element (zeros in the padding), broadcast. So a tap (ky, kx) is a register tile of
 * acc (Ci, Co) += over the pairs of the rows whose input row is inside x: no column matrix is
 * written (kw copies the size of x per block of rows instead of im2col's Kh*Kw) and none is
 * packed again for the GEMM. Each acc element is summed over a block's pixels in a fixed order,
 * then added into the caller's fp32 (Kh, Kw, Ci, Co): the same bits for the same row range.
 * db, where asked, is summed in fp32 pixel by pixel in order while dy's rows are copied.
 * Called only where cpu_isa() reports AVX512-BF16.
 */
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "cpu.h"

#define TARGET512_BF16
#include "target512_push.h"

#define AI static inline __attribute__((always_inline))

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

void (*cpu_wgrad_bf16_scratch)(int t, const void *p, size_t bytes);

size_t cpu_wgrad_bf16_bytes(const struct bk_conv2d *s, int rows, int nc)
{
    const size_t pairs = (size_t)(s->wo + 1) / 2;
    const int halos = imax(1, rows / s->ho); /* a block: part of an image, or whole images */
    return pairs * 4 *
           ((size_t)rows * s->co + (size_t)s->kw * (rows + (size_t)halos * (s->kh - 1)) * nc);
}

/* n 32-bit pairs (lo[i], hi[i]) of bf16 into d; a NULL half is zeros */
static void pair_row(uint32_t *d, const uint16_t *lo, const uint16_t *hi, int n)
{
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i a = lo ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(lo + i)))
                             : _mm512_setzero_si512();
        const __m512i b = hi ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(hi + i)))
                             : _mm512_setzero_si512();
        _mm512_storeu_si512(d + i, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
    }
    for (; i < n; i++)
        d[i] = (lo ? (uint32_t)lo[i] : 0u) | (hi ? (uint32_t)hi[i] << 16 : 0u);
}

/* db (n floats) += lo (n bf16), in fp32 */
static void db_add(float *db, const uint16_t *lo, int n)
{
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)(lo + i)));
        _mm512_storeu_ps(db + i, _mm512_add_ps(_mm512_loadu_ps(db + i),
                                               _mm512_castsi512_ps(_mm512_slli_epi32(a, 16))));
    }
    for (; i < n; i++) {
        const uint32_t u = (uint32_t)lo[i] << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        db[i] += f;
    }
}

/* out (NC, co) += over `rows` rows of `pairs` pairs in each of nimg images: A's CB vectors of
 * 16 channels (pair m of row r of image g at A + g * aimg + r * arow + m * co) times B's NC
 * broadcast pairs (at B + g * bimg + r * brow + m * ci) */
AI void wg_tile(float *out, int co, const uint32_t *A, size_t arow, const uint32_t *B,
                size_t brow, int ci, int rows, int pairs, int nimg, size_t aimg, size_t bimg,
                const int CB, const int NC)
{
    __m512 acc[4][8];
#pragma GCC unroll 4
    for (int b = 0; b < CB; b++)
#pragma GCC unroll 8
        for (int u = 0; u < NC; u++) acc[b][u] = _mm512_setzero_ps();
    for (int g = 0; g < nimg; g++) /* nested, not one divided index: a division per row cost */
        for (int r = 0; r < rows; r++) {
            const uint32_t *a = A + g * aimg + (size_t)r * arow;
            const uint32_t *bp = B + g * bimg + (size_t)r * brow;
            for (int m = 0; m < pairs; m++, a += co, bp += ci) {
                __m512bh av[4];
#pragma GCC unroll 4
                for (int b = 0; b < CB; b++) av[b] = (__m512bh)_mm512_loadu_si512(a + 16 * b);
#pragma GCC unroll 8
                for (int u = 0; u < NC; u++) {
                    const __m512bh bv = (__m512bh)_mm512_set1_epi32((int)bp[u]);
#pragma GCC unroll 4
                    for (int b = 0; b < CB; b++)
                        acc[b][u] = _mm512_dpbf16_ps(acc[b][u], av[b], bv);
                }
            }
        }
#pragma GCC unroll 8
    for (int u = 0; u < NC; u++)
#pragma GCC unroll 4
        for (int b = 0; b < CB; b++) {
            float *o = out + (size_t)u * co + 16 * b;
            _mm512_storeu_ps(o, _mm512_add_ps(_mm512_loadu_ps(o), acc[b][u]));
        }
}

/* wg_tile with CB (1 or 2) and nc (1 .. 8) as constants */
static void wg_tile_any(float *out, int co, const uint32_t *A, size_t arow, const uint32_t *B,
                        size_t brow, int ci, int rows, int pairs, int nimg, size_t aimg,
                        size_t bimg, int cb, int nc)
{
#define WG_CASE(CB, NC)                                                                       \
    case NC:                                                                                  \
        wg_tile(out, co, A, arow, B, brow, ci, rows, pairs, nimg, aimg, bimg, CB, NC);        \
        break;
#define WG_NC(CB)                                                                             \
    switch (nc) {                                                                             \
        WG_CASE(CB, 8)                                                                        \
        WG_CASE(CB, 7)                                                                        \
        WG_CASE(CB, 6)                                                                        \
        WG_CASE(CB, 5)                                                                        \
        WG_CASE(CB, 4)                                                                        \
        WG_CASE(CB, 3)                                                                        \
        WG_CASE(CB, 2)                                                                        \
    default:                                                                                  \
        wg_tile(out, co, A, arow, B, brow, ci, rows, pairs, nimg, aimg, bimg, CB, 1);         \
        break;                                                                                \
    }
    if (cb == 2) {
        WG_NC(2)
    } else {
        WG_NC(1)
    }
#undef WG_NC
#undef WG_CASE
}

void cpu_wgrad_bf16_rows(float *acc, float *db, const uint16_t *dy, const uint16_t *x, int row0,
                         int row1, int c0, int c1, int rb, const struct bk_conv2d *s,
                         void *scratch)
{
    const int ci = c1 - c0, co = s->co, kh = s->kh, kw = s->kw, wo = s->wo;
    const int pairs = (wo + 1) / 2;
    for (int r = row0; r < row1;) {
        /* a block: nimg whole images where rb holds one or more and the range has them, else
         * nr rows of one image */
        const int n = r / s->ho, oy0 = r % s->ho;
        const int nimg = oy0 == 0 && s->ho <= rb && row1 - r >= s->ho
                             ? imin(rb / s->ho, (row1 - r) / s->ho) : 1;
        const int nr = imin(imin(rb, s->ho - oy0), row1 - r), nli = nr + kh - 1;
        r += nimg * nr;
        /* dy's pairs (nimg, nr, pairs, co), then per kx x's channels c0 .. c1 - 1 (nimg, nli,
         * pairs, ci) */
        uint32_t *dyp = scratch, *xp = dyp + (size_t)nimg * nr * pairs * co;
        for (int rr = 0; rr < nimg * nr; rr++) {
            const uint16_t *g =
                dy + ((size_t)(n + rr / nr) * s->ho + oy0 + rr % nr) * wo * co;
            for (int m = 0; m < pairs; m++)
                pair_row(dyp + ((size_t)rr * pairs + m) * co, g + (size_t)2 * m * co,
                         2 * m + 1 < wo ? g + (size_t)(2 * m + 1) * co : NULL, co);
            /* db while the row is in L1: a pass of its own over dy missed in L3 */
            for (int p = 0; db && p < wo; p++) db_add(db, g + (size_t)p * co, co);
        }
        for (int kx = 0; kx < kw; kx++)
            for (int gl = 0; gl < nimg * nli; gl++) {
                const int li = gl % nli, iy = oy0 - s->pad_t + li;
                if (iy < 0 || iy >= s->h) continue; /* not read: its rows are skipped below */
                const uint16_t *xr =
                    x + ((size_t)(n + gl / nli) * s->h + iy) * s->w * s->ci + c0;
                uint32_t *d = xp + ((size_t)kx * nimg * nli + gl) * pairs * ci;
                for (int m = 0; m < pairs; m++) {
                    const int i0 = 2 * m + kx - s->pad_l, i1 = i0 + 1;
                    pair_row(d + (size_t)m * ci,
                             i0 >= 0 && i0 < s->w ? xr + (size_t)i0 * s->ci : NULL,
                             i1 >= 0 && i1 < s->w && 2 * m + 1 < wo ? xr + (size_t)i1 * s->ci
                                                                    : NULL,
                             ci);
                }
            }
        for (int ky = 0; ky < kh; ky++) {
            /* the block's rows rr whose input row oy0 + rr + ky - pad_t is inside x */
            const int lo = imax(0, s->pad_t - ky - oy0), hi = imin(nr, s->h + s->pad_t - ky - oy0);
            if (lo >= hi) continue;
            for (int kx = 0; kx < kw; kx++) {
                float *out = acc + ((size_t)(ky * kw + kx) * s->ci + c0) * co;
                const uint32_t *B = xp + ((size_t)kx * nimg * nli + lo + ky) * pairs * ci;
                const uint32_t *A = dyp + (size_t)lo * pairs * co;
                for (int o = 0; o < co; o += 32) {
                    const int cb = co - o >= 32 ? 2 : 1;
                    for (int c = 0; c < ci; c += 8)
                        wg_tile_any(out + (size_t)c * co + o, co, A + o, (size_t)pairs * co,
                                    B + c, (size_t)pairs * ci, ci, hi - lo, pairs, nimg,
                                    (size_t)nr * pairs * co, (size_t)nli * pairs * ci, cb,
                                    imin(8, ci - c));
                }
            }
        }
    }
}

#include "target512_pop.h"
