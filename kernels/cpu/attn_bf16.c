/* attn_bf16.c - the tiled attention (attention.c's schedule: FlashAttention-2's forward and
 * backward) on bf16 q, k, v, o, dout, dq, dk, dv with AVX512-BF16's vdpbf16ps (two bf16 products
 * summed into each fp32 lane). Called by attention.c only where cpu_isa() reports AVX512-BF16.
 *
 * The five products run on vdpbf16ps register tiles with fp32 accumulators: S = Q K^T and
 * dP = dO V^T on the bf16 operands as given (exact products), O += P V, dQ += dS K,
 * dK += dS^T Q and dV += P^T dO with P and dS rounded to bf16 first, as FlashAttention-2 does on
 * 16-bit inputs. The softmax, its statistics (m, l, lse, Di) and every sum stay fp32 (attn512.c's
 * softmax and dsoftmax steps on scores in base 2, exp2x512, storing P and dS rounded to bf16
 * straight into the products' layouts); each output element is rounded once to nearest even, as kernels/half.h. A 32-bit element "pair" below is two bf16 along the product's
 * summed index, the low half first: vdpbf16ps's operand layout.
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <string.h>

#include "attn_tiles.h"
#include "cpu.h"
#include "half.h"

#define TARGET512_BF16
#include "target512_push.h"

#include "attn512.h"

typedef uint16_t bf16;

static int imin(int a, int b) { return a < b ? a : b; }
static int round16(int x) { return (x + 15) / 16 * 16; }
static size_t al64(size_t b) { return (b + 63) & ~(size_t)63; }

/* the scores are kept in base 2 (S log2 e, lse log2 e), so that each exponential is exp2x512's
 * 2^x: the products' scale times log2 e, and lse to and from base 2 in double */
#define LOG2E 1.4426950408889634
#define LN2 0.6931471805599453
static float scale2(float scale) { return (float)(scale * LOG2E); }
static float lse_to2(float lse) { return (float)(lse * LOG2E); }

/* x rounded to bf16 as half_f32_to_bf16 (nearest even, NaN kept quiet): the bits in the low
 * half of each 32-bit lane */
AI __m512i bf16_lo(__m512 x)
{
    const __m512i u = _mm512_castps_si512(x);
    const __m512i hi = _mm512_srli_epi32(u, 16);
    const __m512i odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    const __m512i r =
        _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), odd), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                  _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_or_epi32(r, nan, hi, _mm512_set1_epi32(0x40));
}

/* 16 bf16 (the low halves of b's lanes) stored under mask k */
AI void store16(bf16 *y, __mmask16 k, __m512i b)
{
    _mm256_mask_storeu_epi16(y, k, _mm512_cvtepi32_epi16(b));
}

/* y (d bf16) = round(x (d fp32) mul) */
static void store_row(bf16 *y, const float *x, int d, float mul)
{
    const __m512 vm = _mm512_set1_ps(mul);
    for (int e = 0; e < d; e += 16) {
        const __mmask16 k = lanes(d - e);
        const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, x + e), vm);
        store16(y + e, k, bf16_lo(v));
    }
}

/* ---- packing the bf16 operands into pairs ---- */

static inline uint32_t pair(bf16 lo, bf16 hi) { return (uint32_t)lo | (uint32_t)hi << 16; }

/* c[j] = lane j of r[0 .. 15] (a 16 x 16 transpose of 32-bit lanes): pairs of rows
 * interleaved by 32 bits, then by 64, then 128-bit lanes combined twice; lane k of u[4 g + j]
 * holds rows 4 g .. 4 g + 3 of column j + 4 k */
AI void transpose16(__m512i c[16], const __m512i r[16])
{
    __m512i t[16], u[16], v[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int g = 0; g < 16; g += 4) {
        u[g] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
        u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
        u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
        u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    for (int h = 0; h < 16; h += 8)
        for (int j = 0; j < 4; j++) { /* [rows h..h+3 | h+4..h+7] of columns j, j + 8; j + 4, j + 12 */
            v[h + j] = _mm512_shuffle_i32x4(u[h + j], u[h + 4 + j], 0x88);
            v[h + 4 + j] = _mm512_shuffle_i32x4(u[h + j], u[h + 4 + j], 0xdd);
        }
    for (int j = 0; j < 8; j++) {
        c[j] = _mm512_shuffle_i32x4(v[j], v[8 + j], 0x88);
        c[j + 8] = _mm512_shuffle_i32x4(v[j], v[8 + j], 0xdd);
    }
}

/* along the features, transposed: t[ep ldt + r] = (x_r[2 ep], x_r[2 ep + 1]) for the rows
 * r < n of x (stride ldx, d columns); zero for r in [n, np) and for the feature d when d is odd.
 * Blocks of 16 rows x 16 pairs through registers (transpose16; the pairs as they lie in the
 * rows): the element-wise transpose's scattered stores were a fifth of the plain form's forward
 * at L 256 */
static void pack_e(uint32_t *t, size_t ldt, const bf16 *x, size_t ldx, int n, int np, int d)
{
    const int dp = (d + 1) / 2, de = d / 2;
    for (int r0 = 0; r0 < n; r0 += 16) {
        const int nr = imin(16, n - r0);
        const __mmask16 kr = lanes(nr);
        for (int e0 = 0; e0 < de; e0 += 16) {
            const int ne = imin(16, de - e0);
            const __mmask16 ke = lanes(ne);
            __m512i r[16], c[16];
            for (int i = 0; i < 16; i++)
                r[i] = i < nr ? _mm512_maskz_loadu_epi32(ke, x + (size_t)(r0 + i) * ldx + 2 * e0)
                              : _mm512_setzero_si512();
            transpose16(c, r);
            for (int j = 0; j < ne; j++)
                _mm512_mask_storeu_epi32(t + (size_t)(e0 + j) * ldt + r0, kr, c[j]);
        }
        if (d % 2)
            for (int r = r0; r < r0 + nr; r++)
                t[(size_t)de * ldt + r] = pair(x[(size_t)r * ldx + d - 1], 0);
    }
    for (int ep = 0; ep < dp; ep++)
        for (int r = n; r < np; r++) t[(size_t)ep * ldt + r] = 0;
}

/* along the rows: t[rp d + e] = (x_{2 rp}[e], x_{2 rp + 1}[e]) for the rows of x (n of stride
 * ldx, d columns), the partner of row n - 1 zero when n is odd */
static void pack_r(uint32_t *t, const bf16 *x, size_t ldx, int n, int d)
{
    for (int rp = 0; rp < (n + 1) / 2; rp++) {
        const bf16 *x0 = x + (size_t)(2 * rp) * ldx, *x1 = x0 + ldx;
        const int two = 2 * rp + 1 < n;
        uint32_t *tr = t + (size_t)rp * d;
        for (int e = 0; e < d; e += 16) {
            const __mmask16 k = lanes(d - e), k1 = two ? k : 0;
            const __m512i a = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, x0 + e));
            const __m512i b = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k1, x1 + e));
            _mm512_mask_storeu_epi32(tr + e, k, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
        }
    }
}

