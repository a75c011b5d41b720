/* attention.cu - multi-head self-attention o = softmax(scale q k^T) v on the GPU, in
 * kernels/cpu/attention.c's two forms. A warp owns one row (a query, or in the key-side backward a
 * key): its lanes score 32 keys at a time (each lane one key), softmax over the warp with
 * shuffles, and accumulate the 32 rows of v (each lane D/32 of the features).
 * Tiled (FlashAttention-style): the forward keeps a running max and sum per row and saves only lse
 * (N,H,L); the backward (head dims up to 128) runs in FlashAttention-2's schedule, tiles of 16
 * queries x 16 keys in shared memory: a block per key tile sums dK and dV over the query tiles in
 * registers, a block per query tile sums dQ over the key tiles, so no two blocks write one row and
 * nothing is atomic (larger head dims: a warp per query row, then per key row). Its workspace
 * holds Di = dO_i . O_i (N,H,L). Nothing of size L x L exists on the device. 16-bit operands
 * outside parity mode go to cuDNN's fused attention where it has an engine (attention_cudnn.cu).
 * Plain: the forward saves p (N,H,L,L); both directions are cuBLAS batched GEMMs over every
 * (n, h) pair at once around one fused softmax and one fused dS kernel (see "plain form on
 * cuBLAS" below), the warp kernels only where cuBLAS does not take the 16-bit type.
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
#include <string.h>

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include "cuda_backend.h"

/* attention_cudnn.cu: cuDNN's fused attention for the tiled form's 16-bit operands outside
 * parity mode. ws_bytes: 1 with the workspace where cuDNN runs s on device in that mode (its
 * graphs built and cached now). fwd, bwd: BK_OK, a device error, or -1 where cuDNN does not run
 * s (refused, not planned, parity mode): the caller runs its own kernels. */
int cu_sdpa_ws_bytes(const struct bk_attn *s, int device, int parity, size_t *ws);
int cu_sdpa_fwd(void *o, float *lse, const void *q, const void *k, const void *v, void *ws,
                const struct bk_attn *s, bk_ctx *ctx);
int cu_sdpa_bwd(void *dq, void *dk, void *dv, const void *dout, const void *q, const void *k,
                const void *v, const void *o, const float *lse, void *ws,
                const struct bk_attn *s, bk_ctx *ctx);

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

