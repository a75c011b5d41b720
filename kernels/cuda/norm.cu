/* norm.cu - group norm over NHWC images (x (N,HW,C), G groups of C/G channels) with SiLU and the
 * broadcast adds fused in, and layer norm (x (M,D) over D), forward and backward, typed (fp32,
 * f16, bf16 activations; fp32 statistics, parameters and their gradients), with
 * kernels/cpu/norm.c's formulas: biased variance, fp32 mean and rstd saved, sums in double.
 * Every sum has a fixed order (no atomics), so results do not change from run to run.
 *
 * Group norm passes run over each image in chunks of pixels (grid: chunks x N, a function of the
 * shape); a thread owns W channels (one 16-byte vector) of every BY-th pixel of its chunk, so a
 * warp reads whole rows of pixels, and sums in fp32 over at most GN_PPT pixels before adding into
 * double. Forward: per-chunk channel sums of x and x^2 (relative to the thread's first value: no
 * cancellation) into the workspace, a block per (group, image) turns them into mean and rstd, an
 * element-wise pass writes y: two reads of x and one write of y (the broadcast add before the
 * norm: its sum is formed and stored in the first pass; a broadcast or residual add after it:
 * added in the last).
 * Backward: per-chunk channel sums of dr xhat, dr and dy; the per-group coefficients of norm.c's
 * dx; a pass writing dx (and summing it per channel for the add before the norm); a block per
 * channel adds dgamma, dbeta (and db) over the images and chunks in order.
 */
#include "cuda_backend.h"

#define GRID_LOOP(i, count)                                                                     \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (count);                 \
         i += (size_t)gridDim.x * blockDim.x)

#define GN_THREADS 256
#define GN_PPT 32            /* pixels a thread sums in fp32 before adding into double */
#define GN_MAX_PC_ROWS 64    /* a chunk is at most this many rows of pixels per thread */
#define GN_TARGET_BLOCKS 512

/* the launch shape of a pass over the images: BX threads across the channel vectors (lanes;
 * a block loops over lane blocks when there are more), BY across the pixels of a chunk of pc
 * pixels; chunks per image. A function of the shape (and the vector width) alone. */
struct gn_cfg {
    int lanes, bx, by, pc, chunks;
};

static struct gn_cfg gn_config(int n, int c, int hw, int w, int max_chunks)
{
    struct gn_cfg g;
    g.lanes = c / w;
    g.bx = g.lanes < GN_THREADS ? g.lanes : GN_THREADS;
    g.by = GN_THREADS / g.bx;
    /* enough blocks to fill a device, at least one row of pixels per thread */
    const int want = (GN_TARGET_BLOCKS + n - 1) / n;
    int chunks = want < (hw + g.by - 1) / g.by ? want : (hw + g.by - 1) / g.by;
    if (chunks < (hw + g.by * GN_MAX_PC_ROWS - 1) / (g.by * GN_MAX_PC_ROWS))
        chunks = (hw + g.by * GN_MAX_PC_ROWS - 1) / (g.by * GN_MAX_PC_ROWS);
    if (max_chunks > 0 && chunks > max_chunks) chunks = max_chunks;
    if (chunks < 1) chunks = 1;
    g.pc = (hw + chunks - 1) / chunks;
    g.chunks = (hw + g.pc - 1) / g.pc;
    return g;
}

/* the threads of a block that sums `items` values: a multiple of 32 up to GN_THREADS, no more
 * than there are items to go round */
static unsigned gn_red_threads(size_t items)
{
    const size_t t = (items + 31) / 32 * 32;
    return t < 32 ? 32u : t > GN_THREADS ? (unsigned)GN_THREADS : (unsigned)t;
}

/* the vector width the channel count and every pointer allow */
template <typename T>
static int gn_width(int c, const void *a, const void *b, const void *d = NULL,
                    const void *e = NULL, const void *f = NULL, const void *gamma = NULL,
                    const void *beta = NULL)
{
    const int ok = c % CU_VW(T) == 0 && cu_al16(a) && cu_al16(b) && cu_al16(d) && cu_al16(e) &&
                   cu_al16(f) && cu_al16(gamma) && cu_al16(beta);
    return ok ? CU_VW(T) : 1;
}

/* out[k] (k < W, the channels of thread (tx, 0)) = the sum over the block's pixel rows of each
 * thread's v[k], in row order (red: GN_THREADS * 8 doubles; every thread calls it) */
template <int W>
__device__ __forceinline__ void gn_rows_sum(double *red, const double *v, double *out, int stride,
                                            int write, const struct gn_cfg &g)
{
    const int t = threadIdx.x, tx = t % g.bx, ty = t / g.bx;
    for (int k = 0; k < W; k++) red[t * W + k] = v[k];
    __syncthreads();
    if (ty == 0 && write)
        for (int k = 0; k < W; k++) {
            double s = 0.0;
            for (int r = 0; r < g.by; r++) s += red[(r * g.bx + tx) * W + k];
            out[k * stride] = s;
        }
    __syncthreads();
}

/* ---- forward ---- */

/* per chunk and channel: S = sum of x', Q = sum of x'^2 (ws: [N][chunks][C][2] doubles), with
 * x' = round(x + xb) stored to xo when xb. A thread sums in fp32 over GN_PPT pixels at a time,
 * relative to its first value k of the channel (no cancellation), and adds cnt k + s1 and
 * cnt k^2 + 2 k s1 + s2 into double. */
