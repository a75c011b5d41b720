/* optim.c - the CPU backend's optimizer kernels over the flat parameter buffer: sum of squares
 * (gradient-norm clipping), AdamW in PyTorch's single-tensor order of operations, and the EMA.
 * The sum of squares is a double reduction over fixed chunks combined in a fixed order.
 */
#include <math.h>
#include <omp.h>

#include "cpu.h"

#define OPTIM_PAR_MIN 16384
#define OPTIM_CHUNK_MIN 16384 /* elements per reduction chunk, at least */
#define OPTIM_CHUNK_MAX 256   /* reduction chunks, at most (partials live on the stack) */

/* PyTorch's lerp (ATen/native/Lerp.h): self + w*(end - self) for |w| < 0.5, otherwise
 * end - (end - self)*(1 - w), which is exact at w = 1. */
static inline float optim_lerp(float self, float end, float w)
{
    return fabsf(w) < 0.5f ? self + w * (end - self) : end - (end - self) * (1.0f - w);
}

/* sumsq's chunks: a count's chunk count, and chunk ch of nch's sum of squares. The chunking
 * depends on count only, so a sum is bit-identical at any thread count. */
static size_t sumsq_chunks(size_t count)
{
    size_t nch = (count + OPTIM_CHUNK_MIN - 1) / OPTIM_CHUNK_MIN;
    if (nch > OPTIM_CHUNK_MAX) nch = OPTIM_CHUNK_MAX;
    return nch ? nch : 1;
}

