/* wino.c - the CPU's fast-mode 3x3 convolutions (stride 1, padded by 1 on every side):
 * Winograd's minimal filtering F(4x4, 3x3) (Lavin and Gray 2016, interpolation points 0, +-1,
 * +-2, infinity). A 6x6 input tile d gives a 4x4 output tile Y = A^T [(G g G^T) . (B^T d B)] A:
 * 36 multiplications a tile and channel pair where the direct form takes 144, so the three
 * passes of a training step do a quarter of the direct form's products, as 36 batched GEMMs
 * (gemm.c: oneDNN's matmul, on whichever of AVX-512 and AVX2 the CPU has; oneDNN 2.6's own
 * Winograd is AVX-512 only and refuses NHWC). The transforms here are AVX2 code on 8 channels
 * at a time; the images stay NHWC.
 *
 * Forward and data gradient are the same algorithm (the data gradient convolves dy with the
 * weights transposed and turned by 180 degrees); the filter gradient is the adjoint of the
 * forward: dg = G^T [sum over tiles (B^T d B) . (A dY A^T)] G, the tile sum being a GEMM over the
 * tiles of a chunk, accumulated over the chunks. Tiles are taken in chunks (at most
 * WINO_CHUNK_BYTES of transformed input and output) so the workspace does not grow with the
 * batch. fp32 operands only: with bf16 ones on AVX512-BF16, oneDNN's direct bf16 kernels
 * (vdpbf16ps, two products a lane) were as fast as this in fp32 (ddpm-cifar10 b8 bf16 step:
 * 885-956 ms against 858-870 direct, the Winograd taken where it measured 1.06-1.27x alone).
 *
 * Accuracy: not the direct form's bits. The transforms' coefficients (up to 5 in B, 8 in A)
 * cost a few bits against the direct fp32 sum: the largest difference from it, relative to the
 * largest output, measured 5e-6 to 2e-5 forward and data, 3e-6 to 5e-5 filter gradient (that one
 * grows with the tiles summed; bench/wino_bench.c on the presets' shapes, test_wino's bound). The parity mode (set_parity(1), memory.deterministic) keeps conv.c's
 * direct kernels. Results are a function of (shape, thread count), as oneDNN's are: the
 * transforms do not depend on it, the GEMMs and the filter gradient's chunk sums may.
 */
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#include "cpu.h"

typedef float f8 __attribute__((vector_size(32)));

#define NX 36                               /* transformed points a tile: 6 x 6 */
#define WINO_CHUNK_BYTES (8u << 20)         /* transformed input + output of a chunk, at most */

size_t cpu_wino_chunk_bytes = WINO_CHUNK_BYTES;

static size_t align64(size_t b) { return (b + 63) & ~(size_t)63; }

int cpu_wino_applies(const struct bk_conv2d *s)
{
    return s && s->kh == 3 && s->kw == 3 && s->stride == 1 && s->pad_t == 1 && s->pad_l == 1 &&
           s->pad_b == 1 && s->pad_r == 1 && s->ho == s->h && s->wo == s->w && s->n >= 1 &&
           s->ci >= WINO_MIN_CH && s->co >= WINO_MIN_CH && s->ci % 8 == 0 && s->co % 8 == 0 &&
           s->h >= 4 && s->w >= 4 && s->dtype == BK_DTYPE_F32;
}

/* the tiling of s and its workspace regions: U (the 36 transformed weights, or the filter
 * gradient's sums), V and M (a chunk's transformed input and output, `t` bytes each: max(Ci, Co)
 * channels), the GEMMs' scratchpad */
struct wino {
    int th, tw, tiles; /* tiles down, across, in all (N th tw) */
    int tc, chunks;    /* tiles a chunk (the last may have fewer), chunks */
    int cm;            /* max(Ci, Co) */
    size_t u, t;       /* bytes of U, of V and of M (64-aligned) */
};

