/* loss.cu - the CUDA backend's losses (MSE, softmax cross-entropy) and Philox fills, with
 * kernels/cpu's formulas (loss.c). Reductions are two-stage over fixed chunks that depend on the
 * count only (cu_red_chunks), partials in double in the job slot's scratch, combined by one
 * thread in order: deterministic (optim.cu's sum of squares is one: cu_sq_partials). Fills are
 * philox.h's functions of their coordinates, the same u32 as on the CPU (dropout: eltwise.cu).
 * The step on the device: mse_step_bwd takes its loss weight and the loss scale from the
 * context's struct cu_step (cuda_backend.h), and loss_step_add sums the step's loss there.
 */
#include <math.h>
#include <stdlib.h>

#include "cuda_backend.h"
#include "philox.h"

#define GRID_LOOP(i, count)                                                                     \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (count);                 \
         i += (size_t)gridDim.x * blockDim.x)

/* part[ch] = sum over chunk ch of (a - b)^2 (b NULL: a^2), in double; one block per chunk */
__global__ void k_sq_partials(double *part, const float *a, const float *b, size_t count, int nch)
{
    __shared__ double sh[33];
    const int ch = blockIdx.x;
    const size_t i0 = count * ch / nch, i1 = count * (ch + 1) / nch;
    double acc = 0.0;
    for (size_t i = i0 + threadIdx.x; i < i1; i += blockDim.x) {
        const double d = b ? (double)a[i] - (double)b[i] : (double)a[i];
        acc += d * d;
    }
    acc = cu_block_sum(acc, sh);
    if (threadIdx.x == 0) part[ch] = acc;
}