template <typename T, int W>
__global__ void k_gn_stats(double *ws, T *xo, const T *x, const T *xb, int c, int hw,
                           struct gn_cfg g)
{
    __shared__ double red[GN_THREADS * 8];
    const int img = blockIdx.y, chunk = blockIdx.x, t = threadIdx.x;
    const int tx = t % g.bx, ty = t / g.bx;
    const int p0 = chunk * g.pc, p1 = p0 + g.pc < hw ? p0 + g.pc : hw;
    for (int lb = 0; lb < g.lanes; lb += g.bx) {
        const int lane = lb + tx, ch = lane * W;
        const int on = ty < g.by && lane < g.lanes;
        double S[W], Q[W];
        for (int k = 0; k < W; k++) S[k] = Q[k] = 0.0;
        if (on) {
            float bv[W], k0[W], s1[W], s2[W], v[W];
            for (int k = 0; k < W; k++) bv[k] = k0[k] = s1[k] = s2[k] = 0.0f;
            if (xb) cu_ldv<T, W>(bv, xb + (size_t)img * c + ch);
            int cnt = 0;
            for (int p = p0 + ty; p < p1; p += g.by) {
                const size_t off = ((size_t)img * hw + p) * c + ch;
                cu_ldv<T, W>(v, x + off);
                if (xb) {
                    for (int k = 0; k < W; k++) v[k] = cu_round<T>(v[k] + bv[k]);
                    cu_stv<T, W>(xo + off, v);
                }
                if (!cnt)
                    for (int k = 0; k < W; k++) k0[k] = v[k];
                for (int k = 0; k < W; k++) {
                    const float d = v[k] - k0[k];
                    s1[k] += d;
                    s2[k] += d * d;
                }
                if (++cnt == GN_PPT || p + g.by >= p1) {
                    for (int k = 0; k < W; k++) {
                        const double kk = k0[k];
                        S[k] += cnt * kk + s1[k];
                        Q[k] += cnt * kk * kk + 2.0 * kk * s1[k] + (double)s2[k];
                        s1[k] = s2[k] = 0.0f;
                    }
                    cnt = 0;
                }
            }
        }
        double *o = ws + (((size_t)img * g.chunks + chunk) * c + ch) * 2;
        gn_rows_sum<W>(red, S, o, 2, lane < g.lanes, g);
        gn_rows_sum<W>(red, Q, o + 1, 2, lane < g.lanes, g);
    }
}

/* mean and rstd (N,G) of each group from the chunks' sums: a block per (group, image) */
__global__ void k_gn_finalize(float *mean, float *rstd, const double *ws, int c, int hw, int groups,
                              int chunks, float eps)
{
    __shared__ double sh[33];
    const int gi = blockIdx.x, img = blockIdx.y, cpg = c / groups;
    const int items = cpg * chunks;
    double s = 0.0, q = 0.0;
    for (int i = threadIdx.x; i < items; i += blockDim.x) {
        const int k = i / cpg, ch = gi * cpg + i % cpg;
        const double *p = ws + (((size_t)img * chunks + k) * c + ch) * 2;
        s += p[0];
        q += p[1];
    }
    s = cu_block_sum(s, sh);
    q = cu_block_sum(q, sh);
    if (threadIdx.x == 0) {
        const double cnt = (double)cpg * hw, mu = s / cnt;
        double var = q / cnt - mu * mu;
        if (var < 0.0) var = 0.0;
        mean[(size_t)img * groups + gi] = (float)mu;
        rstd[(size_t)img * groups + gi] = (float)(1.0 / sqrt(var + (double)eps));
    }
}

/* y = act((x' - mean) rstd gamma + beta), then + yb or + yr: norm.c's formula in fp32,
 * element-wise.
 * one_group: every vector's W channels lie in one group (cpg a multiple of W), whose statistics
 * are then read once; gamma and beta in 16-byte loads when W is */
template <typename T, int W>
__global__ void k_gn_apply(T *y, const T *x, const T *yb, const T *yr, const float *mean,
                           const float *rstd,
                           const float *gamma, const float *beta, int c, size_t hwc, int groups,
                           int silu, int one_group, size_t count)
{
    const int cpg = c / groups;
    GRID_LOOP(i, count / W)
    {
        const size_t e = i * W, img = e / hwc;
        const int ch = (int)(e % c);
        float v[W], b[W], gm[W] = {}, bt[W] = {}, m[W], r[W];
        cu_ldv<T, W>(v, x + e);
        if (yb) cu_ldv<T, W>(b, yb + img * c + ch);
        else if (yr) cu_ldv<T, W>(b, yr + e);
        if (W % 4 == 0)
            for (int q = 0; q < W; q += 4) {
                if (gamma) cu_ldv<float, 4>(gm + q, gamma + ch + q);
                if (beta) cu_ldv<float, 4>(bt + q, beta + ch + q);
            }
        if (one_group) {
            const size_t gi = img * groups + ch / cpg;
            const float mg = mean[gi], rg = rstd[gi];
            for (int k = 0; k < W; k++) m[k] = mg, r[k] = rg;
        } else {
            for (int k = 0; k < W; k++) {
                const size_t gi = img * groups + (ch + k) / cpg;
                m[k] = mean[gi];
                r[k] = rstd[gi];
            }
        }
        for (int k = 0; k < W; k++) {
            const int cc = ch + k;
            const float g = gamma ? (W % 4 == 0 ? gm[k] : gamma[cc]) : 1.0f;
            const float bb = beta ? (W % 4 == 0 ? bt[k] : beta[cc]) : 0.0f;
            float z = (v[k] - m[k]) * r[k] * g + bb;
            if (silu) z = cu_silu(z);
            v[k] = yb || yr ? cu_round<T>(z) + b[k] : z;
        }
        cu_stv<T, W>(y + e, v);
    }
}