/* ---- the softmax steps of attn512.c on scores in base 2 (2^(s - m) by exp2x512: within 2 ulp
 * where exp512 is within 1), storing P and dS rounded to bf16 in the products' layouts by
 * vcvtneps2bf16 (nearest even; fp32 subnormals, p < 2^-126, become 0) ---- */

/* a mask of the first n lanes, none for n <= 0 */
AI __mmask16 lanes0(int n) { return n <= 0 ? 0 : lanes(n); }

/* softmax16's rows r < R from S (stride lds), R rows at once so that their exponentials' chains
 * interleave: each row's max, then 2^(s - max) over 32 columns a step, summed in column order
 * per row and stored as 32 bf16 by one vcvtne2ps2bf16 */
AI void softmax_rows(const float *S, size_t lds, float *mrow, float *lrow, float *O, size_t ldo,
                     bf16 *P, size_t ldp, int nc, int d, int first, const int R)
{
    const int nc2 = nc + nc % 2;
    __m512 vmx[4], vs[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) vmx[r] = _mm512_set1_ps(first ? -INFINITY : mrow[r]);
    for (int c = 0; c < nc; c += 16) {
        const __mmask16 k = lanes(nc - c);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            vmx[r] = _mm512_max_ps(
                vmx[r], _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), k, S + (size_t)r * lds + c));
    }
    float mx[4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        mx[r] = _mm512_reduce_max_ps(vmx[r]);
        vmx[r] = _mm512_set1_ps(mx[r]);
        vs[r] = _mm512_setzero_ps();
    }
    for (int c = 0; c < nc; c += 32) {
        const __mmask16 k0 = lanes(nc - c), k1 = lanes0(nc - c - 16);
        const __mmask32 k2 = (__mmask32)(nc2 - c >= 32 ? 0xffffffffu : (1u << (nc2 - c)) - 1u);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const float *sr = S + (size_t)r * lds + c;
            const __m512 p0 = _mm512_maskz_mov_ps(
                k0, exp2x512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k0, sr), vmx[r])));
            const __m512 p1 = _mm512_maskz_mov_ps(
                k1, exp2x512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k1, sr + 16), vmx[r])));
            vs[r] = _mm512_add_ps(_mm512_add_ps(vs[r], p0), p1);
            _mm512_mask_storeu_epi16(P + (size_t)r * ldp + c, k2,
                                     (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const float sum = _mm512_reduce_add_ps(vs[r]);
        if (!first) {
            const float alpha = _mm512_cvtss_f32(exp2x512(_mm512_set1_ps(mrow[r] - mx[r])));
            lrow[r] = lrow[r] * alpha + sum;
            if (alpha != 1.0f) {
                float *orow = O + (size_t)r * ldo;
                const __m512 va = _mm512_set1_ps(alpha);
                for (int e = 0; e < d; e += 16) {
                    const __mmask16 k = lanes(d - e);
                    _mm512_mask_storeu_ps(orow + e, k,
                                          _mm512_mul_ps(_mm512_maskz_loadu_ps(k, orow + e), va));
                }
            }
        } else {
            lrow[r] = sum;
        }
        mrow[r] = mx[r];
    }
}

/* the forward's online softmax over one key block (attn_tiles.h's softmax), P stored rounded
 * to bf16 rows (stride ldp, pairs along the keys; the column after an odd nc zero) */
static void softmax16(const float *S, size_t lds, float *mrow, float *lrow, float *O, size_t ldo,
                      bf16 *P, size_t ldp, int nr, int nc, int d, int first)
{
    int r = 0;
    for (; r + 4 <= nr; r += 4)
        softmax_rows(S + (size_t)r * lds, lds, mrow + r, lrow + r, O + (size_t)r * ldo, ldo,
                     P + (size_t)r * ldp, ldp, nc, d, first, 4);
    for (; r < nr; r++)
        softmax_rows(S + (size_t)r * lds, lds, mrow + r, lrow + r, O + (size_t)r * ldo, ldo,
                     P + (size_t)r * ldp, ldp, nc, d, first, 1);
}

/* dsoftmax16's row pairs rp < RP (rows r0 = 2 rp, r0 + 1; `two`: whether the last pair's second
 * row exists), RP pairs at once so that their exponentials' chains interleave */
