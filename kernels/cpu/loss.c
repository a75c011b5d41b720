/* loss.c - the CPU backend's MSE loss (forward and backward) and Philox dropout (forward and
 * backward, on fp32 and (typed.h) 16-bit elements). The MSE sum is a double reduction over fixed
 * chunks combined in a fixed order, so it is bit-identical at any thread count; dropout masks
 * are pure functions of their coordinates.
 */
#include "cpu.h"
#include "philox.h"
#include "typed.h"

#define LOSS_PAR_MIN 16384
#define LOSS_CHUNK_MIN 16384 /* elements per reduction chunk, at least */
#define LOSS_CHUNK_MAX 256   /* reduction chunks, at most (partials live on the stack) */

/* loss[0] = mean((pred - target)^2) over count elements, summed in double */
int cpu_mse_fwd(float *loss, const float *pred, const float *target, size_t count,
                bk_ctx *ctx)
{
    double part[LOSS_CHUNK_MAX];
    /* the chunking depends on count only, never on the thread count */
    size_t nch = (count + LOSS_CHUNK_MIN - 1) / LOSS_CHUNK_MIN;
    if (nch > LOSS_CHUNK_MAX) nch = LOSS_CHUNK_MAX;
    if (nch == 0) nch = 1;
#pragma omp parallel for num_threads(ctx->threads) if (nch > 1) schedule(static)
    for (size_t ch = 0; ch < nch; ch++) {
        size_t i0 = count * ch / nch, i1 = count * (ch + 1) / nch;
        double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        size_t i = i0;
        for (; i + 8 <= i1; i += 8)
            for (int l = 0; l < 8; l++) {
                double d = (double)pred[i + l] - (double)target[i + l];
                acc[l] += d * d;
            }
        for (int l = 0; i < i1; i++, l++) {
            double d = (double)pred[i] - (double)target[i];
            acc[l] += d * d;
        }
        part[ch] = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
                   ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    }
    double s = 0.0;
    for (size_t ch = 0; ch < nch; ch++) s += part[ch];
    loss[0] = count ? (float)(s / (double)count) : 0.0f;
    return BK_OK;
}

/* dpred (count) (=/+=) dloss_scale * 2 (pred - target) / count */
int cpu_mse_bwd(float *dpred, const float *pred, const float *target, float dloss_scale,
                int accum, size_t count, bk_ctx *ctx)
{
    if (count == 0) return BK_OK;
    float coef = (float)(2.0 * (double)dloss_scale / (double)count);
#pragma omp parallel for num_threads(ctx->threads) if (count >= LOSS_PAR_MIN) schedule(static)
    for (size_t i = 0; i < count; i++) {
        float g = coef * (pred[i] - target[i]);
        dpred[i] = accum ? dpred[i] + g : g;
    }
    return BK_OK;
}

/* dropout_apply's tasks, one per parallel region below, each inlined per dtype inside its
 * region (TY_DISPATCH_IN). An exact copy (p = 0): element i */
TY_INLINE int dropout_copy_el(size_t i, void *out, const void *in, int accum, int dt)
{
    ty_st(out, i, accum ? ty_ld(out, i, dt) + ty_ld(in, i, dt) : ty_ld(in, i, dt), dt);
    return BK_OK;
}

/* NHWC with HW a multiple of 4: item it, a quad of pixels of one sample, all channels */
TY_INLINE int dropout_quad(size_t it, void *out, const void *in, float p, uint64_t seed,
                           uint64_t step, uint32_t op, int sample_base, int accum,
                           size_t per_sample, size_t C, size_t quads, float scale, int dt)
{
    const size_t hw = 4 * quads;
    size_t s = it / quads, p0 = 4 * (it % quads);
    const size_t o0 = s * per_sample + p0 * C;
    for (size_t c = 0; c < C; c++) {
        struct philox_u4 r = philox_block(seed, PHILOX_TAG_DROPOUT, step,
                                          (uint32_t)(sample_base + (int)s), op,
                                          (uint32_t)((c * hw + p0) / 4));
        for (size_t k = 0; k < 4; k++) {
            const size_t i = o0 + k * C + c;
            float v = philox_uniform(r.v[k]) >= p ? ty_ld(in, i, dt) * scale : 0.0f;
            ty_st(out, i, accum ? ty_ld(out, i, dt) + v : v, dt);
        }
    }
    return BK_OK;
}

