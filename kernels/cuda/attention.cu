/* attention.cu - multi-head self-attention o = softmax(scale q k^T) v on the GPU, in
 * kernels/cpu/attention.c's two forms. A warp owns one row (a query, or in the key-side backward a
 * key): its lanes score 32 keys at a time (each lane one key), softmax over the warp with
 * shuffles, and accumulate the 32 rows of v (each lane D/32 of the features).
 * Tiled (FlashAttention-style): the forward keeps a running max and sum per row and saves only lse
 * (N,H,L); the backward recomputes the scores twice, once per query row (dq) and once per key row
 * (dk, dv), so no two warps write one row and nothing is atomic. Its workspace holds
 * Di = dO_i . O_i (N,H,L). Nothing of size L x L exists on the device.
 * Plain: the forward saves p (N,H,L,L); the backward takes one (L,L) workspace per (n, h), which
 * it visits in turn, as the CPU does.
 * q, k, v, dq, dk, dv rows have stride ld; o and dout are dense (N,L,H*D). Every kernel is a
 * template over the element type T of q, k, v, o, dout, dq, dk, dv (s->dtype: fp32, f16, bf16):
 * rows are read into fp32 (shared memory and registers), scores, softmax, lse, p and every sum
 * are fp32, and each output element is rounded once on its store.
 */
#include <math.h>

#include "cuda_backend.h"

#define ATT_WARPS 8
#define ATT_MAX_D 768 /* two rows per warp of shared memory stay within 48 KiB */
#define FULL 0xffffffffu

static int attn_check(const struct bk_attn *s)
{
    if (!s || s->n < 1 || s->l < 1 || s->heads < 1 || s->d < 1) return BK_ERR_INVALID;
    if ((long long)s->heads * s->d > s->ld) return BK_ERR_INVALID;
    if (s->d > ATT_MAX_D || !cu_dtype_ok(s->dtype)) return BK_ERR_INVALID;
    return BK_OK;
}

size_t cu_attn_ws_bytes(const struct bk_attn *s, int tiled)
{
    if (attn_check(s) != BK_OK) return 0;
    /* tiled: Di (N,H,L). plain backward: dS of one (n, h), (L,L) */
    return tiled ? (size_t)s->n * s->heads * s->l * sizeof(float)
                 : (size_t)s->l * s->l * sizeof(float);
}

/* the geometry of one warp's row r = (ni*H + h)*L + i */
struct att_row {
    int i, h, ni;
};

__device__ __forceinline__ struct att_row att_row_of(long r, int L, int H)
{
    struct att_row a;
    a.i = (int)(r % L);
    const long nh = r / L;
    a.h = (int)(nh % H);
    a.ni = (int)(nh / H);
    return a;
}

/* a (shared, fp32) . b (a row of T in global memory) */
template <typename T> __device__ __forceinline__ float att_dot(const float *a, const T *b, int D)
{
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += a[d] * cu_ld(b[d]);
    return s;
}

/* lanes copy a row of D elements into the warp's shared buffer, as fp32 */
template <typename T>
__device__ __forceinline__ void att_load(float *dst, const T *src, int D, int lane)
{
    for (int d = lane; d < D; d += 32) dst[d] = cu_ld(src[d]);
    __syncwarp();
}

/* ---- tiled forward ---- */

template <int NC, typename T>
__global__ void k_attn_fwd(T *o, float *lse, const T *q, const T *k, const T *v, int L, int H,
                           int D, int ld, float scale, long rows)
{
    CU_EXTERN_SHARED(float, att_sh);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long r = (long)blockIdx.x * ATT_WARPS + warp;
    if (r >= rows) return;
    float *qs = att_sh + warp * D;
    const struct att_row a = att_row_of(r, L, H);
    const size_t hd = (size_t)H * D, base = (size_t)a.ni * L * ld + (size_t)a.h * D;
    att_load(qs, q + base + (size_t)a.i * ld, D, lane);
    const T *kb = k + base, *vb = v + base;
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) acc[c] = 0.0f;
    float m = -INFINITY, l = 0.0f;
    for (int j0 = 0; j0 < L; j0 += 32) {
        const int j = j0 + lane, nj = min(32, L - j0);
        const float s = j < L ? scale * att_dot(qs, kb + (size_t)j * ld, D) : -INFINITY;
        const float mx = fmaxf(m, cu_warp_max(s));
        const float p = j < L ? expf(s - mx) : 0.0f;
        const float alpha = expf(m - mx);
        l = l * alpha + cu_warp_sum(p);
#pragma unroll
        for (int c = 0; c < NC; c++) acc[c] *= alpha;
        for (int jj = 0; jj < nj; jj++) {
            const float pj = __shfl_sync(FULL, p, jj);
            const T *vr = vb + (size_t)(j0 + jj) * ld;
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const int d = lane + 32 * c;
                if (d < D) acc[c] += pj * cu_ld(vr[d]);
            }
        }
        m = mx;
    }
    const float inv = 1.0f / l;
    T *orow = o + ((size_t)a.ni * L + a.i) * hd + (size_t)a.h * D;
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int d = lane + 32 * c;
        if (d < D) orow[d] = cu_to<T>(acc[c] * inv);
    }
    if (lane == 0) lse[r] = m + logf(l);
}