static int gn_check(const struct bk_groupnorm *s)
{
    return !s || s->n < 1 || s->n > 65535 || s->c < 1 || s->hw < 1 || s->groups < 1 ||
           s->groups > 65535 || s->c % s->groups != 0 || !cu_dtype_ok(s->dtype);
}

/* the workspace's parts: the chunks' sums (doubles), then (backward) per (image, group) the
 * coefficients cb, cc and per (image, channel) ca (floats) */
static size_t gn_sums_bytes(const struct bk_groupnorm *s, const struct gn_cfg *g, int backward)
{
    return (size_t)s->n * g->chunks * s->c * (backward ? 4 : 2) * sizeof(double);
}

static size_t gn_ws_bytes(const struct bk_groupnorm *s, const struct gn_cfg *g, int backward)
{
    size_t b = gn_sums_bytes(s, g, backward);
    if (backward) b += ((size_t)s->n * s->groups * 2 + (size_t)s->n * s->c) * sizeof(float);
    return b;
}

size_t cu_t_groupnorm_ws_bytes(const struct bk_groupnorm *s, int backward)
{
    if (gn_check(s)) return 0;
    /* the scalar path (W = 1) has the most chunks */
    const struct gn_cfg g = gn_config(s->n, s->c, s->hw, 1, 0);
    return gn_ws_bytes(s, &g, backward);
}

/* the most chunks whose workspace fits in bytes (0: none fit) */
static int gn_max_chunks(const struct bk_groupnorm *s, int backward, size_t bytes)
{
    const struct gn_cfg one = {0, 0, 0, 0, 1};
    const size_t fixed = gn_ws_bytes(s, &one, backward) - gn_sums_bytes(s, &one, backward);
    const size_t per = gn_sums_bytes(s, &one, backward);
    if (bytes < fixed + per) return 0;
    const size_t k = (bytes - fixed) / per;
    return k > 65535 ? 65535 : (int)k;
}