/* NHWC with HW not a multiple of 4: element i, a Philox block of its own */
TY_INLINE int dropout_el(size_t i, void *out, const void *in, float p, uint64_t seed,
                         uint64_t step, uint32_t op, int sample_base, int accum,
                         size_t per_sample, int channels, float scale, int dt)
{
    const size_t hw = per_sample / (size_t)channels;
    size_t s = i / per_sample, m = i % per_sample;
    size_t e = (m % (size_t)channels) * hw + m / (size_t)channels;
    struct philox_u4 r = philox_block(seed, PHILOX_TAG_DROPOUT, step,
                                      (uint32_t)(sample_base + (int)s), op, (uint32_t)(e / 4));
    float v = philox_uniform(r.v[e % 4]) >= p ? ty_ld(in, i, dt) * scale : 0.0f;
    ty_st(out, i, accum ? ty_ld(out, i, dt) + v : v, dt);
    return BK_OK;
}

/* logical order: block b, four consecutive elements of one sample */
TY_INLINE int dropout_block(size_t b, void *out, const void *in, float p, uint64_t seed,
                            uint64_t step, uint32_t op, int sample_base, int accum,
                            size_t per_sample, size_t nblk, float scale, int dt)
{
    size_t s = b / nblk, blk = b % nblk;
    struct philox_u4 r = philox_block(seed, PHILOX_TAG_DROPOUT, step,
                                      (uint32_t)(sample_base + (int)s), op, (uint32_t)blk);
    size_t e0 = blk * 4;
    size_t ne = per_sample - e0 < 4 ? per_sample - e0 : 4;
    const size_t o0 = s * per_sample + e0;
    for (size_t q = 0; q < ne; q++) {
        float v = philox_uniform(r.v[q]) >= p ? ty_ld(in, o0 + q, dt) * scale : 0.0f;
        ty_st(out, o0 + q, accum ? ty_ld(out, o0 + q, dt) + v : v, dt);
    }
    return BK_OK;
}

/* Shared by forward and backward so both see one mask: element e of sample s (of the micro-batch)
 * is kept iff philox_uniform_at(seed, DROPOUT, step, sample_base + s, op, e) >= p; kept values
 * are multiplied by 1/(1-p) computed once in float (PyTorch's x * (mask / (1-p))).
 * out (N,per_sample) (= or += per accum) from in (N,per_sample), of dtype dt. */
static int dropout_apply(void *out, const void *in, float p, uint64_t seed, uint64_t step,
                         uint32_t op, int sample_base, int accum, int n, size_t per_sample,
                         int channels, bk_ctx *ctx, int dt)
{
    if (!(p >= 0.0f && p < 1.0f) || n < 0 || per_sample > 0xFFFFFFFFull || channels < 0 ||
        (channels > 1 && per_sample % (size_t)channels) || !ty_valid(dt))
        return BK_ERR_INVALID;
    size_t total = (size_t)n * per_sample;
    if (p == 0.0f) { /* every uniform is > 0: all kept, scale 1 - an exact copy */
#pragma omp parallel for num_threads(ctx->threads) if (total >= LOSS_PAR_MIN) schedule(static)
        for (size_t i = 0; i < total; i++) TY_DISPATCH_IN(dt, dropout_copy_el, i, out, in, accum);
        return BK_OK;
    }
    float scale = 1.0f / (1.0f - p);
    if (channels > 1 && (per_sample / (size_t)channels) % 4 == 0) {
        /* NHWC image: memory element m = pixel * C + c is logical element e = c * HW + pixel.
         * With HW a multiple of 4, pixels 4j..4j+3 of channel c are one Philox block's four
         * lanes: each block is drawn once, for a quad of pixels, all channels at a time */
        const size_t C = (size_t)channels, quads = per_sample / C / 4;
        const size_t items = (size_t)n * quads;
#pragma omp parallel for num_threads(ctx->threads) if (total >= LOSS_PAR_MIN / 4) schedule(static)
        for (size_t it = 0; it < items; it++)
            TY_DISPATCH_IN(dt, dropout_quad, it, out, in, p, seed, step, op, sample_base, accum,
                           per_sample, C, quads, scale);
        return BK_OK;
    }
    if (channels > 1) { /* HW not a multiple of 4: a block per element */
#pragma omp parallel for num_threads(ctx->threads) if (total >= LOSS_PAR_MIN / 4) schedule(static)
        for (size_t i = 0; i < total; i++)
            TY_DISPATCH_IN(dt, dropout_el, i, out, in, p, seed, step, op, sample_base, accum,
                           per_sample, channels, scale);
        return BK_OK;
    }
    size_t nblk = (per_sample + 3) / 4; /* one Philox call gives 4 elements */
    size_t blocks = (size_t)n * nblk;
#pragma omp parallel for num_threads(ctx->threads) if (total >= LOSS_PAR_MIN / 4) schedule(static)
    for (size_t b = 0; b < blocks; b++)
        TY_DISPATCH_IN(dt, dropout_block, b, out, in, p, seed, step, op, sample_base, accum,
                       per_sample, nblk, scale);
    return BK_OK;
}

