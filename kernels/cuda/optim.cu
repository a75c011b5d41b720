/* optim.cu - the CUDA backend's optimizer kernels with kernels/cpu/optim.c's formulas: the sum of
 * squares (loss.cu's two-stage reduction), AdamW with the EMA fused, the EMA. The step on the
 * device (backend.h's step_* entries): the per-step values, the loss scale, the step's loss and
 * a log of the optimizer steps are a struct cu_step in the slot's scratch (cuda_backend.h); the
 * same kernels take their per-step values from it (a non-NULL st) or from their arguments, and
 * the whole optimizer step - norm, clipping, the loss scale's skip and update, AdamW with the EMA
 * fused, the log - runs there without the host waiting.
 */
#include <math.h>
#include <stdlib.h>

#include "cuda_backend.h"

#define GRID_LOOP(i, count)                                                                     \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (count);                 \
         i += (size_t)gridDim.x * blockDim.x)

const struct bk_step *cu_step_in(bk_ctx *ctx) { return &cu_step_of(ctx)->in; }

__global__ void k_sum_finish(double *out, const double *part, int nch)
{
    double s = 0.0;
    for (int ch = 0; ch < nch; ch++) s += part[ch];
    out[0] = s;
}

/* ---- optimizer: optim.c's order of operations ---- */

int cu_sumsq(double *out_host, const float *x, size_t count, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!out_host) return BK_ERR_INVALID;
    if (!count) {
        out_host[0] = 0.0;
        return BK_OK;
    }
    const int nch = cu_red_chunks(count);
    double *res = ctx->scratch + CU_SCRATCH_DOUBLES - 1;
    int rc = cu_sq_partials(x, nullptr, count, nch, ctx);
    if (rc) return rc;
    CU_LAUNCH(k_sum_finish, 1, 1, 0, ctx->stream)(res, ctx->scratch, nch);
    CU_LAUNCHED(ctx);
    CU_CHECK(cudaMemcpyAsync(ctx->host, res, sizeof(double), cudaMemcpyDeviceToHost,
                             ctx->stream));
    CU_CHECK(cudaStreamSynchronize(ctx->stream));
    out_host[0] = ctx->host[0];
    return BK_OK;
}

/* The optimizer's arithmetic rounds every operation on its own, as the host's (kernels/cpu/
 * optim.c, C11 without contraction) does: __fmul_rn, __fadd_rn and __fsub_rn are never fused
 * into an FMA, which nvcc (and ptxas, for a mul and add without a rounding mode) otherwise does.
 * An offloaded step runs AdamW and the EMA on the host: with FMAs here the plain step's weights
 * differed from it by an ulp, which two steps of Adam grew to 6.5e-3 (fp32) and 88 (bf16) on an
 * H200. tests/gpu/test_fma_rule.sh checks the PTX. */
__device__ __forceinline__ float optim_lerp(float self, float end, float w)
{
    return fabsf(w) < 0.5f
               ? __fadd_rn(self, __fmul_rn(w, __fsub_rn(end, self)))
               : __fsub_rn(end, __fmul_rn(__fsub_rn(end, self), __fsub_rn(1.0f, w)));
}

/* AdamW over the flat parameters, and the EMA of the new weights when ema is not NULL (ew = 1 -
 * decay: ema_update's arithmetic on the weight just computed). st non-NULL: gscale, decay,
 * step_size and c2 are the optimizer step's decisions there, and a skipped step changes nothing */
__global__ void k_adamw(float *w, float *m, float *v, float *ema, const float *g, float gscale,
                        float decay, float w1, float b2, float w2, float c2, float eps,
                        float step_size, float ew, size_t count, const struct cu_step *st)
{
    if (st) {
        if (st->skip) return;
        gscale = st->gscale;
        decay = st->decay;
        step_size = st->step_size;
        c2 = st->c2;
    }
    GRID_LOOP(i, count)
    {
        const float gi = __fmul_rn(g[i], gscale);
        const float wi = __fmul_rn(w[i], decay);
        const float mi = optim_lerp(m[i], gi, w1);
        const float vi = __fadd_rn(__fmul_rn(v[i], b2), __fmul_rn(__fmul_rn(w2, gi), gi));
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c2), eps);
        const float wn = __fsub_rn(wi, __fmul_rn(step_size, __fdiv_rn(mi, denom)));
        w[i] = wn;
        m[i] = mi;
        v[i] = vi;
        if (ema) ema[i] = optim_lerp(ema[i], wn, ew);
    }
}

int cu_adamw_step(float *w, float *m, float *v, const float *g, float gscale,
                  const struct bk_adamw *h, size_t count, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!h) return BK_ERR_INVALID;
    if (!count) return BK_OK;
    const float decay = (float)(1.0 - (double)h->lr * (double)h->weight_decay);
    const float w1 = 1.0f - h->beta1, b2 = h->beta2, w2 = 1.0f - h->beta2;
    const float step_size = h->lr / h->bias_c1;
    CU_LAUNCH(k_adamw, cu_blocks(count, CU_THREADS), CU_THREADS, 0, ctx->stream)(
        w, m, v, nullptr, g, gscale, decay, w1, b2, w2, h->bias_c2_sqrt, h->eps, step_size, 0.0f,
        count, nullptr);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

__global__ void k_ema(float *ema, const float *w, float wt, size_t count)
{
    GRID_LOOP(i, count) ema[i] = optim_lerp(ema[i], w[i], wt);
}

int cu_ema_update(float *ema, const float *w, float decay, size_t count, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!count) return BK_OK;
    const float wt = 1.0f - decay;
    CU_LAUNCH(k_ema, cu_blocks(count, CU_THREADS), CU_THREADS, 0, ctx->stream)(ema, w, wt, count);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