static void wino_shape(struct wino *p, const struct bk_conv2d *s)
{
    p->th = (s->h + 3) / 4, p->tw = (s->w + 3) / 4;
    p->tiles = s->n * p->th * p->tw;
    p->cm = s->ci > s->co ? s->ci : s->co;
    const size_t per_tile = (size_t)NX * 2 * p->cm * sizeof(float);
    size_t tc = cpu_wino_chunk_bytes / per_tile;
    if (tc < 16) tc = 16;
    if (tc > (size_t)p->tiles) tc = (size_t)p->tiles;
    p->chunks = (int)(((size_t)p->tiles + tc - 1) / tc);
    p->tc = (p->tiles + p->chunks - 1) / p->chunks; /* even chunks */
    p->u = align64((size_t)NX * s->ci * s->co * sizeof(float));
    p->t = align64((size_t)NX * p->tc * p->cm * sizeof(float));
}

/* the batched GEMM of a chunk: 0 forward, 1 data gradient, 2 filter gradient (accumulating
 * into the sums unless it is the first chunk). Every chunk is tc tiles long: a shorter last one
 * computes rows nobody reads (forward, data gradient) or zeros (the filter gradient), so that
 * a shape has one primitive a kind (their JIT code is memory the plan does not see) */
static struct cpu_gemm_shape wino_gemm(const struct wino *p, const struct bk_conv2d *s, int kind,
                                       int accum)
{
    const int rows = p->tc;
    struct cpu_gemm_shape g = {.batch = NX, .dtype = BK_DTYPE_F32, .c_dtype = BK_DTYPE_F32};
    const long long tc = p->tc;
    if (kind == 2) { /* sums (Ci, Co) += V^T (Ci, rows) M (rows, Co) */
        g.ta = 1, g.m = s->ci, g.n = s->co, g.k = rows;
        g.lda = s->ci, g.ldb = s->co, g.ldc = s->co, g.accum = accum;
        g.sa = tc * s->ci, g.sb = tc * s->co, g.sc = (long long)s->ci * s->co;
        return g;
    }
    const int cin = kind == 0 ? s->ci : s->co, cout = kind == 0 ? s->co : s->ci;
    g.m = rows, g.n = cout, g.k = cin;
    g.lda = cin, g.ldb = cout, g.ldc = cout;
    g.sa = tc * cin, g.sb = (long long)cin * cout, g.sc = tc * cout;
    return g;
}

static size_t max2(size_t a, size_t b) { return a > b ? a : b; }

/* the GEMMs' scratchpad bytes of s (oneDNN's, at the machine's cores), remembered per thread:
 * asking oneDNN makes primitive descriptors (30 us a call here), and every call of a shape
 * needs the figure */
static size_t wino_scr_bytes(const struct wino *p, const struct bk_conv2d *s);

size_t cpu_wino_ws_bytes(const struct bk_conv2d *s)
{
    if (!cpu_wino_applies(s)) return 0;
    struct wino p;
    wino_shape(&p, s);
    return p.u + 2 * p.t + wino_scr_bytes(&p, s);
}

static size_t wino_scr_bytes(const struct wino *p, const struct bk_conv2d *s)
{
    enum { MEMO = 64 };
    static _Thread_local struct {
        struct bk_conv2d s;
        size_t chunk, bytes;
    } memo[MEMO];
    static _Thread_local int n_memo, next;
    for (int i = 0; i < n_memo; i++)
        if (!memcmp(&memo[i].s, s, sizeof *s) && memo[i].chunk == cpu_wino_chunk_bytes)
            return memo[i].bytes;
    size_t scr = 0;
    for (int kind = 0; kind < 3; kind++)
        for (int accum = 0; accum < 2; accum++) {
            if (accum && kind != 2) continue;
            const struct cpu_gemm_shape g = wino_gemm(p, s, kind, accum);
            scr = max2(scr, cpu_gemm_ws_bytes(&g));
        }
    scr = align64(scr);
    const int at = n_memo < MEMO ? n_memo++ : next++ % MEMO;
    memcpy(&memo[at].s, s, sizeof *s);
    memo[at].chunk = cpu_wino_chunk_bytes, memo[at].bytes = scr;
    return scr;
}

/* ---- stores of 8 channels ---- */

