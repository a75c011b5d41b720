/* eltwise.cu - the CUDA backend's element-wise, layout, resampling and dropout kernels over NHWC
 * images, typed (fp32, f16, bf16 elements: backend.h struct bk_typed; the fp32 entries are these
 * on fp32), with kernels/cpu's formulas (eltwise.c, layout.c, resample.c, loss.c's dropout); the
 * timestep embedding; and conv.cu's NHWC padding and filter-layout helpers. Arithmetic in fp32,
 * 16-bit stores rounded once (cu_to). Contiguous runs go through 16-byte accesses (cu_ldv, cu_stv:
 * four fp32 or eight 16-bit values) where every pointer is 16-byte aligned and the channel counts
 * are multiples of the vector, else element by element. Every output element is written by one
 * thread and backwards are gathers (no atomics), so results are the same from run to run.
 */
#include <math.h>

#include "cuda_backend.h"
#include "philox.h"

#define GRID_LOOP(i, count)                                                                     \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (count);                 \
         i += (size_t)gridDim.x * blockDim.x)

/* launches kernel<T, W> over `items` grid-loop items: W = T's vector where vec, else 1 */
#define LAUNCH_VW(kernel, T, vec, items, ...)                                                  \
    do {                                                                                       \
        if ((items) == 0) return BK_OK;                                                        \
        if (vec)                                                                               \
            CU_LAUNCH(kernel<T COMMA CU_VW(T)>, cu_blocks((items) / CU_VW(T) + 1, CU_THREADS), \
                      CU_THREADS, 0, ctx->stream)(__VA_ARGS__);                                \
        else                                                                                   \
            CU_LAUNCH(kernel<T COMMA 1>, cu_blocks((items), CU_THREADS), CU_THREADS, 0,         \
                      ctx->stream)(__VA_ARGS__);                                               \
        CU_LAUNCHED(ctx);                                                                      \
    } while (0)

#define TYPED_ENTER(ctx, dtype)                                                                \
    do {                                                                                       \
        CU_ENTER(ctx);                                                                         \
        if (!cu_dtype_ok(dtype)) return BK_ERR_INVALID;                                        \
    } while (0)

/* ---- element-wise over count elements ---- */

enum { EW_SILU, EW_SILU_BWD, EW_GELU, EW_GELU_BWD, EW_ADD, EW_COPY, EW_SCALE };

#define GELU_RSQRT2 0.70710678118654752440f
#define GELU_RSQRT2PI 0.39894228040143267794f

/* one element: y = f(a, b); the backwards' a is dy, b is x */
__device__ __forceinline__ float ew_apply(int op, float a, float b, float s)
{
    switch (op) {
    case EW_SILU: return cu_silu(a);
    case EW_SILU_BWD: return a * cu_silu_grad(b);
    /* Phi(x) = erfc(-x / sqrt 2) / 2 keeps its relative accuracy for negative x, where
     * 1 + erf(x / sqrt 2) cancels (eltwise.c's Mills-ratio form does the same on the CPU) */
    case EW_GELU: return 0.5f * a * erfcf(-a * GELU_RSQRT2);
    case EW_GELU_BWD: {
        const float cdf = 0.5f * erfcf(-b * GELU_RSQRT2);
        const float pdf = expf(-0.5f * b * b) * GELU_RSQRT2PI;
        return a * (cdf + b * pdf);
    }
    case EW_ADD: return a + b;
    case EW_COPY: return a;
    default: return a * s;
    }
}

/* y (=/+= accum) f(a, b) over count elements: items of W (the vectors), then the tail */
template <typename T, int W>
__global__ void k_ew(T *y, const T *a, const T *b, float s, int op, int accum, size_t count)
{
    const size_t nv = count / W;
    GRID_LOOP(i, nv)
    {
        float av[W], bv[W], yv[W];
        cu_ldv<T, W>(av, a + i * W);
        if (b) cu_ldv<T, W>(bv, b + i * W);
        else
            for (int k = 0; k < W; k++) bv[k] = 0.0f;
        if (accum) cu_ldv<T, W>(yv, y + i * W);
        for (int k = 0; k < W; k++) {
            const float r = ew_apply(op, av[k], bv[k], s);
            yv[k] = accum ? yv[k] + r : r;
        }
        cu_stv<T, W>(y + i * W, yv);
    }
    const size_t t = nv * W + blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (W > 1 && t < count) {
        const float r = ew_apply(op, cu_ld(a[t]), b ? cu_ld(b[t]) : 0.0f, s);
        y[t] = cu_to<T>(accum ? cu_ld(y[t]) + r : r);
    }
}

template <typename T>
static int ew(void *y, const void *a, const void *b, float s, int op, int accum, size_t count,
              bk_ctx *ctx)
{
    if (!y || !a || ((op == EW_ADD || op == EW_SILU_BWD || op == EW_GELU_BWD) && !b))
        return BK_ERR_INVALID;
    const int vec = cu_al16(y) && cu_al16(a) && cu_al16(b);
    LAUNCH_VW(k_ew, T, vec, count, (T *)y, (const T *)a, (const T *)b, s, op, accum, count);
    return BK_OK;
}

#define EW_ENTRY(y, a, b, s, op, accum, count, dtype)                                          \
    TYPED_ENTER(ctx, dtype);                                                                   \
    return CU_TYPED(dtype, ew, y, a, b, s, op, accum, count, ctx)

int cu_t_silu_fwd(void *y, const void *x, size_t count, int dtype, bk_ctx *ctx)
{
    EW_ENTRY(y, x, NULL, 0.0f, EW_SILU, 0, count, dtype);
}

int cu_t_silu_bwd(void *dx, const void *dy, const void *x, int accum, size_t count, int dtype,
                  bk_ctx *ctx)
{
    EW_ENTRY(dx, dy, x, 0.0f, EW_SILU_BWD, accum, count, dtype);
}

int cu_t_gelu_fwd(void *y, const void *x, size_t count, int dtype, bk_ctx *ctx)
{
    EW_ENTRY(y, x, NULL, 0.0f, EW_GELU, 0, count, dtype);
}

int cu_t_gelu_bwd(void *dx, const void *dy, const void *x, int accum, size_t count, int dtype,
                  bk_ctx *ctx)
{
    EW_ENTRY(dx, dy, x, 0.0f, EW_GELU_BWD, accum, count, dtype);
}

int cu_t_add_fwd(void *y, const void *a, const void *b, size_t count, int dtype, bk_ctx *ctx)
{
    EW_ENTRY(y, a, b, 0.0f, EW_ADD, 0, count, dtype);
}

