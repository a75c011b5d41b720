/* attention.c - CPU multi-head self-attention o = softmax(scale q k^T) v, in two forms: tiled
 * (FlashAttention-2's schedule, saves only lse (N,H,L); its workspace is a few tiles per thread)
 * and plain (saves p (N,H,L,L); its workspace holds an L x L S or dS per thread in flight).
 * q, k, v, dq, dk, dv rows have stride s->ld; o and dout are dense (N,L,H*D); head h of a token
 * is the columns [h*D, (h+1)*D) of its row. The products and softmax steps are register-tile
 * kernels of the process's instruction set (attn_tiles.h: AVX-512 in attn512.c, AVX2 here),
 * one task per tile row (tiled forward) or per (n, h) pair (tiled backward, plain), so the
 * results do not depend on the thread count; except the tiled backward's split of a pair's keys
 * and the plain form's cpu_gemm (oneDNN) products when there are fewer pairs than threads: those
 * depend on the thread count, as the convolutions' do. The tiled form also takes bf16 operands
 * where the CPU has AVX512-BF16 (attn_bf16.c: the same schedule on vdpbf16ps tiles), and so does
 * the plain form (attn_bf16.c: its products on those tiles, one pair per thread). */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "attn_tiles.h"
#include "cpu.h"
#include "vmath.h"

/* the shape; the dtype: fp32, or bf16 (either form) where the CPU has AVX512-BF16
 * (attn_bf16.c; cpu_half_kernels) */
static int attn_check(const struct bk_attn *s)
{
    if (!s || s->n < 1 || s->l < 1 || s->heads < 1 || s->d < 1) return BK_ERR_INVALID;
    if ((long long)s->heads * s->d > s->ld) return BK_ERR_INVALID;
    if (s->dtype == BK_DTYPE_F32) return BK_OK;
    if (s->dtype == BK_DTYPE_BF16 && cpu_isa() >= CPU_ISA_AVX512_BF16) return BK_OK;
    return BK_ERR_INVALID;
}

static int imin(int a, int b) { return a < b ? a : b; }

/* the tiled backward's split of one (n, h) pair's key blocks: 1 when the pairs keep every
 * thread busy, else enough chunks for the threads (each chunk sums its own dq, in ws) */
static int attn_chunks(const struct bk_attn *s, int threads)
{
    const int pairs = s->n * s->heads, nkb = (s->l + ATTN_BC - 1) / ATTN_BC;
    if (pairs >= threads) return 1;
    return imin(nkb, (threads + pairs - 1) / pairs);
}

static int round16(int x) { return (x + 15) / 16 * 16; }

/* row stride of a thread's S and dS tiles: the key block's width rounded up to 16 (the register
 * tiles' column step) */
static int attn_tile_ld(const struct bk_attn *s) { return round16(imin(ATTN_BC, s->l)); }

/* row stride of the packed transposed query-side blocks (q, dout): the query block's height
 * rounded up to 16 */
static int attn_qt_ld(const struct bk_attn *s) { return round16(imin(ATTN_BR, s->l)); }

/* per-thread tile scratch (floats): the backward's S and dS, the pair's Di = rowsum(dout o), the
 * key block's k and v transposed and the query block's q and dout transposed; or the forward's
 * S, its row max and sum, the query block's q and the pair's whole k transposed (packed once
 * for the run of the pair's query blocks a thread takes in turn) */
static size_t attn_slot_floats(const struct bk_attn *s)
{
    const size_t br = (size_t)imin(ATTN_BR, s->l), bcp = (size_t)attn_tile_ld(s);
    const size_t d = (size_t)s->d, qtl = (size_t)attn_qt_ld(s);
    const size_t bwd = 2 * br * bcp + (size_t)s->l + 2 * br + 2 * d * bcp + 2 * d * qtl;
    const size_t fwd = br * bcp + 2 * br + d * (size_t)round16(s->l) + d * qtl; /* all of k^T */
    return bwd > fwd ? bwd : fwd;
}

static size_t attn_plain_ws_bytes(const struct bk_attn *s);

size_t cpu_attn_ws_bytes(const struct bk_attn *s, int tiled)
{
    if (attn_check(s) != BK_OK) return 0;
    if (!tiled) return attn_plain_ws_bytes(s);
    /* one slot per thread in flight, at most the machine's cores; when a pair's keys are split,
     * a dq per chunk */
    const int procs = cpu_threads(NULL), pairs = s->n * s->heads, ch = attn_chunks(s, procs);
    if (s->dtype == BK_DTYPE_BF16) return attn_bf16_ws_bytes(s, procs, ch);
    size_t f = (size_t)procs * attn_slot_floats(s);
    if (ch > 1) f += (size_t)pairs * ch * s->l * s->d;
    return f * sizeof(float);
}