/* dst (8 channels) = v, or, accumulating, dst + v */
static inline void st8(float *dst, f8 v, int accum)
{
    if (accum) v += (f8)_mm256_loadu_ps(dst);
    _mm256_storeu_ps(dst, (__m256)v);
}

/* ---- the transforms' one-dimensional steps (rows and columns alike) ---- */

/* r = B^T z */
static inline void bt6(f8 r[6], const f8 z[6])
{
    const f8 a = z[4] - 4 * z[2], b = z[3] - 4 * z[1];
    const f8 c = z[4] - z[2], d = 2 * (z[3] - z[1]);
    r[0] = 4 * z[0] - 5 * z[2] + z[4];
    r[1] = a + b, r[2] = a - b;
    r[3] = c + d, r[4] = c - d;
    r[5] = 4 * z[1] - 5 * z[3] + z[5];
}

/* o = A^T m */
static inline void at4(f8 o[4], const f8 m[6])
{
    const f8 p = m[1] + m[2], q = m[1] - m[2], r = m[3] + m[4], t = m[3] - m[4];
    o[0] = m[0] + p + r;
    o[1] = q + 2 * t;
    o[2] = p + 4 * r;
    o[3] = q + 8 * t + m[5];
}

/* z = A y (y: 4 points) */
static inline void a6(f8 z[6], const f8 y[4])
{
    const f8 e = y[0] + y[2], o = y[1] + y[3];
    const f8 e4 = y[0] + 4 * y[2], o2 = 2 * y[1] + 8 * y[3];
    z[0] = y[0];
    z[1] = e + o, z[2] = e - o;
    z[3] = e4 + o2, z[4] = e4 - o2;
    z[5] = y[3];
}

/* u = G g (g: 3 taps) */
static inline void g6(f8 u[6], const f8 g[3])
{
    const f8 a = (g[0] + g[2]) * (-1.0f / 6), b = g[1] * (-1.0f / 6);
    const f8 c = g[0] * (1.0f / 24) + g[2] * (1.0f / 6), d = g[1] * (1.0f / 12);
    u[0] = g[0] * 0.25f;
    u[1] = a + b, u[2] = a - b;
    u[3] = c + d, u[4] = c - d;
    u[5] = g[2];
}

/* g = G^T u */
static inline void gt3(f8 g[3], const f8 u[6])
{
    const f8 s12 = u[1] + u[2], s34 = u[3] + u[4];
    g[0] = u[0] * 0.25f - s12 * (1.0f / 6) + s34 * (1.0f / 24);
    g[1] = (u[2] - u[1]) * (1.0f / 6) + (u[3] - u[4]) * (1.0f / 12);
    g[2] = (s34 - s12) * (1.0f / 6) + u[5];
}

/* ---- the passes ---- */

/* the tile t's image and corner: image n, rows y0 .., columns x0 .. of the output */
static void tile_at(const struct wino *p, int t, int *n, int *y0, int *x0)
{
    const int per = p->th * p->tw, r = t % per;
    *n = t / per, *y0 = 4 * (r / p->tw), *x0 = 4 * (r % p->tw);
}

/* V[x][t - t0][c] = (B^T d B)[x] for the chunk's tiles t0 .. t0 + rows - 1 of src (N,H,W,C),
 * zero outside the image; V's point x at x * tc * C */
static void wino_in(float *V, const float *src, int c, int t0, int rows,
                    const struct wino *p, const struct bk_conv2d *s, int threads)
{
    const size_t xs = (size_t)p->tc * c;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int r = 0; r < rows; r++) {
        int n, y0, x0;
        tile_at(p, t0 + r, &n, &y0, &x0);
        const float *px[NX];
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 6; j++) {
                const int y = y0 - 1 + i, x = x0 - 1 + j;
                px[i * 6 + j] = y < 0 || y >= s->h || x < 0 || x >= s->w
                                    ? NULL
                                    : src + (((size_t)n * s->h + y) * s->w + x) * c;
            }
        float *out = V + (size_t)r * c;
        for (int ch = 0; ch < c; ch += 8) {
            f8 d[NX], t[NX];
            for (int k = 0; k < NX; k++)
                d[k] = px[k] ? (f8)_mm256_loadu_ps(px[k] + ch) : (f8){0};
            for (int j = 0; j < 6; j++) { /* columns: t = B^T d */
                f8 z[6], o[6];
                for (int i = 0; i < 6; i++) z[i] = d[i * 6 + j];
                bt6(o, z);
                for (int i = 0; i < 6; i++) t[i * 6 + j] = o[i];
            }
            for (int i = 0; i < 6; i++) { /* rows: (B^T d) B */
                f8 o[6];
                bt6(o, &t[i * 6]);
                for (int j = 0; j < 6; j++)
                    _mm256_storeu_ps(out + (size_t)(i * 6 + j) * xs + ch, (__m256)o[j]);
            }
        }
    }
}