/* out (16 x 16, fp32, row-major) = A B^T, A and B 16 x D tiles of T (rows of dp): one warp */
template <typename T>
__device__ __forceinline__ void tc_mma_abt(float *out, const T *a, const T *b, int dp, int D)
{
    if constexpr (tc_arch_ok<T>() && !std::is_same<T, float>::value) {
        using namespace nvcuda;
        typedef typename tc_type<T>::t W;
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fill_fragment(acc, 0.0f);
        for (int kk = 0; kk < D; kk += 16) {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, W, wmma::row_major> fa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, W, wmma::col_major> fb;
            wmma::load_matrix_sync(fa, (const W *)(a + kk), dp);
            wmma::load_matrix_sync(fb, (const W *)(b + kk), dp);
            wmma::mma_sync(acc, fa, fb, acc);
        }
        wmma::store_matrix_sync(out, acc, 16, wmma::mem_row_major);
    }
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
            tc_mma_abt<T>(S, (const T *)qw, (const T *)ks, D, D);
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
                wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
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

/* ---- tiled backward in FlashAttention-2's schedule (head dims up to FB_MAX_D) ----
 * Per (n, h) pair and tile of FB_BR queries x FB_BC keys, the tiles of q, k, v, dout in shared
 * memory as they are (T), and in fp32: P = exp(scale Q K^T - lse) (the forward's lse: no softmax
 * again), dS = scale P (dO V^T - Di). k_attn_bwd_kv: a block owns FB_BC keys, their K and V; it
 * walks every query tile, summing dV += P^T dO and dK += dS^T Q in registers, and writes both
 * once. k_attn_bwd_q: a block owns FB_BR queries; it walks every key tile, summing dQ += dS K in
 * registers, and writes it once. dQ by a pass of its own rather than by atomics: deterministic,
 * as parity mode promises, for computing each tile's P and dS once more. TC (16-bit, D a multiple
 * of 16: attn_tc_ok): Q K^T and dO V^T of a tile by warp matrix multiply-accumulate (exact
 * products, fp32 sums); the sums over P and dS, which stay fp32, on CUDA cores. Rows and keys
 * past L are zeros in the tiles and 0 in P and dS. */

#define FB_BR 16
#define FB_BC 16
#define FB_THREADS 128
#define FB_MAX_D 128 /* shared memory: 36.4 KiB at 128 in fp32, 22.2 KiB in 16-bit */
#define FB_PER ((FB_BC * FB_MAX_D + FB_THREADS - 1) / FB_THREADS) /* accumulators per thread */

/* the block's shared memory, byte offsets from its 32-byte aligned base: the K, V, Q, dO tiles
 * (rows of dp elements of T: D + 1, the dot products' rows in different banks; with TC D + 16,
 * WMMA's 256-bit alignment), then fp32 tiles S and dP (TC), P, dS, and the rows' lse and Di */
struct fb_layout {
    int dp;
    size_t k, v, q, o, s, dpm, p, ds, lse, di, bytes;
};
__host__ __device__ static inline struct fb_layout fb_layout_of(int D, size_t es, bool tc)
{
    struct fb_layout t;
    t.dp = tc ? D + 16 : D + 1;
    const size_t tile = ((size_t)FB_BR * t.dp * es + 31) / 32 * 32, sq = FB_BR * FB_BC * 4;
    t.k = 0;
    t.v = t.k + tile;
    t.q = t.v + tile;
    t.o = t.q + tile;
    t.s = t.o + tile;
    t.dpm = t.s + sq;
    t.p = t.dpm + sq;
    t.ds = t.p + sq;
    t.lse = t.ds + sq;
    t.di = t.lse + FB_BR * 4;
    t.bytes = t.di + FB_BR * 4 + 32; /* + 32: the base aligned up */
    return t;
}

/* rows [row0, row0 + n) of x (row stride ldx, D features) into dst (rows of dp); past L: 0 */
template <typename T>
__device__ __forceinline__ void fb_rows(T *dst, int dp, const T *x, size_t ldx, int row0, int n,
                                        int L, int D)
{
    for (int e = threadIdx.x; e < n * D; e += blockDim.x) {
        const int r = e / D, d = e % D, i = row0 + r;
        dst[r * dp + d] = i < L ? x[(size_t)i * ldx + d] : cu_to<T>(0.0f);
    }
}

template <typename T> __device__ __forceinline__ float fb_dot(const T *a, const T *b, int D)
{
    float s = 0.0f;
    for (int d = 0; d < D; d++) s += cu_ld(a[d]) * cu_ld(b[d]);
    return s;
}


/* the block's base and layout */
#define FB_SHARED(T, TC)                                                                       \
    CU_EXTERN_SHARED(char, fb_sh_);                                                            \
    char *sh = (char *)(((uintptr_t)fb_sh_ + 31) & ~(uintptr_t)31);                            \
    const struct fb_layout t = fb_layout_of(D, sizeof(T), TC);                                 \
    T *tk = (T *)(sh + t.k), *tv = (T *)(sh + t.v), *tq = (T *)(sh + t.q), *to = (T *)(sh + t.o); \
    float *P = (float *)(sh + t.p), *dS = (float *)(sh + t.ds), *lr = (float *)(sh + t.lse),   \
          *dr = (float *)(sh + t.di)

/* P and dS of the tile (queries i0 + r, keys j0 + c) from the tiles in shared memory; then a
 * block barrier */
template <typename T, bool TC>
__device__ __forceinline__ void fb_tile(char *sh, const struct fb_layout &t, int i0, int j0,
                                        int L, int D, float scale)
{
    const T *tk = (const T *)(sh + t.k), *tv = (const T *)(sh + t.v), *tq = (const T *)(sh + t.q),
            *to = (const T *)(sh + t.o);
    float *S = (float *)(sh + t.s), *DP = (float *)(sh + t.dpm), *P = (float *)(sh + t.p),
          *dS = (float *)(sh + t.ds);
    const float *lr = (const float *)(sh + t.lse), *dr = (const float *)(sh + t.di);
    if constexpr (TC) {
        const int warp = threadIdx.x >> 5;
        if (warp == 0) tc_mma_abt(S, tq, tk, t.dp, D);
        if (warp == 1) tc_mma_abt(DP, to, tv, t.dp, D);
        __syncthreads();
    }
    for (int e = threadIdx.x; e < FB_BR * FB_BC; e += blockDim.x) {
        const int r = e / FB_BC, c = e % FB_BC;
        float p = 0.0f, ds = 0.0f;
        if (i0 + r < L && j0 + c < L) {
            const float sv = TC ? S[e] : fb_dot(tq + r * t.dp, tk + c * t.dp, D);
            const float dpv = TC ? DP[e] : fb_dot(to + r * t.dp, tv + c * t.dp, D);
            p = expf(scale * sv - lr[r]);
            ds = p * (dpv - dr[r]) * scale;
        }
        P[e] = p;
        dS[e] = ds;
    }
    __syncthreads();
}

/* the tile's queries i0.. (Q, dO, lse, Di) into shared memory */
template <typename T>
__device__ __forceinline__ void fb_queries(T *tq, T *to, float *lr, float *dr, int dp,
                                           const T *q, const T *dout, const float *lrow,
                                           const float *drow, size_t ld, size_t hd, int i0,
                                           int L, int D)
{
    fb_rows(tq, dp, q, ld, i0, FB_BR, L, D);
    fb_rows(to, dp, dout, hd, i0, FB_BR, L, D);
    if (threadIdx.x < FB_BR) {
        const int i = i0 + threadIdx.x;
        lr[threadIdx.x] = i < L ? lrow[i] : 0.0f;
        dr[threadIdx.x] = i < L ? drow[i] : 0.0f;
    }
}

template <typename T, bool TC>
__global__ void k_attn_bwd_kv(T *dk, T *dv, const T *dout, const T *q, const T *k, const T *v,
                              const float *lse, const float *di, int L, int H, int D, int ld,
                              float scale)
{
    FB_SHARED(T, TC);
    const int nh = blockIdx.y, h = nh % H, ni = nh / H, j0 = blockIdx.x * FB_BC;
    const size_t hd = (size_t)H * D, base = (size_t)ni * L * ld + (size_t)h * D;
    const size_t dbase = (size_t)ni * L * hd + (size_t)h * D;
    fb_rows(tk, t.dp, k + base, ld, j0, FB_BC, L, D);
    fb_rows(tv, t.dp, v + base, ld, j0, FB_BC, L, D);
    float ak[FB_PER], av[FB_PER];
#pragma unroll
    for (int m = 0; m < FB_PER; m++) ak[m] = av[m] = 0.0f;
    for (int i0 = 0; i0 < L; i0 += FB_BR) {
        __syncthreads(); /* the last tile read */
        fb_queries(tq, to, lr, dr, t.dp, q + base, dout + dbase, lse + (size_t)nh * L,
                   di + (size_t)nh * L, ld, hd, i0, L, D);
        __syncthreads();
        fb_tile<T, TC>(sh, t, i0, j0, L, D, scale);
        /* dV[c] += sum_r P[r][c] dO[r], dK[c] += sum_r dS[r][c] Q[r]: element (c, d) is the
         * thread's m-th */
#pragma unroll
        for (int m = 0; m < FB_PER; m++) {
            const int e = threadIdx.x + m * FB_THREADS;
            if (e < FB_BC * D) {
                const int c = e / D, d = e % D;
                for (int r = 0; r < FB_BR; r++) {
                    av[m] += P[r * FB_BC + c] * cu_ld(to[r * t.dp + d]);
                    ak[m] += dS[r * FB_BC + c] * cu_ld(tq[r * t.dp + d]);
                }
            }
        }
    }
#pragma unroll
    for (int m = 0; m < FB_PER; m++) {
        const int e = threadIdx.x + m * FB_THREADS, c = e / D, d = e % D, j = j0 + c;
        if (e < FB_BC * D && j < L) {
            dk[base + (size_t)j * ld + d] = cu_to<T>(ak[m]);
            dv[base + (size_t)j * ld + d] = cu_to<T>(av[m]);
        }
    }
}

template <typename T, bool TC>
__global__ void k_attn_bwd_q(T *dq, const T *dout, const T *q, const T *k, const T *v,
                             const float *lse, const float *di, int L, int H, int D, int ld,
                             float scale)
{
    FB_SHARED(T, TC);
    (void)P;
    const int nh = blockIdx.y, h = nh % H, ni = nh / H, i0 = blockIdx.x * FB_BR;
    const size_t hd = (size_t)H * D, base = (size_t)ni * L * ld + (size_t)h * D;
    const size_t dbase = (size_t)ni * L * hd + (size_t)h * D;
    fb_queries(tq, to, lr, dr, t.dp, q + base, dout + dbase, lse + (size_t)nh * L,
               di + (size_t)nh * L, ld, hd, i0, L, D);
    float aq[FB_PER];
#pragma unroll
    for (int m = 0; m < FB_PER; m++) aq[m] = 0.0f;
    for (int j0 = 0; j0 < L; j0 += FB_BC) {
        __syncthreads(); /* the last tile read */
        fb_rows(tk, t.dp, k + base, ld, j0, FB_BC, L, D);
        fb_rows(tv, t.dp, v + base, ld, j0, FB_BC, L, D);
        __syncthreads();
        fb_tile<T, TC>(sh, t, i0, j0, L, D, scale);
        /* dQ[r] += sum_c dS[r][c] K[c]: element (r, d) is the thread's m-th */
#pragma unroll
        for (int m = 0; m < FB_PER; m++) {
            const int e = threadIdx.x + m * FB_THREADS;
            if (e < FB_BR * D) {
                const int r = e / D, d = e % D;
                for (int c = 0; c < FB_BC; c++)
                    aq[m] += dS[r * FB_BC + c] * cu_ld(tk[c * t.dp + d]);
            }
        }
    }
#pragma unroll
    for (int m = 0; m < FB_PER; m++) {
        const int e = threadIdx.x + m * FB_THREADS, r = e / D, d = e % D, i = i0 + r;
        if (e < FB_BR * D && i < L) dq[base + (size_t)i * ld + d] = cu_to<T>(aq[m]);
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
    const int rc = cu_sdpa_fwd(o, lse, q, k, v, ws, s, ctx);
    if (rc >= 0) return rc;
    return CU_TYPED(s->dtype, attn_fwd_t, o, lse, q, k, v, s, ctx);
}

/* the FlashAttention-2 backward for this shape (DDPMD_CUDA_ATTN_FA2=0: never, the warp kernels) */
static int attn_fa2_ok(const struct bk_attn *s)
{
    static int off = -1;
    if (off < 0) {
        const char *e = getenv("DDPMD_CUDA_ATTN_FA2");
        off = e && e[0] == '0';
    }
    return !off && s->d <= FB_MAX_D && (long)s->n * s->heads <= 65535;
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
    if (attn_fa2_ok(s)) {
        /* 16-bit on tensor cores where the forward is (attn_tc_ok) */
        const bool tc = attn_tc_ok(s, ctx);
        const unsigned nh = (unsigned)(s->n * s->heads);
        const size_t smem = fb_layout_of(s->d, sizeof(T), tc).bytes;
        const dim3 gk((unsigned)((s->l + FB_BC - 1) / FB_BC), nh);
        const dim3 gq((unsigned)((s->l + FB_BR - 1) / FB_BR), nh);
        auto kv = tc ? &k_attn_bwd_kv<T, true> : &k_attn_bwd_kv<T, false>;
        auto kq = tc ? &k_attn_bwd_q<T, true> : &k_attn_bwd_q<T, false>;
        CU_LAUNCH(kv, gk, FB_THREADS, smem, ctx->stream)(
            (T *)dk, (T *)dv, (const T *)dout, (const T *)q, (const T *)k, (const T *)v, lse,
            (const float *)di, s->l, s->heads, s->d, s->ld, s->scale);
        CU_LAUNCHED(ctx);
        CU_LAUNCH(kq, gq, FB_THREADS, smem, ctx->stream)(
            (T *)dq, (const T *)dout, (const T *)q, (const T *)k, (const T *)v, lse,
            (const float *)di, s->l, s->heads, s->d, s->ld, s->scale);
        CU_LAUNCHED(ctx);
        return BK_OK;
    }
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
    const int rc = cu_sdpa_bwd(dq, dk, dv, dout, q, k, v, o, lse, ws, s, ctx);
    if (rc >= 0) return rc;
    return CU_TYPED(s->dtype, attn_bwd_t, dq, dk, dv, dout, q, k, v, o, lse, (float *)ws, s, ctx);
}

/* ---- plain form on cuBLAS: every (n, head) pair in one batched GEMM ----
 * S = scale Q K^T, O = P V, dP = dO V^T, dV = P^T dO, dQ = dS K, dK = dS^T Q as batched GEMMs
 * (one strided batch where H is 1; else one batch of pointer arrays that a kernel builds in the
 * workspace, so the step stays capturable as a CUDA graph), the softmax and dS = scale P (dP -
 * rowsum(P dP)) one fused kernel each (rowsum(P dP) is dO . O). fp32: fp32 GEMMs (parity mode:
 * pedantic, no TF32; otherwise TF32 allowed). 16-bit: the GEMMs take q, k, v, dout in 16 bits
 * on tensor cores with fp32 sums; P and dS stay fp32 and enter a GEMM as two 16-bit halves (hi
 * + lo, as the tensor-core forward), summed by the GEMM into an fp32 scratch that one kernel
 * rounds into the output. The pairs run in chunks whose scratch fits ATT_CHUNK_BYTES.
 * Where cuBLAS does not take the 16-bit type (bf16 below sm_80) the warp kernels above run. */

#define ATT_BLAS_WS ((size_t)4 << 20)     /* cuBLAS's own share of the workspace */
#define ATT_CHUNK_BYTES ((size_t)32 << 20) /* scratch of a chunk of pairs (one pair at least) */

/* scratch bytes per chunk of pairs: ATT_CHUNK_BYTES, or DDPMD_CUDA_ATTN_CHUNK bytes (tests make
 * chunks small); read once, as planning and running must agree */
static size_t att_chunk_bytes(void)
{
    static size_t bytes;
    if (!bytes) {
        const char *e = getenv("DDPMD_CUDA_ATTN_CHUNK");
        const long long v = e ? atoll(e) : 0;
        bytes = v > 0 ? (size_t)v : ATT_CHUNK_BYTES;
    }
    return bytes;
}

/* the operands of the batched GEMMs: global ones indexed by pair b = n * H + h, local ones
 * (scratch of the chunk in the workspace) by the pair's place in its chunk */
enum att_operand {
    AO_Q, AO_K, AO_V, AO_DO, AO_O, AO_DQ, AO_DK, AO_DV, AO_P, /* global */
    AO_SC, AO_PHI, AO_PLO, AO_ACC, AO_X32,                    /* local */
    AO_COUNT,
    AO_LOCAL = AO_SC
};

struct att_plain {
    int pairs, chunk, h, half; /* N*H, pairs per chunk, H, 16-bit operands */
    size_t pp[AO_COUNT];       /* local operands: bytes per pair */
    size_t off[AO_COUNT];      /* local operands: offset in the workspace */
    size_t ptrs;               /* pointer arrays (H > 1): AO_COUNT arrays of `pairs` entries */
    size_t used, total;        /* what the kernels keep in the workspace; + cuBLAS's share */
};

static size_t att_align(size_t b) { return (b + 255) & ~(size_t)255; }

/* the workspace of the plain form (the backward's, a superset of the forward's) */
static struct att_plain att_plain_of(const struct bk_attn *s)
{
    struct att_plain a;
    memset(&a, 0, sizeof a);
    const size_t L = (size_t)s->l, es = bk_dtype_size(s->dtype);
    a.pairs = s->n * s->heads;
    a.h = s->heads;
    a.half = s->dtype != BK_DTYPE_F32;
    a.pp[AO_SC] = L * L * 4;
    if (a.half) {
        a.pp[AO_PHI] = 2 * L * L * es; /* rows of hi | lo */
        a.pp[AO_ACC] = a.pp[AO_X32] = L * (size_t)s->d * 4;
    }
    size_t per = 0;
    for (int i = AO_LOCAL; i < AO_COUNT; i++) per += a.pp[i];
    const size_t chunk = att_chunk_bytes() / per;
    a.chunk = chunk < 1 ? 1 : chunk > (size_t)a.pairs ? a.pairs : (int)chunk;
    size_t off = 0;
    if (a.h > 1) {
        a.ptrs = 0;
        off = att_align((size_t)AO_COUNT * a.pairs * sizeof(void *));
    }
    for (int i = AO_LOCAL; i < AO_COUNT; i++) {
        a.off[i] = off;
        off += att_align(a.pp[i] * a.chunk);
    }
    /* the low halves: the second half of each row of the high ones */
    a.pp[AO_PLO] = a.pp[AO_PHI];
    a.off[AO_PLO] = a.off[AO_PHI] + L * es;
    a.used = off;
    a.total = off + ATT_BLAS_WS;
    return a;
}

/* where the operands are: base, and for global ones the bytes per sample and per head */
struct att_ptr_src {
    const char *base[AO_COUNT];
    long long sn[AO_COUNT], sh[AO_COUNT];
};

/* out[a * pairs + b] = operand a's matrix of pair b (local operands: of the chunk's b-th pair) */
__global__ void k_attn_ptrs(const char **out, struct att_ptr_src src, int H, int pairs)
{
    const long total = (long)AO_COUNT * pairs;
    for (long e = blockIdx.x * (long)blockDim.x + threadIdx.x; e < total;
         e += (long)gridDim.x * blockDim.x) {
        const int a = (int)(e / pairs), b = (int)(e % pairs);
        out[e] = src.base[a] ? src.base[a] + (b / H) * src.sn[a] + (b % H) * src.sh[a] : NULL;
    }
}

/* P (at most 1) enters the 16-bit GEMMs as hi + lo of P * 2^14: f16's low half stays a normal
 * number down to P = 2^-17 (unscaled it would be subnormal below 2^-3 and lose its bits); the
 * GEMMs' alpha 2^-14 undoes it exactly */
#define ATT_P_SCALE 16384.0f

/* the halves of x = P * ATT_P_SCALE into row r of phl: hi at [0, L), lo at [L, 2L) */
template <typename T> __device__ __forceinline__ void att_split(T *hr, int L, int j, float x)
{
    const T hi = cu_to<T>(x);
    hr[j] = hi;
    hr[L + j] = cu_to<T>(x - cu_ld(hi));
}

/* softmax of the scaled score rows in p, in place, fp32; 16-bit: and each row's P as its
 * halves (rows of 2L elements of T in phl). A warp per row. */
template <typename T>
__global__ void k_attn_softmax(float *p, T *phl, int L, long rows)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long r = (long)blockIdx.x * ATT_WARPS + warp;
    if (r >= rows) return;
    float *pr = p + (size_t)r * L;
    float mx = -INFINITY;
    for (int j = lane; j < L; j += 32) mx = fmaxf(mx, pr[j]);
    mx = cu_warp_max(mx);
    double sum = 0.0; /* in double, as the CPU */
    for (int j = lane; j < L; j += 32) {
        const float e = expf(pr[j] - mx);
        pr[j] = e;
        sum += e;
    }
    const float inv = (float)(1.0 / cu_warp_sum(sum));
    T *hr = phl ? phl + (size_t)r * 2 * L : NULL;
    for (int j = lane; j < L; j += 32) {
        const float pj = pr[j] * inv;
        pr[j] = pj;
        if (hr) att_split(hr, L, j, pj * ATT_P_SCALE);
    }
}

/* dS = scale P (dP - rowsum(P dP)) in place of dP (fp32 rows in sc); 16-bit: and P's halves
 * (phl). A warp per row. */
template <typename T>
__global__ void k_attn_ds(float *sc, T *phl, const float *p, float scale, int L, long rows)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long r = (long)blockIdx.x * ATT_WARPS + warp;
    if (r >= rows) return;
    float *dr = sc + (size_t)r * L;
    const float *pr = p + (size_t)r * L;
    double acc = 0.0; /* rowsum(P dP) = dO . O in double, as the CPU: every dS of the row has it */
    for (int j = lane; j < L; j += 32) acc += (double)pr[j] * dr[j];
    const float rs = (float)cu_warp_sum(acc);
    T *hr = phl ? phl + (size_t)r * 2 * L : NULL;
    for (int j = lane; j < L; j += 32) {
        const float pj = pr[j];
        dr[j] = pj * (dr[j] - rs) * scale;
        if (hr) att_split(hr, L, j, pj * ATT_P_SCALE);
    }
}

