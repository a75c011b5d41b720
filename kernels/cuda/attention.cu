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
 * q, k, v, dq, dk, dv rows have stride ld; o and dout are dense (N,L,H*D).
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
    if (s->d > ATT_MAX_D) return BK_ERR_INVALID;
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

__device__ __forceinline__ float att_dot(const float *a, const float *b, int D)
{
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += a[d] * b[d];
    return s;
}

/* lanes copy a row of D floats into the warp's shared buffer */
__device__ __forceinline__ void att_load(float *dst, const float *src, int D, int lane)
{
    for (int d = lane; d < D; d += 32) dst[d] = src[d];
    __syncwarp();
}

/* ---- tiled forward ---- */

template <int NC>
__global__ void k_attn_fwd(float *o, float *lse, const float *q, const float *k, const float *v,
                           int L, int H, int D, int ld, float scale, long rows)
{
    CU_EXTERN_SHARED(float, att_sh);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long r = (long)blockIdx.x * ATT_WARPS + warp;
    if (r >= rows) return;
    float *qs = att_sh + warp * D;
    const struct att_row a = att_row_of(r, L, H);
    const size_t hd = (size_t)H * D, base = (size_t)a.ni * L * ld + (size_t)a.h * D;
    att_load(qs, q + base + (size_t)a.i * ld, D, lane);
    const float *kb = k + base, *vb = v + base;
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
            const float *vr = vb + (size_t)(j0 + jj) * ld;
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const int d = lane + 32 * c;
                if (d < D) acc[c] += pj * vr[d];
            }
        }
        m = mx;
    }
    const float inv = 1.0f / l;
    float *orow = o + ((size_t)a.ni * L + a.i) * hd + (size_t)a.h * D;
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int d = lane + 32 * c;
        if (d < D) orow[d] = acc[c] * inv;
    }
    if (lane == 0) lse[r] = m + logf(l);
}

/* ---- tiled backward ---- */

/* di[r] = dO_r . O_r */
__global__ void k_attn_di(float *di, const float *dout, const float *o, int L, int H, int D,
                          long rows)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long r = (long)blockIdx.x * ATT_WARPS + warp;
    if (r >= rows) return;
    const struct att_row a = att_row_of(r, L, H);
    const size_t off = ((size_t)a.ni * L + a.i) * ((size_t)H * D) + (size_t)a.h * D;
    float s = 0.0f;
    for (int d = lane; d < D; d += 32) s += dout[off + d] * o[off + d];
    s = cu_warp_sum(s);
    if (lane == 0) di[r] = s;
}

/* dq of one query row per warp: dS_ij = scale P_ij (dP_ij - Di), dq_i = sum_j dS_ij k_j */
template <int NC>
__global__ void k_attn_dq(float *dq, const float *dout, const float *q, const float *k,
                          const float *v, const float *lse, const float *di, int L, int H, int D,
                          int ld, float scale, long rows)
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
    const float *kb = k + base, *vb = v + base;
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
            const float *kr = kb + (size_t)(j0 + jj) * ld;
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const int d = lane + 32 * c;
                if (d < D) acc[c] += dsj * kr[d];
            }
        }
    }
    float *dqr = dq + base + (size_t)a.i * ld;
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int d = lane + 32 * c;
        if (d < D) dqr[d] = acc[c];
    }
}

/* dk, dv of one key row per warp: dv_j = sum_i P_ij dO_i, dk_j = sum_i dS_ij q_i */
template <int NC>
__global__ void k_attn_dkdv(float *dk, float *dv, const float *dout, const float *q,
                            const float *k, const float *v, const float *lse, const float *di,
                            int L, int H, int D, int ld, float scale, long rows)
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
    const float *qb = q + base, *lrow = lse + (r - a.i), *drow = di + (r - a.i);
    float ak[NC], av[NC];
#pragma unroll
    for (int c = 0; c < NC; c++) ak[c] = av[c] = 0.0f;
    for (int i0 = 0; i0 < L; i0 += 32) {
        const int i = i0 + lane, ni = min(32, L - i0);
        float p = 0.0f, ds = 0.0f;
        if (i < L) {
            p = expf(scale * att_dot(qb + (size_t)i * ld, ks, D) - lrow[i]);
            const float dp = att_dot(dout + dbase + (size_t)i * hd, vs, D);
            ds = p * (dp - drow[i]) * scale;
        }
        for (int ii = 0; ii < ni; ii++) {
            const float pi = __shfl_sync(FULL, p, ii), dsi = __shfl_sync(FULL, ds, ii);
            const float *dor = dout + dbase + (size_t)(i0 + ii) * hd;
            const float *qr = qb + (size_t)(i0 + ii) * ld;
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const int d = lane + 32 * c;
                if (d < D) {
                    av[c] += pi * dor[d];
                    ak[c] += dsi * qr[d];
                }
            }
        }
    }
    float *dkr = dk + base + (size_t)a.i * ld, *dvr = dv + base + (size_t)a.i * ld;
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int d = lane + 32 * c;
        if (d < D) {
            dkr[d] = ak[c];
            dvr[d] = av[c];
        }
    }
}