/* ---- the step on the device ---- */

__global__ void k_step_set(struct cu_step *st, struct bk_step in)
{
    st->in = in;
    if (in.reset) {
        st->loss = 0.0;
        st->nrec = 0;
        st->last.loss = st->last.grad_norm = 0.0f;
        st->last.scale = st->scaler.scale;
        st->last.applied = 0;
    }
}

int cu_step_set(const struct bk_step *s, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!s) return BK_ERR_INVALID;
    if (s->reset && !ctx->capturing) ctx->steps_read = 0;
    CU_LAUNCH(k_step_set, 1, 1, 0, ctx->stream)(cu_step_of(ctx), *s);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

__global__ void k_scaler_set(struct cu_step *st, struct bk_scaler sc) { st->scaler = sc; }

int cu_scaler_set(const struct bk_scaler *s, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!s) return BK_ERR_INVALID;
    CU_LAUNCH(k_scaler_set, 1, 1, 0, ctx->stream)(cu_step_of(ctx), *s);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

/* One thread, after the partial sums of squares of the gradients: exec.c's optimizer_step on the
 * device. The norm of the unscaled gradients; under loss scaling an inf or NaN skips the step;
 * torch's clip coefficient; AdamW's scalars of lr and t (minus the skipped steps under scaling);
 * the loss scale's update (loss_scaler_update); the step's record. */
__global__ void k_optim_decide(struct cu_step *st, const double *part, int nch, struct bk_optim o)
{
    double ss = 0.0;
    for (int ch = 0; ch < nch; ch++) ss += part[ch];
    struct bk_scaler *sc = &st->scaler;
    const float scale = o.scaling ? sc->scale : 1.0f;
    const float norm = (float)(sqrt(ss) / (double)scale);
    const int skip = o.scaling && !isfinite(ss);
    float gscale = 1.0f;
    if (o.clip > 0.0f) {
        const float coef = o.clip / (norm + 1e-6f);
        gscale = coef < 1.0f ? coef : 1.0f;
    }
    if (scale != 1.0f) gscale = (float)((double)gscale / (double)scale);
    const float lr = st->in.lr;
    const double t = (double)(st->in.t - (o.scaling ? sc->skipped : 0));
    const float bias_c1 = (float)(1.0 - pow((double)o.beta1, t));
    st->c2 = (float)sqrt(1.0 - pow((double)o.beta2, t));
    st->decay = (float)__dsub_rn(1.0, __dmul_rn((double)lr, (double)o.weight_decay));
    st->step_size = lr / bias_c1;
    st->gscale = gscale;
    st->skip = skip;
    if (o.scaling) {
        if (skip) {
            sc->scale *= o.backoff;
            sc->good_steps = 0;
            sc->skipped++;
        } else if (++sc->good_steps >= o.growth_interval) {
            const float grown = sc->scale * o.growth;
            if (isfinite(grown)) sc->scale = grown; /* an infinite scale would make every step inf */
            sc->good_steps = 0;
        }
    }
    struct bk_step_rec r;
    r.loss = (float)st->loss;
    r.grad_norm = norm;
    r.scale = o.scaling ? sc->scale : 1.0f;
    r.applied = !skip;
    st->last = r;
    st->log[st->nrec % CU_STEP_LOG] = r;
    st->nrec++;
}

int cu_optim_step(float *w, float *m, float *v, float *ema, const float *g, size_t count,
                  const struct bk_optim *o, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!o || (count && (!w || !m || !v || !g))) return BK_ERR_INVALID;
    struct cu_step *st = cu_step_of(ctx);
    const int nch = cu_red_chunks(count);
    if (count) {
        const int rc = cu_sq_partials(g, nullptr, count, nch, ctx);
        if (rc) return rc;
    }
    CU_LAUNCH(k_optim_decide, 1, 1, 0, ctx->stream)(st, ctx->scratch, count ? nch : 0, *o);
    CU_LAUNCHED(ctx);
    if (!count) return BK_OK;
    const float w1 = 1.0f - o->beta1, b2 = o->beta2, w2 = 1.0f - o->beta2;
    const float ew = 1.0f - o->ema_decay;
    float *e = o->ema_decay > 0.0f ? ema : nullptr;
    CU_LAUNCH(k_adamw, cu_blocks(count, CU_THREADS), CU_THREADS, 0, ctx->stream)(
        w, m, v, e, g, 0.0f, 0.0f, w1, b2, w2, 0.0f, o->eps, 0.0f, ew, count, st);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

int cu_step_read(struct bk_step_rec *last, struct bk_scaler *scaler, struct bk_step_rec *recs,
                 int max, int *n, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (n) *n = 0;
    if (ctx->capturing) return BK_ERR_INVALID;
    struct cu_step *h = (struct cu_step *)malloc(sizeof *h);
    if (!h) return BK_ERR_NOMEM;
    cudaError_t e = cudaMemcpyAsync(h, cu_step_of(ctx), sizeof *h, cudaMemcpyDeviceToHost,
                                    ctx->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(ctx->stream);
    if (e != cudaSuccess) {
        free(h);
        return cu_fail_cuda(e, "reading the step's scalars", __FILE__, __LINE__);
    }
    if (last) *last = h->last;
    if (scaler) *scaler = h->scaler;
    if (recs && n) {
        unsigned long long from = ctx->steps_read;
        if (h->nrec > CU_STEP_LOG && from < h->nrec - CU_STEP_LOG) from = h->nrec - CU_STEP_LOG;
        int k = 0;
        for (; from < h->nrec && k < max; from++) recs[k++] = h->log[from % CU_STEP_LOG];
        *n = k;
        ctx->steps_read = from;
    }
    free(h);
    return BK_OK;
}
