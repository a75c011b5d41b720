/* eltwise.cu - the CUDA backend's element-wise, layout and resampling kernels and the timestep
 * embedding, with kernels/cpu's formulas (eltwise.c, layout.c, resample.c, embed.c). Every output
 * element is written by one thread; backwards are gathers (no atomics), so results are the same
 * from run to run. Also the zero-padded copy and cropped copy-back of conv.cu.
 */
#include <math.h>

#include "cuda_backend.h"

#define GRID_LOOP(i, count)                                                                     \
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (count);                 \
         i += (size_t)gridDim.x * blockDim.x)

#define LAUNCH_1D(kernel, count, ...)                                                              \
    do {                                                                                           \
        if ((count) == 0) return BK_OK;                                                            \
        CU_LAUNCH(kernel, cu_blocks((count), CU_THREADS), CU_THREADS, 0, ctx->stream)              \
        (__VA_ARGS__);                                                                             \
        CU_LAUNCHED(ctx);                                                                          \
    } while (0)

/* ---- element-wise ---- */

__global__ void k_silu_fwd(float *y, const float *x, size_t count)
{
    GRID_LOOP(i, count)
    {
        const float v = x[i];
        y[i] = v / (1.0f + expf(-v));
    }
}

__global__ void k_silu_bwd(float *dx, const float *dy, const float *x, int accum, size_t count)
{
    GRID_LOOP(i, count)
    {
        const float v = x[i];
        const float s = 1.0f / (1.0f + expf(-v));
        const float g = dy[i] * (s * (1.0f + v * (1.0f - s)));
        dx[i] = accum ? dx[i] + g : g;
    }
}

#define GELU_RSQRT2 0.70710678118654752440f
#define GELU_RSQRT2PI 0.39894228040143267794f

__global__ void k_gelu_fwd(float *y, const float *x, size_t count)
{
    GRID_LOOP(i, count)
    {
        const float v = x[i];
        y[i] = 0.5f * v * (1.0f + erff(v * GELU_RSQRT2));
    }
}

__global__ void k_gelu_bwd(float *dx, const float *dy, const float *x, int accum, size_t count)
{
    GRID_LOOP(i, count)
    {
        const float v = x[i];
        const float cdf = 0.5f * (1.0f + erff(v * GELU_RSQRT2));
        const float pdf = expf(-0.5f * v * v) * GELU_RSQRT2PI;
        const float g = dy[i] * (cdf + v * pdf);
        dx[i] = accum ? dx[i] + g : g;
    }
}

__global__ void k_add(float *y, const float *a, const float *b, size_t count)
{
    GRID_LOOP(i, count) y[i] = a[i] + b[i];
}

__global__ void k_copy_grad(float *dx, const float *dy, int accum, size_t count)
{
    GRID_LOOP(i, count) dx[i] = accum ? dx[i] + dy[i] : dy[i];
}

__global__ void k_scale(float *y, const float *x, float s, size_t count)
{
    GRID_LOOP(i, count) y[i] = x[i] * s;
}

__global__ void k_add_bcast_fwd(float *y, const float *x, const float *b, int hw, size_t count)
{
    GRID_LOOP(i, count) y[i] = x[i] + b[i / hw];
}

/* one warp per (n, c) row: db = sum over HW in double */
__global__ void k_add_bcast_bwd(float *db, const float *dy, int accum, long rows, int hw)
{
    const long r = (long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= rows) return;
    const float *g = dy + (size_t)r * hw;
    double acc = 0.0;
    for (int p = lane; p < hw; p += 32) acc += (double)g[p];
    acc = cu_warp_sum(acc);
    if (lane == 0) db[r] = accum ? (float)((double)db[r] + acc) : (float)acc;
}

int cu_silu_fwd(float *y, const float *x, size_t count, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    LAUNCH_1D(k_silu_fwd, count, y, x, count);
    return BK_OK;
}

int cu_silu_bwd(float *dx, const float *dy, const float *x, int accum, size_t count, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    LAUNCH_1D(k_silu_bwd, count, dx, dy, x, accum, count);
    return BK_OK;
}

int cu_gelu_fwd(float *y, const float *x, size_t count, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    LAUNCH_1D(k_gelu_fwd, count, y, x, count);
    return BK_OK;
}