AI void dsoftmax_pairs(const float *P, const float *dS, size_t ld, const float *lse,
                       const float *sdi, int nc, int two, uint32_t *prp, uint32_t *dsrp,
                       size_t ldr, bf16 *ds16, size_t ld16, const int RP)
{
    const int nc2 = nc + nc % 2;
    /* 16-bit lane 2i from lane i, 2i + 1 from lane 16 + i */
    const __m512i zip = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    __m512 vl[2][2], vd[2][2];
#pragma GCC unroll 2
    for (int q = 0; q < RP; q++) {
        const int t1 = q < RP - 1 || two;
        vl[q][0] = _mm512_set1_ps(lse_to2(lse[2 * q]));
        vd[q][0] = _mm512_set1_ps(sdi[2 * q]);
        vl[q][1] = _mm512_set1_ps(t1 ? lse_to2(lse[2 * q + 1]) : 0.0f);
        vd[q][1] = _mm512_set1_ps(t1 ? sdi[2 * q + 1] : 0.0f);
    }
    for (int c = 0; c < nc; c += 16) {
        const __mmask16 k = lanes(nc - c), k16 = lanes(nc2 - c);
#pragma GCC unroll 2
        for (int q = 0; q < RP; q++) {
            const int t1 = q < RP - 1 || two;
            const __mmask16 k1 = t1 ? k : 0;
            const float *p0 = P + (size_t)(2 * q) * ld + c, *d0 = dS + (size_t)(2 * q) * ld + c;
            const __m512 pa = _mm512_maskz_mov_ps(
                k, exp2x512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, p0), vl[q][0])));
            const __m512 da = _mm512_mul_ps(pa, _mm512_sub_ps(_mm512_maskz_loadu_ps(k, d0), vd[q][0]));
            const __m512 pb = _mm512_maskz_mov_ps(
                k1, exp2x512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k1, p0 + ld), vl[q][1])));
            const __m512 db =
                _mm512_mul_ps(pb, _mm512_sub_ps(_mm512_maskz_loadu_ps(k1, d0 + ld), vd[q][1]));
            /* [row r0's 16 | row r0 + 1's 16] in bf16, then interleaved into pairs */
            const __m512i hp = (__m512i)_mm512_cvtne2ps_pbh(pb, pa);
            const __m512i hd = (__m512i)_mm512_cvtne2ps_pbh(db, da);
            _mm512_mask_storeu_epi32(prp + (size_t)q * ldr + c, k, _mm512_permutexvar_epi16(zip, hp));
            _mm512_mask_storeu_epi32(dsrp + (size_t)q * ldr + c, k,
                                     _mm512_permutexvar_epi16(zip, hd));
            _mm256_mask_storeu_epi16(ds16 + (size_t)(2 * q) * ld16 + c, k16,
                                     _mm512_castsi512_si256(hd));
            if (t1)
                _mm256_mask_storeu_epi16(ds16 + (size_t)(2 * q + 1) * ld16 + c, k16,
                                         _mm512_extracti64x4_epi64(hd, 1));
        }
    }
}

/* the backward's step (attn_tiles.h's dsoftmax) on the scores P (base 2) and dP (times scale,
 * fp32, stride ld): p = 2^(P - lse_r log2 e), ds = p (dP - scale di_r) (sdi: scale di), stored
 * rounded to bf16 as p and ds in pairs along the rows (prp, dsrp: stride ldr; the partner of row
 * nr - 1 zero when nr is odd) and ds in rows (ds16, stride ld16; the column after an odd nc
 * zero) */
static void dsoftmax16(const float *P, const float *dS, size_t ld, const float *lse,
                       const float *sdi, int nr, int nc, uint32_t *prp, uint32_t *dsrp,
                       size_t ldr, bf16 *ds16, size_t ld16)
{
    const int np = (nr + 1) / 2;
    int rp = 0;
    for (; rp + 2 <= np; rp += 2)
        dsoftmax_pairs(P + (size_t)(2 * rp) * ld, dS + (size_t)(2 * rp) * ld, ld, lse + 2 * rp,
                       sdi + 2 * rp, nc, 2 * rp + 3 < nr, prp + (size_t)rp * ldr,
                       dsrp + (size_t)rp * ldr, ldr, ds16 + (size_t)(2 * rp) * ld16, ld16, 2);
    for (; rp < np; rp++)
        dsoftmax_pairs(P + (size_t)(2 * rp) * ld, dS + (size_t)(2 * rp) * ld, ld, lse + 2 * rp,
                       sdi + 2 * rp, nc, 2 * rp + 1 < nr, prp + (size_t)rp * ldr,
                       dsrp + (size_t)rp * ldr, ldr, ds16 + (size_t)(2 * rp) * ld16, ld16, 1);
}

/* ---- S (nr, ncp) = alpha A B^T over dp feature pairs: A and B packed along the features
 * (A[ep apl + r], B[ep ldb + c]); R rows x 16 NC columns per register tile ---- */
AI void abt_tile(float *S, size_t lds, const uint32_t *A, size_t apl, const uint32_t *B,
                 size_t ldb, int dp, __m512 va, const int R, const int NC)
{
    __m512 acc[12][2];
#pragma GCC unroll 12
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int u = 0; u < NC; u++) acc[r][u] = _mm512_setzero_ps();
    for (int ep = 0; ep < dp; ep++) {
        __m512bh b[2];
#pragma GCC unroll 2
        for (int u = 0; u < NC; u++)
            b[u] = (__m512bh)_mm512_loadu_si512(B + (size_t)ep * ldb + 16 * u);
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)A[(size_t)ep * apl + r]);
#pragma GCC unroll 2
            for (int u = 0; u < NC; u++) acc[r][u] = _mm512_dpbf16_ps(acc[r][u], a, b[u]);
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int u = 0; u < NC; u++)
            _mm512_storeu_ps(S + (size_t)r * lds + 16 * u, _mm512_mul_ps(acc[r][u], va));
}

AI void abt_rows(float *S, size_t lds, const uint32_t *A, size_t apl, const uint32_t *B,
                 size_t ldb, int ncp, int dp, __m512 va, const int R)
{
    int c = 0;
    for (; c + 32 <= ncp; c += 32) abt_tile(S + c, lds, A, apl, B + c, ldb, dp, va, R, 2);
    if (c < ncp) abt_tile(S + c, lds, A, apl, B + c, ldb, dp, va, R, 1);
}

