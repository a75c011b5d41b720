/* attention.c - CPU multi-head self-attention o = softmax(scale q k^T) v, in two forms: tiled
 * (FlashAttention-style online softmax, saves only lse (N,H,L), no workspace) and plain (saves
 * p (N,H,L,L); its backward takes an L x L workspace; GEMMs through cpu_gemm).
 * q, k, v, dq, dk, dv rows have stride s->ld; o and dout are dense (N,L,H*D); head h of a token
 * is the columns [h*D, (h+1)*D) of its row. The tiled form does every sum in one thread in a
 * fixed order (no thread-count dependence); its backward runs a pass over key blocks for dk, dv
 * and a pass over query blocks for dq instead of racing on dq. The plain form's results depend
 * on the thread count (cpu_gemm's split), as the convolutions' do.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "cpu.h"
#include "vmath.h"

/* query rows and key columns of one tile; the only scratch is a few of these on the stack */
#define ATTN_BR 32
#define ATTN_BC 32

/* dot product in 8 interleaved partial sums (an order the compiler can map onto one vector
 * register without reassociating), reduced pairwise */
static inline float attn_dot(const float *restrict a, const float *restrict b, int n)
{
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    int t = 0;
    for (; t + 8 <= n; t += 8)
        for (int u = 0; u < 8; u++) acc[u] += a[t + u] * b[t + u];
    for (int u = 0; t + u < n; u++) acc[u] += a[t + u] * b[t + u];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* four attn_dot(a, b_j) at once (a loaded once); each result has attn_dot's exact order */
static inline void attn_dot4(float *out, const float *restrict a, const float *restrict b0,
                             const float *restrict b1, const float *restrict b2,
                             const float *restrict b3, int n)
{
    float c0[8] = {0}, c1[8] = {0}, c2[8] = {0}, c3[8] = {0};
    int t = 0;
    for (; t + 8 <= n; t += 8)
        for (int u = 0; u < 8; u++) {
            c0[u] += a[t + u] * b0[t + u];
            c1[u] += a[t + u] * b1[t + u];
            c2[u] += a[t + u] * b2[t + u];
            c3[u] += a[t + u] * b3[t + u];
        }
    for (int u = 0; t + u < n; u++) {
        c0[u] += a[t + u] * b0[t + u];
        c1[u] += a[t + u] * b1[t + u];
        c2[u] += a[t + u] * b2[t + u];
        c3[u] += a[t + u] * b3[t + u];
    }
    out[0] = ((c0[0] + c0[4]) + (c0[1] + c0[5])) + ((c0[2] + c0[6]) + (c0[3] + c0[7]));
    out[1] = ((c1[0] + c1[4]) + (c1[1] + c1[5])) + ((c1[2] + c1[6]) + (c1[3] + c1[7]));
    out[2] = ((c2[0] + c2[4]) + (c2[1] + c2[5])) + ((c2[2] + c2[6]) + (c2[3] + c2[7]));
    out[3] = ((c3[0] + c3[4]) + (c3[1] + c3[5])) + ((c3[2] + c3[6]) + (c3[3] + c3[7]));
}

/* out[c] = a . b_c, b_c = b + c ldb, for c in [0, nc) */
static void attn_dots(float *out, const float *a, const float *b, size_t ldb, int nc, int n)
{
    int c = 0;
    for (; c + 4 <= nc; c += 4)
        attn_dot4(out + c, a, b + c * ldb, b + (c + 1) * ldb, b + (c + 2) * ldb,
                  b + (c + 3) * ldb, n);
    for (; c < nc; c++) out[c] = attn_dot(a, b + c * ldb, n);
}

/* y += w_c x_c over c in [0, nc) in increasing c, w_c = w[c wst], x_c = x + c ldx. Four terms
 * are added per pass over y, in the same order as four single updates: same bits, fewer
 * loads and stores of y. */
static void attn_axpys(float *restrict y, const float *w, size_t wst, const float *x, size_t ldx,
                       int nc, int n)
{
    int c = 0;
    for (; c + 4 <= nc; c += 4) {
        const float a0 = w[c * wst], a1 = w[(c + 1) * wst], a2 = w[(c + 2) * wst],
                    a3 = w[(c + 3) * wst];
        const float *restrict x0 = x + c * ldx, *restrict x1 = x0 + ldx, *restrict x2 = x1 + ldx,
                              *restrict x3 = x2 + ldx;
        int t = 0;
        for (; t + 8 <= n; t += 8)
            for (int u = 0; u < 8; u++)
                y[t + u] = (((y[t + u] + a0 * x0[t + u]) + a1 * x1[t + u]) + a2 * x2[t + u]) +
                           a3 * x3[t + u];
        for (; t < n; t++) y[t] = (((y[t] + a0 * x0[t]) + a1 * x1[t]) + a2 * x2[t]) + a3 * x3[t];
    }
    for (; c < nc; c++) {
        const float a = w[c * wst];
        const float *restrict xc = x + c * ldx;
        for (int t = 0; t < n; t++) y[t] += a * xc[t];
    }
}

static inline void attn_scal(float *y, float a, int n)
{
    for (int t = 0; t < n; t++) y[t] *= a;
}

static int attn_check(const struct bk_attn *s)
{
    if (!s || s->n < 1 || s->l < 1 || s->heads < 1 || s->d < 1) return BK_ERR_INVALID;
    if ((long long)s->heads * s->d > s->ld) return BK_ERR_INVALID;
    return BK_OK;
}

size_t cpu_attn_ws_bytes(const struct bk_attn *s, int tiled)
{
    if (attn_check(s) != BK_OK) return 0;
    /* tiled: none. plain backward: dS (L,L) of each (n, h) in flight: one per thread, at most
     * the machine's cores (see attn_plain_split) */
    if (tiled) return 0;
    int procs = cpu_threads(NULL), pairs = s->n * s->heads;
    int slots = pairs < procs ? pairs : procs;
    return (size_t)slots * s->l * s->l * sizeof(float);
}

/* row pointers: strided inputs (q, k, v, dq, dk, dv) and dense (o, dout) */
#define ROW_LD(p, ni, i, h) ((p) + ((size_t)(ni) * L + (i)) * ld + (size_t)(h) * D)
#define ROW_HD(p, ni, i, h) ((p) + ((size_t)(ni) * L + (i)) * hd + (size_t)(h) * D)

int cpu_attn_fwd(float *o, float *lse, const float *q, const float *k, const float *v,
                 void *ws, const struct bk_attn *s, bk_ctx *ctx)
{
    if (attn_check(s) != BK_OK || !o || !lse || !q || !k || !v || !ctx) return BK_ERR_INVALID;
    const int L = s->l, H = s->heads, D = s->d;
    const size_t ld = (size_t)s->ld, hd = (size_t)H * D;
    const float scale = s->scale;
    const int nqb = (L + ATTN_BR - 1) / ATTN_BR, tasks = s->n * H * nqb;
#pragma omp parallel for num_threads(ctx->threads) schedule(dynamic, 1)
    for (int t = 0; t < tasks; t++) {
        const int qb = t % nqb, h = (t / nqb) % H, ni = t / (nqb * H);
        const int i0 = qb * ATTN_BR, nr = L - i0 < ATTN_BR ? L - i0 : ATTN_BR;
        float m[ATTN_BR], l[ATTN_BR], sc[ATTN_BC];
        for (int r = 0; r < nr; r++) {
            m[r] = -INFINITY;
            l[r] = 0.0f;
            memset(ROW_HD(o, ni, i0 + r, h), 0, (size_t)D * sizeof(float));
        }
        /* key blocks outer so one block of k, v serves all rows of the query block; o itself
         * is the running (unnormalised) accumulator */
        for (int j0 = 0; j0 < L; j0 += ATTN_BC) {
            const int nc = L - j0 < ATTN_BC ? L - j0 : ATTN_BC;
            const float *kb = ROW_LD(k, ni, j0, h), *vb = ROW_LD(v, ni, j0, h);
            for (int r = 0; r < nr; r++) {
                float *orow = ROW_HD(o, ni, i0 + r, h);
                attn_dots(sc, ROW_LD(q, ni, i0 + r, h), kb, ld, nc, D);
                float mx = m[r];
                for (int c = 0; c < nc; c++) {
                    sc[c] *= scale;
                    mx = fmaxf(mx, sc[c]);
                }
                /* online softmax: rescale what the earlier blocks summed to the new maximum */
                const float alpha = expf(m[r] - mx);
                float sum = 0.0f;
                for (int c = 0; c < nc; c++) {
                    sc[c] = expf(sc[c] - mx);
                    sum += sc[c];
                }
                l[r] = l[r] * alpha + sum;
                m[r] = mx;
                if (alpha != 1.0f) attn_scal(orow, alpha, D);
                attn_axpys(orow, sc, 1, vb, ld, nc, D);
            }
        }
        for (int r = 0; r < nr; r++) {
            attn_scal(ROW_HD(o, ni, i0 + r, h), 1.0f / l[r], D);
            lse[((size_t)ni * H + h) * L + i0 + r] = m[r] + logf(l[r]);
        }
    }
    return BK_OK;
}

/* queries handled together by the dk, dv pass, so each dk, dv row is updated once per group */
#define ATTN_QG 4

int cpu_attn_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                 const float *k, const float *v, const float *o, const float *lse, void *ws,
                 const struct bk_attn *s, bk_ctx *ctx)
{
    if (attn_check(s) != BK_OK || !dq || !dk || !dv || !dout || !q || !k || !v || !o || !lse ||
        !ctx)
        return BK_ERR_INVALID;
    const int L = s->l, H = s->heads, D = s->d;
    const size_t ld = (size_t)s->ld, hd = (size_t)H * D;
    const float scale = s->scale;

    /* pass 1: dk, dv of one key block per task, summed over all queries in increasing order:
     * p = exp(scale q.k - lse), dp = dout.v, ds = p (dp - Di), Di = dout_i.o_i (recomputed
     * per block: D/(4*BC) of the block's work, and it keeps the tiled form workspace-free) */
    const int nkb = (L + ATTN_BC - 1) / ATTN_BC, tasks_k = s->n * H * nkb;
#pragma omp parallel for num_threads(ctx->threads) schedule(dynamic, 1)
    for (int t = 0; t < tasks_k; t++) {
        const int kb = t % nkb, h = (t / nkb) % H, ni = t / (nkb * H);
        const int j0 = kb * ATTN_BC, nc = L - j0 < ATTN_BC ? L - j0 : ATTN_BC;
        const float *lrow = lse + ((size_t)ni * H + h) * L;
        const float *kb0 = ROW_LD(k, ni, j0, h), *vb0 = ROW_LD(v, ni, j0, h);
        /* (query in group, key in block) */
        float p[ATTN_QG][ATTN_BC], ds[ATTN_QG][ATTN_BC];
        for (int c = 0; c < nc; c++) {
            memset(ROW_LD(dk, ni, j0 + c, h), 0, (size_t)D * sizeof(float));
            memset(ROW_LD(dv, ni, j0 + c, h), 0, (size_t)D * sizeof(float));
        }
        for (int i0 = 0; i0 < L; i0 += ATTN_QG) {
            const int ng = L - i0 < ATTN_QG ? L - i0 : ATTN_QG;
            for (int g = 0; g < ng; g++) {
                const float *qr = ROW_LD(q, ni, i0 + g, h), *dor = ROW_HD(dout, ni, i0 + g, h);
                const float di = attn_dot(dor, ROW_HD(o, ni, i0 + g, h), D);
                attn_dots(p[g], qr, kb0, ld, nc, D);
                attn_dots(ds[g], dor, vb0, ld, nc, D);
                for (int c = 0; c < nc; c++) {
                    p[g][c] = expf(p[g][c] * scale - lrow[i0 + g]);
                    ds[g][c] = p[g][c] * (ds[g][c] - di) * scale;
                }
            }
            for (int c = 0; c < nc; c++) {
                attn_axpys(ROW_LD(dv, ni, j0 + c, h), &p[0][c], ATTN_BC, ROW_HD(dout, ni, i0, h),
                           hd, ng, D);
                attn_axpys(ROW_LD(dk, ni, j0 + c, h), &ds[0][c], ATTN_BC, ROW_LD(q, ni, i0, h),
                           ld, ng, D);
            }
        }
    }

    /* pass 2: dq of one query block per task, summed over all keys in increasing order */
    const int nqb = (L + ATTN_BR - 1) / ATTN_BR, tasks_q = s->n * H * nqb;
#pragma omp parallel for num_threads(ctx->threads) schedule(dynamic, 1)
    for (int t = 0; t < tasks_q; t++) {
        const int qb = t % nqb, h = (t / nqb) % H, ni = t / (nqb * H);
        const int i0 = qb * ATTN_BR, nr = L - i0 < ATTN_BR ? L - i0 : ATTN_BR;
        const float *lrow = lse + ((size_t)ni * H + h) * L;
        float di[ATTN_BR], p[ATTN_BC], dp[ATTN_BC];
        for (int r = 0; r < nr; r++) {
            memset(ROW_LD(dq, ni, i0 + r, h), 0, (size_t)D * sizeof(float));
            di[r] = attn_dot(ROW_HD(dout, ni, i0 + r, h), ROW_HD(o, ni, i0 + r, h), D);
        }
        for (int j0 = 0; j0 < L; j0 += ATTN_BC) {
            const int nc = L - j0 < ATTN_BC ? L - j0 : ATTN_BC;
            const float *kb = ROW_LD(k, ni, j0, h), *vb = ROW_LD(v, ni, j0, h);
            for (int r = 0; r < nr; r++) {
                attn_dots(p, ROW_LD(q, ni, i0 + r, h), kb, ld, nc, D);
                attn_dots(dp, ROW_HD(dout, ni, i0 + r, h), vb, ld, nc, D);
                for (int c = 0; c < nc; c++) {
                    float pc = expf(p[c] * scale - lrow[i0 + r]);
                    dp[c] = pc * (dp[c] - di[r]) * scale; /* ds */
                }
                attn_axpys(ROW_LD(dq, ni, i0 + r, h), dp, 1, kb, ld, nc, D);
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