/* ---- tiled backward ---- */

/* di[r] = dO_r . O_r */
template <typename T>
__global__ void k_attn_di(float *di, const T *dout, const T *o, int L, int H, int D, long rows)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long r = (long)blockIdx.x * ATT_WARPS + warp;
    if (r >= rows) return;
    const struct att_row a = att_row_of(r, L, H);
    const size_t off = ((size_t)a.ni * L + a.i) * ((size_t)H * D) + (size_t)a.h * D;
    float s = 0.0f;
    for (int d = lane; d < D; d += 32) s += cu_ld(dout[off + d]) * cu_ld(o[off + d]);
    s = cu_warp_sum(s);
    if (lane == 0) di[r] = s;
}

/* dq of one query row per warp: dS_ij = scale P_ij (dP_ij - Di), dq_i = sum_j dS_ij k_j */
template <int NC, typename T>
__global__ void k_attn_dq(T *dq, const T *dout, const T *q, const T *k, const T *v,
                          const float *lse, const float *di, int L, int H, int D, int ld,
                          float scale, long rows)
{
    CU_EXTERN_SHARED(float, att_sh);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long r = (long)blockIdx.x * ATT_WARPS + warp;
    if (r >= rows) return;
    float *qs = att_sh + 2 * warp * D, *dos = qs + D;
    const struct att_row a = att_row_of(r, L, H);
    const size_t hd = (size_t)H * D, base = (size_t)a.ni * L * ld + (size_t)a.h * D;
    att_load(qs, q + base + (size_t)a.i * ld, D, lane);
    att_load(dos, dout + ((size_t)a.ni * L + a.i) * hd + (size_t)a.h * D, D, lane);
    const T *kb = k + base, *vb = v + base;
    const float lr = lse[r], dr0 = di[r];
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) acc[c] = 0.0f;
    for (int j0 = 0; j0 < L; j0 += 32) {
        const int j = j0 + lane, nj = min(32, L - j0);
        float ds = 0.0f;
        if (j < L) {
            const float p = expf(scale * att_dot(qs, kb + (size_t)j * ld, D) - lr);
            const float dp = att_dot(dos, vb + (size_t)j * ld, D);
            ds = p * (dp - dr0) * scale;
        }
        for (int jj = 0; jj < nj; jj++) {
            const float dsj = __shfl_sync(FULL, ds, jj);
            const T *kr = kb + (size_t)(j0 + jj) * ld;
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const int d = lane + 32 * c;
                if (d < D) acc[c] += dsj * cu_ld(kr[d]);
            }
        }
    }
    T *dqr = dq + base + (size_t)a.i * ld;
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int d = lane + 32 * c;
        if (d < D) dqr[d] = cu_to<T>(acc[c]);
    }
}