/* ---- plain forward: p rows saved ---- */

template <int NC>
__global__ void k_attn_plain_fwd(float *o, float *p, const float *q, const float *k,
                                 const float *v, int L, int H, int D, int ld, float scale,
                                 long rows)
{
    CU_EXTERN_SHARED(float, att_sh);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long r = (long)blockIdx.x * ATT_WARPS + warp;
    if (r >= rows) return;
    float *qs = att_sh + warp * D;
    const struct att_row a = att_row_of(r, L, H);
    const size_t hd = (size_t)H * D, base = (size_t)a.ni * L * ld + (size_t)a.h * D;
    att_load(qs, q + base + (size_t)a.i * ld, D, lane);
    const float *kb = k + base, *vb = v + base;
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
        const float *vr = vb + (size_t)j * ld;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int d = lane + 32 * c;
            if (d < D) acc[c] += pj * vr[d];
        }
    }
    float *orow = o + ((size_t)a.ni * L + a.i) * hd + (size_t)a.h * D;
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int d = lane + 32 * c;
        if (d < D) orow[d] = acc[c];
    }
}

/* ---- plain backward of one (n, h): rows then columns ---- */

/* query row i: ds_i = scale p_i (dp_i - rowsum(p_i dp_i)) into ws, dq_i = ds_i k */
template <int NC>
__global__ void k_attn_plain_rows(float *dq, float *ds, const float *dout, const float *k,
                                  const float *v, const float *ph, int ni, int h, int L, int H,
                                  int D, int ld, float scale)
{
    CU_EXTERN_SHARED(float, att_sh);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int i = blockIdx.x * ATT_WARPS + warp;
    if (i >= L) return;
    float *dos = att_sh + warp * D;
    const size_t hd = (size_t)H * D, base = (size_t)ni * L * ld + (size_t)h * D;
    att_load(dos, dout + ((size_t)ni * L + i) * hd + (size_t)h * D, D, lane);
    const float *kb = k + base, *vb = v + base, *pr = ph + (size_t)i * L;
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
        const float *kr = kb + (size_t)j * ld;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int d = lane + 32 * c;
            if (d < D) acc[c] += w * kr[d];
        }
    }
    float *dqr = dq + base + (size_t)i * ld;
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int d = lane + 32 * c;
        if (d < D) dqr[d] = acc[c];
    }
}

/* key column c: dv_c = p^T dout, dk_c = ds^T q */
template <int NC>
__global__ void k_attn_plain_cols(float *dk, float *dv, const float *ds, const float *dout,
                                  const float *q, const float *ph, int ni, int h, int L, int H,
                                  int D, int ld)
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
        const float *dor = dout + dbase + (size_t)i * hd, *qr = q + base + (size_t)i * ld;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int d = lane + 32 * c;
            if (d < D) {
                av[c] += pw * dor[d];
                ak[c] += dw * qr[d];
            }
        }
    }
    float *dkr = dk + base + (size_t)cidx * ld, *dvr = dv + base + (size_t)cidx * ld;
#pragma unroll
    for (int c = 0; c < NC; c++) {
        const int d = lane + 32 * c;
        if (d < D) {
            dkr[d] = ak[c];
            dvr[d] = av[c];
        }
    }
}

/* ---- launches: NC (features per lane, rounded up) in {2, 8, 32} ---- */

static int att_nc(int D) { return D <= 64 ? 2 : D <= 256 ? 8 : 32; }

#define ATT_LAUNCH(KERNEL, nc, grid, smem, ...)                                                    \
    do {                                                                                           \
        const unsigned th_ = ATT_WARPS * 32;                                                       \
        if ((nc) == 2)                                                                             \
            CU_LAUNCH(KERNEL<2>, (grid), th_, (smem), ctx->stream)(__VA_ARGS__);                   \
        else if ((nc) == 8)                                                                        \
            CU_LAUNCH(KERNEL<8>, (grid), th_, (smem), ctx->stream)(__VA_ARGS__);                   \
        else                                                                                       \
            CU_LAUNCH(KERNEL<32>, (grid), th_, (smem), ctx->stream)(__VA_ARGS__);                  \
        CU_LAUNCHED(ctx);                                                                          \
    } while (0)

static unsigned att_grid(long rows) { return (unsigned)((rows + ATT_WARPS - 1) / ATT_WARPS); }

