/* optim.c - the CPU backend's optimizer kernels over the flat parameter buffer: sum of squares
 * (gradient-norm clipping), AdamW in PyTorch's single-tensor order of operations, and the EMA.
 * The sum of squares is a double reduction over fixed chunks combined in a fixed order.
 */
#include <math.h>

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

/* out_host[0] = sum of x[i]^2 (count), in double. The chunking depends on count only, so the
 * result is bit-identical at any thread count. */
int cpu_sumsq(double *out_host, const float *x, size_t count, bk_ctx *ctx)
{
    double part[OPTIM_CHUNK_MAX];
    size_t nch = (count + OPTIM_CHUNK_MIN - 1) / OPTIM_CHUNK_MIN;
    if (nch > OPTIM_CHUNK_MAX) nch = OPTIM_CHUNK_MAX;
    if (nch == 0) nch = 1;
#pragma omp parallel for num_threads(ctx->threads) if (nch > 1) schedule(static)
    for (size_t ch = 0; ch < nch; ch++) {
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
        part[ch] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
                   ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
    double s = 0.0;
    for (size_t ch = 0; ch < nch; ch++) s += part[ch];
    out_host[0] = s;
    return BK_OK;
}

/* One AdamW step over w, m, v, g (count), torch.optim.AdamW(foreach=False) order:
 *   g = g*gscale; w = w*(1 - lr*wd); m = lerp(m, g, 1-beta1); v = v*beta2 + ((1-beta2)*g)*g;
 *   denom = sqrt(v)/bias_c2_sqrt + eps; w = w - (lr/bias_c1) * (m/denom).
 * The scalar factors are rounded to float once, as torch passes them to float kernels. */
int cpu_adamw_step(float *w, float *m, float *v, const float *g, float gscale,
                   const struct bk_adamw *h, size_t count, bk_ctx *ctx)
{
    const float decay = (float)(1.0 - (double)h->lr * (double)h->weight_decay);
    const float w1 = 1.0f - h->beta1, b2 = h->beta2, w2 = 1.0f - h->beta2;
    const float c2 = h->bias_c2_sqrt, eps = h->eps;
    const float step_size = h->lr / h->bias_c1;
#pragma omp parallel for num_threads(ctx->threads) if (count >= OPTIM_PAR_MIN) schedule(static)
    for (size_t i = 0; i < count; i++) {
        float gi = g[i] * gscale;
        float wi = w[i] * decay;
        float mi = optim_lerp(m[i], gi, w1);
        float vi = v[i] * b2 + (w2 * gi) * gi;
        float denom = sqrtf(vi) / c2 + eps;
        w[i] = wi - step_size * (mi / denom);
        m[i] = mi;
        v[i] = vi;
    }
    return BK_OK;
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