/* dk, dv of one key row per warp: dv_j = sum_i P_ij dO_i, dk_j = sum_i dS_ij q_i */
template <int NC, typename T>
__global__ void k_attn_dkdv(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v,
                            const float *lse, const float *di, int L, int H, int D, int ld,
                            float scale, long rows)
{
    CU_EXTERN_SHARED(float, att_sh);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long r = (long)blockIdx.x * ATT_WARPS + warp;
    if (r >= rows) return;
    float *ks = att_sh + 2 * warp * D, *vs = ks + D;
    const struct att_row a = att_row_of(r, L, H); /* a.i is the key */
    const size_t hd = (size_t)H * D, base = (size_t)a.ni * L * ld + (size_t)a.h * D;
    const size_t dbase = (size_t)a.ni * L * hd + (size_t)a.h * D;
    att_load(ks, k + base + (size_t)a.i * ld, D, lane);
    att_load(vs, v + base + (size_t)a.i * ld, D, lane);
    const T *qb = q + base;
    const float *lrow = lse + (r - a.i), *drow = di + (r - a.i);
    float ak[NC], av[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) ak[c] = av[c] = 0.0f;
    for (int i0 = 0; i0 < L; i0 += 32) {
        const int i = i0 + lane, ni = min(32, L - i0);
        float p = 0.0f, ds = 0.0f;
        if (i < L) {
            p = expf(scale * att_dot(ks, qb + (size_t)i * ld, D) - lrow[i]);
            const float dp = att_dot(vs, dout + dbase + (size_t)i * hd, D);
            ds = p * (dp - drow[i]) * scale;
        }
        for (int ii = 0; ii < ni; ii++) {
            const float pi = __shfl_sync(FULL, p, ii), dsi = __shfl_sync(FULL, ds, ii);
            const T *dor = dout + dbase + (size_t)(i0 + ii) * hd;
            const T *qr = qb + (size_t)(i0 + ii) * ld;
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const int d = lane + 32 * c;
                if (d < D) {
                    av[c] += pi * cu_ld(dor[d]);
                    ak[c] += dsi * cu_ld(qr[d]);
                }
            }
        }
    }
    T *dkr = dk + base + (size_t)a.i * ld, *dvr = dv + base + (size_t)a.i * ld;
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int d = lane + 32 * c;
        if (d < D) {
            dkr[d] = cu_to<T>(ak[c]);
            dvr[d] = cu_to<T>(av[c]);
        }
    }
}

/* ---- plain forward: p rows saved ---- */

template <int NC, typename T>
__global__ void k_attn_plain_fwd(T *o, float *p, const T *q, const T *k, const T *v, int L, int H,
                                 int D, int ld, float scale, long rows)
{
    CU_EXTERN_SHARED(float, att_sh);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long r = (long)blockIdx.x * ATT_WARPS + warp;
    if (r >= rows) return;
    float *qs = att_sh + warp * D;
    const struct att_row a = att_row_of(r, L, H);
    const size_t hd = (size_t)H * D, base = (size_t)a.ni * L * ld + (size_t)a.h * D;
    att_load(qs, q + base + (size_t)a.i * ld, D, lane);
    const T *kb = k + base, *vb = v + base;
    float *pr = p + (size_t)r * L;
    float mx = -INFINITY;
    for (int j = lane; j < L; j += 32) {
        const float s = att_dot(qs, kb + (size_t)j * ld, D) * scale;
        pr[j] = s;
        mx = fmaxf(mx, s);
    }
    mx = cu_warp_max(mx);
    double sum = 0.0;
    for (int j = lane; j < L; j += 32) {
        const float e = expf(pr[j] - mx);
        pr[j] = e;
        sum += e;
    }
    const float inv = (float)(1.0 / cu_warp_sum(sum));
    for (int j = lane; j < L; j += 32) pr[j] *= inv;
    __syncwarp();
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) acc[c] = 0.0f;
    for (int j = 0; j < L; j++) {
        const float pj = pr[j];
        const T *vr = vb + (size_t)j * ld;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int d = lane + 32 * c;
            if (d < D) acc[c] += pj * cu_ld(vr[d]);
        }
    }
    T *orow = o + ((size_t)a.ni * L + a.i) * hd + (size_t)a.h * D;
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int d = lane + 32 * c;
        if (d < D) orow[d] = cu_to<T>(acc[c]);
    }
}

/* ---- plain backward of one (n, h): rows then columns ---- */