int cu_attn_fwd(void *ov, float *lse, const void *qv, const void *kv, const void *vv, void *ws,
                const struct bk_attn *s, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (attn_check(s) != BK_OK || !ov || !lse || !qv || !kv || !vv) return BK_ERR_INVALID;
    if (s->dtype != BK_DTYPE_F32) return BK_ERR_INVALID; /* no 16-bit kernels yet */
    float *o = (float *)ov;
    const float *q = (const float *)qv, *k = (const float *)kv, *v = (const float *)vv;
    const long rows = (long)s->n * s->heads * s->l;
    const size_t smem = (size_t)ATT_WARPS * s->d * sizeof(float);
    ATT_LAUNCH(k_attn_fwd, att_nc(s->d), att_grid(rows), smem, o, lse, q, k, v, s->l, s->heads,
               s->d, s->ld, s->scale, rows);
    return BK_OK;
}

int cu_attn_bwd(void *dqv, void *dkv, void *dvv, const void *doutv, const void *qv,
                const void *kv, const void *vv, const void *ov, const float *lse, void *ws,
                const struct bk_attn *s, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (attn_check(s) != BK_OK || !dqv || !dkv || !dvv || !doutv || !qv || !kv || !vv || !ov ||
        !lse || !ws)
        return BK_ERR_INVALID;
    if (s->dtype != BK_DTYPE_F32) return BK_ERR_INVALID; /* no 16-bit kernels yet */
    float *dq = (float *)dqv, *dk = (float *)dkv, *dv = (float *)dvv;
    const float *dout = (const float *)doutv, *q = (const float *)qv, *k = (const float *)kv,
                *v = (const float *)vv, *o = (const float *)ov;
    const long rows = (long)s->n * s->heads * s->l;
    float *di = (float *)ws;
    CU_LAUNCH(k_attn_di, att_grid(rows), ATT_WARPS * 32, 0, ctx->stream)(
        di, dout, o, s->l, s->heads, s->d, rows);
    CU_LAUNCHED(ctx);
    const size_t smem = (size_t)2 * ATT_WARPS * s->d * sizeof(float);
    ATT_LAUNCH(k_attn_dq, att_nc(s->d), att_grid(rows), smem, dq, dout, q, k, v, lse, di, s->l,
               s->heads, s->d, s->ld, s->scale, rows);
    ATT_LAUNCH(k_attn_dkdv, att_nc(s->d), att_grid(rows), smem, dk, dv, dout, q, k, v, lse, di,
               s->l, s->heads, s->d, s->ld, s->scale, rows);
    return BK_OK;
}

int cu_attn_plain_fwd(void *ov, float *p, const void *qv, const void *kv, const void *vv,
                      void *ws, const struct bk_attn *s, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (attn_check(s) != BK_OK || !ov || !p || !qv || !kv || !vv) return BK_ERR_INVALID;
    if (s->dtype != BK_DTYPE_F32) return BK_ERR_INVALID; /* no 16-bit kernels yet */
    float *o = (float *)ov;
    const float *q = (const float *)qv, *k = (const float *)kv, *v = (const float *)vv;
    const long rows = (long)s->n * s->heads * s->l;
    const size_t smem = (size_t)ATT_WARPS * s->d * sizeof(float);
    ATT_LAUNCH(k_attn_plain_fwd, att_nc(s->d), att_grid(rows), smem, o, p, q, k, v, s->l,
               s->heads, s->d, s->ld, s->scale, rows);
    return BK_OK;
}

int cu_attn_plain_bwd(void *dqv, void *dkv, void *dvv, const void *doutv, const void *qv,
                      const void *kv, const void *vv, const float *p, void *ws,
                      const struct bk_attn *s, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (attn_check(s) != BK_OK || !dqv || !dkv || !dvv || !doutv || !qv || !kv || !vv || !p ||
        !ws)
        return BK_ERR_INVALID;
    if (s->dtype != BK_DTYPE_F32) return BK_ERR_INVALID; /* no 16-bit kernels yet */
    float *dq = (float *)dqv, *dk = (float *)dkv, *dv = (float *)dvv;
    const float *dout = (const float *)doutv, *q = (const float *)qv, *k = (const float *)kv,
                *v = (const float *)vv;
    const int L = s->l, H = s->heads, D = s->d, nc = att_nc(D);
    float *ds = (float *)ws;
    const size_t smem = (size_t)ATT_WARPS * D * sizeof(float);
    for (int nh = 0; nh < s->n * H; nh++) {
        const int h = nh % H, ni = nh / H;
        const float *ph = p + (size_t)nh * L * L;
        ATT_LAUNCH(k_attn_plain_rows, nc, att_grid(L), smem, dq, ds, dout, k, v, ph, ni, h, L, H,
                   D, s->ld, s->scale);
        ATT_LAUNCH(k_attn_plain_cols, nc, att_grid(L), 0, dk, dv, ds, dout, q, ph, ni, h, L, H, D,
                   s->ld);
    }
    return BK_OK;
}