/* dst (N,H,W,C) (= or +=) A^T M A (+ bias) for the chunk's tiles, the parts inside the image */
static void wino_out(float *dst, const float *M, const float *bias, int c, int accum,
                     int t0, int rows, const struct wino *p, const struct bk_conv2d *s,
                     int threads)
{
    const size_t xs = (size_t)p->tc * c;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int r = 0; r < rows; r++) {
        int n, y0, x0;
        tile_at(p, t0 + r, &n, &y0, &x0);
        const int ny = s->h - y0 < 4 ? s->h - y0 : 4, nx = s->w - x0 < 4 ? s->w - x0 : 4;
        const float *in = M + (size_t)r * c;
        float *row0 = dst + (((size_t)n * s->h + y0) * s->w + x0) * c;
        for (int ch = 0; ch < c; ch += 8) {
            f8 t[4 * 6];
            for (int j = 0; j < 6; j++) { /* columns: A^T M */
                f8 z[6], o[4];
                for (int i = 0; i < 6; i++)
                    z[i] = (f8)_mm256_loadu_ps(in + (size_t)(i * 6 + j) * xs + ch);
                at4(o, z);
                for (int i = 0; i < 4; i++) t[i * 6 + j] = o[i];
            }
            const f8 b = bias ? (f8)_mm256_loadu_ps(bias + ch) : (f8){0};
            for (int i = 0; i < ny; i++) { /* rows: (A^T M) A */
                f8 o[4];
                at4(o, &t[i * 6]);
                float *prow = row0 + (size_t)i * s->w * c + ch;
                for (int j = 0; j < nx; j++) st8(prow + (size_t)j * c, o[j] + b, accum);
            }
        }
    }
}

/* the filter gradient's dy side: M[x][t - t0][k] = (A dY A^T)[x], dY the tile's 4x4 outputs
 * (zero outside the image) */
static void wino_dy(float *M, const float *dy, int t0, int rows, const struct wino *p,
                    const struct bk_conv2d *s, int threads)
{
    const int c = s->co;
    const size_t xs = (size_t)p->tc * c;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int r = 0; r < rows; r++) {
        int n, y0, x0;
        tile_at(p, t0 + r, &n, &y0, &x0);
        const float *px[16];
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 4; j++)
                px[i * 4 + j] = y0 + i >= s->h || x0 + j >= s->w
                                    ? NULL
                                    : dy + (((size_t)n * s->h + y0 + i) * s->w + x0 + j) * c;
        float *out = M + (size_t)r * c;
        for (int ch = 0; ch < c; ch += 8) {
            f8 t[6 * 4];
            for (int j = 0; j < 4; j++) { /* columns: A dY */
                f8 y[4], z[6];
                for (int i = 0; i < 4; i++)
                    y[i] = px[i * 4 + j] ? (f8)_mm256_loadu_ps(px[i * 4 + j] + ch) : (f8){0};
                a6(z, y);
                for (int i = 0; i < 6; i++) t[i * 4 + j] = z[i];
            }
            for (int i = 0; i < 6; i++) { /* rows: (A dY) A^T */
                f8 z[6];
                a6(z, &t[i * 4]);
                for (int j = 0; j < 6; j++)
                    _mm256_storeu_ps(out + (size_t)(i * 6 + j) * xs + ch, (__m256)z[j]);
            }
        }
    }
}