template <typename T, int W>
static int gn_fwd(void *y, float *mean, float *rstd, void *xo, const void *x, const void *xb,
                  const void *yb, const void *yr, const float *gamma, const float *beta,
                  void *ws, int max_chunks, const struct bk_groupnorm *s, bk_ctx *ctx)
{
    const struct gn_cfg g = gn_config(s->n, s->c, s->hw, W, max_chunks);
    CU_LAUNCH(k_gn_stats<T COMMA W>, dim3(g.chunks, s->n), GN_THREADS, 0, ctx->stream)(
        (double *)ws, (T *)xo, (const T *)x, (const T *)xb, s->c, s->hw, g);
    CU_LAUNCHED(ctx);
    CU_LAUNCH(k_gn_finalize, dim3(s->groups, s->n),
              gn_red_threads((size_t)(s->c / s->groups) * g.chunks), 0, ctx->stream)(
        mean, rstd, (const double *)ws, s->c, s->hw, s->groups, g.chunks, s->eps);
    CU_LAUNCHED(ctx);
    const size_t count = (size_t)s->n * s->hw * s->c;
    CU_LAUNCH(k_gn_apply<T COMMA W>, cu_blocks(count / W, CU_THREADS), CU_THREADS, 0,
              ctx->stream)((T *)y, (const T *)(xb ? xo : x), (const T *)yb, (const T *)yr, mean,
                           rstd, gamma,
                           beta, s->c, (size_t)s->hw * s->c, s->groups, s->silu,
                           (s->c / s->groups) % W == 0, count);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

template <typename T>
static int gn_fwd_t(void *y, float *mean, float *rstd, void *xo, const void *x, const void *xb,
                    const void *yb, const void *yr, const float *gamma, const float *beta,
                    void *ws, int max_chunks, const struct bk_groupnorm *s, bk_ctx *ctx)
{
    if (gn_width<T>(s->c, y, x, xo, xb, yb, gamma, beta) > 1 && cu_al16(yr))
        return gn_fwd<T, CU_VW(T)>(y, mean, rstd, xo, x, xb, yb, yr, gamma, beta, ws, max_chunks,
                                   s, ctx);
    return gn_fwd<T, 1>(y, mean, rstd, xo, x, xb, yb, yr, gamma, beta, ws, max_chunks, s, ctx);
}

int cu_t_groupnorm_fwd(void *y, float *mean, float *rstd, void *xo, const void *x, const void *xb,
                       const void *yb, const void *yr, const float *gamma, const float *beta,
                       void *ws, const struct bk_groupnorm *s, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (gn_check(s) || !y || !mean || !rstd || !x || (xb && !xo) || (yb && yr) || !ws ||
        !(s->eps >= 0.0f))
        return BK_ERR_INVALID;
    return CU_TYPED(s->dtype, gn_fwd_t, y, mean, rstd, xo, x, xb, yb, yr, gamma, beta, ws, 0, s,
                    ctx);
}

/* ---- backward ---- */

/* per chunk and channel: the sums of dr xhat, of dr and of dy (ws: [N][chunks][C][4] doubles;
 * the fourth is k_gn_dx's), dr = dy, or dy silu'(z) with z recomputed; fp32 over GN_PPT pixels
 * at a time, then double */
template <typename T, int W>
__global__ void k_gn_bwd_sums(double *ws, const T *dy, const T *x, const float *gamma,
                              const float *beta, const float *mean, const float *rstd, int c,
                              int hw, int groups, int silu, struct gn_cfg g)
{
    __shared__ double red[GN_THREADS * 8];
    const int img = blockIdx.y, chunk = blockIdx.x, t = threadIdx.x, cpg = c / groups;
    const int tx = t % g.bx, ty = t / g.bx;
    const int p0 = chunk * g.pc, p1 = p0 + g.pc < hw ? p0 + g.pc : hw;
    for (int lb = 0; lb < g.lanes; lb += g.bx) {
        const int lane = lb + tx, ch = lane * W;
        const int on = ty < g.by && lane < g.lanes;
        double SG[W], SB[W], SD[W];
        for (int k = 0; k < W; k++) SG[k] = SB[k] = SD[k] = 0.0;
        if (on) {
            float m[W], r[W], gm[W], bt[W], xv[W], gv[W], sg[W], sb[W], sd[W];
            for (int k = 0; k < W; k++) {
                m[k] = mean[(size_t)img * groups + (ch + k) / cpg];
                r[k] = rstd[(size_t)img * groups + (ch + k) / cpg];
                gm[k] = gamma ? gamma[ch + k] : 1.0f;
                bt[k] = beta ? beta[ch + k] : 0.0f;
                sg[k] = sb[k] = sd[k] = 0.0f;
            }
            int cnt = 0;
            for (int p = p0 + ty; p < p1; p += g.by) {
                const size_t off = ((size_t)img * hw + p) * c + ch;
                cu_ldv<T, W>(xv, x + off);
                cu_ldv<T, W>(gv, dy + off);
                for (int k = 0; k < W; k++) {
                    const float dr =
                        silu ? gv[k] * cu_silu_grad((xv[k] - m[k]) * r[k] * gm[k] + bt[k]) : gv[k];
                    sg[k] += dr * ((xv[k] - m[k]) * r[k]);
                    sb[k] += dr;
                    sd[k] += gv[k];
                }
                if (++cnt == GN_PPT || p + g.by >= p1) {
                    for (int k = 0; k < W; k++) {
                        SG[k] += sg[k];
                        SB[k] += sb[k];
                        SD[k] += sd[k];
                        sg[k] = sb[k] = sd[k] = 0.0f;
                    }
                    cnt = 0;
                }
            }
        }
        double *o = ws + (((size_t)img * g.chunks + chunk) * c + ch) * 4;
        gn_rows_sum<W>(red, SG, o, 4, lane < g.lanes, g);
        gn_rows_sum<W>(red, SB, o + 1, 4, lane < g.lanes, g);
        gn_rows_sum<W>(red, SD, o + 2, 4, lane < g.lanes, g);
    }
}

/* per (group, image): a = sum dr gamma / cnt, b = sum dr xhat gamma / cnt over the group, and the
 * dx coefficients of norm.c: cb = -rstd^2 b, cc = -rstd a (coef: (N,G,2)), ca = rstd gamma per
 * channel (ca: (N,C)) */
__global__ void k_gn_bwd_coef(float *coef, float *ca, const double *ws, const float *gamma,
                              const float *rstd, int c, int hw, int groups, int chunks)
{
    __shared__ double sh[33];
    const int gi = blockIdx.x, img = blockIdx.y, cpg = c / groups;
    const int items = cpg * chunks;
    double s1 = 0.0, s2 = 0.0;
    for (int i = threadIdx.x; i < items; i += blockDim.x) {
        const int k = i / cpg, ch = gi * cpg + i % cpg;
        const double *p = ws + (((size_t)img * chunks + k) * c + ch) * 4;
        const double gm = gamma ? gamma[ch] : 1.0;
        s2 += p[0] * gm;
        s1 += p[1] * gm;
    }
    s1 = cu_block_sum(s1, sh);
    s2 = cu_block_sum(s2, sh);
    const double cnt = (double)cpg * hw, rs = rstd[(size_t)img * groups + gi];
    if (threadIdx.x == 0) {
        coef[((size_t)img * groups + gi) * 2] = (float)(-rs * rs * (s2 / cnt));
        coef[((size_t)img * groups + gi) * 2 + 1] = (float)(-rs * (s1 / cnt));
    }
    for (int k = threadIdx.x; k < cpg; k += blockDim.x) {
        const int ch = gi * cpg + k;
        ca[(size_t)img * c + ch] = (float)(rs * (gamma ? (double)gamma[ch] : 1.0));
    }
}

/* dx (=/+=) ca dr + cb (x - mean) + cc (norm.c's gn_bwd_image); with db_of_dx the stored dx
 * values are summed per chunk and channel into the workspace's fourth double */
template <typename T, int W>
__global__ void k_gn_dx(T *dx, double *ws, const T *dy, const T *x, const float *coef,
                        const float *ca, const float *gamma, const float *beta, const float *mean,
                        const float *rstd, int accum, int c, int hw, int groups, int silu,
                        int db_of_dx, struct gn_cfg g)
{
    __shared__ double red[GN_THREADS * 8];
    const int img = blockIdx.y, chunk = blockIdx.x, t = threadIdx.x, cpg = c / groups;
    const int tx = t % g.bx, ty = t / g.bx;
    const int p0 = chunk * g.pc, p1 = p0 + g.pc < hw ? p0 + g.pc : hw;
    for (int lb = 0; lb < g.lanes; lb += g.bx) {
        const int lane = lb + tx, ch = lane * W;
        const int on = ty < g.by && lane < g.lanes;
        double SX[W];
        for (int k = 0; k < W; k++) SX[k] = 0.0;
        if (on) {
            float m[W], r[W], gm[W], bt[W], fa[W], fb[W], fc[W], xv[W], gv[W], o[W], sx[W];
            for (int k = 0; k < W; k++) {
                const size_t gi = (size_t)img * groups + (ch + k) / cpg;
                m[k] = mean[gi];
                r[k] = rstd[gi];
                gm[k] = gamma ? gamma[ch + k] : 1.0f;
                bt[k] = beta ? beta[ch + k] : 0.0f;
                fa[k] = ca[(size_t)img * c + ch + k];
                fb[k] = coef[2 * gi];
                fc[k] = coef[2 * gi + 1];
                sx[k] = 0.0f;
            }
            int cnt = 0;
            for (int p = p0 + ty; p < p1; p += g.by) {
                const size_t off = ((size_t)img * hw + p) * c + ch;
                cu_ldv<T, W>(xv, x + off);
                cu_ldv<T, W>(gv, dy + off);
                if (accum) cu_ldv<T, W>(o, dx + off);
                for (int k = 0; k < W; k++) {
                    const float dr =
                        silu ? gv[k] * cu_silu_grad((xv[k] - m[k]) * r[k] * gm[k] + bt[k]) : gv[k];
                    const float v = fa[k] * dr + fb[k] * (xv[k] - m[k]) + fc[k];
                    o[k] = accum ? o[k] + v : v;
                    if (db_of_dx) sx[k] += cu_round<T>(o[k]);
                }
                cu_stv<T, W>(dx + off, o);
                if (++cnt == GN_PPT || p + g.by >= p1) {
                    for (int k = 0; k < W; k++) {
                        SX[k] += sx[k];
                        sx[k] = 0.0f;
                    }
                    cnt = 0;
                }
            }
        }
        if (db_of_dx) {
            double *os = ws + (((size_t)img * g.chunks + chunk) * c + ch) * 4 + 3;
            gn_rows_sum<W>(red, SX, os, 4, lane < g.lanes, g);
        }
    }
}

/* a block per channel: dgamma, dbeta += the sums over the images and chunks (block sums in a
 * fixed order), and db (N,C) (=/+=) each image's sum over the chunks of dy (slot 2; slot 1 when
 * it equals dr, without silu) or of dx (db_of_dx: slot 3) */
template <typename T>
__global__ void k_gn_bwd_params(float *dgamma, float *dbeta, T *db, const double *ws, int n, int c,
                                int chunks, int db_accum, int slot)
{
    __shared__ double sh[33];
    const int ch = blockIdx.x, items = n * chunks;
    if (dgamma || dbeta) {
        double sg = 0.0, sb = 0.0;
        for (int i = threadIdx.x; i < items; i += blockDim.x) {
            const double *p = ws + ((size_t)i * c + ch) * 4;
            sg += p[0];
            sb += p[1];
        }
        sg = cu_block_sum(sg, sh);
        sb = cu_block_sum(sb, sh);
        if (threadIdx.x == 0) {
            if (dgamma) dgamma[ch] += (float)sg;
            if (dbeta) dbeta[ch] += (float)sb;
        }
    }
    if (db)
        for (int img = threadIdx.x; img < n; img += blockDim.x) {
            double s = 0.0;
            for (int k = 0; k < chunks; k++)
                s += ws[(((size_t)img * chunks + k) * c + ch) * 4 + slot];
            T *d = db + (size_t)img * c + ch;
            *d = cu_to<T>(db_accum ? (float)((double)cu_ld(*d) + s) : (float)s);
        }
}

template <typename T, int W>
static int gn_bwd(void *dx, float *dgamma, float *dbeta, void *db, const void *dy, const void *x,
                  const float *gamma, const float *beta, const float *mean, const float *rstd,
                  int accum, int db_accum, int db_of_dx, void *ws, int max_chunks,
                  const struct bk_groupnorm *s, bk_ctx *ctx)
{
    const struct gn_cfg g = gn_config(s->n, s->c, s->hw, W, max_chunks);
    const dim3 grid(g.chunks, s->n);
    double *sums = (double *)ws;
    float *coef = (float *)((char *)ws + gn_sums_bytes(s, &g, 1));
    float *ca = coef + (size_t)s->n * s->groups * 2;
    CU_LAUNCH(k_gn_bwd_sums<T COMMA W>, grid, GN_THREADS, 0, ctx->stream)(
        sums, (const T *)dy, (const T *)x, gamma, beta, mean, rstd, s->c, s->hw, s->groups,
        s->silu, g);
    CU_LAUNCHED(ctx);
    if (dx) {
        CU_LAUNCH(k_gn_bwd_coef, dim3(s->groups, s->n),
                  gn_red_threads((size_t)(s->c / s->groups) * g.chunks), 0, ctx->stream)(
            coef, ca, sums, gamma, rstd, s->c, s->hw, s->groups, g.chunks);
        CU_LAUNCHED(ctx);
        CU_LAUNCH(k_gn_dx<T COMMA W>, grid, GN_THREADS, 0, ctx->stream)(
            (T *)dx, sums, (const T *)dy, (const T *)x, coef, ca, gamma, beta, mean, rstd, accum,
            s->c, s->hw, s->groups, s->silu, db && db_of_dx, g);
        CU_LAUNCHED(ctx);
    }
    if (dgamma || dbeta || db) {
        const int slot = db_of_dx ? 3 : s->silu ? 2 : 1;
        CU_LAUNCH(k_gn_bwd_params<T>, s->c, gn_red_threads((size_t)s->n * g.chunks), 0,
                  ctx->stream)(
            dgamma, dbeta, (T *)db, sums, s->n, s->c, g.chunks, db_accum, slot);
        CU_LAUNCHED(ctx);
    }
    return BK_OK;
}

template <typename T>
static int gn_bwd_t(void *dx, float *dgamma, float *dbeta, void *db, const void *dy,
                    const void *x, const float *gamma, const float *beta, const float *mean,
                    const float *rstd, int accum, int db_accum, int db_of_dx, void *ws,
                    int max_chunks, const struct bk_groupnorm *s, bk_ctx *ctx)
{
    if (gn_width<T>(s->c, dx, dy, x) > 1)
        return gn_bwd<T, CU_VW(T)>(dx, dgamma, dbeta, db, dy, x, gamma, beta, mean, rstd, accum,
                                   db_accum, db_of_dx, ws, max_chunks, s, ctx);
    return gn_bwd<T, 1>(dx, dgamma, dbeta, db, dy, x, gamma, beta, mean, rstd, accum, db_accum,
                        db_of_dx, ws, max_chunks, s, ctx);
}

int cu_t_groupnorm_bwd(void *dx, float *dgamma, float *dbeta, void *db, const void *dy,
                       const void *x, const float *gamma, const float *beta, const float *mean,
                       const float *rstd, int accum, int db_accum, int db_of_dx, void *ws,
                       const struct bk_groupnorm *s, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (gn_check(s) || !dy || !x || !mean || !rstd || !ws || (db && db_of_dx && !dx))
        return BK_ERR_INVALID;
    return CU_TYPED(s->dtype, gn_bwd_t, dx, dgamma, dbeta, db, dy, x, gamma, beta, mean, rstd,
                    accum, db_accum, db_of_dx, ws, 0, s, ctx);
}

/* ---- layer norm: a warp per row, sums in double as norm.c ---- */

#define LN_ROWS_PER_BLOCK 8

template <typename T, int W>
__global__ void k_layernorm_fwd(T *y, float *mean, float *rstd, const T *x, const float *gamma,
                                const float *beta, int m, int d, float eps)
{
    const int row = blockIdx.x * LN_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= m) return;
    const T *xr = x + (size_t)row * d;
    T *yr = y + (size_t)row * d;
    float v[W];
    double s = 0.0;
    for (int j = lane * W; j < d; j += 32 * W) {
        cu_ldv<T, W>(v, xr + j);
        for (int k = 0; k < W; k++) s += v[k];
    }
    const double mu = cu_warp_sum(s) / d;
    double ss = 0.0;
    for (int j = lane * W; j < d; j += 32 * W) {
        cu_ldv<T, W>(v, xr + j);
        for (int k = 0; k < W; k++) ss += ((double)v[k] - mu) * ((double)v[k] - mu);
    }
    ss = cu_warp_sum(ss);
    const float muf = (float)mu, rsf = (float)(1.0 / sqrt(ss / d + (double)eps));
    if (lane == 0) {
        mean[row] = muf;
        rstd[row] = rsf;
    }
    for (int j = lane * W; j < d; j += 32 * W) {
        cu_ldv<T, W>(v, xr + j);
        for (int k = 0; k < W; k++)
            v[k] = (v[k] - muf) * rsf * (gamma ? gamma[j + k] : 1.0f) + (beta ? beta[j + k] : 0.0f);
        cu_stv<T, W>(yr + j, v);
    }
}