static void abt16(float *S, size_t lds, const uint32_t *A, size_t apl, const uint32_t *B,
                  size_t ldb, int ncp, int nr, int dp, float alpha)
{
    const __m512 va = _mm512_set1_ps(alpha);
    int r = 0;
    for (; r + 12 <= nr; r += 12)
        abt_rows(S + (size_t)r * lds, lds, A + r, apl, B, ldb, ncp, dp, va, 12);
    for (; r + 4 <= nr; r += 4)
        abt_rows(S + (size_t)r * lds, lds, A + r, apl, B, ldb, ncp, dp, va, 4);
    for (; r < nr; r++) abt_rows(S + (size_t)r * lds, lds, A + r, apl, B, ldb, ncp, dp, va, 1);
}

/* ---- Y (ny, d) fp32 (+)= W X over nt pairs t of the summed index: W_jt = W[j sw + t st] (a
 * pair), X packed along it (X[t ldx + e]); R rows x NV vectors of X's columns per register
 * tile, the last vector masked by m; CSW > 0 makes sw that constant (attn512.c's wx_tile) ---- */
AI void wx_tile(float *Y, size_t ldy, const uint32_t *W, size_t sw, size_t st, const uint32_t *X,
                size_t ldx, int nt, int acc_y, __mmask16 m, const int R, const int NV,
                const int CSW)
{
    __m512 acc[16][4];
    const size_t swc = CSW > 0 ? (size_t)CSW : sw;
#pragma GCC unroll 16
    for (int j = 0; j < R; j++)
#pragma GCC unroll 4
        for (int u = 0; u < NV; u++) acc[j][u] = _mm512_setzero_ps();
    for (int t = 0; t < nt; t++) {
        __m512bh x[4];
        const uint32_t *wt = W + (size_t)t * st;
#pragma GCC unroll 4
        for (int u = 0; u < NV; u++)
            x[u] = (__m512bh)(u == NV - 1 ? _mm512_maskz_loadu_epi32(m, X + (size_t)t * ldx + 16 * u)
                                          : _mm512_loadu_si512(X + (size_t)t * ldx + 16 * u));
#pragma GCC unroll 16
        for (int j = 0; j < R; j++) {
            const __m512bh w = (__m512bh)_mm512_set1_epi32((int)wt[(size_t)j * swc]);
#pragma GCC unroll 4
            for (int u = 0; u < NV; u++) acc[j][u] = _mm512_dpbf16_ps(acc[j][u], w, x[u]);
        }
    }
    wx_tile_store(Y, ldy, acc, R, NV, m, acc_y);
}

/* W's row stride: 1 (the pairs along the rows: dK, dV) or 64 (a 128-key tile's bf16 rows: O,
 * dQ) as constants */
#define WX_NV(R, NV)                                                                          \
    do {                                                                                      \
        if (sw == 1) WX_ROWS(R, NV, 1);                                                       \
        else if (sw == ATTN_BC / 2) WX_ROWS(R, NV, ATTN_BC / 2);                              \
        else WX_ROWS((R < 6 ? R : 6), NV, 0);                                                 \
    } while (0)

static void wx16(float *Y, size_t ldy, const uint32_t *W, size_t sw, size_t st, const uint32_t *X,
                 size_t ldx, int ny, int nt, int d, int acc_y)
{
    for (int c0 = 0; c0 < d; c0 += 64) {
        const int w = imin(64, d - c0), nv = (w + 15) / 16;
        float *Yc = Y + c0;
        const uint32_t *Xc = X + c0;
        const __mmask16 m = lanes(w - 16 * (nv - 1));
        switch (nv) {
        case 1: WX_NV(16, 1); break;
        case 2: WX_NV(12, 2); break;
        case 3: WX_NV(8, 3); break;
        default: WX_NV(6, 4); break;
        }
    }
}

/* ---- the workspace ---- */

/* a thread's slot, byte offsets. Forward: S (br, bc) fp32, P (br, bc) bf16, m and l (br), O
 * (br, d) fp32, the query block packed along the features (dp, qtl), the pair's k likewise
 * (dp, l16) and v along the keys ((L + 1) / 2, d). Backward: P and dS (br, bc) fp32, P and dS in
 * pairs along the rows ((br + 1) / 2, bc), dS in bf16 rows (br, bc), scale Di (L), the key block's k
 * and v packed along the features (dp, bc) and k along the keys (bc / 2, d), dK and dV (bc, d)
 * fp32, the pair's q and dout packed along the features (dp, l16) and along the rows
 * ((L + 1) / 2, d), and its dq accumulated in fp32 (L, d). */
enum { F_S, F_P, F_M, F_L, F_O, F_QT, F_KT, F_VP, F_END };
enum { B_P, B_DS, B_PRP, B_DSRP, B_DS16, B_DI, B_KT, B_VT, B_KC, B_DK, B_DV, B_QT, B_DOT, B_QR,
       B_DOR, B_DQ, B_END };

static size_t slot_layout(const struct bk_attn *s, int bwd, size_t *off)
{
    const size_t L = (size_t)s->l, d = (size_t)s->d, dp = (d + 1) / 2;
    const size_t br = (size_t)imin(ATTN_BR, s->l), bc = (size_t)round16(imin(ATTN_BC, s->l));
    const size_t qtl = (size_t)round16(imin(ATTN_BR, s->l)), l16 = (size_t)round16(s->l);
    const size_t lp = (L + 1) / 2, f = sizeof(float), u = sizeof(uint32_t);
    size_t fwd[F_END] = {br * bc * f, br * bc * 2, br * f, br * f, br * d * f, dp * qtl * u,
                         dp * l16 * u, lp * d * u};
    size_t bw[B_END] = {br * bc * f, br * bc * f, (br + 1) / 2 * bc * u, (br + 1) / 2 * bc * u,
                        br * bc * 2, L * f, dp * bc * u, dp * bc * u, bc / 2 * d * u,
                        bc * d * f, bc * d * f, dp * l16 * u, dp * l16 * u, lp * d * u,
                        lp * d * u, L * d * f};
    const size_t *sz = bwd ? bw : fwd;
    const int n = bwd ? B_END : F_END;
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        if (off) off[i] = at;
        at += al64(sz[i]);
    }
    return at;
}