/* row pointers: strided inputs (q, k, v, dq, dk, dv) and dense (o, dout) */
#define ROW_LD(p, ni, i, h) ((p) + ((size_t)(ni) * L + (i)) * ld + (size_t)(h) * D)
#define ROW_HD(p, ni, i, h) ((p) + ((size_t)(ni) * L + (i)) * hd + (size_t)(h) * D)

/* ---- the tile products (AVX2 + FMA register tiles) ----
 * With K or N = D small (the UNets' heads: 16 to 64), sgemm spent more on packing and C's beta
 * pass than on the multiply (measured: 35% of the time in its kernel, 30% in copies and beta).
 * These keep the tile's accumulators in registers and read q, k, v, dout rows in place; only the
 * key block is packed transposed (BT, D x ncp, ncp = the block's width rounded up to 16, zero
 * columns after nc), once per key block. Any D: the W X products run over D in column chunks of
 * 64 (8 vectors), a last partial vector through masked loads and stores. */
#define AI static inline __attribute__((always_inline))

/* bt (d, ncp) = b (nc rows of stride ldb, d columns) transposed, zero beyond nc */
static void attn_pack_t(float *bt, int ncp, const float *b, size_t ldb, int nc, int d)
{
    for (int e = 0; e < d; e++) {
        float *row = bt + (size_t)e * ncp;
        for (int c = 0; c < nc; c++) row[c] = b[(size_t)c * ldb + e];
        for (int c = nc; c < ncp; c++) row[c] = 0.0f;
    }
}

/* S rows [0, R) = alpha A BT, columns [0, ncp) in steps of 16; A packed transposed: element
 * (r, e) at A[e lda + r] */
AI void abt_rows(float *S, size_t lds, const float *A, size_t lda, const float *bt, size_t ldb,
                 int ncp, int d, float alpha, const int R)
{
    const __m256 va = _mm256_set1_ps(alpha);
    for (int c = 0; c < ncp; c += 16) {
        __m256 acc[6][2];
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        for (int e = 0; e < d; e++) {
            const __m256 b0 = _mm256_loadu_ps(bt + (size_t)e * ldb + c);
            const __m256 b1 = _mm256_loadu_ps(bt + (size_t)e * ldb + c + 8);
#pragma GCC unroll 6
            for (int r = 0; r < R; r++) {
                const __m256 x = _mm256_broadcast_ss(A + (size_t)e * lda + r);
                acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
            }
        }
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            _mm256_storeu_ps(S + (size_t)r * lds + c, _mm256_mul_ps(acc[r][0], va));
            _mm256_storeu_ps(S + (size_t)r * lds + c + 8, _mm256_mul_ps(acc[r][1], va));
        }
    }
}

/* S (nr, ncp) = alpha A BT, A packed transposed (d, lda) */
static void attn_abt(float *S, size_t lds, const float *A, size_t lda, const float *bt,
                     size_t ldb, int ncp, int nr, int d, float alpha)
{
    int r = 0;
    for (; r + 6 <= nr; r += 6)
        abt_rows(S + (size_t)r * lds, lds, A + r, lda, bt, ldb, ncp, d, alpha, 6);
    for (; r < nr; r++)
        abt_rows(S + (size_t)r * lds, lds, A + r, lda, bt, ldb, ncp, d, alpha, 1);
}

/* Y rows [0, R) (+)= W X: Y_j = sum_t W[j sw + t st] X_t over t in [0, nt), X rows of stride
 * ldx, NV vectors (8 NV columns) each; MASKED: one vector, its lanes where mask is set */