template <typename T, int W>
__global__ void k_layernorm_bwd_dx(T *dx, const T *dy, const T *x, const float *gamma,
                                   const float *mean, const float *rstd, int accum, int m, int d)
{
    const int row = blockIdx.x * LN_ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= m) return;
    const T *xr = x + (size_t)row * d, *dr = dy + (size_t)row * d;
    T *o = dx + (size_t)row * d;
    const double mu = mean[row], rs = rstd[row];
    float xv[W], gv[W], ov[W];
    double s1 = 0.0, s2 = 0.0;
    for (int j = lane * W; j < d; j += 32 * W) {
        cu_ldv<T, W>(xv, xr + j);
        cu_ldv<T, W>(gv, dr + j);
        for (int k = 0; k < W; k++) {
            const double gd = (double)gv[k] * (gamma ? (double)gamma[j + k] : 1.0);
            s1 += gd;
            s2 += gd * (((double)xv[k] - mu) * rs);
        }
    }
    const double a = cu_warp_sum(s1) / d, b = cu_warp_sum(s2) / d;
    for (int j = lane * W; j < d; j += 32 * W) {
        cu_ldv<T, W>(xv, xr + j);
        cu_ldv<T, W>(gv, dr + j);
        if (accum) cu_ldv<T, W>(ov, o + j);
        for (int k = 0; k < W; k++) {
            const double gd = (double)gv[k] * (gamma ? (double)gamma[j + k] : 1.0);
            const float v = (float)(rs * (gd - a - ((double)xv[k] - mu) * rs * b));
            ov[k] = accum ? ov[k] + v : v;
        }
        cu_stv<T, W>(o + j, ov);
    }
}

