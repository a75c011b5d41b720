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
 * The tiled forward in 16 bits on tensor cores (k_attn_fwd_tc: f16 from sm_70, bf16 from sm_80,
 * D a multiple of 16 up to 128): a warp owns 16 queries, the block's warps share each tile of 16
 * keys and values in shared memory; S = Q K^T by warp matrix multiply-accumulate (exact products,
 * fp32 sums), the online softmax in fp32 per row, and O += P V with P split in two 16-bit parts
 * (P = hi + lo to 2^-16 relative for bf16, 2^-22 for f16) so the fp32 probabilities are not
 * rounded to 16 bits; O and the running max and sum stay fp32 in shared memory.
 */
#include <math.h>
#include <stdlib.h>

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

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

/* ---- tiled forward on tensor cores ---- */

#define TC_WARPS 2   /* warps per block, 16 queries each */
#define TC_MAX_D 128 /* shared memory: (64 + 4 + 64 W) D + 2.5 KiB W bytes, 36.5 KiB at 128 */

/* the WMMA element type of a storage type */
template <typename T> struct tc_type;
template <> struct tc_type<cu_f16> {
    typedef __half t;
};
template <> struct tc_type<cu_bf16> {
    typedef __nv_bfloat16 t;
};

/* bf16 tensor cores from sm_80: a device pass below it compiles the kernel empty (never
 * launched there: attn_tc_ok) */
template <typename T> __device__ constexpr bool tc_arch_ok()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    return !std::is_same<T, cu_bf16>::value;
#else
    return true;
#endif
}

/* the block's shared memory, each part 32-byte aligned (WMMA's 256 bits) */
struct tc_layout {
    size_t q, k, v, s, phi, plo, o, st, warp, total;
};
__host__ __device__ static inline struct tc_layout tc_layout_of(int D)
{
    struct tc_layout t;
    const size_t rows = (size_t)TC_WARPS * 16;
    t.q = 0;
    t.k = t.q + (rows * D * 2 + 31) / 32 * 32;
    t.v = t.k + ((size_t)16 * D * 2 + 31) / 32 * 32;
    /* per warp, from t.s on: S (16x16 fp32), P hi and lo (16x16 16-bit), O (16 x D fp32), and
     * the rows' max, sum and rescale factor */
    t.s = t.v + ((size_t)16 * D * 2 + 31) / 32 * 32;
    t.phi = 1024;
    t.plo = t.phi + 512;
    t.o = t.plo + 512;
    t.st = t.o + (size_t)16 * D * 4;
    t.warp = (t.st + 3 * 16 * 4 + 31) / 32 * 32;
    t.total = t.s + TC_WARPS * t.warp + 32; /* + 32: the base aligned up */
    return t;
}