int cu_gelu_bwd(float *dx, const float *dy, const float *x, int accum, size_t count, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    LAUNCH_1D(k_gelu_bwd, count, dx, dy, x, accum, count);
    return BK_OK;
}

int cu_add_fwd(float *y, const float *a, const float *b, size_t count, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    LAUNCH_1D(k_add, count, y, a, b, count);
    return BK_OK;
}

int cu_copy_grad(float *dx, const float *dy, int accum, size_t count, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    LAUNCH_1D(k_copy_grad, count, dx, dy, accum, count);
    return BK_OK;
}

int cu_scale_fwd(float *y, const float *x, float s, size_t count, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    LAUNCH_1D(k_scale, count, y, x, s, count);
    return BK_OK;
}

int cu_add_bcast_fwd(float *y, const float *x, const float *b, int n, int c, int hw, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (n < 0 || c < 0 || hw < 1) return n == 0 || c == 0 ? BK_OK : BK_ERR_INVALID;
    const size_t count = (size_t)n * c * hw;
    LAUNCH_1D(k_add_bcast_fwd, count, y, x, b, hw, count);
    return BK_OK;
}

int cu_add_bcast_bwd(float *db, const float *dy, int accum, int n, int c, int hw, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    const long rows = (long)n * c;
    if (rows <= 0 || hw < 1) return rows <= 0 ? BK_OK : BK_ERR_INVALID;
    const int warps = CU_THREADS / 32;
    CU_LAUNCH(k_add_bcast_bwd, (unsigned)((rows + warps - 1) / warps), CU_THREADS, 0, ctx->stream)(
        db, dy, accum, rows, hw);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

/* ---- layout ---- */

__global__ void k_concat_fwd(float *y, const float *a, const float *b, int c1, int c2, int hw,
                             size_t count)
{
    const int ct = c1 + c2;
    GRID_LOOP(i, count)
    {
        const size_t r = i / hw, s = r / ct;
        const int p = (int)(i % hw), ch = (int)(r % ct);
        y[i] = ch < c1 ? a[(s * c1 + ch) * hw + p] : b[(s * c2 + (ch - c1)) * hw + p];
    }
}

__global__ void k_concat_bwd(float *da, float *db, const float *dy, int accum_a, int accum_b,
                             int c1, int c2, int hw, size_t count)
{
    const int ct = c1 + c2;
    GRID_LOOP(i, count)
    {
        const size_t r = i / hw, s = r / ct;
        const int p = (int)(i % hw), ch = (int)(r % ct);
        if (ch < c1) {
            if (!da) continue;
            float *d = da + (s * c1 + ch) * hw + p;
            *d = accum_a ? *d + dy[i] : dy[i];
        } else {
            if (!db) continue;
            float *d = db + (s * c2 + (ch - c1)) * hw + p;
            *d = accum_b ? *d + dy[i] : dy[i];
        }
    }
}

int cu_concat_fwd(float *y, const float *a, const float *b, int n, int c1, int c2, int hw,
                  bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (n < 0 || c1 < 0 || c2 < 0 || hw < 0) return BK_ERR_INVALID;
    const size_t count = (size_t)n * (c1 + c2) * hw;
    LAUNCH_1D(k_concat_fwd, count, y, a, b, c1, c2, hw, count);
    return BK_OK;
}

int cu_concat_bwd(float *da, float *db, const float *dy, int accum_a, int accum_b, int n, int c1,
                  int c2, int hw, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (n < 0 || c1 < 0 || c2 < 0 || hw < 0) return BK_ERR_INVALID;
    const size_t count = (size_t)n * (c1 + c2) * hw;
    LAUNCH_1D(k_concat_bwd, count, da, db, dy, accum_a, accum_b, c1, c2, hw, count);
    return BK_OK;
}

#define TR_TILE 32
#define TR_ROWS 8

/* y (N,HW,C) (=/+=) transpose of x (N,C,HW), through a 32 x 33 tile in shared memory */
__global__ void k_transpose(float *y, const float *x, int accum, int c, int hw)
{
    __shared__ float tile[TR_TILE][TR_TILE + 1];
    const size_t img = (size_t)c * hw;
    const float *xs = x + blockIdx.z * img;
    float *ys = y + blockIdx.z * img;
    const int p0 = blockIdx.x * TR_TILE, c0 = blockIdx.y * TR_TILE;
    for (int r = threadIdx.y; r < TR_TILE; r += TR_ROWS) {
        const int ch = c0 + r, p = p0 + threadIdx.x;
        if (ch < c && p < hw) tile[r][threadIdx.x] = xs[(size_t)ch * hw + p];
    }
    __syncthreads();
    for (int r = threadIdx.y; r < TR_TILE; r += TR_ROWS) {
        const int p = p0 + r, ch = c0 + threadIdx.x;
        if (ch < c && p < hw) {
            float *d = ys + (size_t)p * c + ch;
            const float v = tile[threadIdx.x][r];
            *d = accum ? *d + v : v;
        }
    }
}

int cu_transpose_fwd(float *y, const float *x, int accum, int n, int c, int hw, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (n < 0 || c < 0 || hw < 0 || n > 65535) return BK_ERR_INVALID;
    if (!n || !c || !hw) return BK_OK;
    dim3 grid((hw + TR_TILE - 1) / TR_TILE, (c + TR_TILE - 1) / TR_TILE, n);
    if (grid.y > 65535) return BK_ERR_INVALID;
    CU_LAUNCH(k_transpose, grid, dim3(TR_TILE, TR_ROWS), 0, ctx->stream)(y, x, accum, c, hw);
    CU_LAUNCHED(ctx);
    return BK_OK;
}

/* ---- resampling ---- */

/* y (N,C,2H,2W): y[2i+a][2j+b] = x[i][j] */
__global__ void k_nearest_fwd(float *y, const float *x, int h, int w, size_t count)
{
    const int ho = 2 * h, wo = 2 * w;
    GRID_LOOP(i, count)
    {
        const size_t pl = i / ((size_t)ho * wo);
        const int r = (int)(i % ((size_t)ho * wo)), oy = r / wo, ox = r % wo;
        y[i] = x[(pl * h + oy / 2) * w + ox / 2];
    }
}

/* dx (N,C,H,W) (=/+=) the 2x2 block's sum */
__global__ void k_nearest_bwd(float *dx, const float *dy, int accum, int h, int w, size_t count)
{
    const int wo = 2 * w;
    GRID_LOOP(i, count)
    {
        const size_t row = i / w; /* (n, c, iy) */
        const int j = (int)(i % w);
        const float *g0 = dy + row * 2 * wo, *g1 = g0 + wo;
        const float s = (g0[2 * j] + g0[2 * j + 1]) + (g1[2 * j] + g1[2 * j + 1]);
        dx[i] = accum ? dx[i] + s : s;
    }
}

int cu_upsample_nearest2x_fwd(float *y, const float *x, int n, int c, int h, int w, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (n < 0 || c < 0 || h < 0 || w < 0) return BK_ERR_INVALID;
    const size_t count = (size_t)n * c * 4 * h * w;
    LAUNCH_1D(k_nearest_fwd, count, y, x, h, w, count);
    return BK_OK;
}

int cu_upsample_nearest2x_bwd(float *dx, const float *dy, int accum, int n, int c, int h, int w,
                              bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (n < 0 || c < 0 || h < 0 || w < 0) return BK_ERR_INVALID;
    const size_t count = (size_t)n * c * h * w;
    LAUNCH_1D(k_nearest_bwd, count, dx, dy, accum, h, w, count);
    return BK_OK;
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

__global__ void k_bilinear_fwd(float *y, const float *x, int align_corners, int h, int w,
                               float sh, float sw, size_t count)
{
    const int ho = 2 * h, wo = 2 * w;
    GRID_LOOP(i, count)
    {
        const size_t pl = i / ((size_t)ho * wo);
        const int r = (int)(i % ((size_t)ho * wo)), oy = r / wo, ox = r % wo;
        int y0, y1, x0, x1;
        float ly0, ly1, lx0, lx1;
        bilinear_tap(oy, h, sh, align_corners, &y0, &y1, &ly0, &ly1);
        bilinear_tap(ox, w, sw, align_corners, &x0, &x1, &lx0, &lx1);
        const float *xr0 = x + (pl * h + y0) * w, *xr1 = x + (pl * h + y1) * w;
        y[i] = ly0 * (lx0 * xr0[x0] + lx1 * xr0[x1]) + ly1 * (lx0 * xr1[x0] + lx1 * xr1[x1]);
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

/* dx (N,C,H,W) (=/+=) as a gather: the outputs whose taps reach (iy, ix) lie within
 * [2i - 3, 2i + 4] on each axis for either align_corners (see resample.c's taps) */
__global__ void k_bilinear_bwd(float *dx, const float *dy, int align_corners, int accum, int h,
                               int w, float sh, float sw, size_t count)
{
    const int ho = 2 * h, wo = 2 * w;
    GRID_LOOP(i, count)
    {
        const size_t pl = i / ((size_t)h * w);
        const int r = (int)(i % ((size_t)h * w)), iy = r / w, ix = r % w;
        const float *g = dy + pl * ho * wo;
        const int oy0 = max(0, 2 * iy - 3), oy1 = min(ho - 1, 2 * iy + 4);
        const int ox0 = max(0, 2 * ix - 3), ox1 = min(wo - 1, 2 * ix + 4);
        float acc = 0.0f;
        for (int oy = oy0; oy <= oy1; oy++) {
            int hy;
            const float wy = bilinear_weight(oy, iy, h, sh, align_corners, &hy);
            if (!hy) continue;
            for (int ox = ox0; ox <= ox1; ox++) {
                int hx;
                const float wx = bilinear_weight(ox, ix, w, sw, align_corners, &hx);
                if (!hx) continue;
                acc += wy * wx * g[(size_t)oy * wo + ox];
            }
        }
        dx[i] = accum ? dx[i] + acc : acc;
    }
}

int cu_upsample_bilinear2x_fwd(float *y, const float *x, int align_corners, int n, int c, int h,
                               int w, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (n < 0 || c < 0 || h < 0 || w < 0) return BK_ERR_INVALID;
    const float sh = bilinear_scale(h, 2 * h, align_corners);
    const float sw = bilinear_scale(w, 2 * w, align_corners);
    const size_t count = (size_t)n * c * 4 * h * w;
    LAUNCH_1D(k_bilinear_fwd, count, y, x, align_corners, h, w, sh, sw, count);
    return BK_OK;
}

int cu_upsample_bilinear2x_bwd(float *dx, const float *dy, int align_corners, int accum, int n,
                               int c, int h, int w, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (n < 0 || c < 0 || h < 0 || w < 0) return BK_ERR_INVALID;
    const float sh = bilinear_scale(h, 2 * h, align_corners);
    const float sw = bilinear_scale(w, 2 * w, align_corners);
    const size_t count = (size_t)n * c * h * w;
    LAUNCH_1D(k_bilinear_bwd, count, dx, dy, align_corners, accum, h, w, sh, sw, count);
    return BK_OK;
}

/* the window's maximum and its index (row-major), as resample.c: a later value wins only if
 * strictly greater, or NaN */
__device__ __forceinline__ int maxpool_argmax(const float *r0, const float *r1, int j, float *out)
{
    const float v[4] = {r0[2 * j], r0[2 * j + 1], r1[2 * j], r1[2 * j + 1]};
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

__global__ void k_maxpool_fwd(float *y, const float *x, int h, int w, size_t count)
{
    const int ho = h / 2, wo = w / 2;
    GRID_LOOP(i, count)
    {
        const size_t pl = i / ((size_t)ho * wo);
        const int r = (int)(i % ((size_t)ho * wo)), oy = r / wo, j = r % wo;
        const float *r0 = x + (pl * h + 2 * oy) * w, *r1 = r0 + w;
        float m;
        maxpool_argmax(r0, r1, j, &m);
        y[i] = m;
    }
}

/* one thread per input element: a gather from its window (windows do not overlap) */
__global__ void k_maxpool_bwd(float *dx, const float *dy, const float *x, int accum, int h, int w,
                              size_t count)
{
    const int ho = h / 2, wo = w / 2;
    GRID_LOOP(i, count)
    {
        const size_t pl = i / ((size_t)h * w);
        const int r = (int)(i % ((size_t)h * w)), iy = r / w, ix = r % w;
        const int oy = iy / 2, j = ix / 2;
        float v = 0.0f;
        if (oy < ho && j < wo) {
            const float *r0 = x + (pl * h + 2 * oy) * w, *r1 = r0 + w;
            float m;
            const int k = maxpool_argmax(r0, r1, j, &m);
            if (k == (iy - 2 * oy) * 2 + (ix - 2 * j)) v = dy[(pl * ho + oy) * wo + j];
        }
        dx[i] = accum ? dx[i] + v : v;
    }
}

int cu_maxpool2x2_fwd(float *y, const float *x, int n, int c, int h, int w, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (n < 0 || c < 0 || h < 0 || w < 0) return BK_ERR_INVALID;
    const size_t count = (size_t)n * c * (h / 2) * (w / 2);
    LAUNCH_1D(k_maxpool_fwd, count, y, x, h, w, count);
    return BK_OK;
}

int cu_maxpool2x2_bwd(float *dx, const float *dy, const float *x, int accum, int n, int c, int h,
                      int w, bk_ctx *ctx)
{
    CU_ENTER(ctx);
    if (n < 0 || c < 0 || h < 0 || w < 0) return BK_ERR_INVALID;
    const size_t count = (size_t)n * c * h * w;
    LAUNCH_1D(k_maxpool_bwd, count, dx, dy, x, accum, h, w, count);
    return BK_OK;
}

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
    LAUNCH_1D(k_timestep_embed, count, y, t, n, dim, half, flip_sin_to_cos != 0, lnp, denom);
    return BK_OK;
}

/* ---- conv.cu's padding helpers, per (N*C) plane, on conv's element type T ---- */

template <typename T>
__global__ void k_pad2d(T *xp, const T *x, int h, int w, int pt, int pl, int hp, int wp,
                        size_t count)
{
    GRID_LOOP(i, count)
    {
        const size_t plane = i / ((size_t)hp * wp);
        const int r = (int)(i % ((size_t)hp * wp)), y = r / wp - pt, xx = r % wp - pl;
        xp[i] = (y >= 0 && y < h && xx >= 0 && xx < w) ? x[(plane * h + y) * w + xx]
                                                       : cu_to<T>(0.0f);
    }
}

template <typename T>
__global__ void k_crop2d(T *x, const T *xp, int h, int w, int pt, int pl, int hp, int wp,
                         size_t count)
{
    GRID_LOOP(i, count)
    {
        const size_t plane = i / ((size_t)h * w);
        const int r = (int)(i % ((size_t)h * w)), y = r / w, xx = r % w;
        x[i] = xp[(plane * hp + y + pt) * wp + xx + pl];
    }
}

template <typename T>
static int pad2d(void *xp, const void *x, int nc, int h, int w, int pt, int pl, int pb, int pr,
                 bk_ctx *ctx)
{
    const int hp = h + pt + pb, wp = w + pl + pr;
    const size_t count = (size_t)nc * hp * wp;
    LAUNCH_1D(k_pad2d<T>, count, (T *)xp, (const T *)x, h, w, pt, pl, hp, wp, count);
    return BK_OK;
}

template <typename T>
static int crop2d(void *x, const void *xp, int nc, int h, int w, int pt, int pl, int pb, int pr,
                  bk_ctx *ctx)
{
    const int hp = h + pt + pb, wp = w + pl + pr;
    const size_t count = (size_t)nc * h * w;
    LAUNCH_1D(k_crop2d<T>, count, (T *)x, (const T *)xp, h, w, pt, pl, hp, wp, count);
    return BK_OK;
}

int cu_pad2d(void *xp, const void *x, int dtype, int nc, int h, int w, int pt, int pl, int pb,
             int pr, bk_ctx *ctx)
{
    return CU_TYPED(dtype, pad2d, xp, x, nc, h, w, pt, pl, pb, pr, ctx);
}

int cu_crop2d(void *x, const void *xp, int dtype, int nc, int h, int w, int pt, int pl, int pb,
              int pr, bk_ctx *ctx)
{
    return CU_TYPED(dtype, crop2d, x, xp, nc, h, w, pt, pl, pb, pr, ctx);
}