#define LN_COLS 32
#define LN_ROWS 32

/* dgamma, dbeta (D) over the M rows: a block owns 32 columns, 32 row lanes, fixed-order combine */
template <typename T>
__global__ void k_layernorm_bwd_param(float *dgamma, float *dbeta, const T *dy, const T *x,
                                      const float *mean, const float *rstd, int m, int d)
{
    __shared__ double pg[LN_ROWS][LN_COLS + 1], pb[LN_ROWS][LN_COLS + 1];
    const int tx = threadIdx.x, ty = threadIdx.y, j = blockIdx.x * LN_COLS + tx;
    double sg = 0.0, sb = 0.0;
    if (j < d)
        for (int i = ty; i < m; i += LN_ROWS) {
            const double dd = (double)cu_ld(dy[(size_t)i * d + j]);
            sg += dd * (((double)cu_ld(x[(size_t)i * d + j]) - (double)mean[i]) * (double)rstd[i]);
            sb += dd;
        }
    pg[ty][tx] = sg;
    pb[ty][tx] = sb;
    __syncthreads();
    if (ty == 0 && j < d) {
        double gs = 0.0, bs = 0.0;
        for (int r = 0; r < LN_ROWS; r++) {
            gs += pg[r][tx];
            bs += pb[r][tx];
        }
        if (dgamma) dgamma[j] += (float)gs;
        if (dbeta) dbeta[j] += (float)bs;
    }
}