/* query row i: ds_i = scale p_i (dp_i - rowsum(p_i dp_i)) into ws, dq_i = ds_i k */
template <int NC, typename T>
__global__ void k_attn_plain_rows(T *dq, float *ds, const T *dout, const T *k, const T *v,
                                  const float *ph, int ni, int h, int L, int H, int D, int ld,
                                  float scale)
{
    CU_EXTERN_SHARED(float, att_sh);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i = blockIdx.x * ATT_WARPS + warp;
    if (i >= L) return;
    float *dos = att_sh + warp * D;
    const size_t hd = (size_t)H * D, base = (size_t)ni * L * ld + (size_t)h * D;
    att_load(dos, dout + ((size_t)ni * L + i) * hd + (size_t)h * D, D, lane);
    const T *kb = k + base, *vb = v + base;
    const float *pr = ph + (size_t)i * L;
    float *dsr = ds + (size_t)i * L;
    double rs = 0.0;
    for (int j = lane; j < L; j += 32) {
        const float dp = att_dot(dos, vb + (size_t)j * ld, D);
        dsr[j] = dp;
        rs += (double)pr[j] * dp;
    }
    const float rsf = (float)cu_warp_sum(rs);
    for (int j = lane; j < L; j += 32) dsr[j] = pr[j] * (dsr[j] - rsf) * scale;
    __syncwarp();
    float acc[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) acc[c] = 0.0f;
    for (int j = 0; j < L; j++) {
        const float w = dsr[j];
        const T *kr = kb + (size_t)j * ld;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int d = lane + 32 * c;
            if (d < D) acc[c] += w * cu_ld(kr[d]);
        }
    }
    T *dqr = dq + base + (size_t)i * ld;
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int d = lane + 32 * c;
        if (d < D) dqr[d] = cu_to<T>(acc[c]);
    }
}

/* key column c: dv_c = p^T dout, dk_c = ds^T q */
template <int NC, typename T>
__global__ void k_attn_plain_cols(T *dk, T *dv, const float *ds, const T *dout, const T *q,
                                  const float *ph, int ni, int h, int L, int H, int D, int ld)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int cidx = blockIdx.x * ATT_WARPS + warp;
    if (cidx >= L) return;
    const size_t hd = (size_t)H * D, base = (size_t)ni * L * ld + (size_t)h * D;
    const size_t dbase = (size_t)ni * L * hd + (size_t)h * D;
    float ak[NC], av[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) ak[c] = av[c] = 0.0f;
    for (int i = 0; i < L; i++) {
        const float pw = ph[(size_t)i * L + cidx], dw = ds[(size_t)i * L + cidx];
        const T *dor = dout + dbase + (size_t)i * hd, *qr = q + base + (size_t)i * ld;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int d = lane + 32 * c;
            if (d < D) {
                av[c] += pw * cu_ld(dor[d]);
                ak[c] += dw * cu_ld(qr[d]);
            }
        }
    }
    T *dkr = dk + base + (size_t)cidx * ld, *dvr = dv + base + (size_t)cidx * ld;
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int d = lane + 32 * c;
        if (d < D) {
            dkr[d] = cu_to<T>(ak[c]);
            dvr[d] = cu_to<T>(av[c]);
        }
    }
}

/* ---- launches: NC (features per lane, rounded up) in {2, 8, 32}, T the element type ---- */

static int att_nc(int D) { return D <= 64 ? 2 : D <= 256 ? 8 : 32; }

#define ATT_LAUNCH(KERNEL, T, nc, grid, smem, ...)                                                 \
    do {                                                                                           \
        const unsigned th_ = ATT_WARPS * 32;                                                       \
        auto k_ = (nc) == 2 ? &KERNEL<2, T> : (nc) == 8 ? &KERNEL<8, T> : &KERNEL<32, T>;          \
        CU_LAUNCH(k_, (grid), th_, (smem), ctx->stream)(__VA_ARGS__);                              \
        CU_LAUNCHED(ctx);                                                                          \
    } while (0)

static unsigned att_grid(long rows) { return (unsigned)((rows + ATT_WARPS - 1) / ATT_WARPS); }

template <typename T>
static int attn_fwd_t(void *o, float *lse, const void *q, const void *k, const void *v,
                      const struct bk_attn *s, bk_ctx *ctx)
{
    const long rows = (long)s->n * s->heads * s->l;
    const size_t smem = (size_t)ATT_WARPS * s->d * sizeof(float);
    ATT_LAUNCH(k_attn_fwd, T, att_nc(s->d), att_grid(rows), smem, (T *)o, lse, (const T *)q,
               (const T *)k, (const T *)v, s->l, s->heads, s->d, s->ld, s->scale, rows);
    return BK_OK;
}

int cu_attn_fwd(void *o, float *lse, const void *q, const void *k, const void *v, void *ws,
                const struct bk_attn *s, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (attn_check(s) != BK_OK || !o || !lse || !q || !k || !v) return BK_ERR_INVALID;
    return CU_TYPED(s->dtype, attn_fwd_t, o, lse, q, k, v, s, ctx);
}