AI void wx_rows(float *Y, size_t ldy, const float *W, size_t sw, size_t st, const float *X,
                size_t ldx, int nt, int acc_y, __m256i mask, const int R, const int NV,
                const int MASKED)
{
    __m256 acc[6][8];
#pragma GCC unroll 6
    for (int j = 0; j < R; j++)
#pragma GCC unroll 8
        for (int u = 0; u < NV; u++) acc[j][u] = _mm256_setzero_ps();
    for (int t = 0; t < nt; t++) {
        __m256 x[8];
#pragma GCC unroll 8
        for (int u = 0; u < NV; u++)
            x[u] = MASKED ? _mm256_maskload_ps(X + (size_t)t * ldx, mask)
                          : _mm256_loadu_ps(X + (size_t)t * ldx + 8 * u);
#pragma GCC unroll 6
        for (int j = 0; j < R; j++) {
            const __m256 w = _mm256_broadcast_ss(W + (size_t)j * sw + (size_t)t * st);
#pragma GCC unroll 8
            for (int u = 0; u < NV; u++) acc[j][u] = _mm256_fmadd_ps(w, x[u], acc[j][u]);
        }
    }
#pragma GCC unroll 6
    for (int j = 0; j < R; j++)
#pragma GCC unroll 8
        for (int u = 0; u < NV; u++) {
            float *y = Y + (size_t)j * ldy + 8 * u;
            if (MASKED)
                _mm256_maskstore_ps(y, mask, acc_y ? _mm256_add_ps(_mm256_maskload_ps(y, mask),
                                                                   acc[j][u])
                                                   : acc[j][u]);
            else
                _mm256_storeu_ps(y, acc_y ? _mm256_add_ps(_mm256_loadu_ps(y), acc[j][u])
                                          : acc[j][u]);
        }
}

/* the rows of Yc (ny, NV vectors) (+)= W Xc, R rows per register tile (at most 12
 * accumulators) */
#define WX_ROWS(NV, R, MASKED)                                                                \
    do {                                                                                      \
        int j = 0;                                                                            \
        for (; j + R <= ny; j += R)                                                           \
            wx_rows(Yc + (size_t)j * ldy, ldy, W + (size_t)j * sw, sw, st, Xc, ldx, nt, acc_y, \
                    mask, R, NV, MASKED);                                                     \
        for (; j < ny; j++)                                                                   \
            wx_rows(Yc + (size_t)j * ldy, ldy, W + (size_t)j * sw, sw, st, Xc, ldx, nt, acc_y, \
                    mask, 1, NV, MASKED);                                                     \
    } while (0)
#define WX_CASE(NV, R)                                                                        \
    case NV:                                                                                  \
        WX_ROWS(NV, R, 0);                                                                    \
        break;

/* Y (ny, d) (+)= W X, W_jt = W[j sw + t st]: sw = ld, st = 1 is W X (P V, dS K); sw = 1,
 * st = ld is W^T X (P^T dout, dS^T q). Column chunks of 64, then the last d % 8 masked. */
static void attn_wx(float *Y, size_t ldy, const float *W, size_t sw, size_t st, const float *X,
                    size_t ldx, int ny, int nt, int d, int acc_y)
{
    for (int c0 = 0; c0 < d; c0 += 64) {
        const int w = imin(64, d - c0);
        float *Yc = Y + c0;
        const float *Xc = X + c0;
        __m256i mask = _mm256_setzero_si256();
        switch (w / 8) {
            WX_CASE(1, 6)
            WX_CASE(2, 6)
            WX_CASE(3, 4)
            WX_CASE(4, 3)
            WX_CASE(5, 2)
            WX_CASE(6, 2)
            WX_CASE(7, 1)
            WX_CASE(8, 1)
        default:
            break;
        }
        if (w % 8) {
            Yc += w / 8 * 8;
            Xc += w / 8 * 8;
            mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(w % 8),
                                      _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
            WX_ROWS(1, 6, 1);
        }
    }
}

/* the forward's online softmax over one key block (attn_tiles.h) */
static void attn_softmax(float *S, size_t lds, float *m, float *l, float *O, size_t ldo, int nr,
                         int nc, int d, int first)
{
    for (int r = 0; r < nr; r++) {
        float *sr = S + (size_t)r * lds;
        float mx = first ? -INFINITY : m[r];
#pragma omp simd reduction(max : mx)
        for (int c = 0; c < nc; c++) mx = sr[c] > mx ? sr[c] : mx;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int c = 0; c < nc; c++) {
            sr[c] = vm_expf(sr[c] - mx);
            sum += sr[c];
        }
        if (!first) {
            const float alpha = vm_expf(m[r] - mx);
            l[r] = l[r] * alpha + sum;
            if (alpha != 1.0f) {
                float *orow = O + (size_t)r * ldo;
#pragma omp simd
                for (int e = 0; e < d; e++) orow[e] *= alpha;
            }
        } else {
            l[r] = sum;
        }
        m[r] = mx;
    }
}

