/* attn512.c - the attention's tile kernels in AVX-512 (attn_tiles.h): 16-float vectors, register
 * tiles of up to 24 accumulators, the exponential in vectors (vm_expf's operations, lane for
 * lane: the same bits). Compiled for AVX-512 by a target pragma; called only where cpu_isa()
 * reports AVX-512 (the rest of the backend is built for x86-64-v3).
 */
#include <immintrin.h>
#include <math.h>

#include "attn_tiles.h"
#include "cpu.h"
#include "vmath.h"

#include "target512_push.h"

#include "attn512.h"

static int imin(int a, int b) { return a < b ? a : b; }

/* ---- S = alpha A BT: R rows x 16 NC columns per register tile; A packed transposed (AT,
 * element (r, e) at AT[e apl + r]), so a step's R broadcasts are constant offsets ---- */
AI void abt_tile(float *S, size_t lds, const float *A, size_t lda, const float *bt, size_t ldb,
                 int d, __m512 va, const int R, const int NC)
{
    __m512 acc[12][2];
#pragma GCC unroll 12
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int u = 0; u < NC; u++) acc[r][u] = _mm512_setzero_ps();
    for (int e = 0; e < d; e++) {
        __m512 b[2];
#pragma GCC unroll 2
        for (int u = 0; u < NC; u++) b[u] = _mm512_loadu_ps(bt + (size_t)e * ldb + 16 * u);
#pragma GCC unroll 12
        for (int r = 0; r < R; r++) {
            const __m512 x = _mm512_set1_ps(A[(size_t)e * lda + r]);
#pragma GCC unroll 2
            for (int u = 0; u < NC; u++) acc[r][u] = _mm512_fmadd_ps(x, b[u], acc[r][u]);
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; r++)
#pragma GCC unroll 2
        for (int u = 0; u < NC; u++)
            _mm512_storeu_ps(S + (size_t)r * lds + 16 * u, _mm512_mul_ps(acc[r][u], va));
}

/* rows [0, R) of S over all ncp columns */
AI void abt_rows(float *S, size_t lds, const float *A, size_t lda, const float *bt, size_t ldb,
                 int ncp, int d, __m512 va, const int R)
{
    int c = 0;
    for (; c + 32 <= ncp; c += 32) abt_tile(S + c, lds, A, lda, bt + c, ldb, d, va, R, 2);
    if (c < ncp) abt_tile(S + c, lds, A, lda, bt + c, ldb, d, va, R, 1);
}

static void abt512(float *S, size_t lds, const float *A, size_t lda, const float *bt, size_t ldb,
                   int ncp, int nr, int d, float alpha)
{
    const __m512 va = _mm512_set1_ps(alpha);
    int r = 0;
    for (; r + 12 <= nr; r += 12)
        abt_rows(S + (size_t)r * lds, lds, A + r, lda, bt, ldb, ncp, d, va, 12);
    for (; r + 4 <= nr; r += 4)
        abt_rows(S + (size_t)r * lds, lds, A + r, lda, bt, ldb, ncp, d, va, 4);
    for (; r < nr; r++)
        abt_rows(S + (size_t)r * lds, lds, A + r, lda, bt, ldb, ncp, d, va, 1);
}

/* ---- Y (+)= W X: R rows x NV vectors of X's columns (the last one masked by m) ----
 * W_jt = W[j sw + t st]; CSW > 0 makes sw that constant, so that the R broadcasts of a step t
 * are constant offsets from one pointer (runtime strides left the row pointers spilled) */