/* U[x][r][q] = (G g G^T)[x] of the 3x3 kernel of w (Co,Ci,3,3)
 * taken as rows r, columns q: the forward's (r = input channel c, q = output channel k), or the
 * data gradient's (r = k, q = c, the kernel turned by 180 degrees) */
static void wino_weights(float *U, const float *w, int turned,
                         const struct bk_conv2d *s, int threads)
{
    const int R = turned ? s->co : s->ci, Q = turned ? s->ci : s->co;
    const size_t xs = (size_t)R * Q;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int r = 0; r < R; r++)
        for (int q0 = 0; q0 < Q; q0 += 8) {
            float lane[9][8];
            for (int l = 0; l < 8; l++) {
                const int k = turned ? r : q0 + l, c = turned ? q0 + l : r;
                const size_t base = ((size_t)k * s->ci + c) * 9;
                for (int e = 0; e < 9; e++) {
                    const size_t at = base + (turned ? 8 - e : e);
                    lane[e][l] = w[at];
                }
            }
            f8 t[6 * 3];
            for (int j = 0; j < 3; j++) { /* columns: G g */
                f8 g[3], u[6];
                for (int i = 0; i < 3; i++) g[i] = (f8)_mm256_loadu_ps(lane[i * 3 + j]);
                g6(u, g);
                for (int i = 0; i < 6; i++) t[i * 3 + j] = u[i];
            }
            for (int i = 0; i < 6; i++) { /* rows: (G g) G^T */
                f8 u[6];
                g6(u, &t[i * 3]);
                for (int j = 0; j < 6; j++)
                    _mm256_storeu_ps(U + (size_t)(i * 6 + j) * xs + (size_t)r * Q + q0,
                                     (__m256)u[j]);
            }
        }
}

/* dw (Co,Ci,3,3) += G^T S G of the sums S[x][c][k] */
static void wino_dw(float *dw, const float *S, const struct bk_conv2d *s, int threads)
{
    const size_t xs = (size_t)s->ci * s->co;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int c = 0; c < s->ci; c++)
        for (int k0 = 0; k0 < s->co; k0 += 8) {
            f8 t[3 * 6];
            for (int j = 0; j < 6; j++) { /* columns: G^T S */
                f8 u[6], g[3];
                for (int i = 0; i < 6; i++)
                    u[i] = (f8)_mm256_loadu_ps(S + (size_t)(i * 6 + j) * xs + (size_t)c * s->co +
                                               k0);
                gt3(g, u);
                for (int i = 0; i < 3; i++) t[i * 6 + j] = g[i];
            }
            for (int i = 0; i < 3; i++) { /* rows: (G^T S) G */
                f8 g[3];
                gt3(g, &t[i * 6]);
                for (int j = 0; j < 3; j++)
                    for (int l = 0; l < 8; l++)
                        dw[(((size_t)(k0 + l) * s->ci + c) * 3 + i) * 3 + j] += g[j][l];
            }
        }
}

/* ---- the entries (conv.c calls them in fast mode where cpu_wino_applies) ---- */

struct wino_ws {
    float *u, *v, *m;
    void *scr;
    size_t scr_bytes;
};

/* s's tiling and ws cut into its regions; 0, or -1 where ws is seen to be too small: inside
 * the plan's workspace (ctx_set_workspace), fewer bytes to its end than s needs. A workspace
 * sized in parity mode (the direct kernels' bytes) used by a fast-mode context would otherwise
 * be overrun without a sign. */
static int wino_begin(struct wino *p, struct wino_ws *w, void *ws, const struct bk_conv2d *s,
                      const bk_ctx *ctx)
{
    wino_shape(p, s);
    char *b = ws, *base = ctx->ws;
    w->u = (float *)b;
    w->v = (float *)(b + p->u);
    w->m = (float *)(b + p->u + p->t);
    w->scr = b + p->u + 2 * p->t;
    w->scr_bytes = wino_scr_bytes(p, s);
    const size_t need = p->u + 2 * p->t + w->scr_bytes;
    if (!base || b < base || b >= base + ctx->ws_bytes || (size_t)(base + ctx->ws_bytes - b) >= need)
        return 0;
    fprintf(stderr,
            "ddpmd: a fast-mode context runs a Winograd convolution in a workspace planned "
            "for %zu bytes less (a plan made in parity mode?)\n",
            need - (size_t)(base + ctx->ws_bytes - b));
    return -1;
}

