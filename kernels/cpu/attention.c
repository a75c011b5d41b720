/* attention.c - CPU multi-head self-attention o = softmax(scale q k^T) v, in two forms: tiled
 * (FlashAttention-2's schedule, saves only lse (N,H,L); its workspace is a few tiles per thread)
 * and plain (saves p (N,H,L,L); its backward takes an L x L workspace per thread).
 * q, k, v, dq, dk, dv rows have stride s->ld; o and dout are dense (N,L,H*D); head h of a token
 * is the columns [h*D, (h+1)*D) of its row. Every product of both forms is an OpenBLAS sgemm:
 * the tiled form's on (query block x key block) tiles, single-threaded, one task per tile row
 * (forward) or per (n, h) pair (backward), so its results do not depend on the thread count
 * (except the backward's split of a pair's keys when there are fewer pairs than threads). The
 * plain form's results depend on the thread count (cpu_gemm's split), as the convolutions' do.
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu.h"
#include "vmath.h"

/* query rows and key columns of one tile: S (BR x BC) and, in the backward, dS next to it stay
 * in the core's L2 (2 x 64 KiB) with the key block's k, v rows */
#define ATTN_BR 128
#define ATTN_BC 128

static int attn_check(const struct bk_attn *s)
{
    if (!s || s->n < 1 || s->l < 1 || s->heads < 1 || s->d < 1) return BK_ERR_INVALID;
    if ((long long)s->heads * s->d > s->ld) return BK_ERR_INVALID;
    return BK_OK;
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

/* per-thread tile scratch (floats): S and dS (or the forward's S and its row max and sum) and
 * the pair's Di = rowsum(dout o) */
static size_t attn_slot_floats(const struct bk_attn *s)
{
    const int br = imin(ATTN_BR, s->l), bc = imin(ATTN_BC, s->l);
    return (size_t)2 * br * bc + (size_t)s->l + 2 * (size_t)br;
}

size_t cpu_attn_ws_bytes(const struct bk_attn *s, int tiled)
{
    if (attn_check(s) != BK_OK) return 0;
    /* one slot (tiled) or dS (L,L) (plain) per thread in flight, at most the machine's cores
     * (see attn_plain_split); tiled, when a pair's keys are split, a dq per chunk */
    int procs = cpu_threads(NULL), pairs = s->n * s->heads;
    if (tiled) {
        const int ch = attn_chunks(s, procs);
        size_t f = (size_t)procs * attn_slot_floats(s);
        if (ch > 1) f += (size_t)pairs * ch * s->l * s->d;
        return f * sizeof(float);
    }
    int slots = pairs < procs ? pairs : procs;
    return (size_t)slots * s->l * s->l * sizeof(float);
}

/* row pointers: strided inputs (q, k, v, dq, dk, dv) and dense (o, dout) */
#define ROW_LD(p, ni, i, h) ((p) + ((size_t)(ni) * L + (i)) * ld + (size_t)(h) * D)
#define ROW_HD(p, ni, i, h) ((p) + ((size_t)(ni) * L + (i)) * hd + (size_t)(h) * D)

/* C (m,n) = alpha op(A) op(B) + beta C, row-major, one thread (called inside parallel loops) */
static inline void attn_gemm(int ta, int tb, int m, int n, int k, float alpha, const float *a,
                             size_t lda, const float *b, size_t ldb, float beta, float *c,
                             size_t ldc)
{
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m,
                n, k, alpha, a, (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

int cpu_attn_fwd(float *o, float *lse, const float *q, const float *k, const float *v,
                 void *ws, const struct bk_attn *s, bk_ctx *ctx)
{
    if (attn_check(s) != BK_OK || !o || !lse || !q || !k || !v || !ws || !ctx)
        return BK_ERR_INVALID;
    const int L = s->l, H = s->heads, D = s->d;
    const size_t ld = (size_t)s->ld, hd = (size_t)H * D, slot = attn_slot_floats(s);
    const float scale = s->scale;
    const int nqb = (L + ATTN_BR - 1) / ATTN_BR, tasks = s->n * H * nqb;
    const int nt = cpu_threads(ctx);
#pragma omp parallel num_threads(nt)
    {
        float *sc = (float *)ws + (size_t)omp_get_thread_num() * slot;
        float *m = sc + (size_t)imin(ATTN_BR, L) * imin(ATTN_BC, L), *l = m + imin(ATTN_BR, L);
#pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < tasks; t++) {
            const int qb = t % nqb, h = (t / nqb) % H, ni = t / (nqb * H);
            const int i0 = qb * ATTN_BR, nr = imin(L - i0, ATTN_BR);
            const int bc = imin(ATTN_BC, L);
            const float *qb0 = ROW_LD(q, ni, i0, h);
            float *ob = ROW_HD(o, ni, i0, h);
            /* key blocks outer, o the running unnormalised accumulator: after block j,
             * o_r = sum_c exp(S_rc - m_r) v_c over the keys so far, l_r = the sum of those
             * weights (online softmax: the earlier blocks are rescaled to each new maximum) */
            for (int j0 = 0; j0 < L; j0 += ATTN_BC) {
                const int nc = imin(L - j0, ATTN_BC);
                attn_gemm(0, 1, nr, nc, D, scale, qb0, ld, ROW_LD(k, ni, j0, h), ld, 0.0f, sc,
                          (size_t)bc);
                for (int r = 0; r < nr; r++) {
                    float *sr = sc + (size_t)r * bc;
                    float mx = j0 ? m[r] : -INFINITY;
#pragma omp simd reduction(max : mx)
                    for (int c = 0; c < nc; c++) mx = sr[c] > mx ? sr[c] : mx;
                    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
                    for (int c = 0; c < nc; c++) {
                        sr[c] = vm_expf(sr[c] - mx);
                        sum += sr[c];
                    }
                    if (j0) {
                        const float alpha = vm_expf(m[r] - mx);
                        l[r] = l[r] * alpha + sum;
                        if (alpha != 1.0f) {
                            float *orow = ob + (size_t)r * hd;
#pragma omp simd
                            for (int e = 0; e < D; e++) orow[e] *= alpha;
                        }
                    } else {
                        l[r] = sum;
                    }
                    m[r] = mx;
                }
                attn_gemm(0, 0, nr, D, nc, 1.0f, sc, (size_t)bc, ROW_LD(v, ni, j0, h), ld,
                          j0 ? 1.0f : 0.0f, ob, hd);
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

int cpu_attn_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                 const float *k, const float *v, const float *o, const float *lse, void *ws,
                 const struct bk_attn *s, bk_ctx *ctx)
{
    if (attn_check(s) != BK_OK || !dq || !dk || !dv || !dout || !q || !k || !v || !o || !lse ||
        !ws || !ctx)
        return BK_ERR_INVALID;
    const int L = s->l, H = s->heads, D = s->d;
    const size_t ld = (size_t)s->ld, hd = (size_t)H * D, slot = attn_slot_floats(s);
    const float scale = s->scale;
    const int nt = cpu_threads(ctx);
    const int pairs = s->n * H, nkb = (L + ATTN_BC - 1) / ATTN_BC, nch = attn_chunks(s, nt);
    const int br = imin(ATTN_BR, L), bc = imin(ATTN_BC, L);
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
                for (int i0 = 0; i0 < L; i0 += ATTN_BR) {
                    const int nr = imin(L - i0, ATTN_BR);
                    const float *qi = ROW_LD(q, ni, i0, h), *doi = ROW_HD(dout, ni, i0, h);
                    attn_gemm(0, 1, nr, nc, D, scale, qi, ld, kj, ld, 0.0f, pt, (size_t)bc);
                    attn_gemm(0, 1, nr, nc, D, 1.0f, doi, hd, vj, ld, 0.0f, dst, (size_t)bc);
                    for (int r = 0; r < nr; r++) {
                        float *prow = pt + (size_t)r * bc, *drow = dst + (size_t)r * bc;
                        const float lr = lrow[i0 + r], dr = di[i0 + r];
#pragma omp simd
                        for (int c = 0; c < nc; c++) {
                            const float pc = vm_expf(prow[c] - lr);
                            prow[c] = pc;
                            drow[c] = pc * (drow[c] - dr) * scale;
                        }
                    }
                    const float beta = i0 ? 1.0f : 0.0f;
                    attn_gemm(1, 0, nc, D, nr, 1.0f, pt, (size_t)bc, doi, hd, beta, dvj, ld);
                    attn_gemm(1, 0, nc, D, nr, 1.0f, dst, (size_t)bc, qi, ld, beta, dkj, ld);
                    attn_gemm(0, 0, nr, D, nc, 1.0f, dst, (size_t)bc, kj, ld,
                              jb > kb0 ? 1.0f : 0.0f, dqp + (size_t)i0 * ldq, ldq);
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

/* Plain form, per (n, h): S = scale q k^T (L,L) into p, row softmax, o = p v; three GEMMs.
 * With at least as many (n, h) pairs as threads, each thread takes whole pairs and runs them
 * with single-threaded GEMMs (small heads: no split overhead); otherwise the pairs run in turn,
 * each GEMM split across the threads by cpu_gemm. Either way a pair's results depend only on
 * the thread count. */
static int attn_plain_split(const struct bk_attn *s, const bk_ctx *ctx)
{
    int nt = cpu_threads(ctx);
    return s->n * s->heads >= nt ? nt : 0; /* threads over pairs, or 0: pairs in turn */
}

static void plain_fwd_one(float *o, float *p, const float *q, const float *k, const float *v,
                          const struct bk_attn *s, int nh, bk_ctx *c)
{
    const int L = s->l, H = s->heads, D = s->d, h = nh % H, ni = nh / H;
    const size_t ld = (size_t)s->ld, hd = (size_t)H * D;
    float *ph = p + (size_t)nh * L * L;
    cpu_gemm(0, 1, L, L, D, s->scale, ROW_LD(q, ni, 0, h), (int)ld, ROW_LD(k, ni, 0, h), (int)ld,
             0.0f, ph, L, c);
#pragma omp parallel for num_threads(c->threads) schedule(static)
    for (int i = 0; i < L; i++) {
        float *pr = ph + (size_t)i * L;
        float mx = -INFINITY;
        for (int j = 0; j < L; j++) mx = fmaxf(mx, pr[j]);
#pragma omp simd
        for (int j = 0; j < L; j++) pr[j] = vm_expf(pr[j] - mx);
        double sum = 0.0;
        for (int j = 0; j < L; j++) sum += pr[j];
        const float inv = (float)(1.0 / sum);
        for (int j = 0; j < L; j++) pr[j] *= inv;
    }
    cpu_gemm(0, 0, L, D, L, 1.0f, ph, L, ROW_LD(v, ni, 0, h), (int)ld, 0.0f, ROW_HD(o, ni, 0, h),
             (int)hd, c);
}

int cpu_attn_plain_fwd(float *o, float *p, const float *q, const float *k, const float *v,
                       void *ws, const struct bk_attn *s, bk_ctx *ctx)
{
    if (attn_check(s) != BK_OK || !o || !p || !q || !k || !v || !ctx) return BK_ERR_INVALID;
    const int pairs = s->n * s->heads, nt = attn_plain_split(s, ctx);
    if (nt) {
        bk_ctx one = {.threads = 1};
#pragma omp parallel for num_threads(nt) schedule(static)
        for (int nh = 0; nh < pairs; nh++) plain_fwd_one(o, p, q, k, v, s, nh, &one);
    } else {
        for (int nh = 0; nh < pairs; nh++) plain_fwd_one(o, p, q, k, v, s, nh, ctx);
    }
    return BK_OK;
}

/* per (n, h): dp = dout v^T, ds = scale p (dp - rowsum(p dp)) (in ds, L x L), dq = ds k,
 * dk = ds^T q, dv = p^T dout */
static void plain_bwd_one(float *dq, float *dk, float *dv, const float *dout, const float *q,
                          const float *k, const float *v, const float *p, float *ds,
                          const struct bk_attn *s, int nh, bk_ctx *c)
{
    const int L = s->l, H = s->heads, D = s->d, h = nh % H, ni = nh / H;
    const size_t ld = (size_t)s->ld, hd = (size_t)H * D;
    const float scale = s->scale;
    const float *ph = p + (size_t)nh * L * L;
    cpu_gemm(0, 1, L, L, D, 1.0f, ROW_HD(dout, ni, 0, h), (int)hd, ROW_LD(v, ni, 0, h), (int)ld,
             0.0f, ds, L, c);
#pragma omp parallel for num_threads(c->threads) schedule(static)
    for (int i = 0; i < L; i++) {
        const float *pr = ph + (size_t)i * L;
        float *dsr = ds + (size_t)i * L;
        double rs = 0.0;
        for (int j = 0; j < L; j++) rs += (double)pr[j] * dsr[j];
        const float rsf = (float)rs;
        for (int j = 0; j < L; j++) dsr[j] = pr[j] * (dsr[j] - rsf) * scale;
    }
    cpu_gemm(0, 0, L, D, L, 1.0f, ds, L, ROW_LD(k, ni, 0, h), (int)ld, 0.0f, ROW_LD(dq, ni, 0, h),
             (int)ld, c);
    cpu_gemm(1, 0, L, D, L, 1.0f, ds, L, ROW_LD(q, ni, 0, h), (int)ld, 0.0f, ROW_LD(dk, ni, 0, h),
             (int)ld, c);
    cpu_gemm(1, 0, L, D, L, 1.0f, ph, L, ROW_HD(dout, ni, 0, h), (int)hd, 0.0f,
             ROW_LD(dv, ni, 0, h), (int)ld, c);
}

int cpu_attn_plain_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                       const float *k, const float *v, const float *p, void *ws,
                       const struct bk_attn *s, bk_ctx *ctx)
{
    if (attn_check(s) != BK_OK || !dq || !dk || !dv || !dout || !q || !k || !v || !p || !ws ||
        !ctx)
        return BK_ERR_INVALID;
    const int pairs = s->n * s->heads, nt = attn_plain_split(s, ctx);
    const size_t ll = (size_t)s->l * s->l;
    if (nt) {
        bk_ctx one = {.threads = 1};
#pragma omp parallel num_threads(nt)
        {
            float *ds = (float *)ws + (size_t)omp_get_thread_num() * ll;
#pragma omp for schedule(static)
            for (int nh = 0; nh < pairs; nh++)
                plain_bwd_one(dq, dk, dv, dout, q, k, v, p, ds, s, nh, &one);
        }
    } else {
        for (int nh = 0; nh < pairs; nh++)
            plain_bwd_one(dq, dk, dv, dout, q, k, v, p, ws, s, nh, ctx);
    }
    return BK_OK;
}