int cu_t_copy_grad(void *dx, const void *dy, int accum, size_t count, int dtype, bk_ctx *ctx)
{
    EW_ENTRY(dx, dy, NULL, 0.0f, EW_COPY, accum, count, dtype);
}

int cu_t_scale_fwd(void *y, const void *x, float s, size_t count, int dtype, bk_ctx *ctx)
{
    EW_ENTRY(y, x, NULL, s, EW_SCALE, 0, count, dtype);
}

/* ---- the time term: y (N,HW,C) = x + b (N,C) over the pixels ---- */

template <typename T, int W>
__global__ void k_add_bcast(T *y, const T *x, const T *b, int c, size_t hwc, size_t count)
{
    GRID_LOOP(i, count / W)
    {
        const size_t e = i * W, img = e / hwc;
        const int ch = (int)(e % (size_t)c);
        float xv[W], bv[W];
        cu_ldv<T, W>(xv, x + e);
        cu_ldv<T, W>(bv, b + img * c + ch);
        for (int k = 0; k < W; k++) xv[k] += bv[k];
        cu_stv<T, W>(y + e, xv);
    }
}

template <typename T>
static int add_bcast_fwd(void *y, const void *x, const void *b, int n, int c, int hw,
                         bk_ctx *ctx)
{
    const size_t count = (size_t)n * c * hw;
    const int vec = c % CU_VW(T) == 0 && cu_al16(y) && cu_al16(x) && cu_al16(b);
    LAUNCH_VW(k_add_bcast, T, vec, count, (T *)y, (const T *)x, (const T *)b, c,
              (size_t)hw * c, count);
    return BK_OK;
}

int cu_t_add_bcast_fwd(void *y, const void *x, const void *b, int n, int c, int hw, int dtype,
                       bk_ctx *ctx)
{
    TYPED_ENTER(ctx, dtype);
    if (n < 0 || c < 0 || hw < 1) return n == 0 || c == 0 ? BK_OK : BK_ERR_INVALID;
    if (!y || !x || !b) return BK_ERR_INVALID;
    return CU_TYPED(dtype, add_bcast_fwd, y, x, b, n, c, hw, ctx);
}

/* db (N,C) (=/+=) the sum over the pixels of dy (N,HW,C): a block per (channel block, image),
 * thread (x, y) sums W channels over the pixels y, y + BC_ROWS, ... (fp32 over BC_CHUNK of them,
 * then double), the rows' sums added in order */
#define BC_LANES 32
#define BC_ROWS 8
#define BC_CHUNK 32

template <typename T, int W>
__global__ void k_add_bcast_bwd(T *db, const T *dy, int accum, int c, int hw)
{
    __shared__ double part[BC_ROWS][BC_LANES * 8];
    const int img = blockIdx.y, tx = threadIdx.x, ty = threadIdx.y;
    const int ch = (blockIdx.x * BC_LANES + tx) * W;
    double acc[W];
    for (int k = 0; k < W; k++) acc[k] = 0.0;
    if (ch < c) {
        const T *g = dy + (size_t)img * hw * c + ch;
        for (int p0 = ty; p0 < hw; p0 += BC_ROWS * BC_CHUNK) {
            float f[W], v[W];
            for (int k = 0; k < W; k++) f[k] = 0.0f;
            for (int p = p0; p < hw && p < p0 + BC_ROWS * BC_CHUNK; p += BC_ROWS) {
                cu_ldv<T, W>(v, g + (size_t)p * c);
                for (int k = 0; k < W; k++) f[k] += v[k];
            }
            for (int k = 0; k < W; k++) acc[k] += f[k];
        }
    }
    for (int k = 0; k < W; k++) part[ty][tx * W + k] = acc[k];
    __syncthreads();
    if (ty == 0 && ch < c) {
        T *d = db + (size_t)img * c + ch;
        for (int k = 0; k < W; k++) {
            double s = 0.0;
            for (int r = 0; r < BC_ROWS; r++) s += part[r][tx * W + k];
            d[k] = cu_to<T>(accum ? (float)((double)cu_ld(d[k]) + s) : (float)s);
        }
    }
}