static size_t slot_bytes(const struct bk_attn *s)
{
    const size_t f = slot_layout(s, 0, NULL), b = slot_layout(s, 1, NULL);
    return f > b ? f : b;
}

size_t attn_bf16_ws_bytes(const struct bk_attn *s, int procs, int chunks)
{
    size_t b = (size_t)procs * slot_bytes(s);
    if (chunks > 1) b += (size_t)s->n * s->heads * chunks * s->l * s->d * sizeof(float);
    return b;
}

/* row pointers: strided inputs (q, k, v, dq, dk, dv) and dense (o, dout) */
#define ROW_LD(p, ni, i, h) ((p) + ((size_t)(ni) * L + (i)) * ld + (size_t)(h) * D)
#define ROW_HD(p, ni, i, h) ((p) + ((size_t)(ni) * L + (i)) * hd + (size_t)(h) * D)

void attn_bf16_fwd(void *ov, float *lse, const void *qv, const void *kv, const void *vv, void *ws,
                   const struct bk_attn *s, int nt)
{
    bf16 *o = ov;
    const bf16 *q = qv, *k = kv, *v = vv;
    const int L = s->l, H = s->heads, D = s->d, dp = (D + 1) / 2;
    const size_t ld = (size_t)s->ld, hd = (size_t)H * D, slot = slot_bytes(s);
    const int nqb = (L + ATTN_BR - 1) / ATTN_BR, tasks = s->n * H * nqb;
    const int bc = round16(imin(ATTN_BC, L)), qtl = round16(imin(ATTN_BR, L)), l16 = round16(L);
    size_t off[F_END];
    slot_layout(s, 0, off);
#pragma omp parallel num_threads(nt)
    {
        char *base = (char *)ws + (size_t)omp_get_thread_num() * slot;
        float *sc = (float *)(base + off[F_S]), *m = (float *)(base + off[F_M]);
        float *l = (float *)(base + off[F_L]), *oa = (float *)(base + off[F_O]);
        bf16 *p16 = (bf16 *)(base + off[F_P]);
        uint32_t *qt = (uint32_t *)(base + off[F_QT]), *kt = (uint32_t *)(base + off[F_KT]);
        uint32_t *vp = (uint32_t *)(base + off[F_VP]);
        int packed = -1; /* the pair whose k and v are in kt, vp */
#pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < tasks; t++) {
            const int qb = t % nqb, h = (t / nqb) % H, ni = t / (nqb * H);
            const int i0 = qb * ATTN_BR, nr = imin(L - i0, ATTN_BR);
            pack_e(qt, (size_t)qtl, ROW_LD(q, ni, i0, h), ld, nr, qtl, D);
            if (packed != t / nqb) {
                pack_e(kt, (size_t)l16, ROW_LD(k, ni, 0, h), ld, L, l16, D);
                pack_r(vp, ROW_LD(v, ni, 0, h), ld, L, D);
                packed = t / nqb;
            }
            /* attention.c's forward: oa the running unnormalised output, in fp32 */
            for (int j0 = 0; j0 < L; j0 += ATTN_BC) {
                const int nc = imin(L - j0, ATTN_BC);
                abt16(sc, (size_t)bc, qt, (size_t)qtl, kt + j0, (size_t)l16, round16(nc), nr, dp,
                      scale2(s->scale));
                softmax16(sc, (size_t)bc, m, l, oa, (size_t)D, p16, (size_t)bc, nr, nc, D, j0 == 0);
                wx16(oa, (size_t)D, (const uint32_t *)p16, (size_t)bc / 2, 1,
                     vp + (size_t)(j0 / 2) * D, (size_t)D, nr, (nc + 1) / 2, D, j0 != 0);
            }
            for (int r = 0; r < nr; r++) {
                store_row(ROW_HD(o, ni, i0 + r, h), oa + (size_t)r * D, D, 1.0f / l[r]);
                lse[((size_t)ni * H + h) * L + i0 + r] = (float)(m[r] * LN2 + log(l[r]));
            }
        }
    }
}