template <typename T>
static int ln_fwd(void *y, float *mean, float *rstd, const void *x, const float *gamma,
                  const float *beta, int m, int d, float eps, bk_ctx *ctx)
{
    const unsigned blocks = (unsigned)((m + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK);
    if (gn_width<T>(d, y, x) > 1)
        CU_LAUNCH(k_layernorm_fwd<T COMMA CU_VW(T)>, blocks, 32 * LN_ROWS_PER_BLOCK, 0,
                  ctx->stream)((T *)y, mean, rstd, (const T *)x, gamma, beta, m, d, eps);
    else
        CU_LAUNCH(k_layernorm_fwd<T COMMA 1>, blocks, 32 * LN_ROWS_PER_BLOCK, 0, ctx->stream)(
            (T *)y, mean, rstd, (const T *)x, gamma, beta, m, d, eps);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

template <typename T>
static int ln_bwd(void *dx, float *dgamma, float *dbeta, const void *dy, const void *x,
                  const float *gamma, const float *mean, const float *rstd, int accum, int m,
                  int d, bk_ctx *ctx)
{
    if (dx) {
        const unsigned blocks = (unsigned)((m + LN_ROWS_PER_BLOCK - 1) / LN_ROWS_PER_BLOCK);
        if (gn_width<T>(d, dx, dy, x) > 1)
            CU_LAUNCH(k_layernorm_bwd_dx<T COMMA CU_VW(T)>, blocks, 32 * LN_ROWS_PER_BLOCK, 0,
                      ctx->stream)((T *)dx, (const T *)dy, (const T *)x, gamma, mean, rstd, accum,
                                   m, d);
        else
            CU_LAUNCH(k_layernorm_bwd_dx<T COMMA 1>, blocks, 32 * LN_ROWS_PER_BLOCK, 0,
                      ctx->stream)((T *)dx, (const T *)dy, (const T *)x, gamma, mean, rstd, accum,
                                   m, d);
        CU_LAUNCHED(ctx);
    }
    if (dgamma || dbeta) {
        dim3 block(LN_COLS, LN_ROWS);
        CU_LAUNCH(k_layernorm_bwd_param<T>, (d + LN_COLS - 1) / LN_COLS, block, 0, ctx->stream)(
            dgamma, dbeta, (const T *)dy, (const T *)x, mean, rstd, m, d);
        CU_LAUNCHED(ctx);
    }
    return BK_OK;
}

int cu_t_layernorm_fwd(void *y, float *mean, float *rstd, const void *x, const float *gamma,
                       const float *beta, int m, int d, float eps, int dtype, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!y || !mean || !rstd || !x || m < 1 || d < 1 || !(eps >= 0.0f) || !cu_dtype_ok(dtype))
        return BK_ERR_INVALID;
    return CU_TYPED(dtype, ln_fwd, y, mean, rstd, x, gamma, beta, m, d, eps, ctx);
}

int cu_t_layernorm_bwd(void *dx, float *dgamma, float *dbeta, const void *dy, const void *x,
                       const float *gamma, const float *mean, const float *rstd, int accum, int m,
                       int d, int dtype, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (!dy || !x || !mean || !rstd || m < 1 || d < 1 || !cu_dtype_ok(dtype))
        return BK_ERR_INVALID;
    return CU_TYPED(dtype, ln_bwd, dx, dgamma, dbeta, dy, x, gamma, mean, rstd, accum, m, d, ctx);
}

/* ---- the fp32 entries. Those without a workspace argument take the plan's (ctx_set_workspace)
 * or else the slot's scratch, in fewer chunks if need be; a shape whose smallest workspace fits
 * neither is refused (the executor runs the typed entries with a planned workspace). ---- */

static int gn_scratch(bk_ctx *ctx, const struct bk_groupnorm *s, int backward, void **ws,
                      int *max_chunks)
{
    const size_t own = CU_SCRATCH_DOUBLES * sizeof(double);
    const int use_plan = ctx->ws && ctx->ws_bytes > own;
    *ws = use_plan ? ctx->ws : (void *)ctx->scratch;
    *max_chunks = gn_max_chunks(s, backward, use_plan ? ctx->ws_bytes : own);
    return *max_chunks > 0 ? BK_OK : BK_ERR_INVALID;
}

static int gn_fwd_f32(float *y, float *mean, float *rstd, const float *x, const float *gamma,
                      const float *beta, int n, int c, int hw, int groups, float eps, int silu,
                      bk_ctx *ctx)
{
    CU_ENTER(ctx);
    const struct bk_groupnorm s = {n, c, hw, groups, eps, silu, BK_DTYPE_F32};
    void *ws;
    int mc;
    if (gn_check(&s) || !y || !mean || !rstd || !x || !(eps >= 0.0f) ||
        gn_scratch(ctx, &s, 0, &ws, &mc))
        return BK_ERR_INVALID;
    return gn_fwd_t<float>(y, mean, rstd, NULL, x, NULL, NULL, NULL, gamma, beta, ws, mc, &s,
                           ctx);
}

int cu_groupnorm_fwd(float *y, float *mean, float *rstd, const float *x, const float *gamma,
                     const float *beta, int n, int c, int hw, int groups, float eps,
                     bk_ctx *ctx)
{
    return gn_fwd_f32(y, mean, rstd, x, gamma, beta, n, c, hw, groups, eps, 0, ctx);
}

int cu_groupnorm_silu_fwd(float *y, float *mean, float *rstd, const float *x, const float *gamma,
                          const float *beta, int n, int c, int hw, int groups, float eps,
                          bk_ctx *ctx)
{
    return gn_fwd_f32(y, mean, rstd, x, gamma, beta, n, c, hw, groups, eps, 1, ctx);
}

int cu_groupnorm_bwd(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                     const float *gamma, const float *mean, const float *rstd, int accum, int n,
                     int c, int hw, int groups, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    const struct bk_groupnorm s = {n, c, hw, groups, 0.0f, 0, BK_DTYPE_F32};
    void *ws;
    int mc;
    if (gn_check(&s) || !dy || !x || !mean || !rstd || gn_scratch(ctx, &s, 1, &ws, &mc))
        return BK_ERR_INVALID;
    return gn_bwd_t<float>(dx, dgamma, dbeta, NULL, dy, x, gamma, NULL, mean, rstd, accum, 0, 0,
                           ws, mc, &s, ctx);
}

size_t cu_groupnorm_bwd_ws_bytes(int n, int c, int hw, int groups, int silu)
{
    const struct bk_groupnorm s = {n, c, hw, groups, 0.0f, silu, BK_DTYPE_F32};
    return cu_t_groupnorm_ws_bytes(&s, 1);
}

int cu_groupnorm_bwd_ws(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                        const float *gamma, const float *beta, const float *mean,
                        const float *rstd, int accum, int n, int c, int hw, int groups, int silu,
                        void *ws, bk_ctx *ctx)
{
    const struct bk_groupnorm s = {n, c, hw, groups, 0.0f, silu, BK_DTYPE_F32};
    return cu_t_groupnorm_bwd(dx, dgamma, dbeta, NULL, dy, x, gamma, beta, mean, rstd, accum, 0,
                              0, ws, &s, ctx);
}

int cu_layernorm_fwd(float *y, float *mean, float *rstd, const float *x, const float *gamma,
                     const float *beta, int m, int d, float eps, bk_ctx *ctx)
{
    return cu_t_layernorm_fwd(y, mean, rstd, x, gamma, beta, m, d, eps, BK_DTYPE_F32, ctx);
}

int cu_layernorm_bwd(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                     const float *gamma, const float *mean, const float *rstd, int accum, int m,
                     int d, bk_ctx *ctx)
{
    return cu_t_layernorm_bwd(dx, dgamma, dbeta, dy, x, gamma, mean, rstd, accum, m, d,
                              BK_DTYPE_F32, ctx);
}