/* forward (kind 0: y = conv(x, w) + b) or data gradient (kind 1: dx (=/+=) conv^T(dy, w)) */
static int wino_conv(float *dst, const float *src, const float *w, const float *bias, int accum,
                     int kind, void *ws, const struct bk_conv2d *s, bk_ctx *ctx)
{
    struct wino p;
    struct wino_ws b;
    if (wino_begin(&p, &b, ws, s, ctx)) return BK_ERR_INVALID;
    const int threads = cpu_threads(ctx);
    const int cin = kind == 0 ? s->ci : s->co, cout = kind == 0 ? s->co : s->ci;
    wino_weights(b.u, w, kind == 1, s, threads);
    for (int t0 = 0; t0 < p.tiles; t0 += p.tc) {
        const int rows = p.tiles - t0 < p.tc ? p.tiles - t0 : p.tc;
        wino_in(b.v, src, cin, t0, rows, &p, s, threads);
        const struct cpu_gemm_shape g = wino_gemm(&p, s, kind, 0);
        const int rc = cpu_gemm(&g, b.m, b.v, b.u, NULL, b.scr, b.scr_bytes, ctx);
        if (rc != BK_OK) return rc;
        wino_out(dst, b.m, bias, cout, accum, t0, rows, &p, s, threads);
    }
    return BK_OK;
}

int cpu_wino_fwd(void *y, const void *x, const void *w, const float *b, void *ws,
                 const struct bk_conv2d *s, bk_ctx *ctx)
{
    if (!cpu_wino_applies(s) || !y || !x || !w || !ws || !ctx) return BK_ERR_INVALID;
    return wino_conv(y, x, w, b, 0, 0, ws, s, ctx);
}

int cpu_wino_bwd_data(void *dx, const void *dy, const void *w, int accum, void *ws,
                      const struct bk_conv2d *s, bk_ctx *ctx)
{
    if (!cpu_wino_applies(s) || !dx || !dy || !w || !ws || !ctx) return BK_ERR_INVALID;
    return wino_conv(dx, dy, w, NULL, accum, 1, ws, s, ctx);
}

int cpu_wino_bwd_filter(float *dw, float *db, const void *dy, const void *x, void *ws,
                        const struct bk_conv2d *s, bk_ctx *ctx)
{
    if (!cpu_wino_applies(s) || !dw || !dy || !x || !ws || !ctx) return BK_ERR_INVALID;
    struct wino p;
    struct wino_ws b;
    if (wino_begin(&p, &b, ws, s, ctx)) return BK_ERR_INVALID;
    const int threads = cpu_threads(ctx);
    for (int t0 = 0; t0 < p.tiles; t0 += p.tc) {
        const int rows = p.tiles - t0 < p.tc ? p.tiles - t0 : p.tc;
        wino_in(b.v, x, s->ci, t0, rows, &p, s, threads);
        wino_dy(b.m, dy, t0, rows, &p, s, threads);
        if (rows < p.tc) /* the tiles past the end: zero on both sides (no stale Inf * 0) */
            for (int x = 0; x < NX; x++) {
                memset(b.v + ((size_t)x * p.tc + rows) * s->ci, 0,
                       (size_t)(p.tc - rows) * s->ci * sizeof(float));
                memset(b.m + ((size_t)x * p.tc + rows) * s->co, 0,
                       (size_t)(p.tc - rows) * s->co * sizeof(float));
            }
        const struct cpu_gemm_shape g = wino_gemm(&p, s, 2, t0 > 0);
        const int rc = cpu_gemm(&g, b.u, b.v, b.m, NULL, b.scr, b.scr_bytes, ctx);
        if (rc != BK_OK) return rc;
    }
    wino_dw(dw, b.u, s, threads);
    if (db) cpu_col_sums(db, dy, BK_DTYPE_F32, s->n * s->h * s->w, s->co, ctx);
    return BK_OK;
}