template <typename T>
static int add_bcast_bwd(void *db, const void *dy, int accum, int n, int c, int hw, bk_ctx *ctx)
{
    const int vec = c % CU_VW(T) == 0 && cu_al16(dy), w = vec ? CU_VW(T) : 1;
    const dim3 grid((c + BC_LANES * w - 1) / (BC_LANES * w), n), block(BC_LANES, BC_ROWS);
    if (vec)
        CU_LAUNCH(k_add_bcast_bwd<T COMMA CU_VW(T)>, grid, block, 0, ctx->stream)(
            (T *)db, (const T *)dy, accum, c, hw);
    else
        CU_LAUNCH(k_add_bcast_bwd<T COMMA 1>, grid, block, 0, ctx->stream)((T *)db,
                                                                          (const T *)dy, accum,
                                                                          c, hw);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

int cu_t_add_bcast_bwd(void *db, const void *dy, int accum, int n, int c, int hw, int dtype,
                       bk_ctx *ctx)
{
    TYPED_ENTER(ctx, dtype);
    if (n < 0 || c < 0 || hw < 1 || n > 65535) return BK_ERR_INVALID;
    if (!n || !c) return BK_OK;
    if (!db || !dy) return BK_ERR_INVALID;
    return CU_TYPED(dtype, add_bcast_bwd, db, dy, accum, n, c, hw, ctx);
}

/* ---- layout ---- */

/* channel concat of NHWC images: pixel r of y is [a's C1 channels, b's C2 channels] */
template <typename T, int W>
__global__ void k_concat_fwd(T *y, const T *a, const T *b, int c1, int c2, size_t count)
{
    const int ct = c1 + c2;
    GRID_LOOP(i, count / W)
    {
        const size_t e = i * W, r = e / ct;
        const int ch = (int)(e % ct);
        float v[W];
        if (ch < c1) cu_ldv<T, W>(v, a + r * c1 + ch);
        else cu_ldv<T, W>(v, b + r * c2 + (ch - c1));
        cu_stv<T, W>(y + e, v);
    }
}

template <typename T, int W>
__global__ void k_concat_bwd(T *da, T *db, const T *dy, int accum_a, int accum_b, int c1, int c2,
                             size_t count)
{
    const int ct = c1 + c2;
    GRID_LOOP(i, count / W)
    {
        const size_t e = i * W, r = e / ct;
        const int ch = (int)(e % ct);
        T *d = ch < c1 ? (da ? da + r * c1 + ch : NULL) : (db ? db + r * c2 + (ch - c1) : NULL);
        if (!d) continue;
        const int accum = ch < c1 ? accum_a : accum_b;
        float g[W], v[W];
        cu_ldv<T, W>(g, dy + e);
        if (accum) {
            cu_ldv<T, W>(v, d);
            for (int k = 0; k < W; k++) g[k] += v[k];
        }
        cu_stv<T, W>(d, g);
    }
}

template <typename T>
static int concat_fwd(void *y, const void *a, const void *b, int n, int c1, int c2, int hw,
                      bk_ctx *ctx)
{
    const size_t count = (size_t)n * (c1 + c2) * hw;
    const int w = CU_VW(T);
    const int vec = c1 % w == 0 && c2 % w == 0 && cu_al16(y) && cu_al16(a) && cu_al16(b);
    LAUNCH_VW(k_concat_fwd, T, vec, count, (T *)y, (const T *)a, (const T *)b, c1, c2, count);
    return BK_OK;
}

template <typename T>
static int concat_bwd(void *da, void *db, const void *dy, int accum_a, int accum_b, int n, int c1,
                      int c2, int hw, bk_ctx *ctx)
{
    const size_t count = (size_t)n * (c1 + c2) * hw;
    const int w = CU_VW(T);
    const int vec = c1 % w == 0 && c2 % w == 0 && cu_al16(da) && cu_al16(db) && cu_al16(dy);
    LAUNCH_VW(k_concat_bwd, T, vec, count, (T *)da, (T *)db, (const T *)dy, accum_a, accum_b, c1,
              c2, count);
    return BK_OK;
}

int cu_t_concat_fwd(void *y, const void *a, const void *b, int n, int c1, int c2, int hw,
                    int dtype, bk_ctx *ctx)
{
    TYPED_ENTER(ctx, dtype);
    if (n < 0 || c1 < 0 || c2 < 0 || hw < 0) return BK_ERR_INVALID;
    return CU_TYPED(dtype, concat_fwd, y, a, b, n, c1, c2, hw, ctx);
}

int cu_t_concat_bwd(void *da, void *db, const void *dy, int accum_a, int accum_b, int n, int c1,
                    int c2, int hw, int dtype, bk_ctx *ctx)
{
    TYPED_ENTER(ctx, dtype);
    if (n < 0 || c1 < 0 || c2 < 0 || hw < 0) return BK_ERR_INVALID;
    return CU_TYPED(dtype, concat_bwd, da, db, dy, accum_a, accum_b, n, c1, c2, hw, ctx);
}

#define TR_TILE 32
#define TR_ROWS 8

/* y (N,HW,C) (=/+=) transpose of x (N,C,HW), through a 32 x 33 tile in shared memory */
template <typename T> __global__ void k_transpose(T *y, const T *x, int accum, int c, int hw)
{
    __shared__ float tile[TR_TILE][TR_TILE + 1];
    const size_t img = (size_t)c * hw;
    const T *xs = x + blockIdx.z * img;
    T *ys = y + blockIdx.z * img;
    const int p0 = blockIdx.x * TR_TILE, c0 = blockIdx.y * TR_TILE;
    for (int r = threadIdx.y; r < TR_TILE; r += TR_ROWS) {
        const int ch = c0 + r, p = p0 + threadIdx.x;
        if (ch < c && p < hw) tile[r][threadIdx.x] = cu_ld(xs[(size_t)ch * hw + p]);
    }
    __syncthreads();
    for (int r = threadIdx.y; r < TR_TILE; r += TR_ROWS) {
        const int p = p0 + r, ch = c0 + threadIdx.x;
        if (ch < c && p < hw) {
            T *d = ys + (size_t)p * c + ch;
            const float v = tile[threadIdx.x][r];
            *d = cu_to<T>(accum ? cu_ld(*d) + v : v);
        }
    }
}

template <typename T>
static int transpose_fwd(void *y, const void *x, int accum, int n, int c, int hw, bk_ctx *ctx)
{
    dim3 grid((hw + TR_TILE - 1) / TR_TILE, (c + TR_TILE - 1) / TR_TILE, n);
    if (grid.y > 65535) return BK_ERR_INVALID;
    CU_LAUNCH(k_transpose<T>, grid, dim3(TR_TILE, TR_ROWS), 0, ctx->stream)(
        (T *)y, (const T *)x, accum, c, hw);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

int cu_t_transpose_fwd(void *y, const void *x, int accum, int n, int c, int hw, int dtype,
                       bk_ctx *ctx)
{
    TYPED_ENTER(ctx, dtype);
    if (n < 0 || c < 0 || hw < 0 || n > 65535) return BK_ERR_INVALID;
    if (!n || !c || !hw) return BK_OK;
    return CU_TYPED(dtype, transpose_fwd, y, x, accum, n, c, hw, ctx);
}

/* ---- resampling over NHWC images: one item is W channels of one output pixel ---- */

/* y (N,2H,2W,C): y[2i+a][2j+b] = x[i][j] */
template <typename T, int W>
__global__ void k_nearest_fwd(T *y, const T *x, int c, int h, int w, size_t count)
{
    const int wo = 2 * w;
    GRID_LOOP(i, count / W)
    {
        const size_t e = i * W, px = e / c;
        const int ch = (int)(e % c), ox = (int)(px % wo);
        const size_t row = px / wo; /* (n, oy) */
        const size_t img = row / (2 * h);
        const int oy = (int)(row % (2 * h));
        float v[W];
        cu_ldv<T, W>(v, x + ((img * h + oy / 2) * w + ox / 2) * c + ch);
        cu_stv<T, W>(y + e, v);
    }
}

/* dx (N,H,W,C) (=/+=) the 2x2 block's sum, as resample.c: (a + b) + (e + f) */
template <typename T, int W>
__global__ void k_nearest_bwd(T *dx, const T *dy, int accum, int c, int h, int w, size_t count)
{
    const size_t orow = (size_t)2 * w * c;
    GRID_LOOP(i, count / W)
    {
        const size_t e = i * W, px = e / c;
        const int ch = (int)(e % c), j = (int)(px % w);
        const size_t row = px / w; /* (n, iy) */
        const T *g0 = dy + row * 2 * orow + (size_t)2 * j * c + ch, *g1 = g0 + orow;
        float a[W], b[W], f0[W], f1[W], v[W];
        cu_ldv<T, W>(a, g0);
        cu_ldv<T, W>(b, g0 + c);
        cu_ldv<T, W>(f0, g1);
        cu_ldv<T, W>(f1, g1 + c);
        if (accum) cu_ldv<T, W>(v, dx + e);
        for (int k = 0; k < W; k++) {
            const float s = (a[k] + b[k]) + (f0[k] + f1[k]);
            v[k] = accum ? v[k] + s : s;
        }
        cu_stv<T, W>(dx + e, v);
    }
}

/* PyTorch's area_pixel_compute_scale for scale_factor 2 (resample.c) */
static float bilinear_scale(int in, int out, int align_corners)
{
    if (align_corners) return out > 1 ? (float)(in - 1) / (float)(out - 1) : 0.0f;
    return 0.5f;
}

/* source taps and weights of output index dst, exactly resample.c's bilinear_tap */
__device__ __forceinline__ void bilinear_tap(int dst, int in, float scale, int align_corners,
                                             int *i0, int *i1, float *l0, float *l1)
{
    float src = align_corners ? scale * (float)dst : scale * ((float)dst + 0.5f) - 0.5f;
    if (src < 0.0f) src = 0.0f;
    int i = (int)src;
    if (i > in - 1) i = in - 1;
    float lam = src - (float)i;
    if (lam < 0.0f) lam = 0.0f;
    if (lam > 1.0f) lam = 1.0f;
    *i0 = i;
    *i1 = i < in - 1 ? i + 1 : i;
    *l1 = lam;
    *l0 = 1.0f - lam;
}

template <typename T, int W>
__global__ void k_bilinear_fwd(T *y, const T *x, int align_corners, int c, int h, int w, float sh,
                               float sw, size_t count)
{
    const int ho = 2 * h, wo = 2 * w;
    GRID_LOOP(i, count / W)
    {
        const size_t e = i * W, px = e / c;
        const int ch = (int)(e % c), ox = (int)(px % wo);
        const size_t row = px / wo, img = row / ho;
        const int oy = (int)(row % ho);
        int y0, y1, x0, x1;
        float ly0, ly1, lx0, lx1;
        bilinear_tap(oy, h, sh, align_corners, &y0, &y1, &ly0, &ly1);
        bilinear_tap(ox, w, sw, align_corners, &x0, &x1, &lx0, &lx1);
        const T *r0 = x + (img * h + y0) * w * c + ch, *r1 = x + (img * h + y1) * w * c + ch;
        float a[W], b[W], f0[W], f1[W], v[W];
        cu_ldv<T, W>(a, r0 + (size_t)x0 * c);
        cu_ldv<T, W>(b, r0 + (size_t)x1 * c);
        cu_ldv<T, W>(f0, r1 + (size_t)x0 * c);
        cu_ldv<T, W>(f1, r1 + (size_t)x1 * c);
        for (int k = 0; k < W; k++)
            v[k] = ly0 * (lx0 * a[k] + lx1 * b[k]) + ly1 * (lx0 * f0[k] + lx1 * f1[k]);
        cu_stv<T, W>(y + e, v);
    }
}

/* weight of input index i in output index o along one axis: the forward's taps summed (both
 * taps may be i at the last index) */
__device__ __forceinline__ float bilinear_weight(int o, int i, int in, float scale,
                                                 int align_corners, int *hit)
{
    int i0, i1;
    float l0, l1;
    bilinear_tap(o, in, scale, align_corners, &i0, &i1, &l0, &l1);
    *hit = i0 == i || i1 == i;
    return (i0 == i ? l0 : 0.0f) + (i1 == i ? l1 : 0.0f);
}

/* dx (N,H,W,C) (=/+=) as a gather: the outputs whose taps reach (iy, ix) lie within
 * [2i - 3, 2i + 4] on each axis for either align_corners (see resample.c's taps) */
template <typename T, int W>
__global__ void k_bilinear_bwd(T *dx, const T *dy, int align_corners, int accum, int c, int h,
                               int w, float sh, float sw, size_t count)
{
    const int ho = 2 * h, wo = 2 * w;
    GRID_LOOP(i, count / W)
    {
        const size_t e = i * W, px = e / c;
        const int ch = (int)(e % c), ix = (int)(px % w);
        const size_t row = px / w, img = row / h;
        const int iy = (int)(row % h);
        const T *g = dy + img * ho * wo * c + ch;
        const int oy0 = max(0, 2 * iy - 3), oy1 = min(ho - 1, 2 * iy + 4);
        const int ox0 = max(0, 2 * ix - 3), ox1 = min(wo - 1, 2 * ix + 4);
        float acc[W], v[W];
        for (int k = 0; k < W; k++) acc[k] = 0.0f;
        for (int oy = oy0; oy <= oy1; oy++) {
            int hy;
            const float wy = bilinear_weight(oy, iy, h, sh, align_corners, &hy);
            if (!hy) continue;
            for (int ox = ox0; ox <= ox1; ox++) {
                int hx;
                const float wx = bilinear_weight(ox, ix, w, sw, align_corners, &hx);
                if (!hx) continue;
                cu_ldv<T, W>(v, g + ((size_t)oy * wo + ox) * c);
                for (int k = 0; k < W; k++) acc[k] += wy * wx * v[k];
            }
        }
        if (accum) {
            cu_ldv<T, W>(v, dx + e);
            for (int k = 0; k < W; k++) acc[k] += v[k];
        }
        cu_stv<T, W>(dx + e, acc);
    }
}

/* the window's maximum and its index (row-major), as resample.c: a later value wins only if
 * strictly greater, or NaN */
__device__ __forceinline__ int maxpool_argmax(float v0, float v1, float v2, float v3, float *out)
{
    const float v[4] = {v0, v1, v2, v3};
    float m = -INFINITY;
    int k = 0;
    for (int q = 0; q < 4; q++)
        if (v[q] > m || isnan(v[q])) {
            m = v[q];
            k = q;
        }
    *out = m;
    return k;
}

template <typename T, int W>
__global__ void k_maxpool_fwd(T *y, const T *x, int c, int h, int w, size_t count)
{
    const int ho = h / 2, wo = w / 2;
    GRID_LOOP(i, count / W)
    {
        const size_t e = i * W, px = e / c;
        const int ch = (int)(e % c), j = (int)(px % wo);
        const size_t row = px / wo, img = row / ho;
        const int oy = (int)(row % ho);
        const T *r0 = x + ((img * h + 2 * oy) * w + 2 * j) * c + ch, *r1 = r0 + (size_t)w * c;
        float a[W], b[W], f0[W], f1[W], v[W];
        cu_ldv<T, W>(a, r0);
        cu_ldv<T, W>(b, r0 + c);
        cu_ldv<T, W>(f0, r1);
        cu_ldv<T, W>(f1, r1 + c);
        for (int k = 0; k < W; k++) maxpool_argmax(a[k], b[k], f0[k], f1[k], &v[k]);
        cu_stv<T, W>(y + e, v);
    }
}

/* one item per input element vector: a gather from its window (windows do not overlap); the
 * dropped odd last row and column get 0 */
template <typename T, int W>
__global__ void k_maxpool_bwd(T *dx, const T *dy, const T *x, int accum, int c, int h, int w,
                              size_t count)
{
    const int ho = h / 2, wo = w / 2;
    GRID_LOOP(i, count / W)
    {
        const size_t e = i * W, px = e / c;
        const int ch = (int)(e % c), ix = (int)(px % w);
        const size_t row = px / w, img = row / h;
        const int iy = (int)(row % h), oy = iy / 2, j = ix / 2;
        float v[W], d[W];
        for (int k = 0; k < W; k++) v[k] = 0.0f;
        if (oy < ho && j < wo) {
            const T *r0 = x + ((img * h + 2 * oy) * w + 2 * j) * c + ch, *r1 = r0 + (size_t)w * c;
            float a[W], b[W], f0[W], f1[W], g[W];
            cu_ldv<T, W>(a, r0);
            cu_ldv<T, W>(b, r0 + c);
            cu_ldv<T, W>(f0, r1);
            cu_ldv<T, W>(f1, r1 + c);
            cu_ldv<T, W>(g, dy + ((img * ho + oy) * wo + j) * c + ch);
            const int want = (iy - 2 * oy) * 2 + (ix - 2 * j);
            for (int k = 0; k < W; k++) {
                float m;
                if (maxpool_argmax(a[k], b[k], f0[k], f1[k], &m) == want) v[k] = g[k];
            }
        }
        if (accum) {
            cu_ldv<T, W>(d, dx + e);
            for (int k = 0; k < W; k++) v[k] += d[k];
        }
        cu_stv<T, W>(dx + e, v);
    }
}

/* vec: the channel count a multiple of the vector and every pointer 16-byte aligned */
#define RS_VEC(T, c, ...) ((c) % CU_VW(T) == 0 && cu_al16s(__VA_ARGS__))
static inline int cu_al16s(const void *a, const void *b, const void *c = NULL)
{
    return cu_al16(a) && cu_al16(b) && cu_al16(c);
}

template <typename T>
static int nearest_fwd(void *y, const void *x, int n, int c, int h, int w, bk_ctx *ctx)
{
    const size_t count = (size_t)n * c * 4 * h * w;
    LAUNCH_VW(k_nearest_fwd, T, RS_VEC(T, c, y, x), count, (T *)y, (const T *)x, c, h, w, count);
    return BK_OK;
}

template <typename T>
static int nearest_bwd(void *dx, const void *dy, int accum, int n, int c, int h, int w,
                       bk_ctx *ctx)
{
    const size_t count = (size_t)n * c * h * w;
    LAUNCH_VW(k_nearest_bwd, T, RS_VEC(T, c, dx, dy), count, (T *)dx, (const T *)dy, accum, c, h,
              w, count);
    return BK_OK;
}

template <typename T>
static int bilinear_fwd(void *y, const void *x, int align_corners, int n, int c, int h, int w,
                        bk_ctx *ctx)
{
    const float sh = bilinear_scale(h, 2 * h, align_corners);
    const float sw = bilinear_scale(w, 2 * w, align_corners);
    const size_t count = (size_t)n * c * 4 * h * w;
    LAUNCH_VW(k_bilinear_fwd, T, RS_VEC(T, c, y, x), count, (T *)y, (const T *)x, align_corners,
              c, h, w, sh, sw, count);
    return BK_OK;
}

template <typename T>
static int bilinear_bwd(void *dx, const void *dy, int align_corners, int accum, int n, int c,
                        int h, int w, bk_ctx *ctx)
{
    const float sh = bilinear_scale(h, 2 * h, align_corners);
    const float sw = bilinear_scale(w, 2 * w, align_corners);
    const size_t count = (size_t)n * c * h * w;
    LAUNCH_VW(k_bilinear_bwd, T, RS_VEC(T, c, dx, dy), count, (T *)dx, (const T *)dy,
              align_corners, accum, c, h, w, sh, sw, count);
    return BK_OK;
}

template <typename T>
static int maxpool_fwd(void *y, const void *x, int n, int c, int h, int w, bk_ctx *ctx)
{
    const size_t count = (size_t)n * c * (h / 2) * (w / 2);
    LAUNCH_VW(k_maxpool_fwd, T, RS_VEC(T, c, y, x), count, (T *)y, (const T *)x, c, h, w, count);
    return BK_OK;
}

template <typename T>
static int maxpool_bwd(void *dx, const void *dy, const void *x, int accum, int n, int c, int h,
                       int w, bk_ctx *ctx)
{
    const size_t count = (size_t)n * c * h * w;
    LAUNCH_VW(k_maxpool_bwd, T, RS_VEC(T, c, dx, dy, x), count, (T *)dx, (const T *)dy,
              (const T *)x, accum, c, h, w, count);
    return BK_OK;
}

#define RS_ENTER(ctx, dtype, n, c, h, w)                                                       \
    do {                                                                                       \
        TYPED_ENTER(ctx, dtype);                                                               \
        if ((n) < 0 || (c) < 0 || (h) < 0 || (w) < 0) return BK_ERR_INVALID;                  \
    } while (0)

int cu_t_upsample_nearest2x_fwd(void *y, const void *x, int n, int c, int h, int w, int dtype,
                                bk_ctx *ctx)
{
    RS_ENTER(ctx, dtype, n, c, h, w);
    return CU_TYPED(dtype, nearest_fwd, y, x, n, c, h, w, ctx);
}

int cu_t_upsample_nearest2x_bwd(void *dx, const void *dy, int accum, int n, int c, int h, int w,
                                int dtype, bk_ctx *ctx)
{
    RS_ENTER(ctx, dtype, n, c, h, w);
    return CU_TYPED(dtype, nearest_bwd, dx, dy, accum, n, c, h, w, ctx);
}

int cu_t_upsample_bilinear2x_fwd(void *y, const void *x, int align_corners, int n, int c, int h,
                                 int w, int dtype, bk_ctx *ctx)
{
    RS_ENTER(ctx, dtype, n, c, h, w);
    return CU_TYPED(dtype, bilinear_fwd, y, x, align_corners, n, c, h, w, ctx);
}

int cu_t_upsample_bilinear2x_bwd(void *dx, const void *dy, int align_corners, int accum, int n,
                                 int c, int h, int w, int dtype, bk_ctx *ctx)
{
    RS_ENTER(ctx, dtype, n, c, h, w);
    return CU_TYPED(dtype, bilinear_bwd, dx, dy, align_corners, accum, n, c, h, w, ctx);
}

int cu_t_maxpool2x2_fwd(void *y, const void *x, int n, int c, int h, int w, int dtype,
                        bk_ctx *ctx)
{
    RS_ENTER(ctx, dtype, n, c, h, w);
    return CU_TYPED(dtype, maxpool_fwd, y, x, n, c, h, w, ctx);
}

int cu_t_maxpool2x2_bwd(void *dx, const void *dy, const void *x, int accum, int n, int c, int h,
                        int w, int dtype, bk_ctx *ctx)
{
    RS_ENTER(ctx, dtype, n, c, h, w);
    return CU_TYPED(dtype, maxpool_bwd, dx, dy, x, accum, n, c, h, w, ctx);
}

/* ---- dropout: loss.c's masks (philox.h) ----
 * Element e (logical, NCHW order) of sample s is kept iff philox_uniform_at(seed, DROPOUT, step,
 * sample_base + s, op, e) >= p; kept values are scaled by 1/(1-p) computed once in float. An
 * NHWC image (channels > 1) holds logical element e = c * HW + pixel at pixel * C + c: with HW a
 * multiple of 4 one item is (sample, quad of pixels, channel), one Philox block for its four
 * pixels; otherwise a block per element. Other tensors: one item per block of 4 elements. */
template <typename T>
__global__ void k_dropout(T *out, const T *in, float p, float scale, uint64_t seed, uint64_t step,
                          uint32_t op, int sample_base, int accum, size_t per_sample, size_t ch,
                          size_t items, const struct bk_step *sv)
{
    if (sv) { /* the step on the device: step_set's values, read when the kernel runs */
        seed = sv->seed;
        step = sv->step;
        sample_base = sv->sample_base;
    }
    GRID_LOOP(it, items)
    {
        size_t s = 0, base = 0, stride = 1, blk = 0, ne = 4;
        if (ch > 1 && (per_sample / ch) % 4 == 0) {
            /* (s, quad, c): the quad's pixels 4q..4q+3 of channel c */
            const size_t quads = per_sample / ch / 4, c = it % ch, q = (it / ch) % quads;
            s = it / ch / quads;
            base = s * per_sample + 4 * q * ch + c;
            stride = ch;
            blk = (c * quads * 4 + 4 * q) / 4;
        } else if (ch > 1) {
            s = it / per_sample;
            const size_t m = it % per_sample, e = (m % ch) * (per_sample / ch) + m / ch;
            const struct philox_u4 r = philox_block(seed, PHILOX_TAG_DROPOUT, step,
                                                    (uint32_t)(sample_base + (int)s), op,
                                                    (uint32_t)(e / 4));
            const float v = philox_uniform(r.v[e % 4]) >= p ? cu_ld(in[it]) * scale : 0.0f;
            out[it] = cu_to<T>(accum ? cu_ld(out[it]) + v : v);
            continue;
        } else {
            const size_t nblk = (per_sample + 3) / 4;
            s = it / nblk;
            blk = it % nblk;
            base = s * per_sample + blk * 4;
            stride = 1;
            ne = per_sample - blk * 4 < 4 ? per_sample - blk * 4 : 4;
        }
        const struct philox_u4 r = philox_block(seed, PHILOX_TAG_DROPOUT, step,
                                                (uint32_t)(sample_base + (int)s), op,
                                                (uint32_t)blk);
        for (size_t k = 0; k < ne; k++) {
            const size_t i = base + k * stride;
            const float v = philox_uniform(r.v[k]) >= p ? cu_ld(in[i]) * scale : 0.0f;
            out[i] = cu_to<T>(accum ? cu_ld(out[i]) + v : v);
        }
    }
}

template <typename T>
static int dropout(void *out, const void *in, float p, uint64_t seed, uint64_t step, uint32_t op,
                   int sample_base, int accum, int n, size_t per_sample, int channels,
                   const struct bk_step *sv, bk_ctx *ctx)
{
    const size_t total = (size_t)n * per_sample, ch = channels > 1 ? (size_t)channels : 1;
    if (!total) return BK_OK;
    if (p == 0.0f) /* every uniform is > 0: all kept, scale 1 - an exact copy */
        return ew<T>(out, in, NULL, 0.0f, EW_COPY, accum, total, ctx);
    size_t items;
    if (ch > 1 && (per_sample / ch) % 4 == 0) items = total / 4;
    else if (ch > 1) items = total;
    else items = (size_t)n * ((per_sample + 3) / 4);
    CU_LAUNCH(k_dropout<T>, cu_blocks(items, CU_THREADS), CU_THREADS, 0, ctx->stream)(
        (T *)out, (const T *)in, p, 1.0f / (1.0f - p), seed, step, op, sample_base, accum,
        per_sample, ch, items, sv);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

static int dropout_check(float p, int n, size_t per_sample, int channels)
{
    return !(p >= 0.0f && p < 1.0f) || n < 0 || per_sample > 0xFFFFFFFFull || channels < 0 ||
           (channels > 1 && per_sample % (size_t)channels);
}

int cu_t_dropout_fwd(void *y, const void *x, float p, uint64_t seed, uint64_t step, uint32_t op,
                     int sample_base, int n, size_t per_sample, int channels, int dtype,
                     bk_ctx *ctx)
{
    TYPED_ENTER(ctx, dtype);
    if (dropout_check(p, n, per_sample, channels)) return BK_ERR_INVALID;
    return CU_TYPED(dtype, dropout, y, x, p, seed, step, op, sample_base, 0, n, per_sample,
                    channels, (const struct bk_step *)NULL, ctx);
}

int cu_t_dropout_bwd(void *dx, const void *dy, float p, uint64_t seed, uint64_t step,
                     uint32_t op, int sample_base, int accum, int n, size_t per_sample,
                     int channels, int dtype, bk_ctx *ctx)
{
    TYPED_ENTER(ctx, dtype);
    if (dropout_check(p, n, per_sample, channels)) return BK_ERR_INVALID;
    return CU_TYPED(dtype, dropout, dx, dy, p, seed, step, op, sample_base, accum, n, per_sample,
                    channels, (const struct bk_step *)NULL, ctx);
}

int cu_dropout_step_fwd(void *y, const void *x, float p, uint32_t op, int n, size_t per_sample,
                        int channels, int dtype, bk_ctx *ctx)
{
    TYPED_ENTER(ctx, dtype);
    if (dropout_check(p, n, per_sample, channels)) return BK_ERR_INVALID;
    return CU_TYPED(dtype, dropout, y, x, p, (uint64_t)0, (uint64_t)0, op, 0, 0, n, per_sample,
                    channels, cu_step_in(ctx), ctx);
}

int cu_dropout_step_bwd(void *dx, const void *dy, float p, uint32_t op, int accum, int n,
                        size_t per_sample, int channels, int dtype, bk_ctx *ctx)
{
    TYPED_ENTER(ctx, dtype);
    if (dropout_check(p, n, per_sample, channels)) return BK_ERR_INVALID;
    return CU_TYPED(dtype, dropout, dx, dy, p, (uint64_t)0, (uint64_t)0, op, 0, accum, n,
                    per_sample, channels, cu_step_in(ctx), ctx);
}

/* ---- the fp32 entries: the typed kernels on fp32 ---- */

#define F32 BK_DTYPE_F32
int cu_silu_fwd(float *y, const float *x, size_t count, bk_ctx *ctx)
{
    return cu_t_silu_fwd(y, x, count, F32, ctx);
}
int cu_silu_bwd(float *dx, const float *dy, const float *x, int accum, size_t count, bk_ctx *ctx)
{
    return cu_t_silu_bwd(dx, dy, x, accum, count, F32, ctx);
}
int cu_gelu_fwd(float *y, const float *x, size_t count, bk_ctx *ctx)
{
    return cu_t_gelu_fwd(y, x, count, F32, ctx);
}
int cu_gelu_bwd(float *dx, const float *dy, const float *x, int accum, size_t count, bk_ctx *ctx)
{
    return cu_t_gelu_bwd(dx, dy, x, accum, count, F32, ctx);
}
int cu_add_fwd(float *y, const float *a, const float *b, size_t count, bk_ctx *ctx)
{
    return cu_t_add_fwd(y, a, b, count, F32, ctx);
}
int cu_copy_grad(float *dx, const float *dy, int accum, size_t count, bk_ctx *ctx)
{
    return cu_t_copy_grad(dx, dy, accum, count, F32, ctx);
}
int cu_scale_fwd(float *y, const float *x, float s, size_t count, bk_ctx *ctx)
{
    return cu_t_scale_fwd(y, x, s, count, F32, ctx);
}
int cu_add_bcast_fwd(float *y, const float *x, const float *b, int n, int c, int hw, bk_ctx *ctx)
{
    return cu_t_add_bcast_fwd(y, x, b, n, c, hw, F32, ctx);
}
int cu_add_bcast_bwd(float *db, const float *dy, int accum, int n, int c, int hw, bk_ctx *ctx)
{
    return cu_t_add_bcast_bwd(db, dy, accum, n, c, hw, F32, ctx);
}
int cu_concat_fwd(float *y, const float *a, const float *b, int n, int c1, int c2, int hw,
                  bk_ctx *ctx)
{
    return cu_t_concat_fwd(y, a, b, n, c1, c2, hw, F32, ctx);
}
int cu_concat_bwd(float *da, float *db, const float *dy, int accum_a, int accum_b, int n, int c1,
                  int c2, int hw, bk_ctx *ctx)
{
    return cu_t_concat_bwd(da, db, dy, accum_a, accum_b, n, c1, c2, hw, F32, ctx);
}
int cu_transpose_fwd(float *y, const float *x, int accum, int n, int c, int hw, bk_ctx *ctx)
{
    return cu_t_transpose_fwd(y, x, accum, n, c, hw, F32, ctx);
}
int cu_upsample_nearest2x_fwd(float *y, const float *x, int n, int c, int h, int w, bk_ctx *ctx)
{
    return cu_t_upsample_nearest2x_fwd(y, x, n, c, h, w, F32, ctx);
}
int cu_upsample_nearest2x_bwd(float *dx, const float *dy, int accum, int n, int c, int h, int w,
                              bk_ctx *ctx)
{
    return cu_t_upsample_nearest2x_bwd(dx, dy, accum, n, c, h, w, F32, ctx);
}
int cu_upsample_bilinear2x_fwd(float *y, const float *x, int align_corners, int n, int c, int h,
                               int w, bk_ctx *ctx)
{
    return cu_t_upsample_bilinear2x_fwd(y, x, align_corners, n, c, h, w, F32, ctx);
}
int cu_upsample_bilinear2x_bwd(float *dx, const float *dy, int align_corners, int accum, int n,
                               int c, int h, int w, bk_ctx *ctx)
{
    return cu_t_upsample_bilinear2x_bwd(dx, dy, align_corners, accum, n, c, h, w, F32, ctx);
}
int cu_maxpool2x2_fwd(float *y, const float *x, int n, int c, int h, int w, bk_ctx *ctx)
{
    return cu_t_maxpool2x2_fwd(y, x, n, c, h, w, F32, ctx);
}
int cu_maxpool2x2_bwd(float *dx, const float *dy, const float *x, int accum, int n, int c, int h,
                      int w, bk_ctx *ctx)
{
    return cu_t_maxpool2x2_bwd(dx, dy, x, accum, n, c, h, w, F32, ctx);
}
int cu_dropout_fwd(float *y, const float *x, float p, uint64_t seed, uint64_t step, uint32_t op,
                   int sample_base, int n, size_t per_sample, int channels, bk_ctx *ctx)
{
    return cu_t_dropout_fwd(y, x, p, seed, step, op, sample_base, n, per_sample, channels, F32,
                            ctx);
}
int cu_dropout_bwd(float *dx, const float *dy, float p, uint64_t seed, uint64_t step,
                   uint32_t op, int sample_base, int accum, int n, size_t per_sample,
                   int channels, bk_ctx *ctx)
{
    return cu_t_dropout_bwd(dx, dy, p, seed, step, op, sample_base, accum, n, per_sample,
                            channels, F32, ctx);
}
#undef F32

/* ---- timestep embedding: embed.c's rounding points (freq and sin/cos in double) ---- */

__global__ void k_timestep_embed(float *y, const float *t, int n, int dim, int half,
                                 int first_cos, double lnp, double denom)
{
    const size_t count = (size_t)n * half;
    GRID_LOOP(idx, count)
    {
        const int s = (int)(idx / half), i = (int)(idx % half);
        const float freq = (float)exp(-lnp * (double)i / denom);
        const float arg = t[s] * freq;
        const float sv = (float)sin((double)arg), cv = (float)cos((double)arg);
        float *yr = y + (size_t)s * dim;
        yr[i] = first_cos ? cv : sv;
        yr[half + i] = first_cos ? sv : cv;
        if ((dim & 1) && i == 0) yr[dim - 1] = 0.0f;
    }
}

int cu_timestep_embed_fwd(float *y, const float *t, int n, int dim, int flip_sin_to_cos,
                          float freq_shift, float max_period, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    const int half = dim / 2;
    const double denom = (double)half - (double)freq_shift;
    if (n < 0 || dim < 0 || (half > 0 && denom == 0.0)) return BK_ERR_INVALID;
    if (half == 0) {
        /* dim 1: only the zero pad column */
        if (dim == 1 && n > 0) return cu_mem_set_f32(y, 0.0f, (size_t)n, ctx);
        return BK_OK;
    }
    const double lnp = log((double)max_period);
    const size_t count = (size_t)n * half;
    CU_LAUNCH(k_timestep_embed, cu_blocks(count, CU_THREADS), CU_THREADS, 0, ctx->stream)(
        y, t, n, dim, half, flip_sin_to_cos != 0, lnp, denom);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

/* ---- conv.cu's helpers ---- */

/* xp (N,Hp,Wp,C) = x (N,H,W,C) placed at (pt, pl), zeros around */
template <typename T, int W>
__global__ void k_pad2d(T *xp, const T *x, int c, int h, int w, int pt, int pl, int hp, int wp,
                        size_t count)
{
    GRID_LOOP(i, count / W)
    {
        const size_t e = i * W, px = e / c;
        const int ch = (int)(e % c), xx = (int)(px % wp) - pl;
        const size_t row = px / wp, img = row / hp;
        const int y = (int)(row % hp) - pt;
        float v[W];
        if (y >= 0 && y < h && xx >= 0 && xx < w)
            cu_ldv<T, W>(v, x + ((img * h + y) * w + xx) * c + ch);
        else
            for (int k = 0; k < W; k++) v[k] = 0.0f;
        cu_stv<T, W>(xp + e, v);
    }
}

/* x (N,H,W,C) = the interior of xp (N,Hp,Wp,C) at (pt, pl) */
template <typename T, int W>
__global__ void k_crop2d(T *x, const T *xp, int c, int h, int w, int pt, int pl, int hp, int wp,
                         size_t count)
{
    GRID_LOOP(i, count / W)
    {
        const size_t e = i * W, px = e / c;
        const int ch = (int)(e % c), xx = (int)(px % w);
        const size_t row = px / w, img = row / h;
        const int y = (int)(row % h);
        float v[W];
        cu_ldv<T, W>(v, xp + ((img * hp + y + pt) * wp + xx + pl) * c + ch);
        cu_stv<T, W>(x + e, v);
    }
}

template <typename T>
static int pad2d(void *xp, const void *x, int n, int c, int h, int w, int pt, int pl, int pb,
                 int pr, bk_ctx *ctx)
{
    const int hp = h + pt + pb, wp = w + pl + pr;
    const size_t count = (size_t)n * hp * wp * c;
    LAUNCH_VW(k_pad2d, T, RS_VEC(T, c, xp, x), count, (T *)xp, (const T *)x, c, h, w, pt, pl, hp,
              wp, count);
    return BK_OK;
}

template <typename T>
static int crop2d(void *x, const void *xp, int n, int c, int h, int w, int pt, int pl, int pb,
                  int pr, bk_ctx *ctx)
{
    const int hp = h + pt + pb, wp = w + pl + pr;
    const size_t count = (size_t)n * h * w * c;
    LAUNCH_VW(k_crop2d, T, RS_VEC(T, c, x, xp), count, (T *)x, (const T *)xp, c, h, w, pt, pl, hp,
              wp, count);
    return BK_OK;
}

int cu_pad2d(void *xp, const void *x, int dtype, int n, int c, int h, int w, int pt, int pl,
             int pb, int pr, bk_ctx *ctx)
{
    return CU_TYPED(dtype, pad2d, xp, x, n, c, h, w, pt, pl, pb, pr, ctx);
}

int cu_crop2d(void *x, const void *xp, int dtype, int n, int c, int h, int w, int pt, int pl,
              int pb, int pr, bk_ctx *ctx)
{
    return CU_TYPED(dtype, crop2d, x, xp, n, c, h, w, pt, pl, pb, pr, ctx);
}

/* w_krsc (O,Kh,Kw,I) = w (O,I,Kh,Kw): one thread per output element (filters are small) */
template <typename T>
__global__ void k_filter_to_krsc(T *wk, const T *w, int ci, int khw, size_t count)
{
    GRID_LOOP(i, count)
    {
        const size_t o = i / ((size_t)khw * ci);
        const int r = (int)(i % ((size_t)khw * ci)), k = r / ci, c = r % ci;
        wk[i] = w[(o * ci + c) * khw + k];
    }
}

/* dw (O,I,Kh,Kw, fp32) += g (O,Kh,Kw,I): one thread per dw element */
template <typename T>
__global__ void k_filter_add_krsc(float *dw, const T *g, int ci, int khw, size_t count)
{
    GRID_LOOP(i, count)
    {
        const size_t o = i / ((size_t)ci * khw);
        const int r = (int)(i % ((size_t)ci * khw)), c = r / khw, k = r % khw;
        dw[i] += cu_ld(g[(o * khw + k) * ci + c]);
    }
}

template <typename T>
static int filter_to_krsc(void *wk, const void *w, int o, int i, int kh, int kw, bk_ctx *ctx)
{
    const size_t count = (size_t)o * i * kh * kw;
    CU_LAUNCH(k_filter_to_krsc<T>, cu_blocks(count, CU_THREADS), CU_THREADS, 0, ctx->stream)(
        (T *)wk, (const T *)w, i, kh * kw, count);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

template <typename T>
static int filter_add_krsc(float *dw, const void *g, int o, int i, int kh, int kw, bk_ctx *ctx)
{
    const size_t count = (size_t)o * i * kh * kw;
    CU_LAUNCH(k_filter_add_krsc<T>, cu_blocks(count, CU_THREADS), CU_THREADS, 0, ctx->stream)(
        dw, (const T *)g, i, kh * kw, count);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

int cu_filter_to_krsc(void *w_krsc, const void *w, int dtype, int o, int i, int kh, int kw,
                      bk_ctx *ctx)
{
    return CU_TYPED(dtype, filter_to_krsc, w_krsc, w, o, i, kh, kw, ctx);
}

int cu_filter_add_krsc(float *dw, const void *g, int dtype, int o, int i, int kh, int kw,
                       bk_ctx *ctx)
{
    return CU_TYPED(dtype, filter_add_krsc, dw, g, o, i, kh, kw, ctx);
}