/* the backward's P = exp(P - lse), dS = scale P (dS - di) on one tile (attn_tiles.h) */
static void attn_dsoftmax(float *P, float *dS, size_t ld, const float *lse, const float *di,
                          int nr, int nc, float scale)
{
    for (int r = 0; r < nr; r++) {
        float *prow = P + (size_t)r * ld, *drow = dS + (size_t)r * ld;
        const float lr = lse[r], dr = di[r];
#pragma omp simd
        for (int c = 0; c < nc; c++) {
            const float pc = vm_expf(prow[c] - lr);
            prow[c] = pc;
            drow[c] = pc * (drow[c] - dr) * scale;
        }
    }
}

const struct attn_tiles attn_tiles_avx2 = {attn_abt, attn_wx, attn_softmax, attn_dsoftmax};

/* the tile kernels of the instruction set the process uses (cpu_isa) */
static const struct attn_tiles *attn_tiles(void)
{
    return cpu_isa() >= CPU_ISA_AVX512 ? &attn_tiles_avx512 : &attn_tiles_avx2;
}

int cpu_attn_fwd(void *ov, float *lse, const void *qv, const void *kv, const void *vv,
                 void *ws, const struct bk_attn *s, bk_ctx *ctx)
{
    if (attn_check(s) != BK_OK || !ov || !lse || !qv || !kv || !vv || !ws || !ctx)
        return BK_ERR_INVALID;
    if (s->dtype == BK_DTYPE_BF16) {
        attn_bf16_fwd(ov, lse, qv, kv, vv, ws, s, cpu_threads(ctx));
        return BK_OK;
    }
    float *o = ov;
    const float *q = qv, *k = kv, *v = vv;
    const int L = s->l, H = s->heads, D = s->d;
    const size_t ld = (size_t)s->ld, hd = (size_t)H * D, slot = attn_slot_floats(s);
    const float scale = s->scale;
    const int nqb = (L + ATTN_BR - 1) / ATTN_BR, tasks = s->n * H * nqb;
    const int nt = cpu_threads(ctx), bc = attn_tile_ld(s), qtl = attn_qt_ld(s), l16 = round16(L);
    const struct attn_tiles *tl = attn_tiles();
#pragma omp parallel num_threads(nt)
    {
        float *sc = (float *)ws + (size_t)omp_get_thread_num() * slot;
        float *m = sc + (size_t)imin(ATTN_BR, L) * bc, *l = m + imin(ATTN_BR, L);
        float *qt = l + imin(ATTN_BR, L), *kt = qt + (size_t)D * qtl;
        int packed = -1; /* the pair whose k^T is in kt */
#pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < tasks; t++) {
            const int qb = t % nqb, h = (t / nqb) % H, ni = t / (nqb * H);
            const int i0 = qb * ATTN_BR, nr = imin(L - i0, ATTN_BR);
            float *ob = ROW_HD(o, ni, i0, h);
            attn_pack_t(qt, qtl, ROW_LD(q, ni, i0, h), ld, nr, D);
            if (packed != t / nqb) {
                attn_pack_t(kt, l16, ROW_LD(k, ni, 0, h), ld, L, D);
                packed = t / nqb;
            }
            /* key blocks outer, o the running unnormalised accumulator: after block j,
             * o_r = sum_c exp(S_rc - m_r) v_c over the keys so far, l_r = the sum of those
             * weights (online softmax: the earlier blocks are rescaled to each new maximum) */
            for (int j0 = 0; j0 < L; j0 += ATTN_BC) {
                const int nc = imin(L - j0, ATTN_BC);
                tl->abt(sc, (size_t)bc, qt, (size_t)qtl, kt + j0, (size_t)l16, round16(nc), nr, D,
                        scale);
                tl->softmax(sc, (size_t)bc, m, l, ob, hd, nr, nc, D, j0 == 0);
                tl->wx(ob, hd, sc, (size_t)bc, 1, ROW_LD(v, ni, j0, h), ld, nr, nc, D, j0 != 0);
            }
            for (int r = 0; r < nr; r++) {
                float *orow = ob + (size_t)r * hd;
                const float inv = 1.0f / l[r];
#pragma omp simd
                for (int e = 0; e < D; e++) orow[e] *= inv;
                lse[((size_t)ni * H + h) * L + i0 + r] = m[r] + logf(l[r]);
            }
        }
    }
    return BK_OK;
}

