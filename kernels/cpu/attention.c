/* attention.c - CPU multi-head self-attention o = softmax(scale q k^T) v, in two forms: tiled
 * (FlashAttention-style online softmax, saves only lse (N,H,L), no workspace) and plain (saves
 * p (N,H,L,L); its backward takes an L x L workspace).
 * q, k, v, dq, dk, dv rows have stride s->ld; o and dout are dense (N,L,H*D); head h of a token
 * is the columns [h*D, (h+1)*D) of its row. Every sum is done by one thread in a fixed order
 * (no thread-count dependence); the backward of the tiled form runs a pass over key blocks for
 * dk, dv and a pass over query blocks for dq instead of racing on dq.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"

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

/* y += a x */
static inline void attn_axpy(float *restrict y, float a, const float *restrict x, int n)
{
    int t = 0;
    for (; t + 8 <= n; t += 8)
        for (int u = 0; u < 8; u++) y[t + u] += a * x[t + u];
    for (; t < n; t++) y[t] += a * x[t];
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
    /* tiled: none. plain backward: dS of one (n, h) at a time, (L,L) */
    return tiled ? 0 : (size_t)s->l * s->l * sizeof(float);
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
        /* key blocks outer so one block of k, v serves all rows of the query block */
        for (int j0 = 0; j0 < L; j0 += ATTN_BC) {
            const int nc = L - j0 < ATTN_BC ? L - j0 : ATTN_BC;
            for (int r = 0; r < nr; r++) {
                const float *qr = ROW_LD(q, ni, i0 + r, h);
                float *orow = ROW_HD(o, ni, i0 + r, h);
                float mx = m[r];
                for (int c = 0; c < nc; c++) {
                    sc[c] = attn_dot(qr, ROW_LD(k, ni, j0 + c, h), D) * scale;
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
                for (int c = 0; c < nc; c++) attn_axpy(orow, sc[c], ROW_LD(v, ni, j0 + c, h), D);
            }
        }
        for (int r = 0; r < nr; r++) {
            attn_scal(ROW_HD(o, ni, i0 + r, h), 1.0f / l[r], D);
            lse[((size_t)ni * H + h) * L + i0 + r] = m[r] + logf(l[r]);
        }
    }
    return BK_OK;
}

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

    /* pass 1: dk, dv of one key block per task, summed over all queries in order.
     * p = exp(scale q.k - lse), dp = dout.v, ds = p (dp - Di), Di = dout_i.o_i (recomputed
     * per block: D/(4*BC) of the block's work, and it keeps the tiled form workspace-free) */
    const int nkb = (L + ATTN_BC - 1) / ATTN_BC, tasks_k = s->n * H * nkb;
#pragma omp parallel for num_threads(ctx->threads) schedule(dynamic, 1)
    for (int t = 0; t < tasks_k; t++) {
        const int kb = t % nkb, h = (t / nkb) % H, ni = t / (nkb * H);
        const int j0 = kb * ATTN_BC, nc = L - j0 < ATTN_BC ? L - j0 : ATTN_BC;
        const float *lrow = lse + ((size_t)ni * H + h) * L;
        float p[ATTN_BC];
        for (int c = 0; c < nc; c++) {
            memset(ROW_LD(dk, ni, j0 + c, h), 0, (size_t)D * sizeof(float));
            memset(ROW_LD(dv, ni, j0 + c, h), 0, (size_t)D * sizeof(float));
        }
        for (int i = 0; i < L; i++) {
            const float *qr = ROW_LD(q, ni, i, h), *dor = ROW_HD(dout, ni, i, h);
            const float di = attn_dot(dor, ROW_HD(o, ni, i, h), D);
            for (int c = 0; c < nc; c++)
                p[c] = expf(attn_dot(qr, ROW_LD(k, ni, j0 + c, h), D) * scale - lrow[i]);
            for (int c = 0; c < nc; c++) {
                attn_axpy(ROW_LD(dv, ni, j0 + c, h), p[c], dor, D);
                float dp = attn_dot(dor, ROW_LD(v, ni, j0 + c, h), D);
                attn_axpy(ROW_LD(dk, ni, j0 + c, h), p[c] * (dp - di) * scale, qr, D);
            }
        }
    }

    /* pass 2: dq of one query block per task, summed over all keys in order */
    const int nqb = (L + ATTN_BR - 1) / ATTN_BR, tasks_q = s->n * H * nqb;