AI void wx_tile(float *Y, size_t ldy, const float *W, size_t sw, size_t st, const float *X,
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
        __m512 x[4];
        const float *wt = W + (size_t)t * st;
#pragma GCC unroll 4
        for (int u = 0; u < NV; u++)
            x[u] = u == NV - 1 ? _mm512_maskz_loadu_ps(m, X + (size_t)t * ldx + 16 * u)
                               : _mm512_loadu_ps(X + (size_t)t * ldx + 16 * u);
#pragma GCC unroll 16
        for (int j = 0; j < R; j++) {
            const __m512 w = _mm512_set1_ps(wt[(size_t)j * swc]);
#pragma GCC unroll 4
            for (int u = 0; u < NV; u++) acc[j][u] = _mm512_fmadd_ps(w, x[u], acc[j][u]);
        }
    }
    wx_tile_store(Y, ldy, acc, R, NV, m, acc_y);
}

/* the column chunk's rows, with W's row stride a constant where it is one of the common ones */
#define WX_NV(R, NV)                                                                          \
    do {                                                                                      \
        if (sw == 1) WX_ROWS(R, NV, 1);                                                       \
        else if (sw == 128) WX_ROWS(R, NV, 128);                                              \
        else WX_ROWS((R < 6 ? R : 6), NV, 0);                                                 \
    } while (0)

static void wx512(float *Y, size_t ldy, const float *W, size_t sw, size_t st, const float *X,
                  size_t ldx, int ny, int nt, int d, int acc_y)
{
    for (int c0 = 0; c0 < d; c0 += 64) {
        const int w = imin(64, d - c0), nv = (w + 15) / 16;
        float *Yc = Y + c0;
        const float *Xc = X + c0;
        const __mmask16 m = lanes(w - 16 * (nv - 1));
        switch (nv) {
        case 1: WX_NV(16, 1); break;
        case 2: WX_NV(12, 2); break;
        case 3: WX_NV(8, 3); break;
        default: WX_NV(6, 4); break;
        }
    }
}

/* ---- the softmax steps ---- */

static void softmax512(float *S, size_t lds, float *mrow, float *lrow, float *O, size_t ldo,
                       int nr, int nc, int d, int first)
{
    for (int r = 0; r < nr; r++) {
        float *sr = S + (size_t)r * lds;
        __m512 vmx = _mm512_set1_ps(first ? -INFINITY : mrow[r]);
        for (int c = 0; c < nc; c += 16)
            vmx = _mm512_max_ps(vmx, _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY),
                                                         lanes(nc - c), sr + c));
        const float mx = _mm512_reduce_max_ps(vmx);
        const __m512 vm = _mm512_set1_ps(mx);
        __m512 vs = _mm512_setzero_ps();
        for (int c = 0; c < nc; c += 16) {
            const __mmask16 k = lanes(nc - c);
            const __m512 p = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, sr + c), vm));
            _mm512_mask_storeu_ps(sr + c, k, p);
            vs = _mm512_add_ps(vs, _mm512_maskz_mov_ps(k, p));
        }
        const float sum = _mm512_reduce_add_ps(vs);
        if (!first) {
            const float alpha = vm_expf(mrow[r] - mx);
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
        mrow[r] = mx;
    }
}

static void dsoftmax512(float *P, float *dS, size_t ld, const float *lse, const float *di, int nr,
                        int nc, float scale)
{
    const __m512 vsc = _mm512_set1_ps(scale);
    for (int r = 0; r < nr; r++) {
        float *prow = P + (size_t)r * ld, *drow = dS + (size_t)r * ld;
        const __m512 vl = _mm512_set1_ps(lse[r]), vd = _mm512_set1_ps(di[r]);
        for (int c = 0; c < nc; c += 16) {
            const __mmask16 k = lanes(nc - c);
            const __m512 p = exp512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, prow + c), vl));
            _mm512_mask_storeu_ps(prow + c, k, p);
            const __m512 ds = _mm512_sub_ps(_mm512_maskz_loadu_ps(k, drow + c), vd);
            _mm512_mask_storeu_ps(drow + c, k, _mm512_mul_ps(_mm512_mul_ps(p, ds), vsc));
        }
    }
}

#include "target512_pop.h"

const struct attn_tiles attn_tiles_avx512 = {abt512, wx512, softmax512, dsoftmax512};