int cpu_attn_bwd(void *dqv, void *dkv, void *dvv, const void *doutv, const void *qv,
                 const void *kv, const void *vv, const void *ov, const float *lse, void *ws,
                 const struct bk_attn *s, bk_ctx *ctx)
{
    if (attn_check(s) != BK_OK || !dqv || !dkv || !dvv || !doutv || !qv || !kv || !vv || !ov ||
        !lse || !ws || !ctx)
        return BK_ERR_INVALID;
    if (s->dtype == BK_DTYPE_BF16) {
        const int nt = cpu_threads(ctx);
        attn_bf16_bwd(dqv, dkv, dvv, doutv, qv, kv, vv, ov, lse, ws, s, nt, attn_chunks(s, nt));
        return BK_OK;
    }
    float *dq = dqv, *dk = dkv, *dv = dvv;
    const float *dout = doutv, *q = qv, *k = kv, *v = vv, *o = ov;
    const int L = s->l, H = s->heads, D = s->d;
    const size_t ld = (size_t)s->ld, hd = (size_t)H * D, slot = attn_slot_floats(s);
    const float scale = s->scale;
    const int nt = cpu_threads(ctx);
    const int pairs = s->n * H, nkb = (L + ATTN_BC - 1) / ATTN_BC, nch = attn_chunks(s, nt);
    const int br = imin(ATTN_BR, L), bc = attn_tile_ld(s), qtl = attn_qt_ld(s);
    const struct attn_tiles *tl = attn_tiles();
    /* a split pair's chunk c sums its dq into part + (pair nch + c) L D, dense (L, D) */
    float *part = (float *)ws + (size_t)cpu_threads(NULL) * slot;

    /* one task per (pair, chunk of key blocks): key blocks outer, query blocks inner, so a key
     * block's dk, dv are summed over all queries in one place; dq of the pair's queries is
     * summed over the chunk's keys in the same loop (no second pass). Per tile:
     * p = exp(scale q k^T - lse), dp = dout v^T, ds = scale p (dp - Di), Di = dout_i . o_i,
     * dv += p^T dout, dk += ds^T q, dq += ds k. */
#pragma omp parallel num_threads(nt)
    {
        float *pt = (float *)ws + (size_t)omp_get_thread_num() * slot;
        float *dst = pt + (size_t)br * bc, *di = dst + (size_t)br * bc;
        float *kt = di + L + 2 * br, *vt = kt + (size_t)D * bc;
        float *qt = vt + (size_t)D * bc, *dot = qt + (size_t)D * qtl;
#pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < pairs * nch; t++) {
            const int ch = t % nch, pr = t / nch, h = pr % H, ni = pr / H;
            const int kb0 = (int)((long long)ch * nkb / nch), kb1 = (int)((long long)(ch + 1) * nkb / nch);
            const float *lrow = lse + ((size_t)ni * H + h) * L;
            float *dqp = nch > 1 ? part + (size_t)t * L * D : ROW_LD(dq, ni, 0, h);
            const size_t ldq = nch > 1 ? (size_t)D : ld;
            for (int i = 0; i < L; i++) {
                const float *dor = ROW_HD(dout, ni, i, h), *orow = ROW_HD(o, ni, i, h);
                float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
                for (int e = 0; e < D; e++) acc += dor[e] * orow[e];
                di[i] = acc;
            }
            for (int jb = kb0; jb < kb1; jb++) {
                const int j0 = jb * ATTN_BC, nc = imin(L - j0, ATTN_BC);
                const float *kj = ROW_LD(k, ni, j0, h), *vj = ROW_LD(v, ni, j0, h);
                float *dkj = ROW_LD(dk, ni, j0, h), *dvj = ROW_LD(dv, ni, j0, h);
                attn_pack_t(kt, round16(nc), kj, ld, nc, D);
                attn_pack_t(vt, round16(nc), vj, ld, nc, D);
                for (int i0 = 0; i0 < L; i0 += ATTN_BR) {
                    const int nr = imin(L - i0, ATTN_BR);
                    const float *qi = ROW_LD(q, ni, i0, h), *doi = ROW_HD(dout, ni, i0, h);
                    attn_pack_t(qt, qtl, qi, ld, nr, D);
                    attn_pack_t(dot, qtl, doi, hd, nr, D);
                    tl->abt(pt, (size_t)bc, qt, (size_t)qtl, kt, (size_t)round16(nc), round16(nc),
                            nr, D, scale);
                    tl->abt(dst, (size_t)bc, dot, (size_t)qtl, vt, (size_t)round16(nc),
                            round16(nc), nr, D, 1.0f);
                    tl->dsoftmax(pt, dst, (size_t)bc, lrow + i0, di + i0, nr, nc, scale);
                    tl->wx(dvj, ld, pt, 1, (size_t)bc, doi, hd, nc, nr, D, i0 != 0);
                    tl->wx(dkj, ld, dst, 1, (size_t)bc, qi, ld, nc, nr, D, i0 != 0);
                    tl->wx(dqp + (size_t)i0 * ldq, ldq, dst, (size_t)bc, 1, kj, ld, nr, nc, D,
                           jb > kb0);
                }
            }
        }
        if (nch > 1) {
            /* dq = the chunks' sums added in chunk order */
#pragma omp for schedule(static)
            for (int r = 0; r < pairs * L; r++) {
                const int pr = r / L, i = r % L, h = pr % H, ni = pr / H;
                float *dst_row = ROW_LD(dq, ni, i, h);
                const float *p0 = part + ((size_t)pr * nch * L + i) * D;
                for (int e = 0; e < D; e++) dst_row[e] = p0[e];
                for (int c = 1; c < nch; c++) {
                    const float *pc = p0 + (size_t)c * L * D;
#pragma omp simd
                    for (int e = 0; e < D; e++) dst_row[e] += pc[e];
                }
            }
        }
    }
    return BK_OK;
}