int cu_sq_partials(const float *a, const float *b, size_t count, int nch, bk_ctx *ctx)
{
    CU_LAUNCH(k_sq_partials, nch, CU_THREADS, 0, ctx->stream)(ctx->scratch, a, b, count, nch);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

__global__ void k_mse_finish(float *loss, const double *part, int nch, size_t count)
{
    double s = 0.0;
    for (int ch = 0; ch < nch; ch++) s += part[ch];
    loss[0] = count ? (float)(s / (double)count) : 0.0f;
}

int cu_mse_fwd(float *loss, const float *pred, const float *target, size_t count, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!loss) return BK_ERR_INVALID;
    const int nch = cu_red_chunks(count);
    if (count) {
        const int rc = cu_sq_partials(pred, target, count, nch, ctx);
        if (rc) return rc;
    }
    CU_LAUNCH(k_mse_finish, 1, 1, 0, ctx->stream)(loss, ctx->scratch, count ? nch : 0, count);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

/* st non-NULL: coef = 2 (dloss_scale x loss scale) / count of step_set's and the device's */
__global__ void k_mse_bwd(float *dpred, const float *pred, const float *target, float coef,
                          int accum, size_t count, const struct cu_step *st)
{
    if (st) coef = (float)(2.0 * (double)(st->in.dloss_scale * st->scaler.scale) / (double)count);
    GRID_LOOP(i, count)
    {
        const float g = coef * (pred[i] - target[i]);
        dpred[i] = accum ? dpred[i] + g : g;
    }
}

int cu_mse_bwd(float *dpred, const float *pred, const float *target, float dloss_scale,
               int accum, size_t count, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (count == 0) return BK_OK;
    const float coef = (float)(2.0 * (double)dloss_scale / (double)count);
    CU_LAUNCH(k_mse_bwd, cu_blocks(count, CU_THREADS), CU_THREADS, 0, ctx->stream)(
        dpred, pred, target, coef, accum, count, nullptr);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

int cu_mse_step_bwd(float *dpred, const float *pred, const float *target, int accum,
                    size_t count, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (count == 0) return BK_OK;
    CU_LAUNCH(k_mse_bwd, cu_blocks(count, CU_THREADS), CU_THREADS, 0, ctx->stream)(
        dpred, pred, target, 0.0f, accum, count, cu_step_of(ctx));
    CU_LAUNCHED(ctx);
    return BK_OK;
}

/* one block: a thread per row (rows strided), each row in double as loss.c */
__global__ void k_xent_fwd(float *loss, float *prob, const float *logits, const float *target,
                           int n, int k)
{
    __shared__ double sh[33];
    double total = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float *z = logits + (size_t)i * k, *t = target + (size_t)i * k;
        float *p = prob + (size_t)i * k;
        double mx = z[0], sum = 0.0, l = 0.0;
        for (int j = 1; j < k; j++) mx = z[j] > mx ? z[j] : mx;
        for (int j = 0; j < k; j++) sum += exp((double)z[j] - mx);
        const double lse = mx + log(sum);
        for (int j = 0; j < k; j++) {
            p[j] = (float)exp((double)z[j] - lse);
            l -= (double)t[j] * ((double)z[j] - lse);
        }
        total += l;
    }
    total = cu_block_sum(total, sh);
    if (threadIdx.x == 0) loss[0] = (float)(total / n);
}

int cu_xent_fwd(float *loss, float *prob, const float *logits, const float *target, int n, int k,
                bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!loss || !prob || !logits || !target || n < 1 || k < 1) return BK_ERR_INVALID;
    CU_LAUNCH(k_xent_fwd, 1, CU_THREADS, 0, ctx->stream)(loss, prob, logits, target, n, k);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

__global__ void k_xent_bwd(float *dlogits, const float *prob, const float *target, float s,
                           int accum, size_t count)
{
    GRID_LOOP(i, count)
    {
        const float g = s * (prob[i] - target[i]);
        dlogits[i] = accum ? dlogits[i] + g : g;
    }
}

int cu_xent_bwd(float *dlogits, const float *prob, const float *target, float dloss_scale,
                int accum, int n, int k, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!dlogits || !prob || !target || n < 1 || k < 1) return BK_ERR_INVALID;
    const float s = dloss_scale / (float)n;
    const size_t count = (size_t)n * k;
    CU_LAUNCH(k_xent_bwd, cu_blocks(count, CU_THREADS), CU_THREADS, 0, ctx->stream)(
        dlogits, prob, target, s, accum, count);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

/* ---- Philox fills: philox_normal / philox_u32_at of every element ---- */

__global__ void k_philox_normal(float *y, uint64_t seed, uint32_t tag, uint64_t step, uint32_t op,
                                int sample_base, size_t per_sample, size_t nblk, size_t blocks)
{
    GRID_LOOP(b, blocks)
    {
        const size_t s = b / nblk, blk = b % nblk;
        const struct philox_u4 r = philox_block(seed, tag, step, (uint32_t)(sample_base + (int)s),
                                                op, (uint32_t)blk);
        float z[4];
        philox_gauss2(r.v[0], r.v[1], &z[0], &z[1]);
        philox_gauss2(r.v[2], r.v[3], &z[2], &z[3]);
        const size_t e0 = blk * 4, ne = per_sample - e0 < 4 ? per_sample - e0 : 4;
        for (size_t q = 0; q < ne; q++) y[s * per_sample + e0 + q] = z[q];
    }
}

__global__ void k_philox_u32(uint32_t *y, uint64_t seed, uint32_t tag, uint64_t step, uint32_t op,
                             int sample_base, size_t per_sample, size_t nblk, size_t blocks)
{
    GRID_LOOP(b, blocks)
    {
        const size_t s = b / nblk, blk = b % nblk;
        const struct philox_u4 r = philox_block(seed, tag, step, (uint32_t)(sample_base + (int)s),
                                                op, (uint32_t)blk);
        const size_t e0 = blk * 4, ne = per_sample - e0 < 4 ? per_sample - e0 : 4;
        for (size_t q = 0; q < ne; q++) y[s * per_sample + e0 + q] = r.v[q];
    }
}

int cu_philox_normal_fill(float *y, uint64_t seed, uint32_t tag, uint64_t step, uint32_t op,
                          int sample_base, int n, size_t per_sample, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!y || n < 0 || per_sample > 0xFFFFFFFFull) return BK_ERR_INVALID;
    const size_t nblk = (per_sample + 3) / 4, blocks = (size_t)n * nblk;
    if (!blocks) return BK_OK;
    CU_LAUNCH(k_philox_normal, cu_blocks(blocks, CU_THREADS), CU_THREADS, 0, ctx->stream)(
        y, seed, tag, step, op, sample_base, per_sample, nblk, blocks);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

int cu_philox_u32_fill(uint32_t *y, uint64_t seed, uint32_t tag, uint64_t step, uint32_t op,
                       int sample_base, int n, size_t per_sample, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!y || n < 0 || per_sample > 0xFFFFFFFFull) return BK_ERR_INVALID;
    const size_t nblk = (per_sample + 3) / 4, blocks = (size_t)n * nblk;
    if (!blocks) return BK_OK;
    CU_LAUNCH(k_philox_u32, cu_blocks(blocks, CU_THREADS), CU_THREADS, 0, ctx->stream)(
        y, seed, tag, step, op, sample_base, per_sample, nblk, blocks);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

/* the step's loss: the micro-batches' dloss_scale * loss, summed in double in their order */
__global__ void k_loss_add(struct cu_step *st, const float *loss)
{
    st->loss = __dadd_rn(st->in.first ? 0.0 : st->loss,
                         __dmul_rn((double)st->in.dloss_scale, (double)loss[0]));
}

int cu_loss_step_add(const float *loss, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!loss) return BK_ERR_INVALID;
    CU_LAUNCH(k_loss_add, 1, 1, 0, ctx->stream)(cu_step_of(ctx), loss);
    CU_LAUNCHED(ctx);
    return BK_OK;
}