static double sumsq_chunk(const float *x, size_t count, size_t ch, size_t nch)
{
    size_t i0 = count * ch / nch, i1 = count * (ch + 1) / nch;
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    size_t i = i0;
    for (; i + 8 <= i1; i += 8)
        for (int l = 0; l < 8; l++) {
            double v = (double)x[i + l];
            acc[l] += v * v;
        }
    for (int l = 0; i < i1; i++, l++) {
        double v = (double)x[i];
        acc[l] += v * v;
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* out_host[0] = sum of x[i]^2 (count), in double: the chunks' sums added in order */
int cpu_sumsq(double *out_host, const float *x, size_t count, bk_ctx *ctx)
{
    double part[OPTIM_CHUNK_MAX];
    const size_t nch = sumsq_chunks(count);
#pragma omp parallel for num_threads(ctx->threads) if (nch > 1) schedule(static)
    for (size_t ch = 0; ch < nch; ch++) part[ch] = sumsq_chunk(x, count, ch, nch);
    double s = 0.0;
    for (size_t ch = 0; ch < nch; ch++) s += part[ch];
    out_host[0] = s;
    return BK_OK;
}

/* every segment's chunks in one parallel loop (a call per gradient was an OpenMP region per
 * gradient: ~200 a step), then each segment's chunk sums added in cpu_sumsq's order */
int cpu_sumsq_segs(double *out_host, const struct bk_seg *segs, int n, bk_ctx *ctx)
{
    if (n <= 0) return BK_OK;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += sumsq_chunks(segs[i].count);
    /* the chunks' sums, each chunk's segment, each segment's first chunk */
    double *part = cpu_tables(ctx, total * (sizeof(double) + sizeof(int)) +
                                       ((size_t)n + 1) * sizeof(size_t));
    if (!part) return BK_ERR_NOMEM;
    size_t *first = (size_t *)(part + total);
    int *seg_of = (int *)(first + n + 1);
    first[0] = 0;
    for (int i = 0; i < n; i++) {
        first[i + 1] = first[i] + sumsq_chunks(segs[i].count);
        for (size_t c = first[i]; c < first[i + 1]; c++) seg_of[c] = i;
    }
    /* a chunk's result does not depend on which thread takes it: dynamic for the uneven sizes */
#pragma omp parallel for num_threads(ctx->threads) if (total > 1) schedule(dynamic, 4)
    for (size_t c = 0; c < total; c++) {
        const struct bk_seg *sg = &segs[seg_of[c]];
        const size_t f = first[seg_of[c]];
        part[c] = sumsq_chunk(sg->g, sg->count, c - f, first[seg_of[c] + 1] - f);
    }
    for (int i = 0; i < n; i++) {
        double s = 0.0;
        for (size_t c = first[i]; c < first[i + 1]; c++) s += part[c];
        out_host[i] = s;
    }
    return BK_OK;
}

/* One AdamW step over w, m, v, g (count), torch.optim.AdamW(foreach=False) order:
 *   g = g*gscale; w = w*(1 - lr*wd); m = lerp(m, g, 1-beta1); v = v*beta2 + ((1-beta2)*g)*g;
 *   denom = sqrt(v)/bias_c2_sqrt + eps; w = w - (lr/bias_c1) * (m/denom).
 * The scalar factors are rounded to float once, as torch passes them to float kernels. */
/* AdamW, and the EMA of the updated weights when ema is not NULL, in one pass over memory.
 * optim_lerp's branch depends only on its constant weight: m_small and e_mode are literal
 * constants at each call of this always-inlined loop, so every specialisation is branch-free
 * and vectorizes. e_mode: 0 no EMA, 1 the |w| < 0.5 lerp form, 2 the other. */
struct adamw_k {
    float gscale, decay, w1, b2, w2, c2, eps, step_size, ew;
};

static inline __attribute__((always_inline)) void
adamw_chunk(float *restrict w, float *restrict m, float *restrict v, float *restrict ema,
            const float *restrict g, const struct adamw_k *k, size_t i0, size_t i1,
            const int m_small, const int e_mode)
{
    const float gscale = k->gscale, decay = k->decay, w1 = k->w1, b2 = k->b2, w2 = k->w2;
    const float c2 = k->c2, eps = k->eps, step_size = k->step_size, ew = k->ew;
#pragma omp simd
    for (size_t i = i0; i < i1; i++) {
        float gi = g[i] * gscale;
        float wi = w[i] * decay;
        float mi = m_small ? m[i] + w1 * (gi - m[i]) : gi - (gi - m[i]) * (1.0f - w1);
        float vi = v[i] * b2 + (w2 * gi) * gi;
        float denom = sqrtf(vi) / c2 + eps;
        wi = wi - step_size * (mi / denom);
        w[i] = wi;
        m[i] = mi;
        v[i] = vi;
        if (e_mode == 1) ema[i] = ema[i] + ew * (wi - ema[i]);
        if (e_mode == 2) ema[i] = wi - (wi - ema[i]) * (1.0f - ew);
    }
}

static struct adamw_k adamw_consts(float gscale, const struct bk_adamw *h, float ema_decay)
{
    return (struct adamw_k){
        .gscale = gscale,
        .decay = (float)(1.0 - (double)h->lr * (double)h->weight_decay),
        .w1 = 1.0f - h->beta1,
        .b2 = h->beta2,
        .w2 = 1.0f - h->beta2,
        .c2 = h->bias_c2_sqrt,
        .eps = h->eps,
        .step_size = h->lr / h->bias_c1,
        .ew = 1.0f - ema_decay,
    };
}

/* adamw_chunk's specialisation for the constants' lerp forms (ema NULL: no EMA) */
static void adamw_range(float *w, float *m, float *v, float *ema, const float *g,
                        const struct adamw_k *k, size_t i0, size_t i1)
{
    const int mode = (fabsf(k->w1) < 0.5f ? 3 : 0) + (!ema ? 0 : fabsf(k->ew) < 0.5f ? 1 : 2);
    switch (mode) {
    case 0: adamw_chunk(w, m, v, ema, g, k, i0, i1, 0, 0); break;
    case 1: adamw_chunk(w, m, v, ema, g, k, i0, i1, 0, 1); break;
    case 2: adamw_chunk(w, m, v, ema, g, k, i0, i1, 0, 2); break;
    case 3: adamw_chunk(w, m, v, ema, g, k, i0, i1, 1, 0); break;
    case 4: adamw_chunk(w, m, v, ema, g, k, i0, i1, 1, 1); break;
    default: adamw_chunk(w, m, v, ema, g, k, i0, i1, 1, 2); break;
    }
}

/* thread id's share of `count` elements: equal contiguous chunks, 16-element aligned (the
 * arithmetic is element-wise, so the split changes no result) */
static void thread_span(size_t count, size_t nt, size_t id, size_t *i0, size_t *i1)
{
    size_t per = (count + nt - 1) / nt;
    per = (per + 15) / 16 * 16;
    *i0 = id * per < count ? id * per : count;
    *i1 = *i0 + per < count ? *i0 + per : count;
}

static int adamw(float *w, float *m, float *v, float *ema, const float *g, float gscale,
                 const struct bk_adamw *h, float ema_decay, size_t count, bk_ctx *ctx)
{
    const struct adamw_k k = adamw_consts(gscale, h, ema_decay);
#pragma omp parallel num_threads(ctx->threads) if (count >= OPTIM_PAR_MIN)
    {
        size_t i0, i1;
        thread_span(count, (size_t)omp_get_num_threads(), (size_t)omp_get_thread_num(), &i0, &i1);
        adamw_range(w, m, v, ema, g, &k, i0, i1);
    }
    return BK_OK;
}

/* the segments laid end to end, split among the threads as one count: each thread steps the
 * parts of the segments its span covers, in one parallel region */
int cpu_adamw_segs(float *w, float *m, float *v, float *ema, const struct bk_seg *segs, int n,
                   float gscale, const struct bk_adamw *h, float ema_decay, bk_ctx *ctx)
{
    const struct adamw_k k = adamw_consts(gscale, h, ema_decay);
    if (ema_decay <= 0.0f) ema = NULL;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += segs[i].count;
#pragma omp parallel num_threads(ctx->threads) if (total >= OPTIM_PAR_MIN)
    {
        size_t t0, t1, at = 0;
        thread_span(total, (size_t)omp_get_num_threads(), (size_t)omp_get_thread_num(), &t0, &t1);
        for (int i = 0; i < n && at < t1; at += segs[i++].count) {
            const size_t a = t0 > at ? t0 - at : 0, b = t1 - at < segs[i].count ? t1 - at
                                                                                : segs[i].count;
            if (a >= b) continue;
            const size_t r = segs[i].rel;
            adamw_range(w + r, m + r, v + r, ema ? ema + r : NULL, segs[i].g, &k, a, b);
        }
    }
    return BK_OK;
}

int cpu_adamw_step(float *w, float *m, float *v, const float *g, float gscale,
                   const struct bk_adamw *h, size_t count, bk_ctx *ctx)
{
    return adamw(w, m, v, NULL, g, gscale, h, 0.0f, count, ctx);
}

int cpu_adamw_ema_step(float *w, float *m, float *v, float *ema, const float *g, float gscale,
                       const struct bk_adamw *h, float ema_decay, size_t count, bk_ctx *ctx)
{
    return adamw(w, m, v, ema, g, gscale, h, ema_decay, count, ctx);
}

/* ema (count) = ema + (w - ema)*(1 - decay): the torch lerp form (ema.lerp_(w, 1 - decay)),
 * equal to decay*ema + (1-decay)*w up to rounding; exact copy of w when decay = 0. */
int cpu_ema_update(float *ema, const float *w, float decay, size_t count, bk_ctx *ctx)
{
    const float wt = 1.0f - decay;
#pragma omp parallel for num_threads(ctx->threads) if (count >= OPTIM_PAR_MIN) schedule(static)
    for (size_t i = 0; i < count; i++) ema[i] = optim_lerp(ema[i], w[i], wt);
    return BK_OK;
}