/* y (N,per_sample) = keep ? x / (1-p) : 0 */
int cpu_dropout_fwd(float *y, const float *x, float p, uint64_t seed, uint64_t step,
                    uint32_t op, int sample_base, int n, size_t per_sample, int channels,
                    bk_ctx *ctx)
{
    return dropout_apply(y, x, p, seed, step, op, sample_base, 0, n, per_sample, channels, ctx,
                         BK_DTYPE_F32);
}

/* dx (N,per_sample) (=/+=) keep ? dy / (1-p) : 0, the forward's mask recomputed */
int cpu_dropout_bwd(float *dx, const float *dy, float p, uint64_t seed, uint64_t step,
                    uint32_t op, int sample_base, int accum, int n, size_t per_sample,
                    int channels, bk_ctx *ctx)
{
    return dropout_apply(dx, dy, p, seed, step, op, sample_base, accum, n, per_sample, channels,
                         ctx, BK_DTYPE_F32);
}

/* the typed dropout (ops.def): dropout_apply on x, y (dx, dy) of dtype */
int cpu_t_dropout_fwd(void *y, const void *x, float p, uint64_t seed, uint64_t step, uint32_t op,
                      int sample_base, int n, size_t per_sample, int channels, int dtype,
                      bk_ctx *ctx)
{
    return dropout_apply(y, x, p, seed, step, op, sample_base, 0, n, per_sample, channels, ctx,
                         dtype);
}

int cpu_t_dropout_bwd(void *dx, const void *dy, float p, uint64_t seed, uint64_t step,
                      uint32_t op, int sample_base, int accum, int n, size_t per_sample,
                      int channels, int dtype, bk_ctx *ctx)
{
    return dropout_apply(dx, dy, p, seed, step, op, sample_base, accum, n, per_sample, channels,
                         ctx, dtype);
}

/* softmax cross-entropy: rows in parallel, each row's sums in double in a fixed order */
int cpu_xent_fwd(float *loss, float *prob, const float *logits, const float *target, int n, int k,
                 bk_ctx *ctx)
{
    if (!loss || !prob || !logits || !target || n < 1 || k < 1) return BK_ERR_INVALID;
    double total = 0.0;
#pragma omp parallel for num_threads(ctx->threads) if (n >= 64) schedule(static) reduction(+ : total)
    for (int i = 0; i < n; i++) {
        const float *z = logits + (size_t)i * k, *t = target + (size_t)i * k;
        float *p = prob + (size_t)i * k;
        double mx = z[0], sum = 0.0, l = 0.0;
        for (int j = 1; j < k; j++) mx = z[j] > mx ? z[j] : mx;
        for (int j = 0; j < k; j++) sum += exp((double)z[j] - mx);
        double lse = mx + log(sum);
        for (int j = 0; j < k; j++) {
            p[j] = (float)exp((double)z[j] - lse);
            l -= (double)t[j] * ((double)z[j] - lse);
        }
        total += l;
    }
    loss[0] = (float)(total / n);
    return BK_OK;
}

int cpu_xent_bwd(float *dlogits, const float *prob, const float *target, float dloss_scale,
                 int accum, int n, int k, bk_ctx *ctx)
{
    if (!dlogits || !prob || !target || n < 1 || k < 1) return BK_ERR_INVALID;
    const float s = dloss_scale / (float)n;
    const size_t count = (size_t)n * k;
#pragma omp parallel for num_threads(ctx->threads) if (count >= 65536) schedule(static)
    for (size_t i = 0; i < count; i++) {
        float g = s * (prob[i] - target[i]);
        dlogits[i] = accum ? dlogits[i] + g : g;
    }
    return BK_OK;
}