#pragma omp parallel for num_threads(ctx->threads) schedule(dynamic, 1)
    for (int t = 0; t < tasks_q; t++) {
        const int qb = t % nqb, h = (t / nqb) % H, ni = t / (nqb * H);
        const int i0 = qb * ATTN_BR, nr = L - i0 < ATTN_BR ? L - i0 : ATTN_BR;
        const float *lrow = lse + ((size_t)ni * H + h) * L;
        float di[ATTN_BR];
        for (int r = 0; r < nr; r++) {
            memset(ROW_LD(dq, ni, i0 + r, h), 0, (size_t)D * sizeof(float));
            di[r] = attn_dot(ROW_HD(dout, ni, i0 + r, h), ROW_HD(o, ni, i0 + r, h), D);
        }
        for (int j0 = 0; j0 < L; j0 += ATTN_BC) {
            const int nc = L - j0 < ATTN_BC ? L - j0 : ATTN_BC;
            for (int r = 0; r < nr; r++) {
                const float *qr = ROW_LD(q, ni, i0 + r, h), *dor = ROW_HD(dout, ni, i0 + r, h);
                float *dqr = ROW_LD(dq, ni, i0 + r, h);
                for (int c = 0; c < nc; c++) {
                    const float *kc = ROW_LD(k, ni, j0 + c, h);
                    float p = expf(attn_dot(qr, kc, D) * scale - lrow[i0 + r]);
                    float dp = attn_dot(dor, ROW_LD(v, ni, j0 + c, h), D);
                    attn_axpy(dqr, p * (dp - di[r]) * scale, kc, D);
                }
            }
        }
    }
    return BK_OK;
}

int cpu_attn_plain_fwd(float *o, float *p, const float *q, const float *k, const float *v,
                       void *ws, const struct bk_attn *s, bk_ctx *ctx)
{
    if (attn_check(s) != BK_OK || !o || !p || !q || !k || !v || !ctx) return BK_ERR_INVALID;
    const int L = s->l, H = s->heads, D = s->d;
    const size_t ld = (size_t)s->ld, hd = (size_t)H * D;
    const float scale = s->scale;
    const int rows = s->n * H * L;
    /* one task per (n, h, query row): p row (L) then o row (D) */
#pragma omp parallel for num_threads(ctx->threads) schedule(static)
    for (int t = 0; t < rows; t++) {
        const int i = t % L, h = (t / L) % H, ni = t / (L * H);
        const float *qr = ROW_LD(q, ni, i, h);
        float *pr = p + (size_t)t * L, *orow = ROW_HD(o, ni, i, h);
        float mx = -INFINITY;
        for (int c = 0; c < L; c++) {
            pr[c] = attn_dot(qr, ROW_LD(k, ni, c, h), D) * scale;
            mx = fmaxf(mx, pr[c]);
        }
        double sum = 0.0;
        for (int c = 0; c < L; c++) {
            pr[c] = expf(pr[c] - mx);
            sum += pr[c];
        }
        const float inv = (float)(1.0 / sum);
        memset(orow, 0, (size_t)D * sizeof(float));
        for (int c = 0; c < L; c++) {
            pr[c] *= inv;
            attn_axpy(orow, pr[c], ROW_LD(v, ni, c, h), D);
        }
    }
    return BK_OK;
}

int cpu_attn_plain_bwd(float *dq, float *dk, float *dv, const float *dout, const float *q,
                       const float *k, const float *v, const float *p, void *ws,
                       const struct bk_attn *s, bk_ctx *ctx)
{
    if (attn_check(s) != BK_OK || !dq || !dk || !dv || !dout || !q || !k || !v || !p || !ws ||
        !ctx)
        return BK_ERR_INVALID;
    const int L = s->l, H = s->heads, D = s->d;
    const size_t ld = (size_t)s->ld, hd = (size_t)H * D;
    const float scale = s->scale;
    float *ds = ws; /* (L,L): scale * dS of the current (n, h) */
#pragma omp parallel num_threads(ctx->threads)
    for (int nh = 0; nh < s->n * H; nh++) {
        const int h = nh % H, ni = nh / H;
        const float *ph = p + (size_t)nh * L * L;
        /* rows: dp = dout v^T, ds = p (dp - rowsum(p dp)), dq = scale ds k */
#pragma omp for schedule(static)
        for (int i = 0; i < L; i++) {
            const float *dor = ROW_HD(dout, ni, i, h), *pr = ph + (size_t)i * L;
            float *dsr = ds + (size_t)i * L, *dqr = ROW_LD(dq, ni, i, h);
            double rs = 0.0;
            for (int c = 0; c < L; c++) {
                dsr[c] = attn_dot(dor, ROW_LD(v, ni, c, h), D);
                rs += (double)pr[c] * dsr[c];
            }
            const float rsf = (float)rs;
            memset(dqr, 0, (size_t)D * sizeof(float));
            for (int c = 0; c < L; c++) {
                dsr[c] = pr[c] * (dsr[c] - rsf) * scale;
                attn_axpy(dqr, dsr[c], ROW_LD(k, ni, c, h), D);
            }
        }
        /* columns: dv = p^T dout, dk = (scale ds)^T q; the implicit barrier above orders
         * the reads of ds after its writes */
#pragma omp for schedule(static)
        for (int c = 0; c < L; c++) {
            float *dkr = ROW_LD(dk, ni, c, h), *dvr = ROW_LD(dv, ni, c, h);
            memset(dkr, 0, (size_t)D * sizeof(float));
            memset(dvr, 0, (size_t)D * sizeof(float));
            for (int i = 0; i < L; i++) {
                attn_axpy(dvr, ph[(size_t)i * L + c], ROW_HD(dout, ni, i, h), D);
                attn_axpy(dkr, ds[(size_t)i * L + c], ROW_LD(q, ni, i, h), D);
            }
        }
    }
    return BK_OK;
}