void attn_bf16_bwd(void *dqv, void *dkv, void *dvv, const void *doutv, const void *qv,
                   const void *kv, const void *vv, const void *ov, const float *lse, void *ws,
                   const struct bk_attn *s, int nt, int nch)
{
    bf16 *dq = dqv, *dk = dkv, *dv = dvv;
    const bf16 *dout = doutv, *q = qv, *k = kv, *v = vv, *o = ov;
    const int L = s->l, H = s->heads, D = s->d, dp = (D + 1) / 2;
    const size_t ld = (size_t)s->ld, hd = (size_t)H * D, slot = slot_bytes(s);
    const float scale = s->scale;
    const int pairs = s->n * H, nkb = (L + ATTN_BC - 1) / ATTN_BC;
    const int bc = round16(imin(ATTN_BC, L)), l16 = round16(L);
    size_t off[B_END];
    slot_layout(s, 1, off);
    /* a split pair's chunk c sums its dq into part + (pair nch + c) L D, dense (L, D) */
    float *part = (float *)((char *)ws + (size_t)cpu_threads(NULL) * slot);

    /* attention.c's backward, per tile: p = exp(scale q k^T - lse), dp = dout v^T,
     * ds = scale p (dp - Di), dv += p^T dout, dk += ds^T q, dq += ds k */
#pragma omp parallel num_threads(nt)
    {
        char *base = (char *)ws + (size_t)omp_get_thread_num() * slot;
        float *pt = (float *)(base + off[B_P]), *dst = (float *)(base + off[B_DS]);
        uint32_t *prp = (uint32_t *)(base + off[B_PRP]), *dsrp = (uint32_t *)(base + off[B_DSRP]);
        bf16 *ds16 = (bf16 *)(base + off[B_DS16]);
        float *di = (float *)(base + off[B_DI]);
        uint32_t *kt = (uint32_t *)(base + off[B_KT]), *vt = (uint32_t *)(base + off[B_VT]);
        uint32_t *kc = (uint32_t *)(base + off[B_KC]);
        float *dka = (float *)(base + off[B_DK]), *dva = (float *)(base + off[B_DV]);
        uint32_t *qt = (uint32_t *)(base + off[B_QT]), *dot = (uint32_t *)(base + off[B_DOT]);
        uint32_t *qr = (uint32_t *)(base + off[B_QR]), *dor = (uint32_t *)(base + off[B_DOR]);
        float *dqs = (float *)(base + off[B_DQ]);
#pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < pairs * nch; t++) {
            const int ch = t % nch, pr = t / nch, h = pr % H, ni = pr / H;
            const int kb0 = (int)((long long)ch * nkb / nch);
            const int kb1 = (int)((long long)(ch + 1) * nkb / nch);
            const float *lrow = lse + ((size_t)ni * H + h) * L;
            float *dqa = nch > 1 ? part + (size_t)t * L * D : dqs;
            pack_e(qt, (size_t)l16, ROW_LD(q, ni, 0, h), ld, L, l16, D);
            pack_e(dot, (size_t)l16, ROW_HD(dout, ni, 0, h), hd, L, l16, D);
            pack_r(qr, ROW_LD(q, ni, 0, h), ld, L, D);
            pack_r(dor, ROW_HD(dout, ni, 0, h), hd, L, D);
            for (int i = 0; i < L; i++) {
                const bf16 *dor_i = ROW_HD(dout, ni, i, h), *orow = ROW_HD(o, ni, i, h);
                float acc = 0.0f;
                for (int e = 0; e < D; e++)
                    acc += half_bf16_to_f32(dor_i[e]) * half_bf16_to_f32(orow[e]);
                di[i] = scale * acc;
            }
            for (int jb = kb0; jb < kb1; jb++) {
                const int j0 = jb * ATTN_BC, nc = imin(L - j0, ATTN_BC), ncp = round16(nc);
                pack_e(kt, (size_t)ncp, ROW_LD(k, ni, j0, h), ld, nc, ncp, D);
                pack_e(vt, (size_t)ncp, ROW_LD(v, ni, j0, h), ld, nc, ncp, D);
                pack_r(kc, ROW_LD(k, ni, j0, h), ld, nc, D);
                for (int i0 = 0; i0 < L; i0 += ATTN_BR) {
                    const int nr = imin(L - i0, ATTN_BR), nrp = (nr + 1) / 2;
                    abt16(pt, (size_t)bc, qt + i0, (size_t)l16, kt, (size_t)ncp, ncp, nr, dp,
                          scale2(scale));
                    abt16(dst, (size_t)bc, dot + i0, (size_t)l16, vt, (size_t)ncp, ncp, nr, dp,
                          scale);
                    dsoftmax16(pt, dst, (size_t)bc, lrow + i0, di + i0, nr, nc, prp, dsrp,
                               (size_t)bc, ds16, (size_t)bc);
                    wx16(dva, (size_t)D, prp, 1, (size_t)bc, dor + (size_t)(i0 / 2) * D, (size_t)D,
                         nc, nrp, D, i0 != 0);
                    wx16(dka, (size_t)D, dsrp, 1, (size_t)bc, qr + (size_t)(i0 / 2) * D, (size_t)D,
                         nc, nrp, D, i0 != 0);
                    wx16(dqa + (size_t)i0 * D, (size_t)D, (const uint32_t *)ds16, (size_t)bc / 2, 1,
                         kc, (size_t)D, nr, (nc + 1) / 2, D, jb > kb0);
                }
                for (int c = 0; c < nc; c++) {
                    store_row(ROW_LD(dk, ni, j0 + c, h), dka + (size_t)c * D, D, 1.0f);
                    store_row(ROW_LD(dv, ni, j0 + c, h), dva + (size_t)c * D, D, 1.0f);
                }
            }
            if (nch == 1)
                for (int i = 0; i < L; i++)
                    store_row(ROW_LD(dq, ni, i, h), dqa + (size_t)i * D, D, 1.0f);
        }
        if (nch > 1) {
            /* dq = the chunks' sums added in chunk order, rounded once */
#pragma omp for schedule(static)
            for (int r = 0; r < pairs * L; r++) {
                const int pr = r / L, i = r % L, h = pr % H, ni = pr / H;
                bf16 *dst_row = ROW_LD(dq, ni, i, h);
                const float *p0 = part + ((size_t)pr * nch * L + i) * D;
                for (int e = 0; e < D; e++) {
                    float acc = p0[e];
                    for (int c = 1; c < nch; c++) acc += p0[(size_t)c * L * D + e];
                    dst_row[e] = half_f32_to_bf16(acc);
                }
            }
        }
    }
}

/* ---- the plain form: per (n, h) pair, S = Q K^T (L, L) on the bf16 operands as given,
 * p = softmax(scale S) by rows in fp32 (saved, the op's output), O = P V with P rounded to bf16;
 * backward dP = dO V^T, dS = scale p (dP - rowsum(p dP)) in fp32, dQ = dS K, dK = dS^T Q,
 * dV = P^T dO with P and dS rounded to bf16 (the tiled form's roundings, no recomputed S: one
 * product fewer than its backward). The same tiles as the tiled form, one pair on one thread
 * from packing to the stored outputs. ---- */