/* x32 ((nb, L, D) dense fp32) = the chunk's pairs of x (rows of stride ldx, of T), exactly */
template <typename T>
__global__ void k_attn_widen(float *x32, const T *x, int L, int H, int D, int ldx, int b0,
                             long count)
{
    const long ld_ = (long)L * D;
    for (long e = blockIdx.x * (long)blockDim.x + threadIdx.x; e < count;
         e += (long)gridDim.x * blockDim.x) {
        const long bl = e / ld_, rem = e % ld_;
        const int b = b0 + (int)bl, i = (int)(rem / D), d = (int)(rem % D);
        x32[e] = cu_ld(x[((size_t)(b / H) * L + i) * ldx + (size_t)(b % H) * D + d]);
    }
}

/* out (rows of stride ldo, pair b's head at [h*D, (h+1)*D)) = the chunk's fp32 results acc
 * ((nb, L, D) dense), rounded once to T */
template <typename T>
__global__ void k_attn_store(T *out, const float *acc, int L, int H, int D, int ldo, int b0,
                             long count)
{
    const long ld_ = (long)L * D;
    for (long e = blockIdx.x * (long)blockDim.x + threadIdx.x; e < count;
         e += (long)gridDim.x * blockDim.x) {
        const long bl = e / ld_, rem = e % ld_;
        const int b = b0 + (int)bl, i = (int)(rem / D), d = (int)(rem % D);
        out[((size_t)(b / H) * L + i) * ldo + (size_t)(b % H) * D + d] = cu_to<T>(acc[e]);
    }
}