template <typename T>
__global__ void k_attn_fwd_tc(T *o, float *lse, const T *q, const T *k, const T *v, int L, int H,
                              int D, int ld, float scale)
{
    if constexpr (!tc_arch_ok<T>()) {
        return;
    } else {
        using namespace nvcuda;
        typedef typename tc_type<T>::t W;
        CU_EXTERN_SHARED(char, tc_sh);
        char *sh = (char *)(((uintptr_t)tc_sh + 31) & ~(uintptr_t)31);
        const struct tc_layout t = tc_layout_of(D);
        const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nt = blockDim.x;
        const int nh = blockIdx.y, h = nh % H, ni = nh / H, i0 = blockIdx.x * TC_WARPS * 16;
        uint16_t *qs = (uint16_t *)(sh + t.q), *ks = (uint16_t *)(sh + t.k),
                 *vs = (uint16_t *)(sh + t.v);
        char *wb = sh + t.s + (size_t)warp * t.warp;
        float *S = (float *)wb, *O = (float *)(wb + t.o), *mrow = (float *)(wb + t.st),
              *lrow = mrow + 16, *arow = mrow + 32;
        uint16_t *phi = (uint16_t *)(wb + t.phi), *plo = (uint16_t *)(wb + t.plo);
        const size_t base = (size_t)ni * L * ld + (size_t)h * D;
        const uint16_t *qb = (const uint16_t *)q + base, *kb = (const uint16_t *)k + base,
                       *vb = (const uint16_t *)v + base;
        /* the block's queries (zero rows past L) */
        for (int e = threadIdx.x; e < TC_WARPS * 16 * D; e += nt) {
            const int r = e / D, i = i0 + r;
            qs[e] = i < L ? qb[(size_t)i * ld + e % D] : 0;
        }
        for (int e = lane; e < 16 * D; e += 32) O[e] = 0.0f;
        if (lane < 16) {
            mrow[lane] = -INFINITY;
            lrow[lane] = 0.0f;
        }
        const uint16_t *qw = qs + (size_t)warp * 16 * D;
        for (int j0 = 0; j0 < L; j0 += 16) {
            __syncthreads(); /* the last tile's keys and values read by every warp */
            for (int e = threadIdx.x; e < 16 * D; e += nt) {
                const int j = j0 + e / D;
                ks[e] = j < L ? kb[(size_t)j * ld + e % D] : 0;
                vs[e] = j < L ? vb[(size_t)j * ld + e % D] : 0;
            }
            __syncthreads();
            /* S (16 queries x 16 keys) = Q K^T: K's rows read as the columns of K^T */
            wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
            wmma::fill_fragment(acc, 0.0f);
            for (int kk = 0; kk < D; kk += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::row_major> fa;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::col_major> fb;
                wmma::load_matrix_sync(fa, (const W *)(qw + kk), D);
                wmma::load_matrix_sync(fb, (const W *)(ks + kk), D);
                wmma::mma_sync(acc, fa, fb, acc);
            }
            wmma::store_matrix_sync(S, acc, 16, wmma::mem_row_major);
            __syncwarp();
            /* the online softmax of each query row, as k_attn_fwd */
            if (lane < 16) {
                const int r = lane;
                float mx = mrow[r];
                for (int c = 0; c < 16; c++) {
                    const float s = j0 + c < L ? scale * S[r * 16 + c] : -INFINITY;
                    S[r * 16 + c] = s;
                    mx = fmaxf(mx, s);
                }
                float sum = 0.0f;
                for (int c = 0; c < 16; c++) {
                    const float p = expf(S[r * 16 + c] - mx);
                    sum += p;
                    const T hi = cu_to<T>(p);
                    phi[r * 16 + c] = hi.bits;
                    plo[r * 16 + c] = cu_to<T>(p - cu_ld(hi)).bits;
                }
                const float alpha = expf(mrow[r] - mx);
                lrow[r] = lrow[r] * alpha + sum;
                mrow[r] = mx;
                arow[r] = alpha;
            }
            __syncwarp();
            for (int e = lane; e < 16 * D; e += 32) O[e] *= arow[e / D];
            __syncwarp();
            /* O += P V, P as hi + lo */
            for (int c = 0; c < D; c += 16) {
                wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::row_major> fp;
                wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::row_major> fv;
                wmma::load_matrix_sync(acc, O + c, D, wmma::mem_row_major);
                wmma::load_matrix_sync(fv, (const W *)(vs + c), D);
                wmma::load_matrix_sync(fp, (const W *)phi, 16);
                wmma::mma_sync(acc, fp, fv, acc);
                wmma::load_matrix_sync(fp, (const W *)plo, 16);
                wmma::mma_sync(acc, fp, fv, acc);
                wmma::store_matrix_sync(O + c, acc, D, wmma::mem_row_major);
            }
            __syncwarp();
        }
        const size_t hd = (size_t)H * D;
        for (int e = lane; e < 16 * D; e += 32) {
            const int r = e / D, i = i0 + warp * 16 + r;
            if (i < L) o[((size_t)ni * L + i) * hd + (size_t)h * D + e % D] =
                    cu_to<T>(O[e] * (1.0f / lrow[r]));
        }
        if (lane < 16 && i0 + warp * 16 + lane < L)
            lse[(size_t)nh * L + i0 + warp * 16 + lane] = mrow[lane] + logf(lrow[lane]);
    }
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

/* the tensor-core forward for this shape and type on ctx's device (DDPMD_CUDA_ATTN_TC=0: never) */
static int attn_tc_ok(const struct bk_attn *s, bk_ctx *ctx)
{
    static int off = -1;
    if (off < 0) {
        const char *e = getenv("DDPMD_CUDA_ATTN_TC");
        off = e && e[0] == '0';
    }
    if (off || s->dtype == BK_DTYPE_F32 || s->d % 16 || s->d > TC_MAX_D ||
        (long)s->n * s->heads > 65535)
        return 0;
    return cu_device_cc(ctx->device) >= (s->dtype == BK_DTYPE_BF16 ? 80 : 70);
}

template <typename T>
static int attn_fwd_t(void *o, float *lse, const void *q, const void *k, const void *v,
                      const struct bk_attn *s, bk_ctx *ctx)
{
    if constexpr (!std::is_same<T, float>::value) {
        if (attn_tc_ok(s, ctx)) {
            const dim3 grid((unsigned)((s->l + TC_WARPS * 16 - 1) / (TC_WARPS * 16)),
                            (unsigned)(s->n * s->heads));
            CU_LAUNCH(k_attn_fwd_tc<T>, grid, TC_WARPS * 32, tc_layout_of(s->d).total,
                      ctx->stream)((T *)o, lse, (const T *)q, (const T *)k, (const T *)v, s->l,
                                   s->heads, s->d, s->ld, s->scale);
            CU_LAUNCHED(ctx);
            return BK_OK;
        }
    }
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