/* Plain form, per (n, h) pair: S = q k^T (L,L), p = softmax(scale S) by rows, o = p v; backward
 * dp = dout v^T, ds = scale p (dp - rowsum(p dp)), dq = ds k, dk = ds^T q, dv = p^T dout.
 * With at least as many pairs as threads, each thread takes whole pairs and runs their products
 * on the register tiles above, single-threaded, in a slot of the workspace (S or dS (L, L16) and
 * k or v packed (D, L16)): a pair's results do not depend on the thread count, and a pair's
 * small products pay no threading overhead. With fewer pairs than threads the pairs run in turn,
 * each product one cpu_gemm on the job's threads (results a function of the thread count); the
 * workspace then holds [dS (L,L) | the GEMMs' scratchpad]. */
enum attn_plain_gemm { PG_QK, PG_PV, PG_DP, PG_DQ, PG_DK, PG_DV, PG_COUNT };

static struct cpu_gemm_shape attn_plain_gemm(int which, const struct bk_attn *s)
{
    const int L = s->l, D = s->d, ld = s->ld, hd = s->heads * s->d, f = BK_DTYPE_F32;
    switch (which) {
    case PG_QK: return (struct cpu_gemm_shape){0, 1, L, L, D, ld, ld, L, f, f, 0, 0, 0, 0, 0, 0};
    case PG_PV: return (struct cpu_gemm_shape){0, 0, L, D, L, L, ld, hd, f, f, 0, 0, 0, 0, 0, 0};
    case PG_DP: return (struct cpu_gemm_shape){0, 1, L, L, D, hd, ld, L, f, f, 0, 0, 0, 0, 0, 0};
    case PG_DQ: return (struct cpu_gemm_shape){0, 0, L, D, L, L, ld, ld, f, f, 0, 0, 0, 0, 0, 0};
    case PG_DK: return (struct cpu_gemm_shape){1, 0, L, D, L, L, ld, ld, f, f, 0, 0, 0, 0, 0, 0};
    default: return (struct cpu_gemm_shape){1, 0, L, D, L, L, hd, ld, f, f, 0, 0, 0, 0, 0, 0};
    }
}

/* bytes of the dS block at the start of the in-turn form's workspace */
static size_t attn_plain_ds_bytes(const struct bk_attn *s)
{
    return ((size_t)s->l * s->l * sizeof(float) + 63) & ~(size_t)63;
}

/* the in-turn form's scratchpad: the largest of its GEMMs' */
static size_t attn_plain_scr_bytes(const struct bk_attn *s)
{
    size_t scr = 0;
    for (int i = 0; i < PG_COUNT; i++) {
        struct cpu_gemm_shape g = attn_plain_gemm(i, s);
        size_t b = cpu_gemm_ws_bytes(&g);
        if (b > scr) scr = b;
    }
    return scr;
}

/* floats of a thread's slot in the pairs-on-threads form: S or dS (L, L16), k or v and q or
 * dout packed (D, L16) */
static size_t attn_plain_slot_floats(const struct bk_attn *s)
{
    const size_t l16 = (size_t)round16(s->l);
    return ((size_t)s->l + 2 * (size_t)s->d) * l16;
}