/* the state of one plain op: the layout, the operands, their element types */
struct att_run {
    const struct bk_attn *s;
    bk_ctx *ctx;
    struct att_plain a;
    struct att_ptr_src src;
    cudaDataType type[AO_COUNT];
    char *ws;
    const char **ptrs; /* device pointer arrays (H > 1) */
};

static cudaDataType att_blas_type(int dtype)
{
    return dtype == BK_DTYPE_F16 ? CUDA_R_16F : dtype == BK_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* the operands of pointers given (NULL: unused) */
static void att_run_init(struct att_run *r, const struct bk_attn *s, bk_ctx *ctx, void *ws,
                         const void *q, const void *k, const void *v, const void *dout,
                         const void *o, void *dq, void *dk, void *dv, const float *p)
{
    memset(r, 0, sizeof *r);
    r->s = s;
    r->ctx = ctx;
    r->a = att_plain_of(s);
    r->ws = (char *)ws;
    const long long es = (long long)bk_dtype_size(s->dtype), L = s->l, D = s->d;
    const long long hd = (long long)s->heads * D;
    const void *g[AO_LOCAL] = {q, k, v, dout, o, dq, dk, dv, p};
    for (int i = 0; i < AO_LOCAL; i++) {
        const int dense = i == AO_DO || i == AO_O;
        r->src.base[i] = (const char *)g[i];
        r->src.sn[i] = i == AO_P ? (long long)s->heads * L * L * 4 : L * (dense ? hd : s->ld) * es;
        r->src.sh[i] = i == AO_P ? L * L * 4 : D * es;
        r->type[i] = i == AO_P ? CUDA_R_32F : att_blas_type(s->dtype);
    }
    for (int i = AO_LOCAL; i < AO_COUNT; i++) {
        if (!r->a.pp[i]) continue;
        r->src.base[i] = r->ws + r->a.off[i];
        r->src.sh[i] = (long long)r->a.pp[i];
        r->src.sn[i] = (long long)r->a.pp[i] * s->heads;
        r->type[i] = i == AO_PHI || i == AO_PLO ? att_blas_type(s->dtype) : CUDA_R_32F;
    }
    r->ptrs = r->a.h > 1 ? (const char **)(r->ws + r->a.ptrs) : NULL;
}

/* C_b = alpha op(A_b) op(B_b) + beta C_b (column-major) for the pairs [b0, b0 + nb) */
static int att_gemm(struct att_run *r, int b0, int nb, cublasOperation_t ta, cublasOperation_t tb,
                    int m, int n, int k, float alpha, int ia, int lda, int ib, int ldb,
                    float beta, int ic, int ldc)
{
    bk_ctx *ctx = r->ctx;
    const cudaDataType at = r->type[ia];
    const cublasComputeType_t ct = at != CUDA_R_32F ? CUBLAS_COMPUTE_32F
                                   : ctx->parity    ? CUBLAS_COMPUTE_32F_PEDANTIC
                                                    : CUBLAS_COMPUTE_32F_FAST_TF32;
    if (r->ptrs) {
        const int pairs = r->a.pairs;
        const char *const *pa = r->ptrs + (size_t)ia * pairs + (ia < AO_LOCAL ? b0 : 0);
        const char *const *pb = r->ptrs + (size_t)ib * pairs + (ib < AO_LOCAL ? b0 : 0);
        const char *const *pc = r->ptrs + (size_t)ic * pairs + (ic < AO_LOCAL ? b0 : 0);
        CUBLAS_CHECK(cublasGemmBatchedEx(ctx->cublas, ta, tb, m, n, k, &alpha,
                                         (const void *const *)pa, at, lda,
                                         (const void *const *)pb, r->type[ib], ldb, &beta,
                                         (void *const *)pc, r->type[ic], ldc, nb, ct,
                                         CUBLAS_GEMM_DEFAULT));
        return BK_OK;
    }
    /* H is 1: pair b is sample b, one stride per operand */
    const int ops[3] = {ia, ib, ic};
    const char *base[3];
    long long stride[3];
    for (int i = 0; i < 3; i++) {
        const int o = ops[i];
        const long long es = r->type[o] == CUDA_R_32F ? 4 : 2;
        stride[i] = r->src.sn[o] / es;
        base[i] = r->src.base[o] + (o < AO_LOCAL ? (long long)b0 * r->src.sn[o] : 0);
    }
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(ctx->cublas, ta, tb, m, n, k, &alpha, base[0], at, lda,
                                            stride[0], base[1], r->type[ib], ldb, stride[1],
                                            &beta, (void *)base[2], r->type[ic], ldc, stride[2],
                                            nb, ct, CUBLAS_GEMM_DEFAULT));
    return BK_OK;
}