template <typename T>
static int attn_bwd_t(void *dq, void *dk, void *dv, const void *dout, const void *q,
                      const void *k, const void *v, const void *o, const float *lse, float *di,
                      const struct bk_attn *s, bk_ctx *ctx)
{
    const long rows = (long)s->n * s->heads * s->l;
    CU_LAUNCH(k_attn_di<T>, att_grid(rows), ATT_WARPS * 32, 0, ctx->stream)(
        di, (const T *)dout, (const T *)o, s->l, s->heads, s->d, rows);
    CU_LAUNCHED(ctx);
    const size_t smem = (size_t)2 * ATT_WARPS * s->d * sizeof(float);
    ATT_LAUNCH(k_attn_dq, T, att_nc(s->d), att_grid(rows), smem, (T *)dq, (const T *)dout,
               (const T *)q, (const T *)k, (const T *)v, lse, (const float *)di, s->l, s->heads,
               s->d, s->ld, s->scale, rows);
    ATT_LAUNCH(k_attn_dkdv, T, att_nc(s->d), att_grid(rows), smem, (T *)dk, (T *)dv,
               (const T *)dout, (const T *)q, (const T *)k, (const T *)v, lse, (const float *)di,
               s->l, s->heads, s->d, s->ld, s->scale, rows);
    return BK_OK;
}

int cu_attn_bwd(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                const void *v, const void *o, const float *lse, void *ws,
                const struct bk_attn *s, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (attn_check(s) != BK_OK || !dq || !dk || !dv || !dout || !q || !k || !v || !o || !lse ||
        !ws)
        return BK_ERR_INVALID;
    return CU_TYPED(s->dtype, attn_bwd_t, dq, dk, dv, dout, q, k, v, o, lse, (float *)ws, s, ctx);
}

template <typename T>
static int attn_plain_fwd_t(void *o, float *p, const void *q, const void *k, const void *v,
                            const struct bk_attn *s, bk_ctx *ctx)
{
    const long rows = (long)s->n * s->heads * s->l;
    const size_t smem = (size_t)ATT_WARPS * s->d * sizeof(float);
    ATT_LAUNCH(k_attn_plain_fwd, T, att_nc(s->d), att_grid(rows), smem, (T *)o, p, (const T *)q,
               (const T *)k, (const T *)v, s->l, s->heads, s->d, s->ld, s->scale, rows);
    return BK_OK;
}

int cu_attn_plain_fwd(void *o, float *p, const void *q, const void *k, const void *v, void *ws,
                      const struct bk_attn *s, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (attn_check(s) != BK_OK || !o || !p || !q || !k || !v) return BK_ERR_INVALID;
    return CU_TYPED(s->dtype, attn_plain_fwd_t, o, p, q, k, v, s, ctx);
}

template <typename T>
static int attn_plain_bwd_t(void *dq, void *dk, void *dv, const void *dout, const void *q,
                            const void *k, const void *v, const float *p, float *ds,
                            const struct bk_attn *s, bk_ctx *ctx)
{
    const int L = s->l, H = s->heads, D = s->d, nc = att_nc(D);
    const size_t smem = (size_t)ATT_WARPS * D * sizeof(float);
    for (int nh = 0; nh < s->n * H; nh++) {
        const int h = nh % H, ni = nh / H;
        const float *ph = p + (size_t)nh * L * L;
        ATT_LAUNCH(k_attn_plain_rows, T, nc, att_grid(L), smem, (T *)dq, ds, (const T *)dout,
                   (const T *)k, (const T *)v, ph, ni, h, L, H, D, s->ld, s->scale);
        ATT_LAUNCH(k_attn_plain_cols, T, nc, att_grid(L), 0, (T *)dk, (T *)dv, (const float *)ds,
                   (const T *)dout, (const T *)q, ph, ni, h, L, H, D, s->ld);
    }
    return BK_OK;
}

int cu_attn_plain_bwd(void *dq, void *dk, void *dv, const void *dout, const void *q,
                      const void *k, const void *v, const float *p, void *ws,
                      const struct bk_attn *s, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (attn_check(s) != BK_OK || !dq || !dk || !dv || !dout || !q || !k || !v || !p || !ws)
        return BK_ERR_INVALID;
    return CU_TYPED(s->dtype, attn_plain_bwd_t, dq, dk, dv, dout, q, k, v, p, (float *)ws, s,
                    ctx);
}