/* In the calling thread's slot of ws (pairs-on-threads form): the scores sc (L, L16) = a b^T,
 * a and b (L, D) with row strides lda and ldb, b packed transposed after sc. The forward's S
 * (a = q, b = k) and the backward's dP (a = dout, b = v). Returns sc. */
static float *plain_slot_scores(void *ws, const float *a, size_t lda, const float *b, size_t ldb,
                                const struct bk_attn *s, const struct attn_tiles *tiles)
{
    const int l16 = round16(s->l);
    float *sc = (float *)ws + (size_t)omp_get_thread_num() * attn_plain_slot_floats(s);
    float *bt = sc + (size_t)s->l * l16, *at = bt + (size_t)s->d * l16;
    attn_pack_t(bt, l16, b, ldb, s->l, s->d);
    attn_pack_t(at, l16, a, lda, s->l, s->d);
    tiles->abt(sc, (size_t)l16, at, (size_t)l16, bt, (size_t)l16, l16, s->l, s->d, 1.0f);
    return sc;
}

/* threads over pairs (the count), or 0: pairs in turn with threaded GEMMs */
static int attn_plain_split(const struct bk_attn *s, int threads)
{
    return s->n * s->heads >= threads ? threads : 0;
}

static size_t attn_plain_ws_bytes(const struct bk_attn *s)
{
    /* either form at any thread count up to the machine's cores */
    const int procs = cpu_threads(NULL), pairs = s->n * s->heads;
    if (s->dtype == BK_DTYPE_BF16) return attn_bf16_plain_ws_bytes(s, procs);
    const size_t slots = (size_t)imin(pairs, procs) * attn_plain_slot_floats(s) * sizeof(float);
    const size_t turn = attn_plain_ds_bytes(s) + attn_plain_scr_bytes(s);
    return slots > turn ? slots : turn;
}

/* product `which` of the in-turn form, its scratchpad after dS in the workspace */
static int plain_gemm(int which, void *c, const float *a, const float *b, void *ws,
                      const struct bk_attn *s, bk_ctx *ctx)
{
    struct cpu_gemm_shape g = attn_plain_gemm(which, s);
    const size_t off = attn_plain_ds_bytes(s);
    return cpu_gemm(&g, c, a, b, NULL, (char *)ws + off, attn_plain_scr_bytes(s), ctx);
}

/* p (L) = softmax(scale sr) (p may be sr) */
static void plain_softmax_row(float *pr, const float *sr, int L, float scale)
{
    float mx = -INFINITY;
    for (int j = 0; j < L; j++) mx = fmaxf(mx, sr[j] * scale);
#pragma omp simd
    for (int j = 0; j < L; j++) pr[j] = vm_expf(sr[j] * scale - mx);
    double sum = 0.0;
    for (int j = 0; j < L; j++) sum += pr[j];
    const float inv = (float)(1.0 / sum);
    for (int j = 0; j < L; j++) pr[j] *= inv;
}

/* dS row (L) = scale p (dp - rowsum(p dp)), dp given in dsr */
static void plain_ds_row(float *dsr, const float *pr, int L, float scale)
{
    double rs = 0.0;
    for (int j = 0; j < L; j++) rs += (double)pr[j] * dsr[j];
    const float rsf = (float)rs;
    for (int j = 0; j < L; j++) dsr[j] = pr[j] * (dsr[j] - rsf) * scale;
}

int cpu_attn_plain_fwd(void *ov, float *p, const void *qv, const void *kv, const void *vv,
                       void *ws, const struct bk_attn *s, bk_ctx *ctx)
{
    if (attn_check(s) != BK_OK || !ov || !p || !qv || !kv || !vv || !ws || !ctx)
        return BK_ERR_INVALID;
    if (s->dtype == BK_DTYPE_BF16) {
        attn_bf16_plain_fwd(ov, p, qv, kv, vv, ws, s, cpu_threads(ctx));
        return BK_OK;
    }
    float *o = ov;
    const float *q = qv, *k = kv, *v = vv;
    const int L = s->l, H = s->heads, D = s->d, pairs = s->n * H, l16 = round16(L);
    const int nt = attn_plain_split(s, cpu_threads(ctx));
    const size_t ld = (size_t)s->ld, hd = (size_t)H * D;
    const float scale = s->scale;
    const struct attn_tiles *tl = attn_tiles();
    if (nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int nh = 0; nh < pairs; nh++) {
            const int h = nh % H, ni = nh / H;
            float *ph = p + (size_t)nh * L * L;
            const float *sc =
                plain_slot_scores(ws, ROW_LD(q, ni, 0, h), ld, ROW_LD(k, ni, 0, h), ld, s, tl);
            for (int i = 0; i < L; i++)
                plain_softmax_row(ph + (size_t)i * L, sc + (size_t)i * l16, L, scale);
            tl->wx(ROW_HD(o, ni, 0, h), hd, ph, (size_t)L, 1, ROW_LD(v, ni, 0, h), ld, L, L, D,
                   0);
        }
        return BK_OK;
    }
    for (int nh = 0; nh < pairs; nh++) {
        const int h = nh % H, ni = nh / H;
        float *ph = p + (size_t)nh * L * L;
        int rc = plain_gemm(PG_QK, ph, ROW_LD(q, ni, 0, h), ROW_LD(k, ni, 0, h), ws, s, ctx);
        if (rc) return rc;
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
        for (int i = 0; i < L; i++)
            plain_softmax_row(ph + (size_t)i * L, ph + (size_t)i * L, L, scale);
        rc = plain_gemm(PG_PV, ROW_HD(o, ni, 0, h), ph, ROW_LD(v, ni, 0, h), ws, s, ctx);
        if (rc) return rc;
    }
    return BK_OK;
}