/* the chunk's fp32 results (AO_ACC) rounded once into out (rows of stride ldo) */
template <typename T> static int att_store(struct att_run *r, int b0, int nb, T *out, int ldo)
{
    const struct bk_attn *s = r->s;
    const long count = (long)nb * s->l * s->d;
    bk_ctx *ctx = r->ctx;
    CU_TOUCHES(r->src.base[AO_ACC], (size_t)count * 4);
    CU_LAUNCH(k_attn_store<T>, cu_blocks((size_t)count, CU_THREADS), CU_THREADS, 0,
              ctx->stream)(out, (const float *)r->src.base[AO_ACC], s->l, s->heads, s->d, ldo,
                           b0, count);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

/* a 16-bit result out = op(A) op(P) (P fp32 as its scaled halves), summed in fp32, rounded once */
template <typename T>
static int att_gemm_p(struct att_run *r, int b0, int nb, cublasOperation_t tb, int ia, int lda,
                      T *out, int ldo)
{
    const int L = r->s->l, D = r->s->d;
    int rc = att_gemm(r, b0, nb, CUBLAS_OP_N, tb, D, L, L, 1.0f / ATT_P_SCALE, ia, lda, AO_PHI,
                      2 * L, 0.0f, AO_ACC, D);
    if (!rc)
        rc = att_gemm(r, b0, nb, CUBLAS_OP_N, tb, D, L, L, 1.0f / ATT_P_SCALE, ia, lda, AO_PLO,
                      2 * L, 1.0f, AO_ACC, D);
    return rc ? rc : att_store<T>(r, b0, nb, out, ldo);
}

/* a 16-bit result out = X^T op(dS) with dS fp32 (no bound to split it by): an fp32 GEMM on X
 * (q or k, of T) widened exactly, rounded once */
template <typename T>
static int att_gemm_ds(struct att_run *r, int b0, int nb, cublasOperation_t tb, const T *x,
                       T *out)
{
    const struct bk_attn *s = r->s;
    const int L = s->l, D = s->d;
    const long count = (long)nb * L * D;
    bk_ctx *ctx = r->ctx;
    float *x32 = (float *)r->src.base[AO_X32];
    CU_TOUCHES(x32, (size_t)count * 4);
    CU_LAUNCH(k_attn_widen<T>, cu_blocks((size_t)count, CU_THREADS), CU_THREADS, 0,
              ctx->stream)(x32, x, L, s->heads, D, s->ld, b0, count);
    CU_LAUNCHED(ctx);
    int rc = att_gemm(r, b0, nb, CUBLAS_OP_N, tb, D, L, L, 1.0f, AO_X32, D, AO_SC, L, 0.0f, AO_ACC,
                      D);
    return rc ? rc : att_store<T>(r, b0, nb, out, s->ld);
}

/* the pointer arrays (H > 1), once per op */
static int att_build_ptrs(struct att_run *r)
{
    if (!r->ptrs) return BK_OK;
    bk_ctx *ctx = r->ctx;
    const size_t n = (size_t)AO_COUNT * r->a.pairs;
    CU_TOUCHES(r->ptrs, n * sizeof(void *));
    CU_LAUNCH(k_attn_ptrs, cu_blocks(n, CU_THREADS), CU_THREADS, 0, ctx->stream)(
        r->ptrs, r->src, r->a.h, r->a.pairs);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

template <typename T> static int att_plain_fwd_chunk(struct att_run *r, int b0, int nb)
{
    const struct bk_attn *s = r->s;
    bk_ctx *ctx = r->ctx;
    const int L = s->l, D = s->d, ld = s->ld, hd = s->heads * D;
    /* S^T (column-major) = K Q^T, into p */
    int rc = att_gemm(r, b0, nb, CUBLAS_OP_T, CUBLAS_OP_N, L, L, D, s->scale, AO_K, ld, AO_Q, ld,
                      0.0f, AO_P, L);
    if (rc) return rc;
    const long rows = (long)nb * L;
    float *p = (float *)r->src.base[AO_P] + (size_t)b0 * L * L;
    T *phl = r->a.half ? (T *)r->src.base[AO_PHI] : NULL;
    CU_TOUCHES(p, (size_t)rows * L * 4);
    if (phl) CU_TOUCHES(phl, (size_t)rows * 2 * L * sizeof(T));
    CU_LAUNCH(k_attn_softmax<T>, att_grid(rows), ATT_WARPS * 32, 0, ctx->stream)(p, phl, L,
                                                                                 rows);
    CU_LAUNCHED(ctx);
    /* O^T = V^T P^T */
    if (!r->a.half)
        return att_gemm(r, b0, nb, CUBLAS_OP_N, CUBLAS_OP_N, D, L, L, 1.0f, AO_V, ld, AO_P, L,
                        0.0f, AO_O, hd);
    return att_gemm_p<T>(r, b0, nb, CUBLAS_OP_N, AO_V, ld, (T *)r->src.base[AO_O], hd);
}

template <typename T> static int att_plain_bwd_chunk(struct att_run *r, int b0, int nb)
{
    const struct bk_attn *s = r->s;
    bk_ctx *ctx = r->ctx;
    const int L = s->l, D = s->d, ld = s->ld, hd = s->heads * D;
    /* dP^T (column-major) = V dO^T, into the scratch */
    int rc = att_gemm(r, b0, nb, CUBLAS_OP_T, CUBLAS_OP_N, L, L, D, 1.0f, AO_V, ld, AO_DO, hd,
                      0.0f, AO_SC, L);
    if (rc) return rc;
    const long rows = (long)nb * L;
    float *sc = (float *)r->src.base[AO_SC];
    const float *p = (const float *)r->src.base[AO_P] + (size_t)b0 * L * L;
    T *phl = r->a.half ? (T *)r->src.base[AO_PHI] : NULL;
    CU_TOUCHES(sc, (size_t)rows * L * 4);
    CU_TOUCHES(p, (size_t)rows * L * 4);
    if (phl) CU_TOUCHES(phl, (size_t)rows * 2 * L * sizeof(T));
    CU_LAUNCH(k_attn_ds<T>, att_grid(rows), ATT_WARPS * 32, 0, ctx->stream)(sc, phl, p, s->scale,
                                                                            L, rows);
    CU_LAUNCHED(ctx);
    if (!r->a.half) {
        /* dV^T = dO^T P, dQ^T = K^T dS^T, dK^T = Q^T dS */
        rc = att_gemm(r, b0, nb, CUBLAS_OP_N, CUBLAS_OP_T, D, L, L, 1.0f, AO_DO, hd, AO_P, L,
                      0.0f, AO_DV, ld);
        if (!rc)
            rc = att_gemm(r, b0, nb, CUBLAS_OP_N, CUBLAS_OP_N, D, L, L, 1.0f, AO_K, ld, AO_SC, L,
                          0.0f, AO_DQ, ld);
        if (!rc)
            rc = att_gemm(r, b0, nb, CUBLAS_OP_N, CUBLAS_OP_T, D, L, L, 1.0f, AO_Q, ld, AO_SC, L,
                          0.0f, AO_DK, ld);
        return rc;
    }
    rc = att_gemm_p<T>(r, b0, nb, CUBLAS_OP_T, AO_DO, hd, (T *)r->src.base[AO_DV], ld);
    if (!rc)
        rc = att_gemm_ds<T>(r, b0, nb, CUBLAS_OP_N, (const T *)r->src.base[AO_K],
                            (T *)r->src.base[AO_DQ]);
    if (!rc)
        rc = att_gemm_ds<T>(r, b0, nb, CUBLAS_OP_T, (const T *)r->src.base[AO_Q],
                            (T *)r->src.base[AO_DK]);
    return rc;
}

/* cuBLAS's workspace while the op keeps data in [ws, ws + used): the part of the plan's
 * workspace (ctx_set_workspace) after it, or none; `restore` gives cuBLAS the whole again. A
 * 16-bit op runs its GEMMs on tensor cores: a parity handle's pedantic math is lifted around. */
static int att_blas_enter(bk_ctx *ctx, const char *ws, size_t used, int half, int restore)
{
    if (half && ctx->parity)
        CUBLAS_CHECK(cublasSetMathMode(ctx->cublas, restore ? CUBLAS_PEDANTIC_MATH
                                                            : CUBLAS_DEFAULT_MATH));
    if (!ctx->ws) return BK_OK;
    void *p = ctx->ws;
    size_t bytes = ctx->ws_bytes;
    const char *lo = (const char *)ctx->ws, *hi = lo + ctx->ws_bytes;
    if (!restore && ws < hi && ws + used > lo) {
        const char *a = (const char *)(((uintptr_t)(ws + used) + 255) & ~(uintptr_t)255);
        p = a < hi ? (void *)a : NULL;
        bytes = a < hi ? (size_t)(hi - a) & ~(size_t)255 : 0;
        if (!bytes) p = NULL;
    }
    CUBLAS_CHECK(cublasSetWorkspace(ctx->cublas, p, bytes));
    return BK_OK;
}

template <typename T> static int att_plain_run(struct att_run *r, int bwd)
{
    bk_ctx *ctx = r->ctx;
    int rc = att_blas_enter(ctx, r->ws, r->a.used, r->a.half, 0);
    if (!rc) rc = att_build_ptrs(r);
    for (int b0 = 0; !rc && b0 < r->a.pairs; b0 += r->a.chunk) {
        const int nb = r->a.pairs - b0 < r->a.chunk ? r->a.pairs - b0 : r->a.chunk;
        rc = bwd ? att_plain_bwd_chunk<T>(r, b0, nb) : att_plain_fwd_chunk<T>(r, b0, nb);
    }
    const int rc2 = att_blas_enter(ctx, r->ws, r->a.used, r->a.half, 1);
    if (!rc && !rc2 && cu_sync_checks) CU_LAUNCHED(ctx);
    return rc ? rc : rc2;
}

/* cuBLAS takes the operands' type on ctx's device (16-bit: its tensor cores) */
static int att_plain_blas_ok(const struct bk_attn *s, int device)
{
    return s->dtype == BK_DTYPE_F32 || (cu_device_half(device, s->dtype) & BK_HALF_LINEAR);
}

/* the attention shapes planned in this process that make library calls (the plain form on
 * cuBLAS's batched GEMMs, the tiled one on cuDNN's fused attention), per (device, parity), and
 * whether cu_mem_alloc's warm-up ran them (under cu_query_lock): those libraries load kernels
 * at first use, as for the linears; our own kernels are loaded with the module */
struct att_shape {
    struct att_shape *next;
    int device, parity, warmed;
    struct cu_attn_shape a;
};
static struct att_shape *g_att;

static void att_shape_keep(const struct bk_attn *s, int tiled, size_t ws, int device, int parity)
{
    cu_query_lock();
    struct att_shape *e = g_att;
    while (e && !(e->device == device && e->parity == parity && e->a.tiled == tiled &&
                  !memcmp(&e->a.s, s, sizeof *s)))
        e = e->next;
    if (!e && (e = (struct att_shape *)calloc(1, sizeof *e))) {
        e->device = device;
        e->parity = parity;
        e->a.s = *s;
        e->a.tiled = tiled;
        e->next = g_att;
        g_att = e;
    }
    if (e && ws > e->a.ws) e->a.ws = ws;
    cu_query_unlock();
}

int cu_attn_unwarmed(int device, int parity, struct cu_attn_shape *shapes, int max)
{
    int n = 0;
    cu_query_lock();
    for (struct att_shape *e = g_att; e && n < max; e = e->next)
        if (e->device == device && e->parity == parity && !e->warmed) {
            e->warmed = 1;
            shapes[n++] = e->a;
        }
    cu_query_unlock();
    return n;
}

size_t cu_attn_ws_bytes(const struct bk_attn *s, int tiled)
{
    if (attn_check(s) != BK_OK) return 0;
    const int device = cu_default_device(), parity = cu_thread_parity();
    size_t ws, dnn = 0;
    int lib; /* the shape makes library calls (kept for the warm-up) */
    if (!tiled) { /* plain: the cuBLAS form's (more than the warp kernels' L x L) */
        ws = att_plain_of(s).total;
        lib = att_plain_blas_ok(s, device);
    } else { /* tiled: Di (N,H,L) for our kernels, or cuDNN's graphs' where they run it */
        ws = (size_t)s->n * s->heads * s->l * sizeof(float);
        lib = cu_sdpa_ws_bytes(s, device, parity, &dnn);
        if (lib && dnn > ws) ws = dnn;
    }
    if (lib) att_shape_keep(s, tiled != 0, ws, device, parity);
    return ws;
}

/* ---- plain form with the warp kernels: 16-bit types cuBLAS does not take here ---- */

template <typename T>
static int attn_plain_fwd_t(void *o, float *p, const void *q, const void *k, const void *v,
                            void *ws, const struct bk_attn *s, bk_ctx *ctx)
{
    if (att_plain_blas_ok(s, ctx->device)) {
        struct att_run r;
        att_run_init(&r, s, ctx, ws, q, k, v, NULL, o, NULL, NULL, NULL, p);
        return att_plain_run<T>(&r, 0);
    }
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
    if (attn_check(s) != BK_OK || !o || !p || !q || !k || !v || !ws) return BK_ERR_INVALID;
    return CU_TYPED(s->dtype, attn_plain_fwd_t, o, p, q, k, v, ws, s, ctx);
}

template <typename T>
static int attn_plain_bwd_t(void *dq, void *dk, void *dv, const void *dout, const void *q,
                            const void *k, const void *v, const float *p, float *ds,
                            const struct bk_attn *s, bk_ctx *ctx)
{
    if (att_plain_blas_ok(s, ctx->device)) {
        struct att_run r;
        att_run_init(&r, s, ctx, ds, q, k, v, dout, NULL, dq, dk, dv, p);
        return att_plain_run<T>(&r, 1);
    }
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