/* a thread's slot, byte offsets: S or dP (L, l16) fp32, P or dS in bf16 rows (L, l16), P and dS
 * in pairs along the rows ((L + 1) / 2, l16), the products' A and B packed along the features
 * (dp, l16), X packed along the rows ((L + 1) / 2, d) and a product's fp32 result (L, d) */
enum { PL_S, PL_P16, PL_PRP, PL_DSRP, PL_AT, PL_BT, PL_XR, PL_ACC, PL_END };

static size_t plain_layout(const struct bk_attn *s, size_t *off)
{
    const size_t L = (size_t)s->l, d = (size_t)s->d, dp = (d + 1) / 2, l16 = (size_t)round16(s->l);
    const size_t lp = (L + 1) / 2, f = sizeof(float), u = sizeof(uint32_t);
    const size_t sz[PL_END] = {L * l16 * f, L * l16 * 2, lp * l16 * u, lp * l16 * u,
                               dp * l16 * u, dp * l16 * u, lp * d * u, L * d * f};
    size_t at = 0;
    for (int i = 0; i < PL_END; i++) {
        if (off) off[i] = at;
        at += al64(sz[i]);
    }
    return at;
}

static int plain_threads(const struct bk_attn *s, int nt) { return imin(s->n * s->heads, nt); }

size_t attn_bf16_plain_ws_bytes(const struct bk_attn *s, int procs)
{
    return (size_t)plain_threads(s, procs) * plain_layout(s, NULL);
}

/* p rows (L fp32, stride L) = softmax of the base-2 scores S (stride lds): 2^(s - max) / sum,
 * the sum over 16 lanes in column order; P16 rows (stride ldp) the same rounded to bf16, the
 * column after an odd L zero (the pair's partner in P V) */
static void plain_softmax16(float *S, size_t lds, float *p, bf16 *P16, size_t ldp, int nr, int L)
{
    const int l2 = L + L % 2;
    for (int r = 0; r < nr; r++) {
        float *sr = S + (size_t)r * lds, *pr = p + (size_t)r * L;
        __m512 vmx = _mm512_set1_ps(-INFINITY), vs = _mm512_setzero_ps();
        for (int c = 0; c < L; c += 16)
            vmx = _mm512_max_ps(vmx, _mm512_mask_loadu_ps(vmx, lanes(L - c), sr + c));
        vmx = _mm512_set1_ps(_mm512_reduce_max_ps(vmx));
        for (int c = 0; c < L; c += 16) {
            const __mmask16 k = lanes(L - c);
            const __m512 e =
                _mm512_maskz_mov_ps(k, exp2x512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sr + c), vmx)));
            vs = _mm512_add_ps(vs, e);
            _mm512_mask_storeu_ps(sr + c, k, e);
        }
        const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vs));
        for (int c = 0; c < l2; c += 16) {
            const __mmask16 k = lanes(L - c), k2 = lanes(l2 - c);
            const __m512 pc = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, sr + c), inv);
            _mm512_mask_storeu_ps(pr + c, k, pc);
            store16(P16 + (size_t)r * ldp + c, k2, bf16_lo(pc));
        }
    }
}

/* the backward's rows r0 = 2 rp, r0 + 1 (`two`: whether the second exists) from p (fp32, stride
 * L) and dP (stride ld): ds = scale p (dP - sum_c p dP), the sums over 16 lanes in column order;
 * p and ds rounded to bf16 in pairs along the rows (prp, dsrp) and ds in rows (ds16, stride
 * ld16; the column after an odd L zero) */
static void plain_dsoftmax_pair(const float *p, const float *dP, size_t ld, int L, int two,
                                float scale, uint32_t *prp, uint32_t *dsrp, bf16 *ds16, size_t ld16)
{
    /* 16-bit lane 2i from lane i, 2i + 1 from lane 16 + i (dsoftmax_pairs') */
    const __m512i zip = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const int l2 = L + L % 2;
    const float *p1 = p + (two ? (size_t)L : 0), *d1 = dP + ld;
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
    for (int c = 0; c < L; c += 16) {
        const __mmask16 k = lanes(L - c), k1 = two ? k : 0;
        s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, p + c), _mm512_maskz_loadu_ps(k, dP + c), s0);
        s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k1, p1 + c), _mm512_maskz_loadu_ps(k1, d1 + c),
                             s1);
    }
    const __m512 r0 = _mm512_set1_ps(_mm512_reduce_add_ps(s0));
    const __m512 r1 = _mm512_set1_ps(_mm512_reduce_add_ps(s1)), vs = _mm512_set1_ps(scale);
    for (int c = 0; c < l2; c += 16) {
        const __mmask16 k = lanes(L - c), k1 = two ? k : 0, k16 = lanes(l2 - c);
        const __m512 pa = _mm512_maskz_loadu_ps(k, p + c), pb = _mm512_maskz_loadu_ps(k1, p1 + c);
        const __m512 da = _mm512_mul_ps(
            _mm512_mul_ps(pa, _mm512_sub_ps(_mm512_maskz_loadu_ps(k, dP + c), r0)), vs);
        const __m512 db = _mm512_mul_ps(
            _mm512_mul_ps(pb, _mm512_sub_ps(_mm512_maskz_loadu_ps(k1, d1 + c), r1)), vs);
        const __m512i hp = (__m512i)_mm512_cvtne2ps_pbh(pb, pa);
        const __m512i hd = (__m512i)_mm512_cvtne2ps_pbh(db, da);
        _mm512_mask_storeu_epi32(prp + c, k16, _mm512_permutexvar_epi16(zip, hp));
        _mm512_mask_storeu_epi32(dsrp + c, k16, _mm512_permutexvar_epi16(zip, hd));
        _mm256_mask_storeu_epi16(ds16 + c, k16, _mm512_castsi512_si256(hd));
        if (two) _mm256_mask_storeu_epi16(ds16 + ld16 + c, k16, _mm512_extracti64x4_epi64(hd, 1));
    }
}