int cpu_attn_plain_bwd(void *dqv, void *dkv, void *dvv, const void *doutv, const void *qv,
                       const void *kv, const void *vv, const float *p, void *ws,
                       const struct bk_attn *s, bk_ctx *ctx)
{
    if (attn_check(s) != BK_OK || !dqv || !dkv || !dvv || !doutv || !qv || !kv || !vv || !p ||
        !ws || !ctx)
        return BK_ERR_INVALID;
    if (s->dtype == BK_DTYPE_BF16) {
        attn_bf16_plain_bwd(dqv, dkv, dvv, doutv, qv, kv, vv, p, ws, s, cpu_threads(ctx));
        return BK_OK;
    }
    float *dq = dqv, *dk = dkv, *dv = dvv, *ds = ws;
    const float *dout = doutv, *q = qv, *k = kv, *v = vv;
    const int L = s->l, H = s->heads, D = s->d, pairs = s->n * H, l16 = round16(L);
    const int nt = attn_plain_split(s, cpu_threads(ctx));
    const size_t ld = (size_t)s->ld, hd = (size_t)H * D;
    const float scale = s->scale;
    const struct attn_tiles *tl = attn_tiles();
    if (nt) {
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int nh = 0; nh < pairs; nh++) {
            const int h = nh % H, ni = nh / H;
            const float *ph = p + (size_t)nh * L * L;
            float *dst =
                plain_slot_scores(ws, ROW_HD(dout, ni, 0, h), hd, ROW_LD(v, ni, 0, h), ld, s, tl);
            for (int i = 0; i < L; i++)
                plain_ds_row(dst + (size_t)i * l16, ph + (size_t)i * L, L, scale);
            tl->wx(ROW_LD(dq, ni, 0, h), ld, dst, (size_t)l16, 1, ROW_LD(k, ni, 0, h), ld, L, L,
                   D, 0);
            tl->wx(ROW_LD(dk, ni, 0, h), ld, dst, 1, (size_t)l16, ROW_LD(q, ni, 0, h), ld, L, L,
                   D, 0);
            tl->wx(ROW_LD(dv, ni, 0, h), ld, ph, 1, (size_t)L, ROW_HD(dout, ni, 0, h), hd, L, L,
                   D, 0);
        }
        return BK_OK;
    }
    for (int nh = 0; nh < pairs; nh++) {
        const int h = nh % H, ni = nh / H;
        const float *ph = p + (size_t)nh * L * L;
        int rc = plain_gemm(PG_DP, ds, ROW_HD(dout, ni, 0, h), ROW_LD(v, ni, 0, h), ws, s, ctx);
        if (rc) return rc;
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
        for (int i = 0; i < L; i++) plain_ds_row(ds + (size_t)i * L, ph + (size_t)i * L, L, scale);
        if ((rc = plain_gemm(PG_DQ, ROW_LD(dq, ni, 0, h), ds, ROW_LD(k, ni, 0, h), ws, s, ctx)) ||
            (rc = plain_gemm(PG_DK, ROW_LD(dk, ni, 0, h), ds, ROW_LD(q, ni, 0, h), ws, s, ctx)) ||
            (rc = plain_gemm(PG_DV, ROW_LD(dv, ni, 0, h), ph, ROW_HD(dout, ni, 0, h), ws, s, ctx)))
            return rc;
    }
    return BK_OK;
}