/* y (L rows, stride ldy) = W X in bf16: X (L rows of D, stride ldx) packed along its rows into
 * xr, W the pair's (L, L) bf16 matrix as wx16 takes it (strides sw, st), the product in acc */
static void plain_wx(bf16 *y, size_t ldy, const uint32_t *W, size_t sw, size_t st, const bf16 *x,
                     size_t ldx, uint32_t *xr, float *acc, int L, int D)
{
    pack_r(xr, x, ldx, L, D);
    wx16(acc, (size_t)D, W, sw, st, xr, (size_t)D, L, (L + 1) / 2, D, 0);
    for (int i = 0; i < L; i++) store_row(y + (size_t)i * ldy, acc + (size_t)i * D, D, 1.0f);
}

void attn_bf16_plain_fwd(void *ov, float *p, const void *qv, const void *kv, const void *vv,
                         void *ws, const struct bk_attn *s, int nt)
{
    bf16 *o = ov;
    const bf16 *q = qv, *k = kv, *v = vv;
    const int L = s->l, H = s->heads, D = s->d, dp = (D + 1) / 2, l16 = round16(L);
    const size_t ld = (size_t)s->ld, hd = (size_t)H * D, slot = plain_layout(s, NULL);
    const int pairs = s->n * H;
    size_t off[PL_END];
    plain_layout(s, off);
#pragma omp parallel for num_threads(plain_threads(s, nt)) schedule(static)
    for (int nh = 0; nh < pairs; nh++) {
        const int h = nh % H, ni = nh / H;
        char *base = (char *)ws + (size_t)omp_get_thread_num() * slot;
        float *sc = (float *)(base + off[PL_S]), *acc = (float *)(base + off[PL_ACC]);
        bf16 *p16 = (bf16 *)(base + off[PL_P16]);
        uint32_t *at = (uint32_t *)(base + off[PL_AT]), *bt = (uint32_t *)(base + off[PL_BT]);
        uint32_t *xr = (uint32_t *)(base + off[PL_XR]);
        pack_e(at, (size_t)l16, ROW_LD(q, ni, 0, h), ld, L, l16, D);
        pack_e(bt, (size_t)l16, ROW_LD(k, ni, 0, h), ld, L, l16, D);
        abt16(sc, (size_t)l16, at, (size_t)l16, bt, (size_t)l16, l16, L, dp, scale2(s->scale));
        plain_softmax16(sc, (size_t)l16, p + (size_t)nh * L * L, p16, (size_t)l16, L, L);
        plain_wx(ROW_HD(o, ni, 0, h), hd, (const uint32_t *)p16, (size_t)l16 / 2, 1,
                 ROW_LD(v, ni, 0, h), ld, xr, acc, L, D);
    }
}

void attn_bf16_plain_bwd(void *dqv, void *dkv, void *dvv, const void *doutv, const void *qv,
                         const void *kv, const void *vv, const float *p, void *ws,
                         const struct bk_attn *s, int nt)
{
    bf16 *dq = dqv, *dk = dkv, *dv = dvv;
    const bf16 *dout = doutv, *q = qv, *k = kv, *v = vv;
    const int L = s->l, H = s->heads, D = s->d, dp = (D + 1) / 2, l16 = round16(L);
    const size_t ld = (size_t)s->ld, hd = (size_t)H * D, slot = plain_layout(s, NULL);
    const int pairs = s->n * H, lp = (L + 1) / 2;
    size_t off[PL_END];
    plain_layout(s, off);
#pragma omp parallel for num_threads(plain_threads(s, nt)) schedule(static)
    for (int nh = 0; nh < pairs; nh++) {
        const int h = nh % H, ni = nh / H;
        const float *ph = p + (size_t)nh * L * L;
        char *base = (char *)ws + (size_t)omp_get_thread_num() * slot;
        float *dps = (float *)(base + off[PL_S]), *acc = (float *)(base + off[PL_ACC]);
        bf16 *ds16 = (bf16 *)(base + off[PL_P16]);
        uint32_t *prp = (uint32_t *)(base + off[PL_PRP]), *dsrp = (uint32_t *)(base + off[PL_DSRP]);
        uint32_t *at = (uint32_t *)(base + off[PL_AT]), *bt = (uint32_t *)(base + off[PL_BT]);
        uint32_t *xr = (uint32_t *)(base + off[PL_XR]);
        pack_e(at, (size_t)l16, ROW_HD(dout, ni, 0, h), hd, L, l16, D);
        pack_e(bt, (size_t)l16, ROW_LD(v, ni, 0, h), ld, L, l16, D);
        abt16(dps, (size_t)l16, at, (size_t)l16, bt, (size_t)l16, l16, L, dp, 1.0f);
        for (int rp = 0; rp < lp; rp++)
            plain_dsoftmax_pair(ph + (size_t)(2 * rp) * L, dps + (size_t)(2 * rp) * l16,
                                (size_t)l16, L, 2 * rp + 1 < L, s->scale, prp + (size_t)rp * l16,
                                dsrp + (size_t)rp * l16, ds16 + (size_t)(2 * rp) * l16,
                                (size_t)l16);
        /* dq = dS k, dk = dS^T q, dv = P^T dout, each through acc */
        plain_wx(ROW_LD(dq, ni, 0, h), ld, (const uint32_t *)ds16, (size_t)l16 / 2, 1,
                 ROW_LD(k, ni, 0, h), ld, xr, acc, L, D);
        plain_wx(ROW_LD(dk, ni, 0, h), ld, dsrp, 1, (size_t)l16, ROW_LD(q, ni, 0, h), ld, xr, acc,
                 L, D);
        plain_wx(ROW_LD(dv, ni, 0, h), ld, prp, 1, (size_t)l16, ROW_HD(dout, ni, 0, h), hd, xr,
                 acc, L, D);
    }
}

#include "target512_pop.h"
